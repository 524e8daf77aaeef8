"""A Tune callback, run in the sweep's driver, that mirrors trials into MLflow.

Tune calls it in the driver process for every result a trial reports, so all MLflow writes
come from one process however many trials (and nodes) there are. The trial's planned run
(``config["run"]``) identifies its nested MLflow run by key and names it
(:func:`~flurka.tracking.mlflow_runs.trial_run_name`); a retried or restored trial lands in the
same nested run and replays no step twice. A trial that ended on a failure it reported (a corrupt
checkpoint: :func:`flurka.sweeps.trial_report.trial_failure`) is FAILED with the reason in its ``flurka.status`` tag.

An MLflow server that restarts mid-sweep costs nothing: each write is retried through the outage
(:mod:`flurka.tracking.retrying`); one that outlasts the retry budget never stops the sweep —
the hook's writes wait, in order, and are written once the server answers again (before any
later write, so no step is skipped), at the latest by :meth:`MLflowTrialCallback.settle` after
the phase, which also logs from Tune's results whatever a trial's run still lacks (what
``--resume`` relies on: it settles every trial of a restored phase).
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Callable

from ray.tune import Callback
from ray.tune.result import AUTO_RESULT_KEYS

from flurka.results.retry import StoreUnavailable
from flurka.sweeps.trial_report import EVAL_PREFIX, RESULT_KEY, trial_failure, trial_result
from flurka.tracking.mlflow_runs import BENCHMARK_TAG, SweepTracker, lineage_tags, trial_run_name

STATUS_TAG = "flurka.status"        # a trial's reason for having no result (failed: …, skipped: …)
_SKIP = set(AUTO_RESULT_KEYS) | {"done", "trial_id", "experiment_tag", "step", "should_checkpoint", "stream",
                                 "iterations_since_restore", "time_since_restore", "warmup_time", "device"}


def _timed(method):
    """Add the method's seconds to ``self.seconds`` (the driver's MLflow writes, for the sweep's time split)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        t = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t
    return wrapper


class MLflowTrialCallback(Callback):
    seconds = 0.0   # (also for a callback unpickled from a sweep started before it was counted)

    def __init__(self, tracker: SweepTracker, resolve: Callable[[dict], dict] = lambda c: c,
                 params_of: Callable[[dict], dict] = lambda c: c,
                 name_of: Callable[[dict], str] = lambda c: trial_run_name(c["run"])):
        self.tracker = tracker
        self.resolve = resolve      # trial config -> {"run": planned run, "train": config overrides}
        self.params_of = params_of  # that -> the params to log (full training config)
        self.name_of = name_of      # that -> the nested run's name
        self.seconds = 0.0          # spent in the hooks below (MLflow writes)
        self.pending: list = []     # hooks' writes waiting for the MLflow server: (method, args)

    def _write(self, method, *args) -> None:
        """``method(*args)``: a hook's writes, after those still waiting; if the server stays
        unreachable past the retry budget, they wait too (the sweep goes on)."""
        pending = getattr(self, "pending", None)
        if pending is None:         # a callback unpickled from a sweep started before it waited
            pending = self.pending = []
        pending.append((method, args))
        while pending:
            m, a = pending[0]
            try:
                m(*a)
            except StoreUnavailable:
                return
            pending.pop(0)

    def _run_id(self, trial) -> str:
        cfg = self.resolve(trial.config)
        run = cfg["run"]
        if run["key"] in self.tracker._runs:
            return self.tracker._runs[run["key"]]
        return self.tracker.trial_run(run["key"], run["kind"], self.params_of(cfg), name=self.name_of(cfg),
                                      tags={BENCHMARK_TAG: run["benchmark"], **lineage_tags(run)})

    @_timed
    def on_trial_start(self, iteration, trials, trial, **info):
        self._write(self._run_id, trial)

    @_timed
    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._write(self._log_result, trial, result)

    def _log_result(self, trial, result) -> None:
        run_id = self._run_id(trial)
        step, stream = result.get("step"), result.get("stream")
        if step is None or stream not in ("train", "eval"):
            return
        metrics = {k: v for k, v in result.items() if k not in _SKIP and k != RESULT_KEY}
        if stream == "eval":  # back to training's own names: the tracker names the streams
            metrics = {k.removeprefix(EVAL_PREFIX): v for k, v in metrics.items()}
        logged = self.tracker.log_step(run_id, int(step), metrics, int(result.get("timestamp", time.time()) * 1000),
                                       stream=stream)
        if logged and isinstance(result.get("device"), str):   # where it runs, beside what it runs on
            self.tracker.set_tags(run_id, {"device": result["device"],
                                           **({"node": result["hostname"]} if result.get("hostname") else {})})

    @_timed
    def on_trial_complete(self, iteration, trials, trial, **info):
        self._write(self._complete, trial, dict(trial.last_result or {}))

    def _complete(self, trial, last_result: dict) -> None:
        res = trial_result(last_result)
        extra = {"device": last_result.get("device")} if last_result.get("device") else None
        status = "FINISHED" if res is not None else "FAILED"
        failure = trial_failure(last_result) if res is None else None
        if failure:
            self.tracker.set_tags(self._run_id(trial), {STATUS_TAG: f"failed: {failure}"})
        self.tracker.finish_trial(self._run_id(trial), res, status=status, extra_params=extra)

    @_timed
    def on_trial_error(self, iteration, trials, trial, **info):
        # Only called once Tune has given up on the trial (retries exhausted).
        self._write(self._failed, trial)

    def _failed(self, trial) -> None:
        self.tracker.finish_trial(self._run_id(trial), None, status="FAILED")

    def settle(self, results) -> int:
        """After a phase (``results``: its ``ResultGrid``): the writes still waiting, then, for each
        trial whose run is not finished in MLflow, its run, history, result and status from Tune's
        result, as the hooks would have written them — what a phase restored by ``--resume``
        (whose hooks ran in an earlier driver, or in Tune's own copy of this callback) may lack.
        Returns how many writes could not be made (the server still unreachable: said in one
        line; the same command with ``--resume`` makes them later)."""
        for res in results:
            trial = _Settled(res.config)
            if self._run_key(trial) in self._finished_keys():
                continue
            if res.error is not None and trial_result(res.metrics) is None and trial_failure(res.metrics) is None:
                self._write(self._failed, trial)
            else:
                self._write(self._complete, trial, dict(res.metrics or {}))
        left = len(getattr(self, "pending", []))
        if left:
            print(f"[flurka] {self.tracker.store.what}: still unreachable, {left} MLflow writes of this phase not "
                  "made; when it is back, run the same command with --resume to make them", file=sys.stderr,
                  flush=True)
            self.pending = []
        return left

    def _run_key(self, trial) -> str:
        return self.resolve(trial.config)["run"]["key"]

    def _finished_keys(self) -> set[str]:
        return {key for key, run_id in self.tracker._runs.items() if run_id in self.tracker._finished}


class _Settled:
    """A trial as :meth:`MLflowTrialCallback.settle` hands it to the hooks' writes: its config."""

    def __init__(self, config: dict):
        self.config = config


__all__ = ["MLflowTrialCallback", "STATUS_TAG"]
