"""Shared bits of the benchmarks: prompts, the machine a figure was taken on,
and the memory-read limit of a one-sequence decode step.

Every bench prints `machine()` beside its figures (the CPU's model and the
flags that decide which kernels run, the threads used, torch, the load
average), and `machine_line()` is the same in one line for a human reader.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import time
from functools import lru_cache
from pathlib import Path

import engine  # noqa: F401  (first: it sets libgomp's spin before torch loads it)
import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
    "Give me three tips for better sleep.",
    "Explain recursion to a child.",
    "Name a fruit that is yellow.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def chat_prompts(count: int) -> list[list[dict[str, str]]]:
    # A number in each prompt keeps them distinct, so no run is a prefix-cache hit of another.
    return [chat(f"{PROMPTS[i % len(PROMPTS)]} ({i})") for i in range(count)]


# The CPU flags that decide which kernels run (ours, llama.cpp's, oneDNN's):
# x86 vector widths and int8/bf16 dot products, AMX, and their Arm counterparts.
RELEVANT_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve", "i8mm",
)


def parse_cpuinfo(text: str) -> dict[str, object]:
    """The model name and flags of the first processor in a /proc/cpuinfo text
    (x86's "model name" and "flags", Arm's "Hardware"/"CPU part" and "Features")."""
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Hardware") and not name:
            name = re.sub(r"\s+", " ", value.strip())
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return {
        "model": name,
        "flags": [f for f in RELEVANT_FLAGS if f in flags],
        "all_flags": sorted(flags),
    }


@lru_cache(maxsize=1)
def cpu_description() -> dict[str, object]:
    """This machine's CPU: /proc/cpuinfo where there is one, else the platform's processor string."""
    try:
        info = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        info = {"model": "", "flags": [], "all_flags": []}
    info["model"] = info["model"] or platform.processor() or platform.machine()
    return info


def usable_cores() -> int:
    """The cores this process may run on (its affinity), which can be fewer than the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, where the system reports them."""
    if not hasattr(os, "getloadavg"):
        return None
    return [round(x, 2) for x in os.getloadavg()]


def machine(threads: int | None = None) -> dict[str, object]:
    """What a figure was measured on. `threads`: the CPU threads the bench
    used, where it fixed them (default: this process's torch thread count)."""
    cpu = cpu_description()
    return {
        "cpu": cpu["model"],
        "cpu_flags": cpu["flags"],
        "torch": torch.__version__,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "cores": usable_cores(),
        "load_average": load_average(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def machine_line(info: dict[str, object] | None = None) -> str:
    """`machine()` in one line: "AMD EPYC (avx2 avx512f ...), 2 threads of 2 cores, torch 2.13.0, load 1.2 0.9 0.8"."""
    info = info or machine()
    load = info.get("load_average")
    line = (
        f"{info['cpu']} ({' '.join(info['cpu_flags']) or 'no listed vector flags'}), "  # type: ignore[arg-type]
        f"{info['threads']} threads of {info['cores']} cores, torch {info['torch']}, "
        f"load average {' '.join(map(str, load)) if load else 'n/a'}"  # type: ignore[arg-type]
    )
    return line + (f", GPU {info['cuda']}" if info.get("cuda") else "")


def _busy_cpu_seconds() -> float | None:
    """CPU time spent not idle on the whole machine since boot (all cores), from /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    # user nice system idle iowait irq softirq steal ...
    ticks = [int(x) for x in first[1:9]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class OtherLoad:
    """How many cores other programs kept busy while a bench ran (this
    process and the children it waited for subtracted): a busier neighbour
    than the load average shows, measured over exactly the run.

        with OtherLoad() as other:
            run()
        other.cores  # e.g. 0.05 on a quiet machine, 1.3 beside a test run
    """

    def __enter__(self) -> "OtherLoad":
        self.cores: float | None = None
        self.load_before = load_average()
        self._start = (time.monotonic(), _busy_cpu_seconds(), _own_cpu_seconds())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, busy0, own0 = self._start
        busy1 = _busy_cpu_seconds()
        wall = time.monotonic() - wall0
        if busy0 is not None and busy1 is not None and wall > 0:
            self.cores = round(max(0.0, (busy1 - busy0) - (_own_cpu_seconds() - own0)) / wall, 2)
        self.load_after = load_average()

    def summary(self) -> dict[str, object]:
        return {"other_busy_cores": self.cores, "load_average_before": self.load_before,
                "load_average_after": self.load_after}


def read_bandwidth_gbs(threads: int, gib: float = 1.0, repeats: int = 5) -> float:
    """This machine's memory read bandwidth in GB/s: the best of `repeats`
    sums over a float32 tensor of `gib` GiB (far larger than any cache) on
    `threads` threads. A decode step of one sequence reads every weight once,
    so this over the bytes of the weights bounds its tokens per second."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        data = torch.ones(int(gib * (1 << 30)) // 4)
        data.sum()  # pages touched, threads started
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
        return round(data.numel() * 4 / best / 1e9, 2)
    finally:
        torch.set_num_threads(previous)


def gguf_bytes_per_token(path: Path) -> int:
    """The bytes of a GGUF model's weights that one decoded token reads: every
    tensor once, except a token embedding that has its own output matrix
    (then only its one row is read, which is negligible). With tied
    embeddings the embedding is the LM head and is read whole."""
    from engine.formats.gguf.reader import read_gguf_header

    tensors = read_gguf_header(path, long_arrays=False).tensors
    untied = "output.weight" in tensors
    return sum(t.nbytes for name, t in tensors.items() if not (untied and name == "token_embd.weight"))
