"""Engine lifetime: close racing submits, dropping an engine without close(),
leaving the process mid-generation, and loading with progress and cancel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.llm import Engine
from engine.errors import EngineClosedError, LoadCancelled
from engine.progress import STAGES, LoadProgress
from engine.params import SamplingParams

REPO_ROOT = Path(__file__).resolve().parents[2]
SHORT = SamplingParams(temperature=0.0, max_tokens=8)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def run_python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, env=env,
    )


# --------------------------------------------------------------------------
# close() against requests in flight


def test_submit_racing_close_ends_in_engine_closed_error(tiny_model_dir: Path) -> None:
    eng = Engine(tiny_model_dir, device="cpu", kv_pages=16)
    encoding = threading.Event()
    release = threading.Event()
    real_encode = eng.encode_prompt

    def slow_encode(prompt: Any) -> list[int]:
        # The consumer has passed the closed check and is encoding when close() runs.
        encoding.set()
        release.wait()
        return real_encode(prompt)

    eng.encode_prompt = slow_encode  # type: ignore[method-assign]
    outcome: dict[str, Any] = {}

    def consumer() -> None:
        try:
            outcome["text"] = eng.generate(chat("Hi!"), params=SHORT)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=consumer)
    thread.start()
    assert encoding.wait(60)
    eng.close()
    release.set()
    thread.join(60)
    assert not thread.is_alive(), "the consumer hangs"
    assert isinstance(outcome.get("error"), EngineClosedError)


def test_close_ends_queued_requests_and_runs_queued_calls(tiny_model_dir: Path) -> None:
    eng = Engine(tiny_model_dir, device="cpu", kv_pages=16)
    core = eng._core
    busy = threading.Event()

    def block_until_closing() -> None:
        busy.set()
        core.stopping.wait()  # set by close(), together with queueing the shutdown

    blocker = threading.Thread(target=eng.run_on_engine_thread, args=(block_until_closing,))
    blocker.start()
    assert busy.wait(60)
    # Queued behind the blocked engine thread, before close():
    batch = eng.start_batch([chat("Hi!"), chat("Why is the sky blue?")], SHORT)
    queued = threading.Event()
    real_put = core.put

    def put(items: list[Any]) -> None:
        real_put(items)
        queued.set()

    core.put = put  # type: ignore[method-assign]
    call_result: dict[str, Any] = {}
    caller = threading.Thread(
        target=lambda: call_result.setdefault("value", eng.run_on_engine_thread(lambda: "ran"))
    )
    caller.start()
    assert queued.wait(60)

    eng.close()
    blocker.join(60)
    caller.join(60)
    assert call_result == {"value": "ran"}
    finals = [event.output for _, event in batch if event.output is not None]
    assert len(finals) == 2
    assert all(o.finish_reason == "error" and isinstance(o.error, EngineClosedError) for o in finals)
    with pytest.raises(EngineClosedError):
        eng.run_on_engine_thread(lambda: None)
    with pytest.raises(EngineClosedError):
        eng.start_batch([chat("Hi!")], SHORT)
    eng.close()  # twice is fine


def test_close_from_another_thread_while_streaming(tiny_model_dir: Path) -> None:
    eng = Engine(tiny_model_dir, device="cpu", kv_pages=32)
    params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    stream = eng.generate([chat("Hi!"), chat("Tell me a story.")], stream=True, params=params)
    next(stream)
    closer = threading.Thread(target=eng.close)
    closer.start()
    with pytest.raises(EngineClosedError):
        for _ in stream:
            pass
    closer.join(60)
    assert not closer.is_alive()


def test_close_from_a_sink_on_the_engine_thread(tiny_model_dir: Path) -> None:
    eng = Engine(tiny_model_dir, device="cpu", kv_pages=16)
    finals = []

    def sink(event: Any) -> None:
        if event.output is None:
            eng.close()  # must not wait for its own thread
        else:
            finals.append(event.output)

    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    eng.submit(chat("Hi!"), params, sink)
    eng._core.thread.join(60)
    assert not eng._core.thread.is_alive()
    assert len(finals) == 1 and isinstance(finals[0].error, EngineClosedError)


# --------------------------------------------------------------------------
# Dropping an engine, leaving the process


_DROP_SCRIPT = """
import ctypes, gc, json, os, sys, threading
from engine.llm import Engine

def rss_mb():
    # What the process still references, not what glibc keeps cached: freed
    # memory can stay in a thread's malloc arena (~500 MB of an engine's, in
    # most runs) and, once in some 30 runs, an arena kept a second engine's
    # too. A reference still held cannot be trimmed away.
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

def os_threads():
    return len(os.listdir("/proc/self/task"))

def use_and_drop():
    # Dequantized: fp32 weights make a footprint that cannot hide in the noise.
    eng = Engine(sys.argv[1], device="cpu", dtype="float32", quantized="dequantize", kv_pages=64)
    eng.generate([{"role": "user", "content": "Hi!"}], max_tokens=4, temperature=0)
    loaded = rss_mb()
    del eng
    gc.collect()
    return loaded

report = {"start_threads": threading.active_count(), "start_os_threads": os_threads()}
report["loaded"] = use_and_drop()
report["after_1"] = rss_mb()
report["threads_1"] = threading.active_count()
report["os_threads_1"] = os_threads()
for _ in range(2):
    use_and_drop()
report["after_3"] = rss_mb()
report["threads_3"] = threading.active_count()
report["os_threads_3"] = os_threads()
print(json.dumps(report))
"""


def test_dropped_engine_releases_memory_and_thread(default_model_dir: Path) -> None:
    result = run_python(_DROP_SCRIPT, str(default_model_dir))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # The engine thread is gone with the engine.
    assert report["threads_1"] == report["start_threads"]
    assert report["threads_3"] == report["start_threads"]
    # OpenMP's pool stays for the process; nothing accumulates per engine.
    assert report["os_threads_3"] == report["os_threads_1"]
    # A loaded engine holds its fp32 weights (~540 MB, ~1 GB with what
    # loading them left freed); two more loaded and dropped must not keep
    # theirs (unreleased, that is ~1.1 GB more).
    footprint = report["loaded"] - report["after_1"]
    assert footprint > 300, report
    assert report["after_3"] - report["after_1"] < footprint / 2, report


_CLOSE_SCRIPT = """
import json, sys
from engine.errors import EngineClosedError
from engine.llm import Engine

def rss_mb():  # as the system sees it: no trim of our own here
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024

report = {"start": rss_mb()}
eng = Engine(sys.argv[1], device="cpu", dtype="float32", quantized="dequantize", kv_pages=64)
eng.generate([{"role": "user", "content": "Hi!"}], max_tokens=4, temperature=0)
report["loaded"] = rss_mb()
eng.close()  # the Engine itself is still held, as a window keeps a pane's
report["closed"] = rss_mb()
try:
    eng.model
    report["model"] = "still there"
except EngineClosedError as exc:
    report["model"] = str(exc)
stats = eng.stats()
report["kv_total"], report["kv_committed"] = stats.kv_bytes_total, stats.kv_bytes_committed
print(json.dumps(report))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the trim is glibc's")
def test_closing_an_engine_gives_its_memory_back(default_model_dir: Path) -> None:
    result = run_python(_CLOSE_SCRIPT, str(default_model_dir))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # fp32 weights and what loading them left freed: ~1 GB. Closing, with the
    # Engine still referenced, returns nearly all of it to the system (before:
    # none of it, until the Engine was dropped, and even then glibc kept ~500 MB).
    footprint = report["loaded"] - report["start"]
    assert footprint > 300, report
    assert report["closed"] - report["start"] < footprint / 4, report
    assert "no longer in memory" in report["model"]
    assert report["kv_total"] > 0 and report["kv_committed"] == 0


_EXIT_SCRIPT = """
import asyncio, sys, threading
from engine.llm import Engine
from engine.params import SamplingParams

mode = sys.argv[2]
eng = Engine(sys.argv[1], device="cpu", kv_pages=64)
chat = [{"role": "user", "content": "Tell me a long story."}]
long = SamplingParams(temperature=0.8, seed=1, max_tokens=900, ignore_eos=True)
if mode == "submit":
    streaming = threading.Event()
    for _ in range(4):
        eng.submit(chat, long, lambda event: streaming.set())
    streaming.wait()
elif mode == "async":
    kept = []  # a handle still held: its requests go on after the loop is gone

    async def main():
        batch = eng.start_batch_async([chat, chat, chat], long)
        kept.append(batch)
        async for idx, event in batch:
            if event.num_generated >= 3:
                return  # the loop closes while the batch is still generating
    asyncio.run(main())
elif mode == "finished":
    eng.generate(chat, max_tokens=4)
print("leaving", flush=True)
"""


@pytest.mark.parametrize("mode", ["submit", "async", "finished"])
def test_exit_without_close_exits_normally(default_model_dir: Path, mode: str) -> None:
    result = run_python(_EXIT_SCRIPT, str(default_model_dir), mode)
    assert "leaving" in result.stdout
    assert result.returncode == 0, result.stderr
    assert "terminate called" not in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


# --------------------------------------------------------------------------
# Loading: progress and cancel


def check_order(reports: list[LoadProgress]) -> list[str]:
    """Assert the reports' order; return the stages seen."""
    stages = [r.stage for r in reports]
    assert all(s in STAGES for s in stages)
    ranks = [STAGES.index(s) for s in stages]
    assert ranks == sorted(ranks), stages
    seen = list(dict.fromkeys(stages))
    for stage in seen:
        done = [r.done for r in reports if r.stage == stage]
        totals = {r.total for r in reports if r.stage == stage}
        assert done == sorted(done), (stage, done)
        assert len(totals) == 1 and done[-1] == totals.pop(), stage
    return seen


def test_load_reports_progress_in_order(tiny_model_dir: Path) -> None:
    reports: list[LoadProgress] = []
    threads: set[str] = set()

    def on_progress(progress: LoadProgress) -> None:
        reports.append(progress)
        threads.add(threading.current_thread().name)

    with Engine(tiny_model_dir, device="cpu", kv_pages=16, on_progress=on_progress) as eng:
        assert eng.generate(chat("Hi!"), params=SHORT)
    # A folder needs no import.
    assert check_order(reports) == ["weights", "warmup", "ready"]
    weights = [r for r in reports if r.stage == "weights"]
    # The detail says what the weights are kept as (the window names the model itself).
    assert len(weights) > 10 and weights[0].detail == "Reading the weights onto cpu, kept as float32"
    assert threads == {"tandem-engine"}  # never the caller's (GUI) thread


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    from tests.engine.test_gguf_import import TinyModel, write_gguf

    path = tmp_path / "tiny-model.gguf"
    write_gguf(path, TinyModel(layers=4))
    return path


def test_gguf_import_reports_progress_then_loads(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    reports: list[LoadProgress] = []
    with Engine(tiny_gguf, device="cpu", kv_pages=8, on_progress=reports.append) as eng:
        assert eng.generate([1, 2, 3], params=SHORT) is not None
    assert check_order(reports) == list(STAGES)
    imports = [r for r in reports if r.stage == "import"]
    assert len(imports) > 2
    assert tiny_gguf.name in imports[0].detail and "tiny-model" in imports[0].detail
    # Imported once: the second load goes straight to the weights.
    again: list[LoadProgress] = []
    with Engine(tiny_gguf, device="cpu", kv_pages=8, on_progress=again.append):
        pass
    assert check_order(again) == ["weights", "warmup", "ready"]


def test_cancel_during_import_leaves_no_folder(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(data))
    threads_before = threading.active_count()
    cancel = threading.Event()
    reports: list[LoadProgress] = []

    def on_progress(progress: LoadProgress) -> None:
        reports.append(progress)
        if progress.stage == "import" and progress.done > 0:
            cancel.set()  # half way through writing the weights

    with pytest.raises(LoadCancelled):
        Engine(tiny_gguf, device="cpu", kv_pages=8, on_progress=on_progress, cancel=cancel)
    imports = [r for r in reports if r.stage == "import"]
    assert imports and imports[-1].done < imports[-1].total  # it stopped part way
    assert {r.stage for r in reports} == {"import"}
    models = data / "models"
    assert not models.exists() or list(models.iterdir()) == []
    assert threading.active_count() == threads_before
    # Nothing left in the way of a later import.
    with Engine(tiny_gguf, device="cpu", kv_pages=8) as eng:
        assert eng.model_path == models / "tiny-model"


def test_cancel_while_loading_weights(tiny_model_dir: Path) -> None:
    cancel = threading.Event()

    def on_progress(progress: LoadProgress) -> None:
        if progress.stage == "weights" and progress.done >= 5:
            cancel.set()

    threads_before = threading.active_count()
    with pytest.raises(LoadCancelled):
        Engine(tiny_model_dir, device="cpu", kv_pages=8, on_progress=on_progress, cancel=cancel)
    assert threading.active_count() == threads_before


def test_cancel_set_before_loading(tiny_model_dir: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LoadCancelled, match="cancelled"):
        Engine(tiny_model_dir, device="cpu", cancel=cancel)
