"""The CPU thread policy: the adaptive default follows the machine's load,
explicit counts and deterministic mode stay fixed, bad counts are refused.

Step times come from a simulated machine, so these tests check decisions,
never real timings."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from engine.runner.threads import (
    AdaptiveThreads,
    InvalidThreadCount,
    ThreadPolicy,
    thread_policy,
)

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Machine:
    """Seconds a step takes with n threads: quiet, all threads help; beside a
    busy process, the last thread stalls every op."""

    def __init__(self) -> None:
        self.busy = False

    def step_seconds(self, threads: int, tokens: int) -> float:
        base = 0.010 * tokens**0.5
        if self.busy:
            return base * (6.0 if threads == 2 else 1.8)
        return base * (1.0 if threads == 2 else 1.7)


def run(policy: ThreadPolicy, machine: Machine, steps: int, tokens: int = 1) -> list[int]:
    """Threads used by each of `steps` steps of `tokens` tokens."""
    used = []
    for _ in range(steps):
        policy.before_step(tokens)
        used.append(torch.get_num_threads())
        policy.after_step(tokens, machine.step_seconds(torch.get_num_threads(), tokens))
    return used


def test_quiet_machine_keeps_every_core_and_rarely_checks() -> None:
    policy = AdaptiveThreads(2)
    used = run(policy, Machine(), 2000)
    assert used[0] == 2
    # The periodic check backs off: a handful of one-thread steps in 2000.
    assert 0 < used.count(1) <= 15
    assert used[-50:] == [2] * 50


def test_busy_process_moves_to_one_thread_fewer_and_back() -> None:
    machine = Machine()
    policy = AdaptiveThreads(2)
    run(policy, machine, 1000)  # long quiet stretch: checks have backed off
    machine.busy = True
    used = run(policy, machine, 20)
    # A slowdown triggers a check at once instead of waiting for the next one.
    assert used.index(1) <= 4
    # From then on one thread fewer, bar an occasional check of all cores.
    assert used[used.index(1) :].count(2) <= 2
    machine.busy = False
    used = run(policy, machine, 300)
    assert used[-20:] == [2] * 20


def test_each_step_size_learns_on_its_own() -> None:
    machine = Machine()
    policy = AdaptiveThreads(2)
    run(policy, machine, 50, tokens=16)
    machine.busy = True
    run(policy, machine, 30, tokens=1)
    # The 16-token steps have not been measured under load yet: still all cores.
    policy.before_step(16)
    assert torch.get_num_threads() == 2
    policy.before_step(1)
    assert torch.get_num_threads() == 1


def test_single_core_has_nothing_to_choose() -> None:
    policy = AdaptiveThreads(1)
    machine = Machine()
    machine.busy = True
    assert set(run(policy, machine, 100)) == {1}


def test_explicit_count_is_fixed() -> None:
    policy = thread_policy(CPU, 1, deterministic=False)
    assert not isinstance(policy, AdaptiveThreads)
    machine = Machine()
    assert set(run(policy, machine, 50)) == {1}


def test_default_adapts_on_cpu_but_not_in_deterministic_mode_or_on_gpu() -> None:
    assert isinstance(thread_policy(CPU, None, deterministic=False), AdaptiveThreads)
    fixed = thread_policy(CPU, None, deterministic=True)
    assert not isinstance(fixed, AdaptiveThreads)
    assert torch.get_num_threads() == fixed.threads
    assert not isinstance(thread_policy(torch.device("cuda"), None, deterministic=False), AdaptiveThreads)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_thread_count_is_refused_with_a_clear_message(bad: object) -> None:
    with pytest.raises(InvalidThreadCount, match="threads .* at least 1"):
        thread_policy(CPU, bad, deterministic=False)  # type: ignore[arg-type]


class StutteringMachine(Machine):
    """Busy, two threads alternate a normal step and a stalled one, so two
    slow steps never come in a row: only the averages tell."""

    def __init__(self) -> None:
        super().__init__()
        self._flip = False

    def step_seconds(self, threads: int, tokens: int) -> float:
        base = 0.010 * tokens**0.5
        if self.busy and threads == 2:
            self._flip = not self._flip
            return base * (1.0 if self._flip else 9.0)
        return super().step_seconds(threads, tokens)


def test_a_stuttering_busy_machine_is_noticed_without_waiting_for_the_next_check() -> None:
    policy = AdaptiveThreads(2)
    machine = StutteringMachine()
    run(policy, machine, 3000, tokens=16)  # quiet: the check interval has grown to its longest
    machine.busy = True
    used = run(policy, machine, 32, tokens=16)
    # A lucky fast probe may tempt it back to two threads for a step or two.
    assert used[-24:].count(1) >= 18, used


def test_a_load_that_ends_is_noticed_within_seconds_of_long_steps() -> None:
    """Steps of 16 tokens (40 ms quiet on two threads): after a long busy
    stretch the other count's slow measurement is stale within two seconds
    of steps, so all cores come back long before 256 steps (10 s) pass."""
    machine = Machine()
    policy = AdaptiveThreads(2)
    run(policy, machine, 400, tokens=16)
    machine.busy = True
    run(policy, machine, 400, tokens=16)  # on one thread, its checks backed off
    machine.busy = False
    used = run(policy, machine, 120, tokens=16)
    back = used.index(2)
    assert sum(machine.step_seconds(n, 16) for n in used[:back]) <= 2.5
    assert used[-20:] == [2] * 20


@pytest.mark.parametrize("users_setting", [None, "5"])
def test_importing_the_engine_sets_openmp_spin_before_torch_loads(users_setting: str | None) -> None:
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: `import engine`
    sets libgomp's own default spin (it would otherwise throttle it to 100
    spins, the engine's threads owning several pools) before anything
    imports torch; a value the user set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if users_setting is not None:
        env["GOMP_SPINCOUNT"] = users_setting
    code = "import os, sys, engine; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [users_setting or "300000", "False"]
