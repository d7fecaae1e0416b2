"""How many CPU threads the engine's torch ops use, step by step.

Why not simply one thread per core (PyTorch's default): ATen and oneDNN
split every op statically over their OpenMP threads, and each op ends at a
barrier. On a desktop the engine shares its cores with the GUI and whatever
else the user runs; when another process keeps one core busy, one of our
threads is descheduled at almost every barrier and the whole op waits a
scheduler time slice for it. Measured on a 2-core machine beside one busy
process (`bench/contention.py`, figures in docs/benchmarks.md): one thread
per core fell to 0.15-0.29x of its quiet decode speed, while one thread fewer
than the cores kept about half of the quiet speed. Quiet, though, the extra
thread is worth ~1.5-1.7x at small batches. No fixed count is right for both,
and neither is OpenMP's passive wait policy (it helps under load but costs
~40% quiet, and must be set before torch loads its OpenMP runtime).

So the default measures instead of guessing: `AdaptiveThreads` keeps, per
step size, the recent time of a step with each candidate count (all cores,
and one fewer), runs the current best, and now and then runs one step with
the other count to see whether the machine has changed. A step that takes
much longer than usual (another program just got busy) triggers that check
at once; on one thread fewer, so does a measurement of all cores older than
two seconds of steps (a busy program that stopped). Quiet, the checks back
off to one step in 256, which costs well under 1% of throughput.

`Engine(threads=N)` (CLI `--threads N`) fixes the count instead, and the
deterministic mode fixes it too: a GEMM library may split a product's
reduction differently over another thread count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from engine.errors import EngineError

THREADS_HELP = (
    "CPU threads for the model (default: adapts between one per core and one fewer, "
    "whichever runs faster at the moment, so a busy machine does not stall generation)"
)

# Explore the other thread count after this many steps of one size at first,
# doubling up to _MAX_INTERVAL while the choice keeps winning.
_MIN_INTERVAL = 8
_MAX_INTERVAL = 256
# A step this much slower than its recent average means the machine changed.
_SLOWDOWN = 1.6
# On one thread fewer, all cores' measurement goes stale after this many
# seconds of steps: check it again then, however long the step-count interval
# has grown. A load that ended is found within seconds even where 256 steps
# take ten (B=16 at ~20 steps/s), for one step on all cores in that time.
_STALE_S = 2.0
# The other count must be this much faster to take over (noise margin).
_MARGIN = 0.9
_EWMA = 0.3


def available_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class InvalidThreadCount(EngineError, ValueError):
    """An explicit CPU thread count that cannot be used."""


def check_threads(threads: int | None) -> None:
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidThreadCount(
            f"threads (CPU threads for the model) must be a whole number of at least 1, "
            f"got {threads!r}; leave it unset to let the engine choose"
        )


class ThreadPolicy:
    """A fixed thread count; the base of the adaptive one."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        torch.set_num_threads(threads)

    def before_step(self, num_tokens: int) -> None:
        """Called on the engine thread before each forward."""

    def after_step(self, num_tokens: int, seconds: float) -> None:
        """Called after each forward with its wall time."""

    def describe(self) -> str:
        return f"{self.threads} thread(s), fixed"


@dataclass(slots=True)
class _SizeStats:
    """What one step size (a power-of-two bucket of tokens) has seen."""

    choice: int
    seconds: dict[int, float] = field(default_factory=dict)  # recent step time per count
    since_check: int = 0
    seconds_since_check: float = 0.0
    interval: int = _MIN_INTERVAL
    slow_steps: int = 0
    exploring: int | None = None


class AdaptiveThreads(ThreadPolicy):
    """Chooses between `cores` and `cores - 1` threads from measured step times."""

    def __init__(self, cores: int) -> None:
        super().__init__(cores)
        self.candidates = (cores, cores - 1) if cores > 1 else (1,)
        self._sizes: dict[int, _SizeStats] = {}
        self._current = cores

    def before_step(self, num_tokens: int) -> None:
        if len(self.candidates) == 1:
            return
        stats = self._stats(num_tokens)
        wanted = stats.choice
        other = next(c for c in self.candidates if c != stats.choice)
        # A step size seen for the first time tries the other count after two
        # steps: a request of a new size should not run long on a bad guess.
        due = stats.interval if other in stats.seconds else 2
        # The current count has become slower than the other one was when last
        # measured: the machine changed under a long check interval (a busy
        # process started); look again now rather than after up to 256 steps.
        overtaken = (
            stats.choice in stats.seconds
            and other in stats.seconds
            and _MARGIN * stats.seconds[stats.choice] > stats.seconds[other]
        )
        # Only on the smaller count: there the other's figure is likely from a
        # load that may have ended; on all cores, a slowdown shows by itself.
        stale = (
            stats.choice != self.candidates[0]
            and other in stats.seconds
            and stats.seconds_since_check >= _STALE_S
        )
        if stats.choice in stats.seconds and (
            stats.since_check >= due or stats.slow_steps >= 2 or overtaken or stale
        ):
            wanted = other
            stats.exploring = wanted
        self._set(wanted)

    def after_step(self, num_tokens: int, seconds: float) -> None:
        if len(self.candidates) == 1:
            return
        stats = self._stats(num_tokens)
        used = self._current
        if stats.exploring is not None:
            stats.exploring = None
            stats.seconds[used] = seconds
            stats.since_check = 0
            stats.seconds_since_check = 0.0
            stats.slow_steps = 0
            if seconds < _MARGIN * stats.seconds[stats.choice]:
                stats.choice = used
                stats.interval = _MIN_INTERVAL
            else:
                stats.interval = min(2 * stats.interval, _MAX_INTERVAL)
            return
        previous = stats.seconds.get(used)
        if previous is None:
            stats.seconds[used] = seconds
        else:
            stats.slow_steps = stats.slow_steps + 1 if seconds > _SLOWDOWN * previous else 0
            stats.seconds[used] = (1 - _EWMA) * previous + _EWMA * seconds
        stats.since_check += 1
        stats.seconds_since_check += seconds

    def describe(self) -> str:
        return f"adaptive between {' and '.join(map(str, self.candidates))} threads"

    def _stats(self, num_tokens: int) -> _SizeStats:
        bucket = max(1, num_tokens).bit_length()
        stats = self._sizes.get(bucket)
        if stats is None:
            stats = self._sizes[bucket] = _SizeStats(choice=self.candidates[0])
        return stats

    def _set(self, threads: int) -> None:
        if threads != self._current:
            torch.set_num_threads(threads)
            self._current = threads
        self.threads = threads


def thread_policy(
    device: torch.device, threads: int | None, deterministic: bool
) -> ThreadPolicy:
    """The policy for an engine: fixed when asked for (or when the model runs
    on a GPU, where the CPU threads only feed it, or in deterministic mode),
    else adaptive. Call on the engine thread, before loading the model."""
    check_threads(threads)
    if threads is not None:
        return ThreadPolicy(threads)
    cores = available_cores()
    if device.type != "cpu" or deterministic:
        return ThreadPolicy(cores)
    return AdaptiveThreads(cores)
