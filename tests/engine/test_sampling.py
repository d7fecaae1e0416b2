from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.model import sampler as sampling
from engine.errors import EngineError
from engine.model.sampler import RequestSampler, _filtered_logits, sample
from engine.params import InvalidSamplingParams, SamplingParams

CPU = torch.device("cpu")
DEVICES = [
    pytest.param(CPU, id="cpu"),
    pytest.param(
        torch.device("cuda"),
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ),
]

# Upper 0.1% points of the chi-square distribution, for the goodness-of-fit tests.
CHI2_CRITICAL_999 = {7: 24.322}


def make_sampler(
    device: torch.device = CPU, prompt_ids: tuple[int, ...] = (), **params: object
) -> RequestSampler:
    params.setdefault("seed", 0)
    # Each test turns on the filters it tests: the defaults' top-k, top-p and min-p would hide what it measures.
    for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0)):
        params.setdefault(name, off)
    return RequestSampler(SamplingParams(**params), device, prompt_ids)


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def draw_counts(
    logits_row: torch.Tensor, rows: int, steps: int, **params: object
) -> torch.Tensor:
    """Token counts from `rows` samplers (seeds 0..rows-1) drawing `steps` times each."""
    samplers = [make_sampler(**{**params, "seed": seed}) for seed in range(rows)]
    batch = logits_row.expand(rows, -1)
    counts = torch.zeros(logits_row.numel(), dtype=torch.long)
    for _ in range(steps):
        counts += torch.bincount(
            torch.tensor(sample(batch, samplers)), minlength=logits_row.numel()
        )
    return counts


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def hf_scores(logits_row: torch.Tensor, params: SamplingParams, seen: list[int]) -> torch.Tensor:
    """The scores HF `generate` samples from; for greedy, 0 at its pick and -inf elsewhere."""
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0 and seen:
        processors.append(RepetitionPenaltyLogitsProcessor(float(params.repetition_penalty)))
    if not params.greedy:
        if params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(float(params.temperature)))
        if params.top_k:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
        if params.min_p > 0.0:
            processors.append(MinPLogitsWarper(params.min_p))
    input_ids = torch.tensor([seen], dtype=torch.long).reshape(1, -1)
    scores = processors(input_ids, logits_row.unsqueeze(0).clone())[0]
    if params.greedy:
        return torch.full_like(scores, -math.inf).index_fill_(0, scores.argmax(), 0.0)
    return scores


def assert_same_distribution(ours: torch.Tensor, hf: torch.Tensor) -> None:
    assert torch.equal(ours.isfinite(), hf.isfinite())
    torch.testing.assert_close(ours.softmax(dim=0), hf.softmax(dim=0), atol=1e-6, rtol=1e-5)


# --- greedy -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype: torch.dtype) -> None:
    logits = random_logits(5, 1000, seed=1).to(dtype)
    samplers = [make_sampler(temperature=0.0) for _ in range(5)]
    assert sample(logits, samplers) == logits.float().argmax(dim=1).tolist()


def test_greedy_ties_pick_the_lowest_id() -> None:
    logits = torch.zeros(3, 50_000)
    logits[:, [7, 123, 40_000]] = 5.0
    samplers = [make_sampler(temperature=0.0) for _ in range(3)]
    assert sample(logits, samplers) == [7, 7, 7]
    # The same tie through the mixed-batch path.
    samplers[1] = make_sampler(temperature=1.0)
    tokens = sample(logits, samplers)
    assert tokens[0] == tokens[2] == 7


def test_greedy_rows_unaffected_by_sampled_rows() -> None:
    logits = random_logits(6, 500, seed=2, scale=1.0)
    greedy_rows = [0, 3, 5]
    for step in range(20):
        samplers = [
            make_sampler(temperature=0.0)
            if row in greedy_rows
            else make_sampler(temperature=1.5, top_k=50, top_p=0.9, seed=step * 10 + row)
            for row in range(6)
        ]
        tokens = sample(logits, samplers)
        assert [tokens[row] for row in greedy_rows] == logits[greedy_rows].argmax(dim=1).tolist()


def test_tiny_temperature_is_greedy() -> None:
    assert SamplingParams(temperature=1e-7).greedy
    assert not SamplingParams(temperature=0.01).greedy
    logits = random_logits(2, 100, seed=3)
    samplers = [make_sampler(temperature=1e-7), make_sampler(temperature=1.0)]
    assert sample(logits, samplers)[0] == int(logits[0].argmax())


def test_sample_does_not_modify_logits() -> None:
    logits = random_logits(3, 200, seed=4)
    before = logits.clone()
    samplers = [
        make_sampler(temperature=0.0, repetition_penalty=1.3, prompt_ids=(1, 2, 3)),
        make_sampler(temperature=0.8, top_k=5, top_p=0.5, min_p=0.1),
        make_sampler(temperature=0.0),
    ]
    sample(logits, samplers)
    sample(logits, [make_sampler(temperature=0.0, repetition_penalty=2.0, prompt_ids=(4,))] * 3)
    assert torch.equal(logits, before)


def test_batch_size_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="shape"):
        sample(torch.zeros(2, 10), [make_sampler()])


# --- seeds --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.9, top_p=0.95, seed=1234),
        dict(temperature=0.7, top_k=100, top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=7),
    ],
    ids=["top_p", "everything"],
)
def test_same_seed_same_tokens_in_any_batch(
    device: torch.device, params: dict[str, object]
) -> None:
    vocab = 5000
    prompt = (5, 6, 7)
    # Peaked and flat logits, so that top-p finds its set among the candidates or has to sort.
    steps = [
        random_logits(1, vocab, seed=100 + step, scale=4.0 if step % 2 else 1.0)[0]
        for step in range(20)
    ]

    alone = make_sampler(device, prompt, **params)
    alone_tokens = []
    for row_logits in steps:
        token = sample(row_logits.to(device).unsqueeze(0), [alone])[0]
        alone.observe(token)
        alone_tokens.append(token)

    batched = make_sampler(device, prompt, **params)
    others = [
        make_sampler(device, temperature=0.0),
        make_sampler(device, (1, 2), temperature=1.3, min_p=0.2, repetition_penalty=1.5, seed=9),
        make_sampler(device, temperature=0.5, top_k=1000, top_p=0.5, seed=None),
    ]
    batched_tokens = []
    for step, row_logits in enumerate(steps):
        # The request moves around the batch, among rows with other parameters.
        samplers = list(others)
        position = step % (len(others) + 1)
        samplers.insert(position, batched)
        batch = random_logits(len(samplers), vocab, seed=step).to(device)
        batch[position] = row_logits.to(device)
        tokens = sample(batch, samplers)
        for sampler, token in zip(samplers, tokens):
            sampler.observe(token)
        batched_tokens.append(tokens[position])

    assert batched_tokens == alone_tokens
    assert len(set(alone_tokens)) > 1


def test_different_seeds_give_different_streams() -> None:
    logits = torch.zeros(1, 1000)
    streams = []
    for seed in (1, 2):
        sampler = make_sampler(temperature=1.0, seed=seed)
        streams.append([sample(logits, [sampler])[0] for _ in range(200)])
    same = sum(a == b for a, b in zip(*streams))
    assert same < 10  # about 0.2 expected from a uniform draw over 1000 tokens


def test_unseeded_samplers_differ() -> None:
    logits = torch.zeros(2, 1000)
    samplers = [make_sampler(temperature=1.0, seed=None) for _ in range(2)]
    rounds = [sample(logits, samplers) for _ in range(50)]
    assert sum(a == b for a, b in rounds) < 5


def test_large_and_negative_seeds_are_accepted() -> None:
    logits = torch.zeros(1, 100)
    for seed in (-1, 2**64 + 5, 2**80):
        assert 0 <= sample(logits, [make_sampler(temperature=1.0, seed=seed)])[0] < 100


# --- distributions ------------------------------------------------------------------------


LOGITS_8 = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_draws_follow_softmax_of_scaled_logits(temperature: float) -> None:
    counts = draw_counts(LOGITS_8, rows=200, steps=100, temperature=temperature)
    expected = (LOGITS_8 / temperature).softmax(dim=0)
    assert chi_square(counts, expected) < CHI2_CRITICAL_999[7]
    # The test has the power to see a wrong temperature.
    wrong = (LOGITS_8 / (temperature * 1.25)).softmax(dim=0)
    assert chi_square(counts, wrong) > 10 * CHI2_CRITICAL_999[7]


def test_lower_temperature_sharpens() -> None:
    top_share = {
        t: draw_counts(LOGITS_8, rows=100, steps=50, temperature=t)[0].item()
        for t in (2.0, 1.0, 0.3)
    }
    assert top_share[2.0] < top_share[1.0] < top_share[0.3]


# With top_p < 1 as well, top-k goes through the combined top-k/top-p path.
@pytest.mark.parametrize("top_p", [1.0, 0.999])
def test_top_k_never_leaves_the_top_k(top_p: float) -> None:
    logits = random_logits(1, 200, seed=5)[0]
    ranked = logits.argsort(descending=True)
    for k in (1, 3, 20):
        counts = draw_counts(logits, rows=50, steps=40, temperature=2.0, top_k=k, top_p=top_p)
        assert set(counts.nonzero().flatten().tolist()) <= set(ranked[:k].tolist())
    assert counts.count_nonzero() == 20  # at temperature 2 each of the 20 gets drawn


def test_top_k_per_row_in_one_batch() -> None:
    logits = random_logits(1, 100, seed=6, scale=0.5)[0].expand(3, -1)
    samplers = [
        make_sampler(temperature=1.0, top_k=2, seed=1),
        make_sampler(temperature=1.0, top_k=0, seed=2),
        make_sampler(temperature=1.0, top_k=10_000, seed=3),
    ]
    drawn: list[set[int]] = [set(), set(), set()]
    for _ in range(300):
        for row, token in enumerate(sample(logits, samplers)):
            drawn[row].add(token)
    assert drawn[0] <= set(logits[0].topk(2).indices.tolist())
    assert len(drawn[1]) > 50 and len(drawn[2]) > 50


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs = torch.tensor([0.05, 0.5, 0.3, 0.15])
    logits = probs.log()
    cases = {0.4: {1}, 0.75: {1, 2}, 0.9: {1, 2, 3}, 0.99: {0, 1, 2, 3}}
    for top_p, allowed in cases.items():
        filtered = _filtered_logits(
            logits.unsqueeze(0), [make_sampler(temperature=1.0, top_p=top_p)]
        )[0]
        assert set(filtered.isfinite().nonzero().flatten().tolist()) == allowed
        kept = probs[sorted(allowed)]
        torch.testing.assert_close(
            filtered[sorted(allowed)].softmax(dim=0), kept / kept.sum()
        )


def test_top_p_keeps_the_top_token_when_it_alone_exceeds_p() -> None:
    logits = torch.tensor([[0.0, 8.0, 1.0, 0.5]])
    for top_p in (1e-9, 0.01, 0.5, 0.99):
        counts = draw_counts(logits[0], rows=20, steps=10, temperature=1.0, top_p=top_p)
        assert counts.tolist() == [0, 200, 0, 0]


def test_min_p_drops_tokens_below_min_p_times_max() -> None:
    probs = torch.tensor([0.4, 0.2, 0.15, 0.1, 0.08, 0.07])
    logits = probs.log()
    for min_p, allowed in {0.3: {0, 1, 2}, 0.5: {0, 1}, 0.9: {0}, 0.19: {0, 1, 2, 3, 4}}.items():
        counts = draw_counts(logits, rows=40, steps=25, temperature=1.0, min_p=min_p)
        assert set(counts.nonzero().flatten().tolist()) == allowed


def test_min_p_threshold_is_relative_to_the_top_token_of_each_row() -> None:
    logits = torch.stack([torch.tensor([0.5, 0.25, 0.2, 0.05]).log(), torch.zeros(4)])
    samplers = [make_sampler(temperature=1.0, min_p=0.45)] * 2
    filtered = _filtered_logits(logits, samplers)
    assert filtered.isfinite().tolist() == [[True, True, False, False], [True] * 4]


# --- repetition penalty -------------------------------------------------------------------


def test_repetition_penalty_uses_prompt_and_observed_tokens() -> None:
    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5, -2.0]])
    sampler = make_sampler(temperature=1.0, repetition_penalty=2.0, prompt_ids=(0, 1, 1, 0))
    torch.testing.assert_close(
        _filtered_logits(logits, [sampler]), torch.tensor([[1.0, -2.0, 3.0, 0.5, -2.0]])
    )
    sampler.observe(2)
    sampler.observe(0)
    torch.testing.assert_close(
        _filtered_logits(logits, [sampler]), torch.tensor([[1.0, -2.0, 1.5, 0.5, -2.0]])
    )
    assert sampler.seen_ids().tolist() == [0, 1, 2]


def test_repetition_penalty_turns_greedy_away_from_seen_tokens() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]])
    samplers = [
        make_sampler(temperature=0.0, repetition_penalty=2.0, prompt_ids=(0,)),
        make_sampler(temperature=0.0, prompt_ids=(0,)),
    ]
    assert sample(logits, samplers) == [1, 0]


def test_seen_ids_grow_past_their_buffer() -> None:
    sampler = make_sampler(repetition_penalty=1.2, prompt_ids=(3, 3, 1))
    assert sampler.seen_ids().tolist() == [3, 1]
    for token in range(1000):
        sampler.observe(token % 700)
    assert sampler.seen_ids().tolist() == [3, 1] + [t for t in range(700) if t not in (1, 3)]


def test_no_penalty_tracks_nothing() -> None:
    sampler = make_sampler(prompt_ids=(1, 2, 3))
    sampler.observe(4)
    assert sampler.seen_ids().numel() == 0


# --- agreement with Hugging Face ----------------------------------------------------------

row_params = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.just(1.0), st.floats(0.05, 3.0)),
    top_k=st.one_of(st.just(0), st.integers(1, 80)),
    top_p=st.one_of(st.just(1.0), st.floats(1e-9, 1.0)),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.95)),
    repetition_penalty=st.one_of(st.just(1.0), st.floats(0.5, 3.0)),
    seed=st.just(0),
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    params=st.lists(row_params, min_size=1, max_size=6),
    seen=st.lists(st.lists(st.integers(0, 63), max_size=30), min_size=6, max_size=6),
    vocab=st.sampled_from([64, 1000]),
    scale=st.sampled_from([0.3, 3.0, 10.0]),
    logits_seed=st.integers(0, 2**31),
)
def test_filtered_distribution_matches_hf(
    params: list[SamplingParams],
    seen: list[list[int]],
    vocab: int,
    scale: float,
    logits_seed: int,
) -> None:
    logits = random_logits(len(params), vocab, seed=logits_seed, scale=scale)
    samplers = []
    for row_params_, row_seen in zip(params, seen):
        half = len(row_seen) // 2
        sampler = RequestSampler(row_params_, CPU, row_seen[:half])
        for token in row_seen[half:]:
            sampler.observe(token)
        samplers.append(sampler)

    ours = _filtered_logits(logits, samplers)
    for row, (row_params_, row_seen) in enumerate(zip(params, seen)):
        assert_same_distribution(ours[row], hf_scores(logits[row], row_params_, row_seen))


def test_top_p_sorts_only_rows_whose_set_is_not_among_the_candidates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows_searched = []

    def spy(candidates: torch.Tensor, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows_searched.append((candidates.shape[0], candidates.shape[1]))
        return top_p_threshold(candidates, *args)

    top_p_threshold = sampling._top_p_threshold
    monkeypatch.setattr(sampling, "_top_p_threshold", spy)
    vocab = 5000
    peaked = random_logits(1, vocab, seed=8, scale=6.0)
    flat = random_logits(1, vocab, seed=9, scale=0.5)
    logits = torch.cat([peaked, flat, peaked, flat])
    off = dict(top_k=0, min_p=0.0)  # the defaults' top-k and min-p would decide what this test measures
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, **off),
        SamplingParams(temperature=1.0, top_p=0.9, **off),
        SamplingParams(temperature=1.0, top_p=1.0, **off),
        SamplingParams(temperature=0.8, top_k=2000, top_p=0.95, min_p=0.0),
    ]
    ours = _filtered_logits(logits, [RequestSampler(p, CPU, ()) for p in params])
    assert rows_searched == [(4, 2000), (1, vocab)]  # row 3 keeps at most its top 2000
    for row in range(4):
        assert_same_distribution(ours[row], hf_scores(logits[row], params[row], []))


@pytest.mark.parametrize("device", DEVICES)
def test_matches_hf_at_full_vocab(device: torch.device) -> None:
    vocab = 49_152
    logits = random_logits(4, vocab, seed=7, scale=4.0)
    seen = [list(range(0, 3000, 3)), [], [5, 5, 9], list(range(100))]
    params = [
        SamplingParams(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.1),
        SamplingParams(temperature=1.0, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=0.0, repetition_penalty=1.3),
        SamplingParams(temperature=1.2, top_k=500, min_p=0.02, repetition_penalty=0.9),
    ]
    samplers = [RequestSampler(p, device, s) for p, s in zip(params, seen)]
    ours = _filtered_logits(logits.to(device), samplers).cpu()
    for row in range(4):
        assert_same_distribution(ours[row], hf_scores(logits[row], params[row], seen[row]))


# --- parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", 1.5),
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("top_k", -1),
        ("top_k", 2.0),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_p", math.nan),
        ("min_p", -0.1),
        ("min_p", 1.0),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("seed", "42"),
        ("stop", ["\n"]),
        ("stop", ("",)),
    ],
)
def test_invalid_params_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidSamplingParams, match=rf"^{field} \(.+\) must be") as raised:
        SamplingParams(**{field: value})
    assert isinstance(raised.value, EngineError) and isinstance(raised.value, ValueError)


@pytest.mark.parametrize("field", ["temperature", "top_k", "max_tokens", "repetition_penalty", "top_p"])
@pytest.mark.parametrize("digits", [20, 4001, 5001])
def test_whole_numbers_past_any_tensor_are_refused_in_a_short_sentence(field: str, digits: int) -> None:
    # 10**4000 is a finite number a JSON body or a hand-edited settings.json
    # can hold; past 4,300 digits Python cannot even print it.
    with pytest.raises(InvalidSamplingParams, match=rf"^{field} \(.+\) must be .*, got (1000|a number of)") as raised:
        SamplingParams(**{field: 10 ** (digits - 1)})
    assert len(str(raised.value)) < 400
    SamplingParams(seed=10**5000)  # any whole number seeds a generator (mod 2**64)


def test_defaults_and_edges_are_valid() -> None:
    default = SamplingParams()
    assert not default.greedy
    assert SamplingParams(temperature=0).greedy
    SamplingParams(top_p=1, min_p=0, top_k=0, repetition_penalty=1, max_tokens=1, stop=("x",))


# -- finite draws for any accepted parameter and any logits -----------------------------------


@pytest.mark.parametrize("temperature", [1e-5, 1e-3, 1.0, 50.0])
@pytest.mark.parametrize("penalty", [1e-40, 1e-6, 1.0, 1e6])
def test_extreme_penalty_and_temperature_still_draw_a_token(temperature: float, penalty: float) -> None:
    # repetition_penalty 1e-40 at temperature 1 once overflowed the seen logits to inf and
    # the draw searched past the vocabulary ("index 49152 is out of bounds").
    vocab = 64
    logits = random_logits(3, vocab, seed=5, scale=30.0)
    samplers = [make_sampler(prompt_ids=(1, 2, 3, 40), temperature=temperature,
                             repetition_penalty=penalty, top_p=p, min_p=m, seed=i)
                for i, (p, m) in enumerate([(1.0, 0.0), (0.9, 0.0), (1.0, 0.2)])]
    for _ in range(5):
        tokens = sample(logits, samplers)
        assert all(0 <= t < vocab for t in tokens)
    filtered = _filtered_logits(logits, samplers)
    assert not filtered.isnan().any()
    assert (filtered > -math.inf).any(dim=1).all()  # every row keeps a token to draw


def test_non_finite_logits_never_break_the_draw() -> None:
    vocab = 16
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0))
    logits[0, 3] = math.inf  # an overflowing model: the inf token wins
    logits[1, :] = math.nan  # a row of NaN: some token, never a failure
    logits[2, 5] = math.nan  # one NaN token is never drawn
    logits[2, 6] = -math.inf
    logits[3, :] = -math.inf  # nothing finite at all
    params = {"temperature": 1.0, "top_k": 8, "top_p": 0.95, "min_p": 0.05}
    for seed in range(20):
        samplers = [make_sampler(seed=seed * 4 + i, **params) for i in range(4)]
        tokens = sample(logits, samplers)
        assert all(0 <= t < vocab for t in tokens)
        assert tokens[0] == 3
        assert tokens[2] not in (5, 6)
    greedy = [make_sampler(temperature=0.0, repetition_penalty=1.5, prompt_ids=(0,)) for _ in range(4)]
    assert all(0 <= t < vocab for t in sample(logits, greedy))


@settings(max_examples=60, deadline=None)
@given(
    temperature=st.floats(0.0, 1e4),
    penalty=st.floats(1e-45, 1e30, exclude_min=False).filter(lambda x: x > 0),
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    min_p=st.floats(0.0, 1.0, exclude_max=True),
    top_k=st.integers(0, 40),
    scale=st.sampled_from([1.0, 1e3, 1e30, 1e38]),
)
def test_any_accepted_parameters_draw_a_token_in_the_vocabulary(
    temperature: float, penalty: float, top_p: float, min_p: float, top_k: int, scale: float
) -> None:
    vocab = 32
    logits = random_logits(2, vocab, seed=1) * scale
    samplers = [make_sampler(prompt_ids=(0, 1, 2), temperature=temperature, repetition_penalty=penalty,
                             top_p=top_p, min_p=min_p, top_k=top_k, seed=s) for s in range(2)]
    assert all(0 <= t < vocab for t in sample(logits, samplers))
