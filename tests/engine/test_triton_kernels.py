"""The Triton attention kernels against plain PyTorch, on the CPU, in Triton's interpreter.

TRITON_INTERPRET=1 must be set before triton is first imported: the kernels,
and triton's own library functions, are decorated for the interpreter or the
compiler at import. This module sets it at the top. When triton was already
imported by then (collecting another module may import transformers, which
imports triton), the in-process tests skip and one test runs this module in
a fresh interpreter process instead, so the suite still checks every kernel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

_previous_interpret = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip(
    "triton",
    reason="triton is not installed (pip install -e '.[test]'): the CUDA kernels cannot be checked",
)
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from engine.kernels.triton import attention as kernels  # noqa: E402
from engine.runner.cuda_attention import KernelAttentionMetadata  # noqa: E402
from engine.core.scheduler import ScheduledChunk, ScheduleResult  # noqa: E402
from tests.engine.random_llama import FakeSequence, write_random_llama  # noqa: E402

# Only this module's tests run with the interpreter switched on (the fixture
# below); other modules in the same process see the environment as it was.
if _previous_interpret is None:
    del os.environ["TRITON_INTERPRET"]
else:
    os.environ["TRITON_INTERPRET"] = _previous_interpret

INTERPRETED = isinstance(tl.standard.max, InterpretedFunction) and kernels._INTERPRETED
in_process = pytest.mark.skipif(
    not INTERPRETED,
    reason="triton was imported before interpreter mode could be set; "
    "test_kernels_in_a_fresh_interpreter runs these in a child process",
)


@pytest.fixture(autouse=True)
def _interpreter_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Triton imports parts of itself lazily at the first launch, and those
    # check the variable again.
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_kernels_in_a_fresh_interpreter() -> None:
    if INTERPRETED:
        pytest.skip("the kernels run in this process (the other tests of this module)")
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
         "-k", "not test_kernels_in_a_fresh_interpreter"],
        cwd=Path(__file__).resolve().parents[2], env=env,
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary


# -- references -------------------------------------------------------------

def gather_keys(cache: torch.Tensor, pages: list[int], num_kv: int, length: int) -> torch.Tensor:
    """[num_kv, length, D] keys (or values) of one sequence, by plain indexing."""
    rows, page_size, head_dim = cache.shape
    by_page = cache.view(rows // num_kv, num_kv, page_size, head_dim)[torch.tensor(pages)]
    return by_page.permute(1, 0, 2, 3).reshape(num_kv, -1, head_dim)[:, :length]


def reference_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
    query_pos: torch.Tensor, scale: float, window: int, softcap: float | None = None,
) -> torch.Tensor:
    """q [n, Hq, D] at positions query_pos over keys/values [Hkv, L, D] -> [n, Hq*D], in fp32."""
    group = q.shape[1] // keys.shape[0]
    k = keys.float().repeat_interleave(group, 0)
    v = values.float().repeat_interleave(group, 0)
    scores = torch.einsum("nhd,hld->hnl", q.float(), k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    key_pos = torch.arange(keys.shape[1])
    allowed = key_pos[None, :] <= query_pos[:, None]
    if window:
        allowed &= key_pos[None, :] > query_pos[:, None] - window
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    out = torch.einsum("hnl,hld->nhd", scores.softmax(-1), v)
    return out.reshape(q.shape[0], -1)


TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@dataclass
class PagedBatch:
    """Random sequences scattered over shuffled pages of a fresh cache."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    tables: list[list[int]]
    keys: list[torch.Tensor] = field(default_factory=list)  # [Hkv, L, D] as written
    values: list[torch.Tensor] = field(default_factory=list)

    def block_table(self) -> torch.Tensor:
        width = max(len(t) for t in self.tables)
        # Unused entries point at a real page: a kernel that reads past a
        # sequence's length would pick up its keys and fail the comparison.
        return torch.tensor(
            [t + [self.tables[0][0]] * (width - len(t)) for t in self.tables], dtype=torch.int32
        )


def make_paged_batch(
    lengths: list[int], num_kv: int, head_dim: int, page_size: int, dtype: torch.dtype,
    gen: torch.Generator,
) -> PagedBatch:
    needed = [-(-n // page_size) for n in lengths]
    num_pages = sum(needed) + 3
    order = torch.randperm(num_pages, generator=gen).tolist()
    k_cache = torch.randn(num_pages * num_kv, page_size, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_pages * num_kv, page_size, head_dim, generator=gen).to(dtype)
    batch = PagedBatch(k_cache, v_cache, [])
    for length, count in zip(lengths, needed):
        pages = [order.pop() for _ in range(count)]
        batch.tables.append(pages)
        batch.keys.append(gather_keys(k_cache, pages, num_kv, length).clone())
        batch.values.append(gather_keys(v_cache, pages, num_kv, length).clone())
    return batch


# -- write_kv ---------------------------------------------------------------

@in_process
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_kv,head_dim,page_size", [(2, 16, 4), (3, 24, 5)])
def test_write_kv_stores_each_head_at_its_slot(dtype, num_kv, head_dim, page_size) -> None:
    gen = torch.Generator().manual_seed(num_kv * 100 + page_size)
    num_pages, num_tokens = 6, 11
    k_cache = torch.randn(num_pages * num_kv, page_size, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn_like(k_cache.float()).to(dtype)
    # k and v as the model makes them: views into a wider fused projection.
    fused = torch.randn(num_tokens, 4 * num_kv, head_dim, generator=gen).to(dtype)
    k, v = fused[:, num_kv : 2 * num_kv], fused[:, 3 * num_kv :]
    slots = torch.randperm(num_pages * page_size, generator=gen)[:num_tokens].to(torch.int32)
    slots[[2, 7]] = -1  # padding rows write nothing
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        page, offset = divmod(slot, page_size)
        for h in range(num_kv):
            want_k[page * num_kv + h, offset] = k[t, h]
            want_v[page * num_kv + h, offset] = v[t, h]
    kernels.write_kv(k, v, k_cache, v_cache, slots, num_kv)
    assert torch.equal(k_cache, want_k)
    assert torch.equal(v_cache, want_v)


# -- decode -----------------------------------------------------------------

DECODE_CASES = [
    # num_kv, group, head_dim, page_size, lengths, splits, window
    (2, 1, 16, 16, [1, 16, 17, 40], 1, 0),  # MHA, page-aligned and not
    (2, 4, 32, 8, [5, 33, 100], 3, 0),  # GQA 4, split-KV
    (1, 3, 24, 5, [1, 2, 41], 4, 0),  # group 3 and head_dim 24 (both padded), page 5
    (2, 2, 16, 4, [3, 30, 61], 2, 9),  # sliding window, split
]


@in_process
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "case", DECODE_CASES, ids=lambda c: f"kv{c[0]}g{c[1]}d{c[2]}p{c[3]}s{c[5]}w{c[6]}"
)
def test_decode_matches_reference(dtype, case) -> None:
    num_kv, group, head_dim, page_size, lengths, splits, window = case
    gen = torch.Generator().manual_seed(sum(lengths) + splits)
    batch = make_paged_batch(lengths, num_kv, head_dim, page_size, dtype, gen)
    q = torch.randn(len(lengths), num_kv * group, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5
    out = kernels.decode_attention(
        q, batch.k_cache, batch.v_cache, batch.block_table(),
        torch.tensor(lengths, dtype=torch.int32), scale,
        num_kv_heads=num_kv, window=window, num_splits=splits,
    )
    assert out.dtype == dtype and out.shape == (len(lengths), num_kv * group * head_dim)
    for i, length in enumerate(lengths):
        want = reference_attention(
            q[i : i + 1], batch.keys[i], batch.values[i], torch.tensor([length - 1]), scale, window
        )
        torch.testing.assert_close(out[i : i + 1].float(), want, atol=TOLERANCE[dtype], rtol=0)


@in_process
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_padding_rows_read_nothing_and_give_zeros(splits) -> None:
    gen = torch.Generator().manual_seed(5)
    batch = make_paged_batch([9, 20], 2, 16, 4, torch.float32, gen)
    table = batch.block_table()
    table = torch.cat([table, torch.zeros(2, table.shape[1], dtype=torch.int32)])
    lengths = torch.tensor([9, 20, 0, 0], dtype=torch.int32)
    q = torch.randn(4, 4, 16, generator=gen)
    out = kernels.decode_attention(
        q, batch.k_cache, batch.v_cache, table, lengths, 0.25, num_kv_heads=2, num_splits=splits
    )
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    want = reference_attention(q[1:2], batch.keys[1], batch.values[1], torch.tensor([19]), 0.25, 0)
    torch.testing.assert_close(out[1:2], want, atol=2e-5, rtol=0)


@in_process
def test_decode_fills_only_its_rows_of_a_larger_output() -> None:
    gen = torch.Generator().manual_seed(6)
    batch = make_paged_batch([7, 12], 1, 16, 8, torch.float32, gen)
    q = torch.randn(2, 2, 16, generator=gen)
    out = torch.full((5, 32), 7.0)
    kernels.decode_attention(
        q, batch.k_cache, batch.v_cache, batch.block_table(),
        torch.tensor([7, 12], dtype=torch.int32), 0.25, num_kv_heads=1, out=out,
    )
    assert torch.equal(out[2:], torch.full((3, 32), 7.0))
    assert not torch.equal(out[:2], torch.full((2, 32), 7.0))


# -- prefill ----------------------------------------------------------------

PREFILL_CASES = [
    # num_kv, group, head_dim, page_size, (context, new tokens) per chunk, window
    # fresh, cached prefix, a long chunk (2 query blocks)
    (2, 2, 16, 4, [(0, 9), (12, 5), (3, 40)], 0),
    (1, 4, 32, 16, [(0, 1), (30, 34), (16, 16)], 0),  # a 1-token chunk, page-aligned context
    (2, 1, 24, 5, [(0, 37), (21, 11)], 6),  # sliding window, padded head_dim
]


@in_process
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "case", PREFILL_CASES, ids=lambda c: f"kv{c[0]}g{c[1]}d{c[2]}p{c[3]}w{c[5]}"
)
def test_prefill_matches_reference(dtype, case) -> None:
    num_kv, group, head_dim, page_size, chunks, window = case
    gen = torch.Generator().manual_seed(len(chunks) * 10 + page_size)
    lengths = [ctx + new for ctx, new in chunks]
    batch = make_paged_batch(lengths, num_kv, head_dim, page_size, dtype, gen)
    # Two decode rows first, as in a mixed step: the kernel must leave them alone.
    starts, row = [], 2
    for _, new in chunks:
        starts.append(row)
        row += new
    q = torch.randn(row, num_kv * group, head_dim, generator=gen).to(dtype)
    out = torch.full((row, num_kv * group * head_dim), 3.0, dtype=dtype)
    scale = head_dim**-0.5
    kernels.prefill_attention(
        q, batch.k_cache, batch.v_cache, batch.block_table(),
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor([new for _, new in chunks], dtype=torch.int32),
        torch.tensor([ctx for ctx, _ in chunks], dtype=torch.int32),
        max(new for _, new in chunks), scale,
        num_kv_heads=num_kv, window=window, out=out,
    )
    assert torch.equal(out[:2], torch.full_like(out[:2], 3.0))
    for i, (ctx, new) in enumerate(chunks):
        rows = slice(starts[i], starts[i] + new)
        want = reference_attention(
            q[rows], batch.keys[i], batch.values[i], torch.arange(ctx, ctx + new), scale, window
        )
        torch.testing.assert_close(out[rows].float(), want, atol=TOLERANCE[dtype], rtol=0)


@in_process
@pytest.mark.parametrize("splits", [1, 3])
def test_soft_capped_attention_matches_reference(splits) -> None:
    """Gemma 2's soft-cap (small here, so that it matters) in both kernels,
    with a window, over split and unsplit decodes and a chunk with a cached prefix."""
    num_kv, group, head_dim, page_size, window, cap = 2, 2, 16, 4, 9, 0.7
    gen = torch.Generator().manual_seed(splits)
    lengths = [5, 30]
    batch = make_paged_batch(lengths, num_kv, head_dim, page_size, torch.float32, gen)
    scale = head_dim**-0.5
    q = torch.randn(2, num_kv * group, head_dim, generator=gen) * 4
    out = kernels.decode_attention(
        q, batch.k_cache, batch.v_cache, batch.block_table(), torch.tensor(lengths, dtype=torch.int32),
        scale, num_kv_heads=num_kv, window=window, num_splits=splits, softcap=cap,
    )
    for i, length in enumerate(lengths):
        want = reference_attention(
            q[i : i + 1], batch.keys[i], batch.values[i], torch.tensor([length - 1]), scale, window, cap
        )
        torch.testing.assert_close(out[i : i + 1], want, atol=2e-5, rtol=0)
    # The second sequence as a chunk of its last 12 tokens after 18 cached ones.
    q = torch.randn(12, num_kv * group, head_dim, generator=gen) * 4
    out = kernels.prefill_attention(
        q, batch.k_cache, batch.v_cache, batch.block_table()[1:],
        torch.tensor([0], dtype=torch.int32), torch.tensor([12], dtype=torch.int32),
        torch.tensor([18], dtype=torch.int32), 12, scale,
        num_kv_heads=num_kv, window=window, softcap=cap,
    )
    want = reference_attention(q, batch.keys[1], batch.values[1], torch.arange(18, 30), scale, window, cap)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=0)


def test_num_kv_splits_fills_the_gpu_without_tiny_splits() -> None:
    # A lone long sequence on a big GPU splits as far as the cap allows...
    assert kernels.num_kv_splits(1, 8, 32768, num_sms=132) == 16
    # ...a short one not at all: each split keeps at least 4 key blocks.
    assert kernels.num_kv_splits(1, 8, 200, num_sms=132, block_n=64) == 1
    assert kernels.num_kv_splits(1, 8, 1024, num_sms=132, block_n=64) == 4
    # A batch that already fills the GPU does not split.
    assert kernels.num_kv_splits(128, 8, 32768, num_sms=132) == 1
    with pytest.raises(ValueError):
        kernels.num_kv_splits(0, 8, 100, num_sms=10)


# -- the CUDA runner on the CPU -----------------------------------------------

def write_random_gemma2(folder: Path) -> Path:
    """A tiny Gemma 2 made by transformers: alternating windows of 5 and small
    soft-caps, so that both matter."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    config = transformers.Gemma2Config(
        vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
        attn_logit_softcapping=0.7, final_logit_softcapping=2.0, max_position_embeddings=256,
    )
    model = transformers.Gemma2ForCausalLM(config)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn_like(weight) * 0.05)
    model.save_pretrained(folder)
    return folder


@in_process
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,window",
    [(4, 2, 16, None), (3, 1, 16, 5), (3, 1, 16, "gemma2"),
     # The other families' blocks (tests/engine/test_model_parity.py ARCHS): q/k norms, Gemma 3's local and
     # global layers on their own RoPE bases, LongRoPE with partial rotary (Granite's multipliers are
     # scalars of the torch code both runners share).
     *((None, None, None, arch) for arch in ("qwen3", "gemma3-local-global-rope",
                                             "phi3-longrope-long-partial-rotary"))],
    ids=["gqa2", "gqa3-window5", "gemma2-mixed-windows-softcap", "qwen3", "gemma3", "phi3-partial-rotary"],
)
def test_kernel_runner_matches_the_cpu_runner(tmp_path, heads, kv_heads, head_dim, window) -> None:
    """The CUDA path's runner, run by the interpreter on the CPU, computes the
    same hidden states as the CPU path's over prefill, a cached-prefix chunk,
    a mixed step and decodes, with shuffled pages; for Gemma 2, with its
    global and sliding layers side by side and soft-capped scores."""
    from engine.runner.cuda import KernelModelRunner
    from engine.formats.loader import load_model
    from engine.runner.cpu import ModelRunner

    if window == "gemma2":
        folder = write_random_gemma2(tmp_path / "m")
    elif isinstance(window, str):
        from tests.engine.test_model_parity import ARCHS, _save_tiny

        folder = tmp_path / "m"
        _save_tiny(ARCHS[window](), folder)
    else:
        folder = write_random_llama(
            tmp_path / "m", heads=heads, kv_heads=kv_heads, head_dim=head_dim, window=window, seed=3
        )
    model = load_model(folder, "cpu", "float32")
    page_size = 4
    plain = ModelRunner(model, model.new_kv_cache(24, page_size))
    kernel = KernelModelRunner(model, model.new_kv_cache(24, page_size))
    assert kernel.graphs is None  # graphs are CUDA-only

    gen = torch.Generator().manual_seed(11)
    pages = torch.randperm(24, generator=gen).tolist()
    a = FakeSequence(torch.randint(0, 97, (10,), generator=gen).tolist(), pages[0:4])
    b = FakeSequence(torch.randint(0, 97, (14,), generator=gen).tolist(), pages[4:9])
    c = FakeSequence(torch.randint(0, 97, (6,), generator=gen).tolist(), pages[9:12])
    steps = [
        ScheduleResult(prefills=[ScheduledChunk(a, 0, 10), ScheduledChunk(b, 0, 7)]),
        # b's second chunk attends to its cached first 7 tokens.
        ScheduleResult(decodes=[ScheduledChunk(a, 10, 1)],
                       prefills=[ScheduledChunk(b, 7, 7), ScheduledChunk(c, 0, 6)]),
        ScheduleResult(decodes=[ScheduledChunk(a, 11, 1), ScheduledChunk(b, 14, 1),
                                ScheduledChunk(c, 6, 1)]),
        ScheduleResult(decodes=[ScheduledChunk(c, 7, 1), ScheduledChunk(a, 12, 1)]),
    ]
    for step_index, step in enumerate(steps):
        # A decode feeds the token "sampled" by the step before.
        for chunk in step.decodes:
            while len(chunk.seq.token_ids) <= chunk.start:
                chunk.seq.token_ids.append((7 * step_index + len(chunk.seq.token_ids)) % 97)
        want, want_rows, _ = plain.forward(step)
        got, got_rows, _ = kernel.forward(step)
        assert got_rows == want_rows
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=f"step {step_index}")
    # Both runners wrote the same K/V into the same slots.
    torch.testing.assert_close(kernel.cache.k, plain.cache.k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kernel.cache.v, plain.cache.v, atol=1e-5, rtol=1e-5)


@in_process
def test_kernel_metadata_is_what_the_attention_hook_dispatches_on() -> None:
    from engine.model.attention import AttentionMetadata, paged_attention

    assert not issubclass(KernelAttentionMetadata, AttentionMetadata)
    # A 1-token step through engine.model.attention.paged_attention reaches the kernels.
    k_cache = torch.zeros(1, 2, 4, 16)
    cache = type("Cache", (), {"k": k_cache, "v": torch.zeros_like(k_cache)})()
    meta = KernelAttentionMetadata(
        slots=torch.tensor([1], dtype=torch.int32), num_decode=1,
        decode_block_table=torch.tensor([[0]], dtype=torch.int32),
        decode_seq_lens=torch.tensor([2], dtype=torch.int32), num_splits=1,
        prefill_block_table=None, prefill_query_start=None, prefill_query_len=None,
        prefill_context_len=None, max_prefill_len=0, window=0, num_kv_heads=1,
    )
    k = torch.randn(1, 1, 16)
    v = torch.randn(1, 1, 16)
    cache.k[0, 0, 0] = torch.randn(16)
    cache.v[0, 0, 0] = torch.randn(16)
    q = torch.randn(1, 2, 16)
    out = paged_attention(0, q, k, v, cache, meta, 0.25)
    assert torch.equal(cache.k[0, 0, 1], k[0, 0])
    keys, values = cache.k[0, :1, :2], cache.v[0, :1, :2]
    want = reference_attention(q, keys, values, torch.tensor([1]), 0.25, 0)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=0)


@in_process
def test_padded_static_decode_batch_equals_the_eager_step(tmp_path) -> None:
    """What a CUDA graph captures, run eagerly: a decode step packed into the
    static buffers and padded to a larger size gives the eager step's hidden
    states, and its padding rows write no page of the cache."""
    from engine.runner.cuda_graphs import pack_decode_inputs
    from engine.runner.cuda import KernelModelRunner
    from engine.formats.loader import load_model

    folder = write_random_llama(
        tmp_path / "m", heads=4, kv_heads=2, head_dim=16, window=None, seed=4
    )
    model = load_model(folder, "cpu", "float32")
    static_runner = KernelModelRunner(model, model.new_kv_cache(16, 4))
    eager = KernelModelRunner(model, model.new_kv_cache(16, 4))
    gen = torch.Generator().manual_seed(2)
    seqs = [
        FakeSequence(
            torch.randint(0, 97, (n,), generator=gen).tolist(), list(range(5 * i, 5 * i + 5))
        )
        for i, n in enumerate((3, 9, 6))
    ]
    prefill = ScheduleResult(prefills=[ScheduledChunk(s, 0, len(s.token_ids)) for s in seqs])
    static_runner.forward(prefill)
    eager.forward(prefill)
    batch = static_runner.static_decode_batch(max_size=8)
    for step in range(2):
        for s in seqs:
            s.token_ids.append((5 * step + len(s.token_ids)) % 97)
        decode = ScheduleResult(decodes=[ScheduledChunk(s, len(s.token_ids) - 1, 1) for s in seqs])
        want = eager.forward(decode)[0]
        ps = 4
        values, width = pack_decode_inputs(
            ids=[s.token_ids[-1] for s in seqs],
            positions=[len(s.token_ids) - 1 for s in seqs],
            slots=[
                s.pages[(len(s.token_ids) - 1) // ps] * ps + (len(s.token_ids) - 1) % ps
                for s in seqs
            ],
            seq_lens=[len(s.token_ids) for s in seqs],
            page_tables=[s.pages[: -(-len(s.token_ids) // ps)] for s in seqs],
            padded=4,
        )
        batch.load(torch.tensor(values, dtype=torch.int32), 4, width)
        got = batch.run(4)
        assert got.shape[0] == 4
        torch.testing.assert_close(got[:3], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(static_runner.cache.k, eager.cache.k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(static_runner.cache.v, eager.cache.v, atol=1e-5, rtol=1e-5)


# Compiles (never runs) every kernel for real GPUs with triton's own
# toolchain (ptxas ships in the wheel): what the interpreter cannot catch,
# such as an unsupported construct or a dot shape a GPU cannot do. Runs in a
# fresh process because this one has triton in interpreter mode.
_COMPILE_FOR_GPUS = r"""
import sys, torch, triton.language as tl
from triton.compiler import ASTSource, compile
from triton.backends.compiler import GPUTarget
from engine.kernels.triton import attention as K

def build(fn, types, consts, arch):
    sig = {n: "constexpr" if n in consts else types[n] for n in fn.arg_names}
    compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", arch, 32))

def build_all(arch, dt):
    tld = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}[dt]
    torch_dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]
    precision = "ieee" if dt == "fp32" else "tf32"
    i32 = lambda *names: {n: "i32" for n in names}
    cache = {n: f"*{dt}" for n in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
    block = 32 if dt == "fp32" else 64
    for softcap in (False, True):  # Gemma 2's soft-capped scores, and plain ones
        build(K._decode_kernel,
              {**cache, "table_ptr": "*i32", "lens_ptr": "*i32", "part_out_ptr": "*fp32",
               "part_lse_ptr": "*fp32", "scale_log2": "fp32", "softcap": "fp32",
               **i32("window", "stride_qt", "stride_qh", "stride_ot", "stride_table")},
              dict(NUM_KV=8, GROUP=4, BLOCK_H=16, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128,
                   BLOCK_N=K._decode_block_n(torch_dt), NUM_SPLITS=4, DOT_DTYPE=tld,
                   PRECISION=precision, SOFTCAP=softcap), arch)
        build(K._prefill_kernel,
              {**cache, "table_ptr": "*i32", "query_start_ptr": "*i32", "query_len_ptr": "*i32",
               "context_len_ptr": "*i32", "scale_log2": "fp32", "softcap": "fp32",
               **i32("window", "stride_qt", "stride_qh", "stride_ot", "stride_table")},
              dict(NUM_KV=2, GROUP=3, PAGE_SIZE=16, HEAD_DIM=64, BLOCK_D=64,
                   BLOCK_M=block, BLOCK_N=block,
                   DOT_DTYPE=tld, PRECISION=precision, SOFTCAP=softcap), arch)
    build(K._write_kv_kernel,
          {"k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "k_cache_ptr": f"*{dt}", "v_cache_ptr": f"*{dt}",
           "slot_ptr": "*i32", **i32("stride_kt", "stride_kh", "stride_vt", "stride_vh")},
          dict(NUM_KV=8, PAGE_SIZE=16, HEAD_DIM=128, BLOCK_D=128), arch)
    build(K._merge_splits_kernel,
          {"part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": f"*{dt}",
           "stride_ot": "i32"},
          dict(NUM_HEADS=32, NUM_SPLITS=4, BLOCK_S=4, HEAD_DIM=128, BLOCK_D=128), arch)

arch = int(sys.argv[1])
for dt in sys.argv[2:]:
    build_all(arch, dt)
print("compiled")
"""


def test_kernels_compile_for_cuda_gpus() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_FOR_GPUS, "90", "bf16", "fp32"],
        cwd=Path(__file__).resolve().parents[2], env=env,
        capture_output=True, text=True, timeout=600,
    )
    if result.returncode != 0 and "ptxas" in result.stderr and "not found" in result.stderr.lower():
        pytest.skip(f"triton's CUDA toolchain is not available here: {result.stderr[-300:]}")
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]


@in_process
def test_activation_probe_through_the_kernels_is_a_plain_prefill(tmp_path) -> None:
    """engine.runner.memory measures the activation peak with the kernels' metadata
    on CUDA; on the CPU (interpreter) that forward equals the CPU runner's."""
    from engine.runner import memory
    from engine.formats.loader import load_model
    from engine.runner.cpu import ModelRunner

    folder = write_random_llama(
        tmp_path / "m", heads=4, kv_heads=2, head_dim=16, window=None, seed=0
    )
    model = load_model(folder, "cpu", "float32")
    num_tokens, page_size = 10, 4
    pages = -(-num_tokens // page_size)
    meta = memory._prefill_metadata(model, num_tokens, pages, page_size)
    assert isinstance(meta, KernelAttentionMetadata)
    got = model.forward(
        torch.zeros(num_tokens, dtype=torch.long), torch.arange(num_tokens), meta,
        model.new_kv_cache(pages, page_size), num_tokens - 1,
    )
    runner = ModelRunner(model, model.new_kv_cache(pages, page_size))
    seq = FakeSequence([0] * num_tokens, list(range(pages)))
    want, _, _ = runner.forward(ScheduleResult(prefills=[ScheduledChunk(seq, 0, num_tokens)]))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
