"""The sweep's progress line (``flurka.sweeps.progress``), what a user sees instead of Tune's
trial table unless ``--verbose``: counts, the share of planned steps, an estimate of the rest."""

from __future__ import annotations

import io
import types

from flurka.sweeps import progress
from flurka.sweeps.branching import PlannedRun


def _trial(tid, status, run, step=None):
    return types.SimpleNamespace(trial_id=tid, status=status, config={"run": run},
                                 last_result={} if step is None else {"step": step})


BASE = PlannedRun("baseline", "nmt-small", "linformer", 0, 600, d_k=16).to_dict()
BRANCH = PlannedRun("branch", "nmt-small", "flurka-rnn", 0, 600, d_k=16, alpha=0.75,
                    base="linformer", start_step=450).to_dict()


def test_steps_count_each_run_over_its_own_range():
    assert progress.steps_done(BASE, "RUNNING", 300) == (300, 600)
    assert progress.steps_done(BRANCH, "RUNNING", 500) == (50, 150)    # forked at 450
    assert progress.steps_done(BRANCH, "PENDING", None) == (0, 150)
    assert progress.steps_done(BRANCH, "TERMINATED", 470) == (150, 150)
    stopped_base = PlannedRun("base", "nmt-small", "linformer", 0, 600, stop_step=450).to_dict()
    assert progress.steps_done(stopped_base, "RUNNING", 900) == (450, 450)


def test_the_line_counts_trials_and_estimates_the_rest():
    out, now = io.StringIO(), [1000.0]
    reporter = progress.ProgressLine("first", lambda c: c, every_s=3600, out=out, now=lambda: now[0])
    now[0] += 120                                           # two minutes in
    trials = [_trial("a", "TERMINATED", BASE, 600), _trial("b", "RUNNING", BASE, 300),
              _trial("c", "ERROR", BRANCH, 460), _trial("d", "PENDING", BRANCH)]
    assert reporter.should_report(trials)
    reporter.report(trials, False)
    # 600 + 300 + 10 + 0 of 600 + 600 + 150 + 150 steps: 60.7 %; no rate yet, so no estimate
    assert out.getvalue().splitlines()[-1] == (
        "[flurka] first phase (bases and baselines): 1/4 trials done, 1 running, 1 failed; 61% of its steps; "
        "2:00 elapsed")
    assert not reporter.should_report(trials)               # nothing changed, not due
    assert not reporter.should_report(trials, done=True)    # its last line is already out
    trials[1] = _trial("b", "RUNNING", BASE, 450)
    now[0] += 60
    assert not reporter.should_report(trials)               # steps alone do not print early
    now[0] += 3600 - 60
    assert reporter.should_report(trials)
    reporter.report(trials, False)
    # 150 steps in the hour since steps were first seen: the 440 left take 2:56:00, whatever the
    # phase spent before its first step (not 1:02:00 · 0.70 / 0.30 from the phase's start)
    assert out.getvalue().splitlines()[-1].endswith("71% of its steps; 1:02:00 elapsed, about 2:56:00 left")
    trials[3] = _trial("d", "RUNNING", BRANCH, 460)
    assert not reporter.should_report(trials)               # a trial starting is no line of its own
    trials[1] = _trial("b", "TERMINATED", BASE, 600)
    assert reporter.should_report(trials)


def test_the_estimate_is_the_rate_since_steps_were_first_seen():
    assert progress.time_left(50, 100, None, 10.0) is None             # no steps seen before
    assert progress.time_left(50, 100, (10.0, 50), 20.0) is None       # none since
    assert progress.time_left(100, 100, (10.0, 20), 20.0) is None      # the phase is done
    assert progress.time_left(60, 100, (10.0, 20), 30.0) == 20.0       # 40 steps in 20 s, 40 left
    # a resumed phase's restored steps are not a rate: 80 done at once, then 5 in 10 s
    assert progress.time_left(85, 100, (0.0, 80), 10.0) == 30.0


def test_clock():
    assert [progress.clock(s) for s in (0, 59.6, 61, 3600 + 62)] == ["0:00", "1:00", "1:01",
                                                                       "1:01:02"]


def test_a_trial_that_ended_on_a_corrupt_checkpoint_counts_as_failed():
    """Issue 60: such a trial ends itself (no Tune retry), TERMINATED to Tune, with its reason."""
    out = io.StringIO()
    reporter = progress.ProgressLine("branches", lambda c: c, out=out, now=lambda: 0.0)
    corrupt = _trial("a", "TERMINATED", BRANCH, 450)
    corrupt.last_result["failure"] = "corrupt checkpoint /w/checkpoints/450/meta/metadata: empty (0 bytes)"
    reporter.report([corrupt, _trial("b", "TERMINATED", BRANCH, 600)], True)
    assert "1/2 trials done, 0 running, 1 failed" in out.getvalue()
