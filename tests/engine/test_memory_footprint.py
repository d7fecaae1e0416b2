"""Memory held only as it is used: the CPU KV pool is committed page by page
as chats first reach it, never-written pool memory never leaks into a
result, and the default model's engine stays small after start-up.

Resident memory is read from /proc/self/status in a fresh subprocess, so what
this test process already allocated does not blur it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.model.kv_cache import KVCache
from engine.core.page_pool import PagePool
from engine.llm import Engine
from engine.formats.gguf.importer import import_gguf
from engine.formats.loader import load_model
from engine.model.quant import QuantizedTensor, QuantLinear, cpu_kernel_available
from engine.runner.cpu import highest_page_written
from engine.params import SamplingParams
from engine.core.scheduler import ScheduledChunk, ScheduleResult
from tests.engine.test_gguf_import import TinyModel, write_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20

needs_proc = pytest.mark.skipif(
    not Path("/proc/self/status").is_file(), reason="resident memory is read from /proc"
)


def run_json(code: str, *args: str, timeout: float = 300) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON object last."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


RSS = """
def rss_mib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
"""


# --------------------------------------------------------------------------
# KVCache.commit


def _cache(num_pages: int = 6) -> KVCache:
    return KVCache(
        num_layers=3, num_pages=num_pages, page_size=4, num_kv_heads=2, head_dim=8,
        dtype=torch.float32, device=torch.device("cpu"), commit_on_use=True,
    )


def test_commit_zeroes_each_page_once_in_every_layer() -> None:
    cache = _cache()
    cache.k.fill_(float("nan"))
    cache.v.fill_(float("nan"))
    assert cache.committed_pages == 0 and cache.committed_bytes == 0
    per_page = 2 * 3 * 2 * 4 * 8 * 4  # K and V, layers, heads, slots, head_dim, fp32
    assert cache.bytes_per_page == per_page and cache.total_bytes == 6 * per_page

    cache.commit(2)
    rows = cache.num_kv_heads  # rows of one page in a layer
    for tensor in (cache.k, cache.v):
        assert torch.equal(tensor[:, : 2 * rows], torch.zeros_like(tensor[:, : 2 * rows]))
        assert tensor[:, 2 * rows :].isnan().all()
    assert cache.committed_bytes == 2 * per_page

    # Written K/V is never zeroed again: committing is only ever a first use.
    cache.k[:, :rows] = 7.0
    cache.commit(1)
    cache.commit(2)
    assert (cache.k[:, :rows] == 7.0).all()
    cache.commit(3)
    assert (cache.k[:, :rows] == 7.0).all()
    assert not cache.k[:, : 3 * rows].isnan().any()
    assert cache.k[:, 3 * rows :].isnan().all()

    with pytest.raises(ValueError, match="outside the KV pool of 6 pages"):
        cache.commit(7)


def test_an_eager_cache_is_whole_and_zeroed_from_the_start() -> None:
    cache = KVCache(2, 5, 4, 2, 8, torch.float32, torch.device("cpu"))
    assert cache.committed_pages == 5 and cache.committed_bytes == cache.total_bytes
    assert not cache.k.any() and not cache.v.any()


@needs_proc
def test_uncommitted_pool_memory_is_not_resident() -> None:
    # 512 MiB of pool: nothing resident until committed, then about what was
    # committed (the pool is one slab per layer, so a page is spread thinly
    # over all of them; the operating system commits whole 4 KiB pages).
    result = run_json(RSS + """
import json, torch
from engine.model.kv_cache import KVCache
from engine.core.page_pool import PagePool
from engine.runner.cpu import highest_page_written
from engine.core.scheduler import ScheduledChunk, ScheduleResult
before = rss_mib()
cache = KVCache(32, 1024, 16, 2, 64, torch.float32, torch.device("cpu"), commit_on_use=True)
total = cache.total_bytes / 2**20
created = rss_mib()
cache.commit(256)
quarter = rss_mib()
print(json.dumps({"total": total, "created": created - before, "quarter": quarter - created}))
""")
    assert result["total"] == 512
    assert result["created"] < 16
    assert 128 - 8 < result["quarter"] < 128 + 16


def test_pool_reuses_pages_before_touching_new_ones() -> None:
    # What keeps the committed pages a prefix [0, n) that grows only when
    # every page below n is in use or cached.
    pool = PagePool(num_pages=8, page_size=2)
    first = pool.allocate(3)
    assert first == [0, 1, 2]
    pool.release(first[1:])
    assert sorted(pool.allocate(3)) == [1, 2, 3]
    held = pool.allocate(1)
    assert held == [4]
    pool.register(held[0], None, [5, 6])
    pool.release(held)  # cached, not free: new pages come first
    assert pool.allocate(3) == [5, 6, 7]
    assert pool.allocate(1) == [4]  # only now is the cached page evicted


def test_highest_page_written_looks_at_every_page_a_chunk_writes() -> None:
    # Reused pages come in any order: [.., 9, 2] writes page 9 though its
    # last token lands on page 2.
    seq = SimpleNamespace(pages=[5, 9, 2, 7], token_ids=list(range(16)))
    prefill = ScheduledChunk(seq, 2, 9)  # positions 2..10: pages 5, 9, 2
    assert highest_page_written(ScheduleResult(prefills=[prefill]), 4) == 9
    decode = ScheduledChunk(seq, 12, 1)  # position 12: page 7
    assert highest_page_written(ScheduleResult(decodes=[decode]), 4) == 7
    assert highest_page_written(ScheduleResult(), 4) == -1


def test_a_full_pool_is_committed_whole_and_reuse_keeps_results(tiny_model_dir: Path) -> None:
    # Distinct prompts until pages are evicted and reused out of order: every
    # page ends up committed exactly once, and no later commit zeroes K/V
    # that a cached page still holds (the repeat of the first prompt, served
    # from cached pages, gives the tokens it gave when it was computed).
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [[{"role": "user", "content": f"({i}) " + "word " * 60}] for i in range(6)]
    with Engine(tiny_model_dir, device="cpu", threads=1, kv_pages=16) as eng:
        first = eng.generate_outputs(prompts[:1], params)[0].token_ids
        for prompt in prompts[1:]:
            eng.generate_outputs([prompt], params)
        assert eng.kv_cache.committed_pages == 16
        assert eng.stats().kv_bytes_committed == eng.stats().kv_bytes_total
        again = eng.generate_outputs(prompts[-1:], params)[0].token_ids
        last = eng.generate_outputs(prompts[-1:], params)[0].token_ids
        assert again == last
    with Engine(tiny_model_dir, device="cpu", threads=1, kv_pages=16) as fresh:
        assert fresh.generate_outputs(prompts[:1], params)[0].token_ids == first
        assert fresh.generate_outputs(prompts[-1:], params)[0].token_ids == last


# --------------------------------------------------------------------------
# Never-written pool memory never reaches a result


def _prompts() -> list[list[dict[str, str]]]:
    # Different lengths: partly filled last pages, decodes padded with page
    # 0, and (with max_batch_tokens below) prompts prefilled in several chunks.
    return [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "user", "content": "Name three rivers and one mountain " * 6}],
        [{"role": "user", "content": "Count: " + " ".join(str(i) for i in range(90))}],
    ]


@pytest.mark.parametrize("deterministic", [False, True])
def test_nan_filled_pool_memory_gives_the_same_tokens(
    tiny_model_dir: Path, deterministic: bool
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    setup = {
        "device": "cpu", "threads": 1, "kv_pages": 64, "max_batch_tokens": 48,
        "deterministic": deterministic,
    }
    with Engine(tiny_model_dir, **setup) as clean:
        assert clean.kv_cache.commit_on_use

        def zero_fill() -> None:
            # The reference: a pool zero-filled whole at start.
            clean.kv_cache.k.zero_()
            clean.kv_cache.v.zero_()
            clean.kv_cache.committed_pages = clean.kv_cache.num_pages

        clean.run_on_engine_thread(zero_fill)
        expected = [o.token_ids for o in clean.generate_outputs(_prompts(), params)]

    with Engine(tiny_model_dir, **setup) as poisoned:

        def poison() -> None:
            # What never-written memory may hold: the whole pool, as if fresh.
            poisoned.kv_cache.k.fill_(float("nan"))
            poisoned.kv_cache.v.fill_(float("inf"))
            poisoned.kv_cache.committed_pages = 0

        poisoned.run_on_engine_thread(poison)
        got = [o.token_ids for o in poisoned.generate_outputs(_prompts(), params)]
        stats = poisoned.stats()
        assert got == expected
        # Only pages some request reached were committed (zeroed), the rest
        # still hold the poison: nothing else touched them.
        used = poisoned.kv_cache.committed_pages
        assert 0 < used < 64
        assert stats.kv_bytes_committed == used * poisoned.kv_cache.bytes_per_page
        rows = used * poisoned.kv_cache.num_kv_heads
        assert poisoned.kv_cache.k[:, rows:].isnan().all()


def test_committed_bytes_grow_with_use_not_before(tiny_model_dir: Path) -> None:
    with Engine(tiny_model_dir, device="cpu", threads=1, kv_pages=512) as eng:
        start = eng.stats()
        per_page = eng.kv_cache.bytes_per_page
        assert start.kv_bytes_total == 512 * per_page
        # The warm-up's one prefill and decode.
        assert start.kv_bytes_committed == per_page

        prompt = [{"role": "user", "content": "word " * 300}]
        out = eng.generate_outputs([prompt], SamplingParams(temperature=0.0, max_tokens=4))[0]
        tokens = len(out.prompt_token_ids) + len(out.token_ids)
        after_one = eng.stats().kv_bytes_committed
        assert after_one == -(-tokens // eng.pool.page_size) * per_page

        # The same chat again is served from the cached pages: no new memory.
        eng.generate_outputs([prompt], SamplingParams(temperature=0.0, max_tokens=1))
        assert eng.stats().kv_bytes_committed <= after_one + per_page

        # A new chat takes fresh pages while the old ones stay cached.
        other = [{"role": "user", "content": "other " * 300}]
        eng.generate_outputs([other], SamplingParams(temperature=0.0, max_tokens=4))
        assert eng.stats().kv_bytes_committed > after_one


# --------------------------------------------------------------------------
# One copy of each weight


@pytest.mark.skipif(not cpu_kernel_available(), reason="the CPU quantized kernel is unavailable")
def test_a_tied_quantized_table_is_one_object_for_lookups_and_head(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf", TinyModel(tied=True), qtype=Q.Q4_1)
    model = load_model(import_gguf(tmp_path / "m.gguf", tmp_path / "out"), "cpu", "float32")
    assert isinstance(model.embed, QuantizedTensor)
    assert isinstance(model.lm_head, QuantLinear)
    assert model.lm_head.weight is model.embed


@needs_proc
def test_loaded_weights_keep_no_mapping_of_the_checkpoint(tmp_path: Path) -> None:
    # Weights that were views of the file's mapping would keep it mapped, and
    # with it the pages of the parts stacked into fused q/k/v and gate/up.
    write_gguf(tmp_path / "m.gguf", TinyModel(tied=False), qtype=Q.Q4_0)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    for quantized in ("auto", "dequantize"):
        model = load_model(folder, "cpu", "float32", quantized=quantized)
        assert str(folder / "model.safetensors") not in Path("/proc/self/maps").read_text()
        del model


# --------------------------------------------------------------------------
# The default model


@needs_proc
def test_default_model_engine_resides_in_500_mib_after_a_short_reply(
    default_model_dir: Path,
) -> None:
    # The engine as the app makes it (every setting at its default): the
    # imported GGUF's weights stay quantized where the CPU kernel runs.
    result = run_json(RSS + """
import json, sys
from engine import Engine, SamplingParams
from engine.model.quant import cpu_kernel_available
with Engine(sys.argv[1], threads=1) as eng:
    started = rss_mib()
    kv_started = eng.stats().kv_bytes_committed
    eng.generate([{"role": "user", "content": "Say hello."}],
                 params=SamplingParams(temperature=0.0, max_tokens=16))
    replied = rss_mib()
    stats = eng.stats()
    # A long chat: its pages are committed as it reaches them.
    eng.generate([{"role": "user", "content": "Tell me more. " * 300}],
                 params=SamplingParams(temperature=0.0, max_tokens=1))
    chatted = rss_mib()
    kv_chatted = eng.stats().kv_bytes_committed
print(json.dumps({"started": started, "replied": replied, "chatted": chatted,
                  "kv_started": kv_started / 2**20,
                  "kv_committed": stats.kv_bytes_committed / 2**20,
                  "kv_chatted": kv_chatted / 2**20,
                  "kv_total": stats.kv_bytes_total / 2**20,
                  "weights": stats.weights, "kernel": cpu_kernel_available()}))
""", str(default_model_dir))
    if result["kernel"]:
        assert result["weights"] == "q4_1+q8_0 (kernel)", result
    # The pool is sized for a long day of chats but holds a few pages.
    assert result["kv_started"] <= result["kv_committed"] < 8 < result["kv_total"]
    assert result["replied"] - result["started"] < 32
    assert result["replied"] <= 500, result
    # ~1200 tokens take ~27 MiB of fp16 pages, resident once written.
    grown = result["kv_chatted"] - result["kv_committed"]
    assert grown > 20, result
    assert result["chatted"] - result["replied"] > 0.8 * grown, result


@needs_proc
def test_a_loaded_engine_holds_no_freed_heap_of_its_load(default_model_dir: Path) -> None:
    # Loading allocates and frees tens of MiB of temporaries; what the C heap
    # kept of them is given back once loaded, so trimming it again now frees
    # next to nothing (about 20 MiB when the engine does not trim).
    result = run_json(RSS + """
import ctypes, json, sys
from engine import Engine
with Engine(sys.argv[1], threads=1) as eng:
    loaded = rss_mib()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = rss_mib()
print(json.dumps({"loaded": loaded, "trimmed": trimmed}))
""", str(default_model_dir))
    assert result["loaded"] - result["trimmed"] < 6, result
