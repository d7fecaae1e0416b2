"""CUDA-graph bookkeeping (ladder, padding, fallback, packing, budget) and the
KV-cache memory plan: plain Python, checked without a GPU. With a GPU, one
more test replays captured graphs against the eager forward."""

from __future__ import annotations

import pytest
import torch

from engine.runner.cuda_graphs import (
    GRAPH_BATCH_SIZES,
    CaptureBudget,
    batch_size_ladder,
    pack_decode_inputs,
    padded_batch_size,
    replay_size,
)
from engine.runner.memory import (
    ACTIVATION_HEADROOM,
    DESKTOP_RESERVE_BYTES,
    MIB,
    RUNTIME_EXTRA_BYTES,
    plan_kv_cache,
)

GIB = 1 << 30

if torch.cuda.is_available():
    # Decide triton's mode now, compiled for the GPU, before
    # test_triton_kernels (collected later) can switch on the interpreter.
    try:
        import engine.kernels.triton.attention  # noqa: F401
    except ImportError:
        pass


def test_ladder_covers_every_batch_up_to_the_limit() -> None:
    assert batch_size_ladder(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    # A limit between rungs is captured itself, so the largest batch never runs eagerly.
    assert batch_size_ladder(20) == (1, 2, 4, 8, 16, 20)
    assert batch_size_ladder(1) == (1,)
    assert batch_size_ladder(300)[-2:] == (256, 300)
    for limit in (1, 3, 17, 64, 100, 256):
        ladder = batch_size_ladder(limit)
        assert list(ladder) == sorted(set(ladder)) and ladder[-1] == limit
    with pytest.raises(ValueError):
        batch_size_ladder(0)
    assert GRAPH_BATCH_SIZES == tuple(sorted(GRAPH_BATCH_SIZES))


def test_a_step_pads_up_to_the_next_captured_size() -> None:
    ladder = batch_size_ladder(64)
    assert padded_batch_size(1, ladder) == 1
    assert padded_batch_size(3, ladder) == 4
    assert padded_batch_size(17, ladder) == 24
    assert padded_batch_size(64, ladder) == 64
    for n in range(1, 65):
        size = padded_batch_size(n, ladder)
        assert size is not None and size >= n
        # The smallest captured size that fits: the one below it would not.
        below = [s for s in ladder if s < size]
        assert not below or below[-1] < n
    # Some sizes skipped by the capture budget: pad further up.
    assert padded_batch_size(3, (16, 64)) == 16


def test_steps_that_no_graph_fits_run_eagerly() -> None:
    ladder = batch_size_ladder(32)
    assert padded_batch_size(33, ladder) is None  # more decodes than captured
    assert padded_batch_size(0, ladder) is None
    assert padded_batch_size(1, ()) is None  # nothing captured (capture failed or disabled)
    assert replay_size(4, 0, ladder) == 4
    assert replay_size(4, 1, ladder) is None  # any prefill token: eager
    assert replay_size(0, 30, ladder) is None


def test_packing_pads_rows_that_read_and_write_nothing() -> None:
    values, width = pack_decode_inputs(
        ids=[11, 12, 13],
        positions=[40, 5, 17],
        slots=[3 * 16 + 8, 1 * 16 + 5, 9 * 16 + 1],
        seq_lens=[41, 6, 18],
        page_tables=[[7, 2, 3], [1], [4, 9]],
        padded=4,
    )
    assert width == 3
    head = torch.tensor(values[:16]).view(4, 4)
    assert head[0].tolist() == [11, 12, 13, 0]  # ids
    assert head[1].tolist() == [40, 5, 17, 0]  # positions
    assert head[2].tolist() == [56, 21, 145, -1]  # slots: padding writes nothing
    assert head[3].tolist() == [41, 6, 18, 0]  # lengths: padding reads nothing
    tables = torch.tensor(values[16:]).view(4, 3)
    assert tables.tolist() == [[7, 2, 3], [1, 0, 0], [4, 9, 0], [0, 0, 0]]
    assert len(values) == 4 * 4 + 4 * 3


def test_packing_rejects_inconsistent_inputs() -> None:
    with pytest.raises(ValueError):
        pack_decode_inputs([1, 2], [0, 1], [0, 1], [1, 2], [[0]], padded=2)
    with pytest.raises(ValueError):
        pack_decode_inputs([1, 2], [0, 1], [0, 1], [1, 2], [[0], [1]], padded=1)


def test_capture_budget_bounds_time_and_memory() -> None:
    budget = CaptureBudget(max_seconds=10.0, max_bytes=100 * MIB)
    assert budget.allows_next(0.5, 10 * MIB, 10 * MIB)
    assert not budget.allows_next(10.0, 10 * MIB, 10 * MIB)  # out of time
    # The next (smaller) capture may grow the pool as much as the last one did.
    assert budget.allows_next(1.0, 60 * MIB, 40 * MIB)
    assert not budget.allows_next(1.0, 70 * MIB, 40 * MIB)


def test_memory_plan_leaves_room_for_activations_and_the_desktop() -> None:
    # A 24 GiB card with 20 GiB free after the weights, 1 GiB activation peak.
    plan = plan_kv_cache(20 * GIB, 24 * GIB, 1 * GIB)
    reserve = int(24 * GIB * 0.06)
    assert plan.reserve_bytes == reserve > DESKTOP_RESERVE_BYTES
    assert plan.kv_cache_bytes == (
        20 * GIB - int(GIB * ACTIVATION_HEADROOM) - reserve - RUNTIME_EXTRA_BYTES
    )
    assert "MiB" in plan.describe()
    # A small card keeps at least the fixed desktop reserve.
    small = plan_kv_cache(5 * GIB, 6 * GIB, 256 * MIB)
    assert small.reserve_bytes == DESKTOP_RESERVE_BYTES
    assert small.kv_cache_bytes == (
        5 * GIB - int(256 * MIB * ACTIVATION_HEADROOM) - DESKTOP_RESERVE_BYTES - RUNTIME_EXTRA_BYTES
    )
    # More activation memory, less cache; nothing left, nothing given (never negative).
    assert plan_kv_cache(20 * GIB, 24 * GIB, 2 * GIB).kv_cache_bytes < plan.kv_cache_bytes
    assert plan_kv_cache(1 * GIB, 8 * GIB, 512 * MIB).kv_cache_bytes == 0
    with pytest.raises(ValueError):
        plan_kv_cache(-1, 8 * GIB, 0)


def test_cuda_runner_choice_and_its_fallbacks(tmp_path, monkeypatch) -> None:
    from engine.runner import cuda as kernel_runner
    from engine.formats.loader import load_model
    from engine.runner.cpu import ModelRunner
    from tests.engine.random_llama import write_random_llama

    folder = write_random_llama(
        tmp_path / "m", heads=4, kv_heads=2, head_dim=16, window=None, seed=0
    )
    model = load_model(folder, "cpu", "float32")
    cache = model.new_kv_cache(8, 4)
    monkeypatch.setattr(kernel_runner, "triton_available", lambda: True)
    runner = kernel_runner.make_cuda_runner(model, cache, max_running=16)
    assert isinstance(runner, kernel_runner.KernelModelRunner)
    assert runner.graphs is None  # graphs are captured on CUDA devices only
    # Batch invariance needs the PyTorch path's tiled attention.
    runner = kernel_runner.make_cuda_runner(model, cache, max_running=16, deterministic=True)
    assert type(runner) is ModelRunner and runner.deterministic
    # Without triton (e.g. Windows): the shared PyTorch path, still correct.
    monkeypatch.setattr(kernel_runner, "triton_available", lambda: False)
    assert type(kernel_runner.make_cuda_runner(model, cache, max_running=16)) is ModelRunner


@pytest.mark.parametrize(
    "value,enabled", [(None, True), ("1", True), ("0", False), ("off", False), ("False", False)]
)
def test_cuda_graphs_can_be_switched_off(monkeypatch, value, enabled) -> None:
    from engine.runner.cuda import cuda_graphs_enabled

    if value is None:
        monkeypatch.delenv("TANDEM_CUDA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("TANDEM_CUDA_GRAPHS", value)
    assert cuda_graphs_enabled() is enabled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu.sh runs it)")
def test_graph_replay_equals_eager_decode_on_cuda(tmp_path) -> None:
    pytest.importorskip("triton", reason="triton is not installed")
    from engine.runner.cuda import KernelModelRunner
    from engine.formats.loader import load_model
    from engine.core.scheduler import ScheduledChunk, ScheduleResult
    from tests.engine.random_llama import FakeSequence, write_random_llama

    folder = write_random_llama(
        tmp_path / "m", heads=4, kv_heads=2, head_dim=64, window=None, seed=1
    )
    model = load_model(folder, "cuda", "float32")
    graphed = KernelModelRunner(model, model.new_kv_cache(64, 16), graph_max_batch=8)
    eager = KernelModelRunner(model, model.new_kv_cache(64, 16))
    assert graphed.graphs is not None and graphed.graphs.sizes == (1, 2, 4, 8)
    gen = torch.Generator().manual_seed(0)
    seqs = [
        FakeSequence(
            torch.randint(0, 97, (n,), generator=gen).tolist(), list(range(4 * i, 4 * i + 4))
        )
        for i, n in enumerate((5, 30, 17))
    ]
    prefill = ScheduleResult(prefills=[ScheduledChunk(s, 0, len(s.token_ids)) for s in seqs])
    for runner in (graphed, eager):
        runner.forward(prefill)
    for step in range(3):
        for s in seqs:
            s.token_ids.append((step * 13 + len(s.token_ids)) % 97)
        decode = ScheduleResult(
            decodes=[ScheduledChunk(s, len(s.token_ids) - 1, 1) for s in seqs]
        )
        got = graphed.forward(decode)[0][: len(seqs)].clone()  # replays the size-4 graph
        want = eager.forward(decode)[0]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(graphed.cache.k, eager.cache.k, atol=1e-5, rtol=1e-5)


def test_activation_probe_metadata_is_a_plain_prefill(tmp_path, monkeypatch) -> None:
    """The forward that measures the activation peak is an ordinary prefill
    from position 0 (here on the CPU path's metadata): same hidden states as
    the runner computes for the same tokens."""
    from engine.runner import cuda as kernel_runner
    from engine.runner import memory
    from engine.formats.loader import load_model
    from engine.runner.cpu import ModelRunner
    from engine.core.scheduler import ScheduledChunk, ScheduleResult
    from tests.engine.random_llama import FakeSequence, write_random_llama

    folder = write_random_llama(tmp_path / "m", heads=4, kv_heads=2, head_dim=16, window=3, seed=0)
    model = load_model(folder, "cpu", "float32")
    monkeypatch.setattr(kernel_runner, "triton_available", lambda: False)
    num_tokens, page_size = 10, 4
    pages = -(-num_tokens // page_size)
    meta = memory._prefill_metadata(model, num_tokens, pages, page_size)
    got = model.forward(
        torch.zeros(num_tokens, dtype=torch.long), torch.arange(num_tokens), meta,
        model.new_kv_cache(pages, page_size), num_tokens - 1,
    )
    runner = ModelRunner(model, model.new_kv_cache(pages, page_size))
    seq = FakeSequence([0] * num_tokens, list(range(pages)))
    want, _, _ = runner.forward(ScheduleResult(prefills=[ScheduledChunk(seq, 0, num_tokens)]))
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError):
        memory.measure_activation_peak(model, 16, 4)  # CUDA only
