"""Token sampling: one token per sequence from the logits of its last position.

Each row is processed with its own request's parameters, in the order of Hugging Face
``generate`` (``GenerationMixin._get_logits_processor``) so that the two can be compared:

    repetition penalty -> temperature -> top-k -> top-p -> min-p -> draw

After the repetition penalty and after temperature the logits are made finite (NaN and
-inf to the lowest float32, +inf to the highest), so that no accepted parameter and no
overflowing model output can make the draw fail: a row of NaN becomes a uniform draw.

Each stage is a few tensor ops over the whole batch with the per-row parameters as tensors,
a row whose filter is off getting a neutral value. The only per-row work is drawing one uniform
number from the request's own generator, so that a request's tokens depend on its seed and
logits, not on the other requests in the batch. (Up to rounding: a reduction may sum in another
order for another batch shape, which matters only for a token within rounding of a top-p
boundary.)

A constrained request (engine.structured) brings a mask of the tokens its grammar allows: its
row's other logits become -inf before anything else, so top-k, top-p and min-p choose among the
allowed tokens only, and no other row is touched.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch.nn.utils.rnn import pad_sequence

from engine.kernels import native
from engine.params import SamplingParams
from engine.structured.constraint import InvalidConstraint, one_line

_NEG_INF = -math.inf
_FLOAT32_HIGHEST = torch.finfo(torch.float32).max
_FLOAT32_LOWEST = torch.finfo(torch.float32).min
# How many of each row's most likely tokens to search for the top-p set before sorting them all.
_TOP_P_CANDIDATES = 256


class TokenMask(NamedTuple):
    """The tokens some rows of a step may produce (engine.structured.token_masks)."""

    rows: list[int]
    """Rows of the logits, in the order of `banned`'s rows."""
    banned: torch.Tensor
    """[len(rows), vocab] bool on the logits' device: True for a token the row may not produce."""


class RequestSampler:
    """Sampling state that lives as long as a request: its generator, the tokens it has seen,
    and, for a constrained request, its grammar's state."""

    __slots__ = ("params", "generator", "matcher", "_seen", "_pending", "_seen_ids", "_num_seen_ids")

    def __init__(
        self,
        params: SamplingParams,
        device: torch.device,
        prompt_ids: Sequence[int],
        matcher: Any = None,
    ) -> None:
        self.params = params
        # An llguidance LLMatcher at the grammar's start (engine.structured), or None.
        self.matcher = matcher
        self.generator = torch.Generator(device=device)
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        # torch takes seeds in [-2**63, 2**64); reducing mod 2**64 gives any int a stream.
        self.generator.manual_seed(seed % 2**64)
        # Seen ids are kept unique (a set, for O(1) membership) and mirrored on the device in a
        # growing buffer, so a step uploads only the ids that are new since the last one.
        self._seen: set[int] = set()
        self._pending: list[int] = []
        self._seen_ids = torch.empty(0, dtype=torch.long, device=device)
        self._num_seen_ids = 0
        for token_id in prompt_ids:
            self._see(token_id)

    @property
    def penalizes_repetition(self) -> bool:
        return self.params.repetition_penalty != 1.0

    @property
    def grammar_complete(self) -> bool:
        """Whether the request's grammar has ended: no token but an end token could follow."""
        return self.matcher is not None and self.matcher.is_stopped()

    def observe(self, token_id: int) -> None:
        """Record a generated token: for the repetition penalty, and in the grammar's state.

        Raises InvalidConstraint when the grammar cannot go on (it ran past the grammar
        library's limits for one step); its mask never lets through a token it refuses."""
        self._see(token_id)
        if self.matcher is not None and not self.matcher.consume_token(token_id):
            raise InvalidConstraint(
                f"The reply's grammar could not go on: {one_line(self.matcher.get_error())}"
            )

    def _see(self, token_id: int) -> None:
        if self.penalizes_repetition and token_id not in self._seen:
            self._seen.add(token_id)
            self._pending.append(token_id)

    def seen_ids(self) -> torch.Tensor:
        """The distinct token ids seen so far, on the device, in first-seen order."""
        if self._pending:
            needed = self._num_seen_ids + len(self._pending)
            if needed > self._seen_ids.numel():
                grown = torch.empty(
                    max(needed, 2 * self._seen_ids.numel()),
                    dtype=torch.long, device=self._seen_ids.device,
                )
                grown[: self._num_seen_ids] = self._seen_ids[: self._num_seen_ids]
                self._seen_ids = grown
            self._seen_ids[self._num_seen_ids : needed] = torch.tensor(
                self._pending, dtype=torch.long
            )
            self._num_seen_ids = needed
            self._pending.clear()
        return self._seen_ids[: self._num_seen_ids]


def sample(
    logits: torch.Tensor, samplers: Sequence[RequestSampler], mask: TokenMask | None = None
) -> list[int]:
    """Draw one token per row of ``logits`` [B, V] (any float dtype), row i for ``samplers[i]``;
    the rows of ``mask`` only among the tokens it allows.

    Token ids seen by a sampler must be below V.
    """
    if logits.dim() != 2 or logits.shape[0] != len(samplers):
        raise ValueError(
            f"expected logits of shape [{len(samplers)}, vocab], got {tuple(logits.shape)}"
        )
    sampled = [i for i, s in enumerate(samplers) if not s.params.greedy]
    # Even greedy-only batches go through float32: the cast is exact and its argmax is faster.
    writes = bool(sampled) or any(s.penalizes_repetition for s in samplers)
    logits = logits.to(torch.float32, copy=writes or mask is not None)
    if mask is not None:
        _apply_mask_(logits, mask)
    _apply_repetition_penalty(logits, samplers)
    if writes:  # a copy: argmax alone (never written) copes with any value
        _make_finite_(logits)
    if not sampled:
        tokens = _greedy(logits)
    elif len(sampled) == len(samplers):
        tokens = _draw(logits, _warp(logits, [s.params for s in samplers]), samplers)
    else:
        tokens = _greedy(logits)
        rows = torch.tensor(sampled, device=logits.device)
        sampled_logits = logits[rows]
        floor = _warp(sampled_logits, [samplers[i].params for i in sampled])
        tokens[rows] = _draw(sampled_logits, floor, [samplers[i] for i in sampled])
    if mask is not None:
        _keep_allowed_(tokens, mask)
    return tokens.tolist()


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=1), by the native kernel where the CPU engine has
    loaded it (torch's CPU argmax took 1 ms of a 16-sequence step)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.stride(1) == 1 and native.loaded():
        return native.argmax_rows(logits)
    return logits.argmax(dim=1)


def _apply_mask_(logits: torch.Tensor, mask: TokenMask) -> None:
    """In place: -inf for every token a masked row may not produce (columns past the
    mask's width too); other rows untouched."""
    width = min(mask.banned.shape[1], logits.shape[1])
    # Row by row, in place: a few rows' small ops cost less than gathering the rows and
    # scattering them back.
    for banned, row in zip(mask.banned, mask.rows):
        logits[row, :width].masked_fill_(banned[:width], _NEG_INF)
        if width < logits.shape[1]:
            logits[row, width:] = _NEG_INF


def _keep_allowed_(tokens: torch.Tensor, mask: TokenMask) -> None:
    """In place: a masked row whose draw is banned takes its first allowed token.

    Only a row whose every allowed logit is -inf or NaN can draw a banned token (the
    finite-making above turns its -inf into ties with the banned ones); nothing else can.
    """
    rows = torch.tensor(mask.rows, device=tokens.device)
    drawn = tokens.index_select(0, rows)
    width = mask.banned.shape[1]
    refused = mask.banned.gather(1, drawn.clamp(max=width - 1).unsqueeze(1)).squeeze(1) | (drawn >= width)
    if not bool(refused.any()):
        return
    first_allowed = (~mask.banned).to(torch.uint8).argmax(dim=1)
    tokens.index_copy_(0, rows, torch.where(refused, first_allowed, drawn))


def _filtered_logits(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> torch.Tensor:
    """The float32 logits that ``sample`` draws from, -inf for every token a row may not produce.

    Its softmax is each row's sampling distribution; a greedy row keeps only its argmax. The
    input is not modified.
    """
    logits = logits.to(torch.float32, copy=True)
    _apply_repetition_penalty(logits, samplers)
    _make_finite_(logits)
    filtered = torch.full_like(logits, _NEG_INF)
    filtered.scatter_(1, logits.argmax(dim=1, keepdim=True), 0.0)
    sampled = [i for i, s in enumerate(samplers) if not s.params.greedy]
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        sampled_logits = logits[rows]
        floor = _warp(sampled_logits, [samplers[i].params for i in sampled])
        if floor is not None:
            sampled_logits.masked_fill_(sampled_logits < floor, _NEG_INF)
        filtered[rows] = sampled_logits
    return filtered


def _draw(
    logits: torch.Tensor, floor: torch.Tensor | None, samplers: Sequence[RequestSampler]
) -> torch.Tensor:
    """One token per row from softmax over the logits >= the row's floor ([B, 1]; None: all).

    Inverse-CDF sampling: one uniform per row from the row's generator, then one batched search.
    An exponential race (argmax of p / Exp(1) noise) needs V random numbers per row and costs
    ~25x more on a CPU.
    """
    # Unnormalized probabilities suffice, as the target is scaled by each row's total; a
    # multiply by the mask is several times faster than masked_fill on a CPU.
    weights = (logits - logits.amax(dim=1, keepdim=True)).exp_()
    if floor is not None:
        weights.mul_(logits >= floor)
    cdf = weights.cumsum(dim=1, dtype=torch.float64)
    uniform = torch.empty(len(samplers), 1, dtype=torch.float64, device=logits.device)
    for row, sampler in zip(uniform, samplers):
        row.uniform_(generator=sampler.generator)
    # 1 - u lies in (0, 1], so the target lies in (0, total] even after rounding: the first cdf
    # entry that reaches it exists and belongs to a token of nonzero probability.
    target = (1 - uniform) * cdf[:, -1:]
    return torch.searchsorted(cdf, target).squeeze(1)


def _make_finite_(logits: torch.Tensor) -> torch.Tensor:
    """In place: NaN and -inf to float32's lowest value, +inf to its highest.

    Differences of these extremes still overflow to -inf, whose exp is 0, never NaN; and
    a row with no finite logit at all becomes a row of equal ones, drawn uniformly,
    instead of NaN weights that no search can draw from.
    """
    return logits.nan_to_num_(nan=_FLOAT32_LOWEST, posinf=_FLOAT32_HIGHEST, neginf=_FLOAT32_LOWEST)


def _apply_repetition_penalty(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> None:
    """In place, on float32 logits; the cost is in the seen tokens, not the vocabulary."""
    rows, seen_ids = [], []
    for i, sampler in enumerate(samplers):
        if sampler.penalizes_repetition and (ids := sampler.seen_ids()).numel():
            rows.append(i)
            seen_ids.append(ids)
    if not rows:
        return
    device = logits.device
    ids = pad_sequence(seen_ids, batch_first=True, padding_value=-1)
    # Pad with the row's own first id: writing its penalized logit twice is harmless, whereas a
    # shared pad id would race a penalized write against an unpenalized one.
    ids = torch.where(ids < 0, ids[:, :1], ids)
    row_index = torch.tensor(rows, device=device).unsqueeze(1)
    penalty = torch.tensor(
        [samplers[i].params.repetition_penalty for i in rows], dtype=torch.float32, device=device
    ).unsqueeze(1)
    seen = logits[row_index, ids]
    logits[row_index, ids] = torch.where(seen < 0, seen * penalty, seen / penalty)


def _warp(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """Apply temperature to the float32 logits of non-greedy rows, in place, and return each
    row's floor ([B, 1]): top-k, top-p and min-p together keep the tokens whose logit reaches it
    (None when no row uses any of them).

    So all tokens tied with the last one kept stay. HF does the same for top-k and min-p; for
    top-p it breaks such ties in sort order.
    """
    vocab_size = logits.shape[1]
    top_ks = [p.top_k if p.top_k < vocab_size else 0 for p in params]
    top_p_rows = [p.top_p < 1.0 for p in params]
    columns = torch.tensor(
        [(p.temperature, k, p.top_p, p.min_p) for p, k in zip(params, top_ks)],
        dtype=torch.float32, device=logits.device,
    )
    temperature, top_k, top_p, min_p = (column.unsqueeze(1) for column in columns.unbind(1))

    if any(p.temperature != 1.0 for p in params):
        logits.div_(temperature)
        _make_finite_(logits)  # a large logit over a small temperature overflows float32
    floor = None
    if any(top_ks) or any(top_p_rows):
        # Sorting a 50k vocabulary costs ~50x a topk of a few hundred on a CPU. A top-p set lies
        # within its row's top k, or else almost always among the best few hundred tokens.
        num_candidates = max(top_ks)
        if not all(k for k, uses_top_p in zip(top_ks, top_p_rows) if uses_top_p):
            num_candidates = max(num_candidates, _TOP_P_CANDIDATES)
        floor = _top_k_top_p_floor(
            logits,
            top_k.long() if any(top_ks) else None,
            top_p if any(top_p_rows) else None,
            min(num_candidates, vocab_size),
        )
    if any(p.min_p > 0.0 for p in params):
        # p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); log(0) = -inf keeps all.
        min_p_floor = logits.amax(dim=1, keepdim=True) + min_p.log()
        floor = min_p_floor if floor is None else torch.maximum(floor, min_p_floor)
    return floor


def _top_k_top_p_floor(
    logits: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    num_candidates: int,
) -> torch.Tensor:
    """The lowest logit that top-k and then top-p keep, per row ([B, 1] each; k = 0, p = 1 off).

    Both are looked for among each row's ``num_candidates`` (>= every k) highest logits; a row's
    whole vocabulary is sorted only when its top-p set may reach past them.
    """
    candidates = logits.topk(num_candidates, dim=1).values
    floor = torch.full_like(candidates[:, :1], _NEG_INF)
    if top_k is not None:
        floor = candidates.gather(1, (top_k - 1).clamp(min=0)).masked_fill_(top_k == 0, _NEG_INF)
    if top_p is None:
        return floor
    # Top-p sees the distribution renormalized over what top-k kept. Candidates past a row's k
    # need no masking: its top k alone already hold all the probability.
    max_logit = candidates[:, :1]
    weights = (logits - max_logit).exp_()
    if top_k is not None:
        weights.mul_(logits >= floor)
    # A scan sums each row in one fixed order: sum() would split a lone row over
    # threads (ATen does for a single output), so a request sampled alone and
    # in a batch could see top-p boundaries that differ in the last bit.
    log_norm = weights.cumsum_(dim=1)[:, -1:].log_().add_(max_logit)
    threshold, covered = _top_p_threshold(candidates, log_norm, top_p)
    if num_candidates < logits.shape[1] and not covered.all():
        flat = (~covered).nonzero().squeeze(1)
        everything = logits[flat].sort(dim=1, descending=True).values
        threshold[flat] = _top_p_threshold(everything, log_norm[flat], top_p[flat])[0]
    return torch.maximum(floor, threshold)


def _top_p_threshold(
    candidates: torch.Tensor, log_norm: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lowest logit that top-p keeps in each row ([B, 1]; -inf where p = 1).

    ``candidates`` are each row's highest logits in descending order and ``log_norm`` the log of
    the rows' total probability mass. A token stays while the probability of the tokens ranked
    above it is below p, which keeps the smallest set whose probability reaches p. Also returns,
    per row ([B]), whether that set is sure to lie within the candidates.
    """
    cumulative = (candidates - log_norm).exp_().cumsum_(dim=1)
    num_kept = 1 + (cumulative[:, :-1] < top_p).sum(dim=1, keepdim=True)
    threshold = candidates.gather(1, num_kept - 1).masked_fill_(top_p >= 1.0, _NEG_INF)
    covered = (cumulative[:, -1:] >= top_p) | (top_p >= 1.0)
    return threshold, covered.squeeze(1)
