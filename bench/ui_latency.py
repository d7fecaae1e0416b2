"""GUI responsiveness while three panes stream, and what the window costs the engine.

    QT_QPA_PLATFORM=offscreen .venv/bin/python bench/ui_latency.py [--new-tokens 512]

The real window (offscreen), three panes, one broadcast of a greedy reply of
--new-tokens tokens each (ignore_eos, so every reply runs its full length).
A 10 ms QTimer on the GUI thread records when it fires; the gaps between its
ticks while the replies stream say how long the GUI thread was ever kept
from its events (by rendering, by the event hand-off, by the engine's
threads competing for the cores). The same three requests also run without
the window, before and after, on the same engine: the decode rate with the
window against the mean of those two is the window's cost to the engine.

The GUI thread's own CPU time while the replies stream (`time.thread_time`
on that thread: Python, layout and painting together) is reported as a
share of one core: what the window takes from the engine's cores and GIL.

`--code` asks for Python code instead of a story, so the replies stream a
fenced block; `--no-highlight` shows that code uncoloured, so the two runs
give the GUI-thread time per frame with and without highlighting.
`--profile FILE` writes a cProfile of the GUI thread while it streams.

`--unload` then unloads the model as Models > Unload does (the replies
done, the window still up), with the 10 ms ticks running again: the worst
gap while the engine closes and gives its memory back, how long the unload
took, and the process's resident memory before and after. The engine is
gone then, so the second run without the window is left out.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from bench.common import machine  # noqa: E402
from bench.throughput import resident_mb  # noqa: E402

PROMPT = "Tell me a long story about a lighthouse keeper and a storm."
CODE_PROMPT = (
    "Write a long Python module that parses CSV files, with classes, type hints and docstrings, "
    "in one ```python code block."
)
TICK_MS = 10


def decode_rate(replies: list[tuple[int, float, float]]) -> float:
    """(generated tokens, ttft_s, elapsed_s) of replies started together -> tokens/s after the first token."""
    tokens = sum(n - 1 for n, _, _ in replies)
    span = max(elapsed - ttft for _, ttft, elapsed in replies)
    return tokens / span if span > 0 else 0.0


def run_alone(engine: Any, prompts: list[list[int]], params: Any) -> float:
    engine.reset_prefix_cache()
    outputs = engine.generate_outputs(prompts, params=params)
    replies = []
    for out in outputs:
        m = out.metrics
        replies.append((len(out.token_ids), m.first_token_time - m.arrival_time, m.finish_time - m.arrival_time))
    return decode_rate(replies)


def run_with_window(
    engine: Any, settings: Any, panes: int, store: Path | None = None, *,
    prompt: str = PROMPT, profile: Path | None = None, unload: bool = False,
) -> dict[str, Any]:
    from ui.event_loop import TandemEventLoop
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from app.workspace.workspace import Workspace
    from ui.window.main_window import MainWindow
    from ui.theme import apply_theme

    app = QApplication.instance() or QApplication(sys.argv[:1])
    apply_theme(app, "light")
    loop = TandemEventLoop(app)
    asyncio.set_event_loop(loop)
    workspace = Workspace(settings, engine=engine)
    session = None
    if store is not None:  # as the app runs: every message, reply and checkpoint written to a chat store
        from app.store.session import ChatSession

        session = ChatSession.open(store)
        session.restore(workspace, default_panes=panes)
    else:
        for _ in range(panes):
            workspace.add_pane()
    window = MainWindow(workspace, settings, version="bench", save_settings=False, session=session)
    window.resize(1280, 800)
    window.show()
    ticks: list[float] = []
    streaming = False

    def tick() -> None:
        if streaming:
            ticks.append(time.perf_counter())

    # The window's own work per frame (re-rendering what streamed in), timed
    # apart from the gaps, which also count time the OS gave other threads.
    flushes: list[float] = []
    flush = window.render_frame

    def timed_flush() -> None:
        start = time.perf_counter()
        flush()
        flushes.append((time.perf_counter() - start) * 1000)

    window._frame_timer.timeout.disconnect()
    window._frame_timer.timeout.connect(timed_flush)

    timer = QTimer()
    timer.setInterval(TICK_MS)
    timer.timeout.connect(tick)

    gui_cpu: dict[str, float] = {}
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()

    async def scenario() -> None:
        nonlocal streaming
        # First layout and paint out of the way, and the window's idle warm-up (the code lexer) done,
        # as before anything a user types.
        await asyncio.sleep(2.0)
        engine.reset_prefix_cache()
        timer.start()
        streaming = True
        if profiler is not None:
            profiler.enable()
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        window.composer.edit.setPlainText(prompt)
        window.composer.send_button.click()
        while not all(p.conversation.messages and p.conversation.messages[-1].role == "assistant"
                      and not p.busy for p in workspace.panes):
            await asyncio.sleep(0.05)
        gui_cpu["cpu_s"] = time.thread_time() - cpu0
        gui_cpu["wall_s"] = time.perf_counter() - wall0
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(str(profile))
        streaming = False
        timer.stop()
        if unload:
            await asyncio.sleep(1.0)
            unload_ticks.clear()
            timer.timeout.disconnect(tick)
            timer.timeout.connect(lambda: unload_ticks.append(time.perf_counter()))
            unloading["rss_before_mb"] = resident_mb()
            timer.start()
            await asyncio.sleep(0.2)  # ticks before the unload starts: the gap that spans its start counts
            start = time.perf_counter()
            await workspace.unload_model(workspace.default_model)
            unloading["unload_s"] = time.perf_counter() - start
            await asyncio.sleep(0.5)
            timer.stop()
            unloading["rss_after_mb"] = resident_mb()
            unloading["state"] = workspace.model_state(workspace.default_model)

    unload_ticks: list[float] = []
    unloading: dict[str, Any] = {}
    with loop:
        loop.run_until_complete(scenario())
        replies = []
        code_blocks = highlighted = 0
        for pane in workspace.panes:
            stats = pane.conversation.messages[-1].stats
            replies.append((stats.generated_tokens, stats.ttft_s, stats.elapsed_s))
            view = window.panes[pane.id].messages[len(pane.conversation.messages) - 1]
            blocks = view.body.code_blocks()
            code_blocks += len(blocks)
            highlighted += sum(1 for block in blocks if block.is_highlighted())
        window.hide()
        if session is not None:
            loop.run_until_complete(session.aclose())
    timed = [((b - a) * 1000, a - ticks[0]) for a, b in zip(ticks, ticks[1:])]
    worst_at = max(timed)[1] if timed else None
    gaps = sorted(gap for gap, _ in timed)
    unload_gaps = sorted((b - a) * 1000 for a, b in zip(unload_ticks, unload_ticks[1:]))
    if unloading:
        unloading["worst_gui_gap_ms"] = unload_gaps[-1] if unload_gaps else None
        unloading["ticks"] = len(unload_ticks)
    return {
        "unload": unloading,
        "worst_at_s": worst_at,
        "rate": decode_rate(replies),
        "gaps": gaps,
        "generated": [n for n, _, _ in replies],
        "flushes": sorted(flushes),
        "gui_cpu_s": gui_cpu.get("cpu_s", 0.0),
        "stream_wall_s": gui_cpu.get("wall_s", 0.0),
        "code_blocks": code_blocks,
        "highlighted_blocks": highlighted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--panes", type=int, default=3)
    parser.add_argument("--model", default="default")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="engine CPU threads (default: the engine's policy)")
    parser.add_argument("--store", action="store_true",
                        help="record into a chat store in a temporary folder, as the app does")
    parser.add_argument("--code", action="store_true", help="ask for a Python code block instead of a story")
    parser.add_argument("--no-highlight", action="store_true", help="show fenced code uncoloured")
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile of the GUI thread here")
    parser.add_argument("--unload", action="store_true",
                        help="then unload the model in the window, timing the GUI thread's gaps meanwhile")
    args = parser.parse_args()
    text = CODE_PROMPT if args.code else PROMPT
    if args.no_highlight:
        import ui.panes.markdown_view as markdown_view

        markdown_view.knows_language = lambda _lang: False

    from app.workspace.conversation import Conversation
    from app.settings import Settings
    from engine import Engine, SamplingParams

    settings = Settings(model=args.model, device=args.device, dtype=args.dtype, threads=args.threads)
    settings.default_params = dataclasses.replace(
        SamplingParams(), temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True, seed=None
    )
    engine = Engine(**settings.engine_kwargs())
    # The very prompt each pane sends: same ids, same work, with or without the window.
    prompt = Conversation(system_prompt=settings.default_system_prompt).next_prompt(engine.tokenizer, user_text=text)
    prompts = [prompt] * args.panes
    params = settings.default_params
    engine.generate_outputs([prompt], params=dataclasses.replace(params, max_tokens=8))  # warm-up

    alone_before = run_alone(engine, prompts, params)
    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as folder:
        ui = run_with_window(engine, settings, args.panes, Path(folder) / "chats.sqlite3" if args.store else None,
                             prompt=text, profile=args.profile, unload=args.unload)
    alone_after = alone_before if args.unload else run_alone(engine, prompts, params)
    alone = (alone_before + alone_after) / 2
    gaps = ui["gaps"]
    stats = engine.stats()
    unload = {k: round(v, 3) if isinstance(v, float) else v for k, v in ui["unload"].items()}
    result = {
        "unload": unload or None,
        "worst_gui_gap_ms": round(gaps[-1], 1) if gaps else None,
        "p99_gui_gap_ms": round(gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], 1) if gaps else None,
        "worst_gap_at_s": round(ui["worst_at_s"], 2) if ui["worst_at_s"] is not None else None,
        "p50_gui_gap_ms": round(statistics.median(gaps), 1) if gaps else None,
        "ticks": len(gaps) + 1 if gaps else 0,
        "engine_decode_tok_s_alone": round(alone, 1),
        "engine_decode_tok_s_alone_runs": [round(alone_before, 1)] if args.unload
        else [round(alone_before, 1), round(alone_after, 1)],
        "engine_decode_tok_s_with_ui": round(ui["rate"], 1),
        "ui_cost_pct": round(100 * (1 - ui["rate"] / alone), 1) if alone else None,
        "frame_render_ms_p50": round(statistics.median(ui["flushes"]), 2) if ui["flushes"] else None,
        "frame_render_ms_max": round(ui["flushes"][-1], 2) if ui["flushes"] else None,
        "frames": len(ui["flushes"]),
        "frame_render_ms_mean": round(statistics.fmean(ui["flushes"]), 2) if ui["flushes"] else None,
        # The GUI thread's CPU while streaming, as a share of one core, and per frame.
        "gui_thread_cpu_pct": round(100 * ui["gui_cpu_s"] / ui["stream_wall_s"], 1) if ui["stream_wall_s"] else None,
        "gui_thread_cpu_ms_per_frame": round(1000 * ui["gui_cpu_s"] / len(ui["flushes"]), 2) if ui["flushes"] else None,
        "code": args.code,
        "highlight": not args.no_highlight,
        "code_blocks": ui["code_blocks"],
        "highlighted_code_blocks": ui["highlighted_blocks"],
        "panes": args.panes,
        "new_tokens": args.new_tokens,
        "generated_with_ui": ui["generated"],
        "device": stats.device,
        "dtype": stats.dtype,
        "engine_threads": args.threads,
        "chat_store": args.store,
        "machine": machine(),
        "os_cpus": os.cpu_count(),
    }
    engine.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
