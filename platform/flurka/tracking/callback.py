"""A Tune callback, run in the sweep's driver, that mirrors trials into MLflow.

Tune calls it in the driver process for every result a trial reports, so all MLflow writes
come from one process however many trials (and nodes) there are. The trial's planned run
(``config["run"]``) identifies its nested MLflow run by key and names it
(:func:`~flurka.tracking.mlflow_runs.trial_run_name`); a retried or restored trial lands in the
same nested run and replays no step twice.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any, Callable

from ray.tune import Callback
from ray.tune.result import AUTO_RESULT_KEYS

from flurka.tracking.mlflow_runs import BENCHMARK_TAG, SweepTracker, trial_run_name

RESULT_KEY = "result_json"          # the trainable's final report carries training.run's result
EVAL_PREFIX = "eval_"               # the trainable reports an evaluation's metrics to Tune as eval_<name>
_SKIP = set(AUTO_RESULT_KEYS) | {"done", "trial_id", "experiment_tag", "step", "should_checkpoint", "stream",
                                 "iterations_since_restore", "time_since_restore", "warmup_time", "device"}


def trial_result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """training.run's result dict from a trial's last reported metrics (None if it never finished)."""
    if not result or not result.get(RESULT_KEY):
        return None
    return json.loads(result[RESULT_KEY])


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

    def _run_id(self, trial) -> str:
        cfg = self.resolve(trial.config)
        run = cfg["run"]
        if run["key"] in self.tracker._runs:
            return self.tracker._runs[run["key"]]
        return self.tracker.trial_run(run["key"], run["kind"], self.params_of(cfg), name=self.name_of(cfg),
                                      tags={BENCHMARK_TAG: run["benchmark"]})

    @_timed
    def on_trial_start(self, iteration, trials, trial, **info):
        self._run_id(trial)

    @_timed
    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self._run_id(trial)
        step, stream = result.get("step"), result.get("stream")
        if step is None or stream not in ("train", "eval"):
            return
        metrics = {k: v for k, v in result.items() if k not in _SKIP and k != RESULT_KEY}
        if stream == "eval":  # back to training's own names: the tracker names the streams
            metrics = {k.removeprefix(EVAL_PREFIX): v for k, v in metrics.items()}
        logged = self.tracker.log_step(run_id, int(step), metrics, int(result.get("timestamp", time.time()) * 1000),
                                       stream=stream)
        if logged and isinstance(result.get("device"), str):
            self.tracker.set_tags(run_id, {"device": result["device"]})

    @_timed
    def on_trial_complete(self, iteration, trials, trial, **info):
        res = trial_result(trial.last_result)
        extra = {"device": trial.last_result.get("device")} if trial.last_result.get("device") else None
        status = "FINISHED" if res is not None else "FAILED"
        self.tracker.finish_trial(self._run_id(trial), res, status=status, extra_params=extra)

    @_timed
    def on_trial_error(self, iteration, trials, trial, **info):
        # Only called once Tune has given up on the trial (retries exhausted).
        self.tracker.finish_trial(self._run_id(trial), None, status="FAILED")


__all__ = ["MLflowTrialCallback", "trial_result", "RESULT_KEY", "EVAL_PREFIX"]
