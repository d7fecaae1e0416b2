"""Where a first launch's wait for the model goes, stage by stage.

    .venv/bin/python bench/first_launch.py --fresh   # a first launch: nothing imported or built yet
    .venv/bin/python bench/first_launch.py           # a later launch: the import and the kernels cached

The stages the window's loading thread goes through, in its order, each
timed alone in this one fresh process: importing PyTorch, the rest of the
engine, the native CPU kernels (built by the C compiler on a first launch,
loaded from the cache later), the default model's GGUF import (a first
launch only), then `Engine(...)` with the app's default options, split by
its progress reports into the weights' load and the warm-up step. `--fresh`
points the data folder and the kernel cache at empty temporary folders (the
user's own are untouched). `tandem --smoke-test` reports the same stages as
the app meets them.

Prints one JSON object (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true", help="empty data folder and kernel cache: a first launch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tandem-first-launch-") as scratch:
        if args.fresh:
            os.environ["TANDEM_DATA_DIR"] = str(Path(scratch) / "data")
            os.environ["TANDEM_KERNEL_CACHE"] = str(Path(scratch) / "kernels")
        print(json.dumps(measure(fresh=args.fresh), indent=2))


def measure(*, fresh: bool) -> dict[str, object]:
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = round(now - clock, 2)
        clock = now

    import torch  # noqa: F401  (the stage measured)

    lap("torch_import")
    from engine.llm import Engine

    lap("engine_import")
    from engine.kernels import native

    native.library()
    lap("native_kernels")
    from engine.formats.default_model import resolve_model

    folder = resolve_model("default")
    lap("gguf_import")
    stages: dict[str, float] = {}

    def progress(report: object) -> None:
        stages.setdefault(report.stage, time.perf_counter())  # type: ignore[attr-defined]

    engine = Engine(str(folder), on_progress=progress)
    ready = time.perf_counter()
    weights = stages.get("weights", clock)
    warmup = stages.get("warmup", ready)
    seconds["engine_setup"] = round(weights - clock, 2)  # config, tokenizer, checks before the weights
    seconds["weights_load"] = round(warmup - weights, 2)
    seconds["warm_up"] = round(ready - warmup, 2)
    seconds["total"] = round(sum(seconds.values()), 2)
    weights_kept = engine.stats().weights
    engine.close()

    from bench.common import machine

    return {"fresh": fresh, "seconds": seconds, "weights": weights_kept,
            "kernel_variant": native.loaded_variant(), "machine": machine()}


if __name__ == "__main__":
    main()
