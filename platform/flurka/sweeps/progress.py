"""One progress line per sweep phase instead of Tune's trial table (``--verbose`` keeps the
table): trials done / running / failed, the share of the phase's planned steps done, elapsed
time and an estimate of the rest, printed when a trial finishes or fails and at most every
``every_s`` seconds otherwise.

    [flurka] first phase (bases and baselines): 4/6 trials done, 2 running, 0 failed; 71 % of its steps; 3:12 elapsed, about 1:18 left
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from ray.tune import ProgressReporter

from flurka.sweeps.branching import PlannedRun
from flurka.sweeps.trial_report import trial_failure

_FAILED = ("ERROR",)
_DONE = ("TERMINATED",)


def clock(seconds: float) -> str:
    """m:ss (h:mm:ss past an hour)."""
    seconds = int(round(max(seconds, 0.0)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def steps_done(run: dict[str, Any], status: str, last_step: Any) -> tuple[int, int]:
    """(steps done, steps planned) of one planned run (a :class:`PlannedRun` as a dict): its
    executed steps; a finished trial counts whole, a running one up to its last reported step."""
    planned_run = PlannedRun.from_dict(run)
    planned = max(planned_run.executed_steps, 0)
    if status in _DONE:
        return planned, planned
    done = int(last_step) - planned_run.start_step if isinstance(last_step, (int, float)) else 0
    return min(max(done, 0), planned), planned


def time_left(done: int, planned: int, since: tuple[float, int] | None, now: float) -> float | None:
    """Seconds the phase's remaining steps take at the rate measured since ``since`` (the time and
    the steps done when steps were first seen), None until there is a rate. Not from the phase's
    start: its first half-minute is trials starting and compiling, which would put the estimate
    many times too high, and a resumed phase starts with the steps it restored."""
    if since is None or not 0 < done < planned or done <= since[1] or now <= since[0]:
        return None
    return (planned - done) * (now - since[0]) / (done - since[1])


# What each phase trains, as the progress line names it (Plan.phases: the bases, with baselines
# filling idle workers; then the α branches, with the rest of the baselines beside them).
TRAINS = {"first": "bases", "branches": "α branches"}


def line(phase: str, counts: dict[str, int], done: int, planned: int, elapsed: float,
         left: float | None = None) -> str:
    share = done / planned if planned else 0.0
    rest = f", about {clock(left)} left" if left is not None else ""
    trains = f" ({TRAINS[phase]} and baselines)" if phase in TRAINS else ""
    return (f"[flurka] {phase} phase{trains}: {counts['done']}/{counts['total']} trials done, "
            f"{counts['running']} running, {counts['failed']} failed; {share:.0%} of its steps; "
            f"{clock(elapsed)} elapsed{rest}")


class ProgressLine(ProgressReporter):
    """Tune's reporter hook: :func:`line` for ``phase``; ``resolve`` maps a trial's config to the
    sweep's trial config (its ``run``: the planned run)."""

    def __init__(self, phase: str, resolve: Callable[[dict], dict], every_s: float = 30.0,
                 out=None, now: Callable[[], float] = time.monotonic):
        self.phase, self.resolve, self.every_s, self.now = phase, resolve, every_s, now
        self.out = out   # None: sys.stdout when printing (Tune pickles its reporter)
        self.start = now()
        self.last_print = 0.0
        self.last_state: tuple | None = None
        self.since: tuple[float, int] | None = None   # (time, steps done) when steps were first seen

    def setup(self, start_time=None, total_samples=None, metric=None, mode=None, **kwargs):
        self.start, self.since = self.now(), None

    def _state(self, trials) -> tuple:
        """What a line is printed for at once: trials finishing or failing. A trial starting is not
        (they start in twos and threes, one line each, within a second)."""
        return tuple(sorted((t.trial_id, t.status) for t in trials if t.status in _DONE + _FAILED))

    def should_report(self, trials, done: bool = False) -> bool:
        if self._state(trials) != self.last_state:
            return True
        return not done and self.now() - self.last_print >= self.every_s

    def report(self, trials, done: bool, *sys_info: str) -> None:
        counts = {"total": len(trials), "done": 0, "running": 0, "failed": 0}
        steps = planned = 0
        for t in trials:
            # a trial that ended on a failure it reported (a corrupt checkpoint) is done to Tune
            failed = t.status in _FAILED or (t.status in _DONE and trial_failure(t.last_result) is not None)
            counts["done"] += t.status in _DONE and not failed
            counts["running"] += t.status == "RUNNING"
            counts["failed"] += failed
            d, p = steps_done(self.resolve(t.config)["run"], t.status,
                              (t.last_result or {}).get("step"))
            steps, planned = steps + d, planned + p
        now = self.now()
        if self.since is None and steps:
            self.since = (now, steps)
        print(line(self.phase, counts, steps, planned, now - self.start,
                   time_left(steps, planned, self.since, now)),
              file=self.out or sys.stdout, flush=True)
        self.last_print, self.last_state = now, self._state(trials)
