"""The default path on the real default model, against a plain PyTorch
reference of what its kernels compute.

The reference reads the imported folder's weights (their levels, fp16
scales and q4_1 mins), prepares each product's input in float32 as the
kernels do (the fused RMSNorm, and SwiGLU with ggml's AVX2 exp),
rounds it to int8 in groups of 32 as ggml-cpu's quantize_row_q8_0 / q8_1
do (level = x * (127 / max|x|) in float32, round half to even; the scale
max|x| / 127 in fp16, and a q4_1 weight's min times fp16(scale * the
group's level sum)), computes each product's output with the kernels' own
float32 chain (the same bits), keeps the residual stream in float32 as the
engine does, and does the rest in float64: RoPE, causal attention.

The bits matter: an embedding row is a q8_0 table's levels times one
scale, so after the first norm many inputs land exactly on a rounding tie,
where any other arithmetic rounds some of them the other way and moves the
logits by up to ~2 (as much as dropping the rounding altogether). Attention
still differs from the engine's by float32 rounding, so an input can sit
within an ulp of a tie; where it does, the two sides round it apart and the
row moves by one int8 step of its group. So the layers are compared one at
a time from the engine's own input (bounds below), the head from the
engine's own final hidden states, and the whole chain by its greedy tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.core.scheduler import ScheduledChunk, ScheduleResult
from engine.formats.loader import load_model, quantized_formats, read_weights, stored_quantized
from engine.formats.safetensors import read_tensors, weight_files
from engine.llm import Engine
from engine.model.config import ModelConfig, rope_inverse_frequencies
from engine.model.quant import GROUP_SIZE, cpu_kernel_available, take_rows
from engine.params import SamplingParams
from engine.runner.cpu import ModelRunner
from tests.engine import ggml_math

pytestmark = pytest.mark.skipif(not cpu_kernel_available(), reason="the quantized CPU kernels are unavailable")

LOGIT_BOUND = 1e-3
ROW_BOUND = 1e-5
HALF_FLIP_BOUND = 5e-5
FLIP_BOUND = 1e-3
PROMPT = [{"role": "user", "content": "Which planet is the largest in the solar system, and why is it so big?"}]
NEW_TOKENS = 12


def int8_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x's groups of 32 as the kernels quantize a product's inputs (ggml's
    q8_0 / q8_1 blocks): levels [..., G, 32], the fp32 scale max|x| / 127
    [..., G, 1] and the multiplier 127 / max|x| the levels are rounded with.
    Both divisions are true float32 divisions: torch's `127 / tensor` is
    127 * (1 / tensor), an ulp off for a quarter of all values."""
    groups = x.float().reshape(*x.shape[:-1], -1, GROUP_SIZE)
    amax = groups.abs().amax(-1, keepdim=True)
    scale = amax / 127
    inverse = torch.where(amax > 0, amax.new_tensor(127.0) / amax, torch.zeros_like(amax))
    levels = torch.round(groups * inverse).clamp(-127, 127)
    return levels, scale, inverse


class Reference:
    """The Llama forward in float64 with int8-rounded product inputs."""

    def __init__(self, folder: Path) -> None:
        self.c = ModelConfig.from_folder(folder)
        self.w = {name: t.double() for name, t in read_weights(folder).items()}
        stored = dict(read_tensors(weight_files(folder)))
        # Each quantized weight's levels [groups, 32, rows], scales and q4_1 mins [rows, groups].
        self.blocks: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        for name, fmt in quantized_formats(folder).items():
            q = stored_quantized(stored.pop, name, fmt)
            assert fmt in ("q8_0", "q4_1"), fmt  # the default model's formats
            levels = q.levels().view(q.shape[0], -1, GROUP_SIZE).permute(1, 2, 0).float().contiguous()
            self.blocks[name] = (levels, q.scales.float(), None if q.mins is None else q.mins.float())
        self.inv_freq = torch.tensor(rope_inverse_frequencies(self.c), dtype=torch.float64)

    def product(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x's rows rounded to int8 groups times the weight, as the kernels
        compute each output (quant_matmul.c's header): per group g in order,
        acc = fma(d_w * d_x, P, acc) (then fma(min_w, s_x, acc) for q4_1),
        in float32, P the exact integer dot product. d_w * d_x (two fp16
        numbers) and each fma's product are exact in float64, so rounding
        the float64 sum to float32 is the fma (but for a double rounding, at
        odds of ~2^-29). The same bits as the kernels, so an input on a
        rounding tie after a join rounds the same way on both sides."""
        levels, dx, _ = int8_groups(x)
        w_levels, dw, mins = self.blocks[name]
        dx16 = dx.half().float().squeeze(-1)
        sums = ((dx * levels.sum(-1, keepdim=True)).half().float().squeeze(-1)) if mins is not None else None
        # [groups, tokens, rows]: integers under 2^24, exact in float32
        dots = torch.bmm(levels.transpose(0, 1), w_levels).double().numpy()
        # d_w * d_x: exact in float32 (11 + 11 significant bits). In numpy: a
        # chain of small steps, where torch's per-op overhead would dominate.
        steps = (dx16[:, None, :] * dw[None, :, :]).double().numpy()
        mins_sums = None if mins is None else (mins[None, :, :].double() * sums[:, None, :].double()).numpy()
        acc = np.zeros((x.shape[0], w_levels.shape[2]), dtype=np.float32)
        for g in range(w_levels.shape[0]):
            acc = (acc + steps[:, :, g] * dots[g]).astype(np.float32)
            if mins_sums is not None:
                acc = (acc + mins_sums[:, :, g]).astype(np.float32)
        return torch.from_numpy(acc).double()

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """RMSNorm as the kernels fuse it (and as ggml's rms_norm does): the
        float32 squares summed in float64 in order (a cumulative sum adds
        them in the kernel's order), the rest in float32."""
        squares = x.float().pow(2).double().cumsum(-1)[..., -1:]
        mean_square = (squares / x.shape[-1]).float()
        # sqrtf and 1/x, correctly rounded (torch's float32 sqrt is not
        # always): done in float64, then rounded once to float32.
        root = torch.sqrt((mean_square + torch.tensor(self.c.rms_norm_eps, dtype=torch.float32)).double()).float()
        inverse = (1 / root.double()).float()
        return x.float() * inverse * self.w[name].float()

    @staticmethod
    def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """In float32 with ggml_v_expf's arithmetic, as the kernels fuse it
        (tests/engine/ggml_math.py): another exp (torch's, the C library's)
        is an ulp apart on ~1% of inputs, enough to round an input of the
        down product across a tie now and then (by a step of its group,
        large in a row with an outlier)."""
        return torch.from_numpy(ggml_math.swiglu(gate.float().numpy(), up.float().numpy()))

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = torch.outer(positions.to(self.inv_freq.dtype), self.inv_freq)
        emb = torch.cat((freqs, freqs), -1)[:, None, :]
        half = x.shape[-1] // 2
        return x * emb.cos() + torch.cat((-x[..., half:], x[..., :half]), -1) * emb.sin()

    def layer(
        self, i: int, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Layer i on the residual stream x [tokens, hidden] of one prompt's
        next tokens, after `past` (the layer's keys and values of the tokens
        before them); returns its output and the keys and values so far."""
        c = self.c
        t = x.shape[0]
        start = 0 if past is None else past[0].shape[0]
        heads, kv_heads, dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        positions = torch.arange(start, start + t)
        causal = torch.arange(start + t)[None, :] <= positions[:, None]
        p = f"model.layers.{i}."
        h = self.norm(x, p + "input_layernorm.weight")
        q = self.rotate(self.product(h, p + "self_attn.q_proj.weight").view(t, heads, dim), positions)
        k = self.rotate(self.product(h, p + "self_attn.k_proj.weight").view(t, kv_heads, dim), positions)
        v = self.product(h, p + "self_attn.v_proj.weight").view(t, kv_heads, dim)
        # The cache keeps them in fp16, rounded from float32 (paged_attention.c).
        k, v = k.float().half().double(), v.float().half().double()
        if past is not None:
            k, v = torch.cat((past[0], k)), torch.cat((past[1], v))
        group = heads // kv_heads
        keys, values = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(dim)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        attn = torch.einsum("hqk,khd->qhd", probs, values).reshape(t, heads * dim)
        x = self.join(x, self.product(attn, p + "self_attn.o_proj.weight"))
        h = self.norm(x, p + "post_attention_layernorm.weight")
        gate = self.product(h, p + "mlp.gate_proj.weight")
        up = self.product(h, p + "mlp.up_proj.weight")
        return self.join(x, self.product(self.swiglu(gate, up), p + "mlp.down_proj.weight")), (k, v)

    @staticmethod
    def join(x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """The residual stream after a branch joins it, in float32 as the
        engine keeps it: the next norm's inputs are float32 numbers, and the
        rows of a q8_0 embedding sit on rounding ties there."""
        return (x.float() + branch.float()).double()

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from the last layer's output: torch's RMSNorm in float32 (as
        the engine's last step), then the rounded product with the head."""
        c = self.c
        final = torch.nn.functional.rms_norm(x.float(), (c.hidden_size,), self.w["model.norm.weight"].float(),
                                             c.rms_norm_eps)
        return self.product(final, "lm_head.weight" if "lm_head.weight" in self.w else "model.embed_tokens.weight")

    def greedy(self, ids: list[int], new_tokens: int) -> list[int]:
        """The greedy continuation of `ids`: the prompt in one pass, then one
        token at a time over the kept keys and values."""
        past: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.c.num_hidden_layers
        chosen: list[int] = []
        feed = list(ids)
        for _ in range(new_tokens):
            x = self.w["model.embed_tokens.weight"][torch.tensor(feed)]
            for i in range(self.c.num_hidden_layers):
                x, past[i] = self.layer(i, x, past[i])
            feed = [int(self.head(x)[-1].argmax())]
            chosen.append(feed[0])
        return chosen


@pytest.fixture(scope="module")
def reference(default_model_dir: Path) -> Reference:
    return Reference(default_model_dir)


@pytest.fixture(scope="module")
def prompt_ids(default_model_dir: Path) -> list[int]:
    with Engine(default_model_dir, device="cpu") as engine:
        return engine.encode_prompt(PROMPT)


def _native_layer_inputs(model, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The default path on `ids`, one prefill per depth: the residual stream
    entering each layer and leaving the last (the embeddings, then what the
    final RMSNorm reads when the model is cut after layer i), the LM head's
    input and the logits of the whole model."""
    streams: list[torch.Tensor] = []
    layers, original = model.layers, torch.nn.functional.rms_norm

    def record(x, shape, weight=None, eps=None):  # type: ignore[no-untyped-def]
        if weight is model.norm:
            streams.append(x.clone())
        return original(x, shape, weight, eps)

    streams.append(take_rows(model.embed, torch.tensor(ids)))  # the default model's table is quantized
    torch.nn.functional.rms_norm = record
    try:
        for depth in range(1, len(layers) + 1):
            model.layers = layers[:depth]
            runner = ModelRunner(model, model.new_kv_cache(16, 16))
            seq = SimpleNamespace(token_ids=ids, pages=list(range(16)), sampler=None)
            step = ScheduleResult(decodes=[], prefills=[ScheduledChunk(seq, 0, len(ids))])  # type: ignore[arg-type]
            hidden, _, _ = runner.forward(step)
    finally:
        torch.nn.functional.rms_norm = original
        model.layers = layers
    return streams, hidden, model.logits(hidden)


def test_every_layer_of_the_default_path_matches_the_reference(
    default_model_dir: Path, reference: Reference, prompt_ids
) -> None:
    model = load_model(default_model_dir, "cpu")
    assert model.native_forward  # the default path: quantized kernels on the CPU
    streams, hidden, logits = _native_layer_inputs(model, prompt_ids)
    assert len(streams) == reference.c.num_hidden_layers + 1
    # Layer by layer from the same input, so no error is carried from earlier
    # layers. Most rows agree to float32 summation (ROW_BOUND of the
    # stream's size); a row where an input sat within an ulp of a rounding
    # tie moves by a step of its int8 group (FLIP_BOUND at most). A key or
    # value within a float32 ulp of an fp16 rounding tie is cached half an
    # fp16 ulp from the reference's, and every later row reading it moves a
    # little (HALF_FLIP_BOUND; measured: up to 15% of a layer's rows past
    # ROW_BOUND, 2% past 3e-5). A wrong layout, scale or offset anywhere
    # would move every row by O(1).
    for i, (entering, leaving) in enumerate(zip(streams, streams[1:])):
        want, _ = reference.layer(i, entering.double())
        rows = (leaving.double() - want).abs().amax(-1) / want.abs().amax()
        assert rows.max() <= FLIP_BOUND, i
        assert (rows > HALF_FLIP_BOUND).float().mean() <= 0.1, i
        assert (rows > ROW_BOUND).float().mean() <= 0.3, i
    # The head from the same final hidden states: the logits themselves.
    want = reference.product(hidden, "model.embed_tokens.weight")
    assert (logits.double() - want).abs().max() <= LOGIT_BOUND
    assert torch.equal(logits.argmax(-1), want.argmax(-1))
    # The bound is tight: without the inputs' int8 rounding, the same head
    # moves the logits by far more than it.
    assert (hidden.double() @ reference.w["model.embed_tokens.weight"].T - want).abs().max() > 100 * LOGIT_BOUND


def test_default_engine_decodes_the_reference_greedy_tokens(
    default_model_dir: Path, reference: Reference, prompt_ids
) -> None:
    with Engine(default_model_dir, device="cpu") as engine:
        assert not engine.deterministic
        out = engine.generate_outputs([prompt_ids], SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS))[0]
    assert out.token_ids == reference.greedy(prompt_ids, NEW_TOKENS)
