"""Running a sweep: check everything, run the plan on Ray Tune, record it, print the tables.

Order matters: the spec, the results database, the MLflow store and the cluster are all checked
(one line each on failure) before the first trial starts. The plan runs in two Tune experiments
— baselines and base runs, then the α branches that fork from the bases — each restorable with
``Tuner.restore`` (``--resume``). All MLflow writes happen here, in the driver.

Where the time goes (:func:`time_split`, printed last by :func:`summary`, logged to the parent
run): the trials' own split (``flurka.training.loop``: data, setup, compile per phase, training
steps, eval, checkpoints, reports) summed over trials, and the driver's Ray start and MLflow and
results-DB time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import functools
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Tune warns when the driver spends over 0.5 s on a trial's report: ours writes it to MLflow (a
# SQLite commit, which a busy machine can take that long for), so the warning is noise a user can
# do nothing about. Read when ray.tune is first imported: so set before the imports below.
# ruff: noqa: E402
os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "5")

from ray import tune
from ray._private.accelerators import get_accelerator_manager_for_resource   # the GPUs ray.init counts
from ray.tune.schedulers import ASHAScheduler
from sqlalchemy import select

from flurka import cluster, source
from flurka.cluster import storage as object_storage
from flurka.catalogue.metrics import lower_is_better
from flurka.catalogue.mechanisms import base_family
from flurka.configs.base import as_dict, upgraded
from flurka.results import TrialRecord, ingest_sweep, open_results, quality_tables, speed_tables, trial_from_result
from flurka.results.db import probe, redact
from flurka.results.models import SpeedMeasurement
from flurka.results.quality_tables import format_observations
from flurka.results.records import SweepRecord
from flurka.results.retry import db_store
from flurka.results.tables import format_table
from flurka.sweeps.branching import PlannedRun, describe, make_plan
from flurka.sweeps.progress import ProgressLine
from flurka.sweeps.search import FinalMetricOptuna
from flurka.sweeps.spec import (SECRET_FIELDS, SpecError, SweepSpec, benchmark_config, benchmarks_of, mask_url, masked_fields,
                                password_warnings, phase_spec, stored_dict, validate)
from flurka.sweeps.trainable import WORKER_SETUP_HOOK, _trainable, branch_id, build_config, resolve, train_overrides, work_dir
from flurka.sweeps.trainable import storage_work_dir
from flurka.sweeps.trial_report import trial_failure, trial_result
from flurka.tracking.callback import STATUS_TAG, MLflowTrialCallback
from flurka.tracking.mlflow_runs import (BENCHMARK_TAG, SweepTracker, artifact_root_for, git_commit, lineage_tags,
                                         package_versions, trial_run_name)
from flurka.tracking.store import probe_tracking, relocate_artifacts

PHASES = ("first", "branches")  # what branches fork from, then the α branches (Plan.phases)
RECORD = "sweep-record.json"    # the sweep's results as `flurka ingest` reads them, in its run dir


@dataclasses.dataclass
class SweepOutcome:
    sweep_id: str
    run_dir: Path
    mlflow_uri: str
    results_url: str
    compute: dict[str, float]
    results: dict[str, dict[str, Any]]          # planned run key -> training.run result
    failed: list[str]                           # planned run keys without a result
    tables: dict[str, Any]
    parent_run_id: str | None = None
    stopped: list[str] = dataclasses.field(default_factory=list)   # early-stopped (ASHA)
    time_split: dict[str, Any] = dataclasses.field(default_factory=dict)   # see time_split()
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # branch key -> why (unforkable)
    failures: dict[str, str] = dataclasses.field(default_factory=dict)  # failed key -> why, where known


# -- sweep identity (stable across --resume) ----------------------------------------------------

def _stored_state(spec: SweepSpec) -> dict[str, Any]:
    """``--resume``: the run dir's sweep.json, checked before Ray starts. A URL stored masked
    (its password never is) must be given again by its flag: say so, in one line."""
    path = spec.run_path / "sweep.json"
    if not path.exists():
        raise SpecError(f"--resume: no sweep to resume in {spec.run_path} (no sweep.json)")
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"--resume: cannot read {path}: {' '.join(str(exc).split())}") from None
    if not isinstance(state, dict) or "sweep_id" not in state:
        raise SpecError(f"--resume: {path} holds no sweep (no sweep_id)")
    _check_same_spec(spec, state)
    for field in state.get("masked") or ():
        if field in SECRET_FIELDS and getattr(spec, field) is None:
            flag = f"--{field.replace('_', '-')}"
            stored = (state.get("spec") or {}).get(field)
            raise SpecError(f"--resume: the sweep's {flag} {stored} was stored without its password; "
                            f"give {flag} with the full URL again")
    return state


# What a resumed sweep may change: where and how it runs and retries, not what it trains. The
# run dir is where the state was read; a masked URL compares as stored (its password never is).
RESUME_MAY_CHANGE = ("resume", "new", "run_dir", "address", "num_cpus", "max_failures",
                     "compilation_cache", "verbose")


def _overrides_upgraded(part: dict[str, Any]) -> dict[str, Any]:
    """A stored spec (or its ``pretrain`` part) with its overrides in today's layout: a sweep's from
    before the model's settings were nested compares equal given today's keys (configs.upgraded)."""
    out = dict(part)
    if isinstance(out.get("overrides"), dict):
        out["overrides"] = upgraded(out["overrides"])
    if isinstance(out.get("pretrain"), dict):
        out["pretrain"] = _overrides_upgraded(out["pretrain"])
    return out


def _check_same_spec(spec: SweepSpec, state: dict[str, Any]) -> None:
    """``--resume`` continues the stored sweep: a flag or config value that differs from it
    (``--steps 300`` on a 600-step sweep) is an error naming the field and both values."""
    stored = state.get("spec")
    if not isinstance(stored, dict):
        return
    now = json.loads(json.dumps(stored_dict(spec)))   # tuples as the stored lists
    stored = _overrides_upgraded(stored)
    for field, value in now.items():
        if field in RESUME_MAY_CHANGE or field not in stored:
            continue
        if field in (state.get("masked") or ()) and value is None:
            continue                                      # stored without its password: below
        if value != stored[field]:
            raise SpecError(f"--resume: {field} is {value!r} here but the sweep "
                            f"{state['sweep_id']} ran with {stored[field]!r}; resume with the "
                            "sweep's own settings, or start a new sweep in another --run-dir")


_held: dict[Path, int] = {}     # run dir -> the open descriptor whose flock this process holds


def lock_run_dir(run_dir: Path) -> None:
    """One driver per run dir: two at once (two ``--resume``, a ``--new`` beside a running sweep)
    would train every remaining trial twice on two clusters and write one store from both. An
    exclusive ``flock`` on the run dir itself (no file written: a refused command changes
    nothing), held until :func:`unlock_run_dir` or this process ends (the kernel drops it then,
    even on SIGKILL); SpecError naming the holder where another process holds it."""
    key = run_dir.resolve()
    if key in _held:
        return
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise SpecError(f"--run-dir {run_dir}: cannot lock it: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpecError(f"--run-dir {run_dir} is in use by another sweep driver ({lock_holder(run_dir)}): wait "
                        "for it to end, or give another --run-dir") from None
    except OSError as exc:   # a file system without flock on directories (some NFS mounts)
        os.close(fd)
        print(f"[flurka] --run-dir {run_dir}: not locked ({exc.strerror or exc}); run one sweep driver in it "
              "at a time", file=sys.stderr, flush=True)
        return
    _held[key] = fd


def lock_holder(path: Path) -> str:
    """Who holds a flock on ``path``, from the kernel's table (/proc/locks: pid, device, inode):
    "pid N: its command line", cut to 80 characters; "pid unknown" where the table does not say."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        rows = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
        pid = next(r[4] for r in rows if len(r) > 5 and r[1] == "FLOCK" and r[5] == inode)
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, StopIteration):
        return "pid unknown"
    text = f"pid {pid}: {command}" if command else f"pid {pid}"
    return text if len(text) <= 80 else text[:79] + "…"


def unlock_run_dir(run_dir: Path) -> None:
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)     # closing the descriptor releases the flock


def check_fresh_run_dir(spec: SweepSpec) -> Path | None:
    """A new sweep needs a run dir without one: the same command again would make a second
    sweep over the same trials (twice the seeds in every table) and overwrite sweep.json. With
    ``--new`` the old sweep's run dir is moved aside: returns where to (the move is the caller's,
    once every check has passed), else None."""
    if spec.resume and spec.new:
        raise SpecError("--resume continues the run dir's sweep and --new moves it aside: give one")
    path = spec.run_path / "sweep.json"
    if spec.resume or not path.exists():
        return None
    try:
        sweep_id = json.loads(path.read_text()).get("sweep_id", "?")
    except (OSError, ValueError, AttributeError):
        sweep_id = "?"
    if spec.new:
        aside = spec.run_path.with_name(f"{spec.run_path.name}.{sweep_id}")
        if aside.exists():
            raise SpecError(f"--new: {aside} exists already; move it, or give another --run-dir")
        return aside
    raise SpecError(f"--run-dir {spec.run_path} holds sweep {sweep_id} already: add --resume to "
                    "continue it, --new to move it aside and start afresh, or give another --run-dir")


def _sweep_state(spec: SweepSpec) -> dict[str, Any]:
    """The sweep's identity: read back on ``--resume``, else new, written to ``sweep.json``
    (owner-only) with ``stored_dict``'s spec: no password, the masked fields listed."""
    path = spec.run_path / "sweep.json"
    if spec.resume:
        return _stored_state(spec)
    state = {"sweep_id": f"{spec.name}-{dt.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}",
             "created_at": dt.datetime.now(dt.timezone.utc).isoformat(), "spec": stored_dict(spec),
             "masked": masked_fields(spec)}
    spec.run_path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(state, indent=2))
    return state


# -- Tune ---------------------------------------------------------------------------------------

def _trial_configs(runs: tuple[PlannedRun, ...], spec: SweepSpec, run_dir: Path) -> list[dict[str, Any]]:
    phases = {b: phase_spec(spec, b) for b in {r.benchmark for r in runs}}   # a chained sweep's pre-training: its own
    return [{"run": r.to_dict(),
             "train": train_overrides(r, phases[r.benchmark].config_overrides, run_dir=str(run_dir),
                                      steps=phases[r.benchmark].steps, checkpoint_every=spec.checkpoint_every),
             "compilation_cache": spec.compilation_cache_dir,
             **({"storage": spec.storage} if spec.storage else {})}   # the work dirs' mirror (trainable)
            for r in runs]


def _metric_of(spec: SweepSpec, benchmark: str) -> tuple[str, str]:
    metric = benchmark_config(benchmark, spec).metrics[0]
    return metric, ("min" if metric in ("perplexity", "loss") else "max")


def _search(spec: SweepSpec, configs: list[dict[str, Any]], phase: str):
    """param_space and search algorithm: a grid over the planned runs, or Optuna over (α, d_k)
    choosing among the planned branches (so every sample has its base checkpoint)."""
    if phase == "first" or spec.search == "grid":
        space = {"cfg": tune.grid_search(configs)}
        return space, None, 1 if phase == "first" else spec.num_samples
    table = {branch_id(*(c["run"][k] for k in ("benchmark", "attention", "alpha", "d_k", "seed"))): c
             for c in configs}
    space = {"variant": tune.choice(list(spec.variants)), "alpha": tune.choice(list(spec.all_alphas)),
             "d_k": tune.choice(sorted({c["run"]["d_k"] for c in configs})),
             "seed": tune.choice(list(spec.seeds)), "benchmark": tune.choice(list(spec.benchmarks)),
             "table": table}
    metric, mode = _metric_of(spec, spec.benchmarks[0])
    return space, FinalMetricOptuna(metric=f"final_{metric}", mode=mode, seed=0), spec.num_samples


class SweepInterrupted(RuntimeError):
    """Tune stopped before every trial of a phase had run (or the driver was stopped between
    phases); the run dir keeps what finished. ``exit_code``: 143 after SIGTERM, else 130."""

    def __init__(self, what: str, run_dir):
        super().__init__(f"{what}; {run_dir} keeps what finished: run the same command with --resume to continue")
        self.exit_code = 143 if _terminated else 130


_terminated: list[int] = []   # the SIGTERM this driver got, if any (sigterm_as_ctrl_c)


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """SIGTERM (``kill``, a scheduler ending the job) stops the sweep as Ctrl-C does: Tune ends
    the phase and saves its state for ``--resume``, the cluster is shut down, and the exit is 143
    (Ray's own handler, installed by ``ray.init``, dumped a native stack and aborted: 134). Only
    in the main thread, where Python can handle signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        _terminated.append(signum)
        signal.raise_signal(signal.SIGINT)   # Tune's handler (or KeyboardInterrupt between phases)

    _terminated.clear()                      # this sweep's SIGTERM, not an earlier one's in this process
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def check_all_started(results, phase: str, run_dir) -> None:
    """A phase's Tune results (each with ``.config``): :class:`SweepInterrupted` where some
    trial never started (Tune stopped early: Ctrl-C, SIGTERM), which has no config to read."""
    results = list(results)
    unstarted = sum(res.config is None for res in results)
    if unstarted:
        raise SweepInterrupted(f"interrupted in the {phase} phase: {unstarted} of {len(results)} trials never "
                               "started", run_dir)


def _params(cfg: dict[str, Any]) -> dict[str, Any]:
    """MLflow params of a trial: its planned run and the full training config."""
    _, config = build_config(cfg)
    return {"run": cfg["run"], "config": as_dict(config)}


def _tuner(spec: SweepSpec, phase: str, configs: list[dict[str, Any]], storage: Path | str, exp_name: str, callbacks):
    # A reporter of ours (one line) or Tune's classic CLIReporter (--verbose: the trial table);
    # the newer output engine ignores a passed-in reporter.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Train and eval entries carry different metrics; Optuna reads the final report only.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    resources = {"cpu": spec.cpus_per_trial, "gpu": spec.gpus_per_trial}
    trainable = tune.with_resources(_trainable, resources)
    path = f"{str(storage).rstrip('/')}/{exp_name}"   # a run-dir path or an object-storage URI
    if spec.resume and tune.Tuner.can_restore(str(path)):
        print(f"[flurka] restoring {phase} phase from {path}", flush=True)
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=True,
                                  param_space=None)
    space, search_alg, num_samples = _search(spec, configs, phase)
    scheduler = None
    if spec.scheduler == "asha" and phase == "branches":
        # The metric lives on the scheduler: Optuna names its own (final metric), and Tune
        # refuses a metric given both in TuneConfig and in the searcher.
        # max_t one past the last step: ASHA stops a trial whose report reaches max_t, and the
        # trial's last train report (step T) comes before its final report with the result.
        scheduler = ASHAScheduler(metric="loss", mode="min", time_attr="step",
                                  max_t=max(c["run"]["steps"] for c in configs) + 1,
                                  grace_period=max(1, min(c["run"]["steps"] for c in configs) // 4))
    reporter = (tune.CLIReporter(metric_columns={"step": "step", "loss": "loss"},
                                 parameter_columns={"cfg/run/kind": "kind"},
                                 max_report_frequency=15, print_intermediate_tables=True)
                if spec.verbose else ProgressLine(phase, resolve))
    return tune.Tuner(
        trainable, param_space=space,
        # reuse_actors: a worker process runs trial after trial, so flurka.training's cache of
        # compiled steps is hit by every later trial of the same program (no recompiling per trial).
        tune_config=tune.TuneConfig(num_samples=num_samples, search_alg=search_alg, scheduler=scheduler,
                                    reuse_actors=True, trial_name_creator=functools.partial(
                                        _trial_name, several=len(benchmarks_of(spec)) > 1),
                                    trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(
            name=exp_name, storage_path=str(storage), callbacks=callbacks, progress_reporter=reporter,
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2), verbose=1))


def _run_name(cfg: dict[str, Any], several: bool) -> str:
    """The name Tune's progress table and MLflow show for a planned-run config: what differs
    first, the benchmark too when the sweep has ``several``. The run's key stays the identifier."""
    return trial_run_name(cfg["run"], benchmark=several)


def _trial_name(trial, several: bool = False) -> str:
    return _run_name(resolve(trial.config), several)[:120]


def _trial_dirname(trial) -> str:
    return f"{trial.trial_id}"


# -- records, tables ----------------------------------------------------------------------------

def _environment(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The trials' devices and nodes (each trial's own are on its row); the driver's host where no
    trial says (results from before trials recorded their node), the driver's package versions."""
    devices = sorted({r.get("device", "unknown") for r in results.values()}) or ["unknown"]
    nodes = sorted({(r.get("placement") or {}).get("node") for r in results.values()} - {None})
    return {"device": ", ".join(devices)[:255], "host": ", ".join(nodes)[:255] or socket.gethostname(),
            "versions": package_versions()}


def best_trials(results: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Benchmark -> the key of its finished trial with the best final task metric (the config's
    first metric; lower is better for perplexity and loss): the model a sweep logs for loading."""
    best: dict[str, tuple[float, str]] = {}
    for key, result in results.items():
        config = result.get("config") or {}
        metric = (config.get("metrics") or [None])[0]
        value = (result.get("final_metrics") or {}).get(metric)
        if runs[key]["kind"] == "base" or result.get("status", "ok") != "ok" or value is None:
            continue
        score = -float(value) if lower_is_better(metric) else float(value)
        benchmark = runs[key]["benchmark"]
        if benchmark not in best or score > best[benchmark][0]:
            best[benchmark] = (score, key)
    return {b: key for b, (_, key) in sorted(best.items())}


def unforkable(plan, results: dict[str, dict[str, Any]], failed: list[str],
               stopped: list[str], failures: Mapping[str, str] | None = None) -> dict[str, str]:
    """Branch key -> why it cannot fork from its base: the base failed, was stopped early, or
    diverged at or before the branch's fork step (no checkpoint there). Such branches are not
    launched (they would fail on a missing checkpoint, and say nothing of why)."""
    out = {}
    for branch in (plan.branches if plan is not None else ()):
        base = branch.base_key
        if base is None:
            continue
        result = results.get(base)
        if base in failed:
            why = (failures or {}).get(base)
            out[branch.key] = f"base {base} failed" + (f": {why}" if why else "")
        elif base in stopped or result is None:
            out[branch.key] = f"base {base} stopped early"
        elif result.get("status", "ok") != "ok" and int(result.get("steps") or 0) <= branch.start_step:
            out[branch.key] = f"base {base} {result['status']}"
    return out


def _unfinished_record(run, status: str, run_dir: Path | None = None):
    """The results-DB record of a planned trial that has no result (failed, stopped, skipped):
    what it was to train, its status, no metrics. A status past the column's 255 characters
    names paths under ``run_dir`` relative to it first (a corrupt checkpoint's file)."""
    if len(status) > 255 and run_dir is not None:
        status = status.replace(f"{run_dir}{os.sep}", "")
    return TrialRecord(trial_key=run.key, attention=run.attention, benchmark=run.benchmark,
                       seed=run.seed, status=status[:255], steps=0, alpha=run.alpha,
                       base=base_family(run.base) if run.base else None, d_k=run.d_k, init_from=run.init_from)


def unpretrained(plan, results: dict[str, dict[str, Any]], failed: list[str],
                 stopped: list[str]) -> dict[str, str]:
    """A chained sweep's fine-tuning run key -> why it cannot start: the pre-training run it starts
    from failed, was stopped, diverged or is missing. Such runs are not launched."""
    out = {}
    for run in plan.baselines + plan.branches if plan.pretrain is not None else ():
        source, result = run.init_from, results.get(run.init_from)
        if source in failed:
            out[run.key] = f"its pre-training run {source} failed"
        elif source in stopped or result is None:
            out[run.key] = f"its pre-training run {source} did not finish"
        elif result.get("status", "ok") != "ok":
            out[run.key] = f"its pre-training run {source} {result['status']}"
    return out


def _report_unpretrained(not_started: Mapping[str, str], plan) -> None:
    """One line per pre-training run whose fine-tuning runs are not started."""
    by_why: dict[str, list[str]] = {}
    for run in plan.baselines + plan.branches:
        if run.key in not_started:
            by_why.setdefault(not_started[run.key], []).append(run.benchmark)
    for why, benchmarks in by_why.items():
        print(f"[flurka] not started: {len(benchmarks)} fine-tuning run(s) ({', '.join(benchmarks)}): {why}",
              file=sys.stderr, flush=True)


def _with_lineage(record, run: Mapping[str, Any]):
    """A chained sweep's fine-tuning record says the α and base of the pre-training it started
    from (its own run trains its mechanism throughout, so its config has α 0)."""
    if run.get("init_from") and run.get("alpha") is not None:
        return dataclasses.replace(record, alpha=run["alpha"],
                                   base=base_family(run["base"]) if run["alpha"] > 0 and run.get("base") else None)
    return record


def _log_skipped(tracker, plan, skipped: dict[str, str], spec: SweepSpec, run_dir: Path,
                 name_of) -> None:
    """Each skipped branch as its own MLflow run: KILLED, tagged ``flurka.status`` with the
    reason (the sweep planned it; the runs table shows why it has no curve)."""
    runs = [r for r in plan.runs if r.key in skipped]
    for cfg in _trial_configs(tuple(runs), spec, run_dir):
        run = cfg["run"]
        run_id = tracker.trial_run(run["key"], run["kind"], _params(cfg), name=name_of(cfg),
                                   tags={BENCHMARK_TAG: run["benchmark"], **lineage_tags(run)})
        tracker.set_tags(run_id, {STATUS_TAG: f"skipped: {skipped[run['key']]}"})
        tracker.finish_trial(run_id, None, status="KILLED")


def _report_failures(failures: Mapping[str, str], name_of) -> None:
    """Each reason trials failed on (a corrupt checkpoint: no retry can help), one line for all
    the trials it failed (the α branches of one damaged base checkpoint)."""
    by_reason: dict[str, list[str]] = {}
    for key, why in failures.items():
        by_reason.setdefault(why, []).append(name_of(key))
    for why, names in by_reason.items():
        print(f"[flurka] {why}; not retried, failed: {', '.join(names)}", file=sys.stderr, flush=True)


def _suffix(reported: tuple[str, ...], metric: str) -> str:
    """A table's name after ``uptraining_<bench>``: "" for the benchmark's first reported metric,
    "_<metric>" for the others and the eval loss (``_loss``)."""
    return "" if metric == reported[0] else f"_{metric}"


TABLE_SUFFIXES = ("", "_exact_match", "_loss")   # the order summary prints a benchmark's tables in


def _tables(engine, spec: SweepSpec, sweep_id: str) -> dict[str, Any]:
    """Per benchmark, up-training (Table 5 shape: per variant, base and d_k, mean ± CI over seeds)
    on each reported metric (``uptraining_<bench>`` for the first, ``uptraining_<bench>_<metric>``
    for the others: exact match beside BLEU) and on the eval loss (``uptraining_<bench>_loss``),
    with Table 5's observations on each (``observations_<bench>...``); a quality table over the
    sweep's benchmarks and their reported metrics; and the speed table if the database holds speed
    measurements (a sweep's own database holds none: then no table and no line about it)."""
    out: dict[str, Any] = {}
    columns = []
    for bench in benchmarks_of(spec):
        reported = benchmark_config(bench, spec).reported_metrics
        columns += [(f"{bench}: {quality_tables.metric_label(m, bench)}", bench, m) for m in reported]
        for m in (*reported, "loss"):
            suffix = _suffix(reported, m)
            try:
                out[f"uptraining_{bench}{suffix}"] = quality_tables.uptraining_table(engine, benchmark=bench, metric=m,
                                                                        sweep=sweep_id)
                out[f"observations_{bench}{suffix}"] = quality_tables.uptraining_observations(engine, benchmark=bench, metric=m,
                                                                                 sweep=sweep_id)
            except Exception as exc:  # NoResults: nothing ok to show
                print(f"[flurka] no up-training table for {bench} ({m}): {exc}", file=sys.stderr)
    with engine.connect() as conn:
        measured = conn.execute(select(SpeedMeasurement.id).limit(1)).first() is not None
    for name, fn in [("quality", lambda: quality_tables.metric_table(engine, columns, sweep=sweep_id)),
                     *([("speed", lambda: speed_tables.speed_table(engine))] if measured else [])]:
        try:
            out[name] = fn()
        except Exception as exc:
            print(f"[flurka] no {name} table: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                  file=sys.stderr)
    return out


# -- where the time goes ------------------------------------------------------------------------

TRIAL_PARTS = ("data", "setup", "compile", "train_steps", "eval", "checkpoints", "report", "other")
DRIVER_PARTS = ("ray_start", "mlflow", "results_db")
TRAIN_STEPS_TARGET = 0.8   # the share of the trials' wall time the main job aims to spend in training steps


@contextlib.contextmanager
def _timed(driver: dict[str, float], part: str):
    t = time.perf_counter()
    try:
        yield
    finally:
        driver[part] = driver.get(part, 0.0) + time.perf_counter() - t


def _order(part: str) -> tuple:
    """TRIAL_PARTS' order (``compile/<phase>`` under compile); parts it lacks just before "other"."""
    head = part.split("/")[0]
    return TRIAL_PARTS.index(head) if head in TRIAL_PARTS else len(TRIAL_PARTS) - 1.5, part


def time_split(results: dict[str, dict[str, Any]], driver: dict[str, float]) -> dict[str, Any]:
    """The main job's wall time by part: each trial's ``time_split`` summed over the trials with a
    result (``compile/<phase>`` kept apart; ``other``: their wall time that no part covers, e.g. a
    stopped base run's trainable), the share in training steps, and the driver's parts
    (``ray_start``, ``mlflow``, ``results_db``, ``wall``: seconds from Ray's start to the end)."""
    parts: dict[str, float] = {}
    wall = 0.0
    for r in results.values():
        wall += float(r.get("wall_time_s") or 0.0)
        for k, v in (r.get("time_split") or {}).items():
            parts[k] = parts.get(k, 0.0) + float(v)
    parts["other"] = max(0.0, wall - sum(parts.values()))
    return {"trials": len(results), "trials_wall_s": wall,
            "parts": {k: parts[k] for k in sorted(parts, key=_order)},
            "train_steps_share": parts.get("train_steps", 0.0) / wall if wall > 0 else 0.0,
            "driver": {k: float(driver.get(k, 0.0)) for k in (*DRIVER_PARTS, "wall")}}


def format_time_split(split: dict[str, Any]) -> str:
    """``time_split``'s block: seconds and share per part, then the training-steps share."""
    wall, driver = split["trials_wall_s"], split["driver"]

    def row(name: str, seconds: float, of: float) -> str:
        return f"  {name:<34} {seconds:9.1f} s  " + (f"{100 * seconds / of:5.1f} %" if of > 0 else "    –")

    lines = [f"Time split (trial parts summed over {split['trials']} trials, % of their {wall:.1f} s wall time; "
             f"driver parts, % of the driver's {driver['wall']:.1f} s):"]
    lines += [row(k, v, wall) for k, v in split["parts"].items()]
    lines += [row(f"driver: {k}", driver[k], driver["wall"]) for k in DRIVER_PARTS]
    met = "met" if split["train_steps_share"] >= TRAIN_STEPS_TARGET else "not met"
    lines.append(f"Training steps: {100 * split['train_steps_share']:.1f} % of the trials' wall time "
                 f"(target ≥ {100 * TRAIN_STEPS_TARGET:.0f} %: {met}).")
    return "\n".join(lines)


def _log_time_split(tracker, split: dict[str, Any]) -> None:
    """The split on the parent run: ``time/<part>_s`` metrics and ``time_split.json``."""
    name = lambda k: re.sub(r"[^\w./\- ]", "_", k)  # noqa: E731  (MLflow's metric-name characters)
    tracker.log_sweep_metrics({**{f"time/{name(k)}_s": v for k, v in split["parts"].items()},
                               **{f"time/driver_{k}_s": v for k, v in split["driver"].items()},
                               "time/trials_wall_s": split["trials_wall_s"],
                               "time/train_steps_share": split["train_steps_share"]})
    tracker.log_sweep_dict(split, "time_split.json")


# -- the sweep ----------------------------------------------------------------------------------

def check_stores(spec: SweepSpec) -> None:
    """The results DB and the MLflow store can be opened, creating nothing: an existing SQLite
    file must be a database (read-only look), a server must answer (a few seconds). Raises
    DatabaseUnreachable (one line, no password)."""
    probe(spec.results_url, will_create=spec.run_path)
    probe_tracking(spec.mlflow_tracking_uri, will_create=spec.run_path)
    if spec.storage is not None:
        object_storage.probe(spec.storage)
        _check_storage_sweep(spec)


STORAGE_STATE = "sweep.json"   # in --storage: which sweep its tune/ and work/ belong to


def _check_storage_sweep(spec: SweepSpec) -> None:
    """``--storage`` holds one sweep, as a run dir does: its ``work/<key>`` checkpoints would
    otherwise be taken up by a new sweep's trials of the same keys (resumed, not trained). A new
    sweep needs a prefix without one; ``--resume`` the one its run dir records."""
    stored = object_storage.read_json(object_storage.join(spec.storage, STORAGE_STATE))
    if not isinstance(stored, dict):
        return
    other = stored.get("sweep_id", "?")
    if not spec.resume:
        raise SpecError(f"--storage {spec.storage} holds sweep {other} already: add --resume (in its run dir) to "
                        "continue it, or give another --storage prefix")
    try:
        mine = json.loads((spec.run_path / "sweep.json").read_text()).get("sweep_id")
    except (OSError, ValueError, AttributeError):
        mine = None
    if mine is not None and mine != other:
        raise SpecError(f"--resume: --storage {spec.storage} holds sweep {other}, not this run dir's {mine}; "
                        "give the sweep's own --storage")


@contextlib.contextmanager
def _model_dir(spec: SweepSpec, run_dir: Path, key: str):
    """A trial's work dir to log its model from: its run-dir path, or with ``--storage`` its latest
    uploaded checkpoint fetched into a temporary dir (the trial ran on whichever node)."""
    if spec.storage is None:
        yield work_dir(run_dir, key)
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="flurka-model-") as tmp:
        local = work_dir(tmp, key)
        mirror = object_storage.WorkDir(storage_work_dir(spec.storage, key), local)
        steps = mirror.remote_steps()
        if steps:
            mirror.pull({steps[-1]})
        yield local


def _storage_env(spec: SweepSpec) -> dict[str, str]:
    """The storage settings the driver forwards to the workers (endpoint, region; no key), but
    those the job's own runtime env names (Ray refuses a variable named twice)."""
    if spec.storage is None:
        return {}
    job = cluster.job_runtime_env().get("env_vars") or {}
    return {k: v for k, v in object_storage.forwarded_env().items() if k not in job}


def preflight(spec: SweepSpec):
    """Everything that can fail without running a trial, in the order that creates nothing until
    all has passed (the spec, its paths, a resumed sweep's state, the plan, the stores); then the
    run dir and the migrated results DB. Returns (spec, plan, engine), the run dir locked
    (:func:`lock_run_dir`) until the sweep ends."""
    spec = validate(spec)
    if spec.run_path.is_dir():
        lock_run_dir(spec.run_path)   # before reading its state: another driver may be writing it
    try:
        return _checked(spec)
    except BaseException:
        unlock_run_dir(spec.run_path)
        raise


def _check_embedded_resources(spec: SweepSpec) -> None:
    """A trial must fit the embedded Ray, whose size is known before it starts: its CPUs
    (``--num-cpus`` or this machine's) and the GPUs Ray would detect (its own accelerator
    manager, what ``ray.init`` asks). Refused as a connected cluster is
    (:func:`flurka.cluster.check_resources`), but before Ray starts; a real cluster's size is
    known once connected."""
    if (spec.address or os.environ.get("RAY_ADDRESS") or "local") != "local":
        return
    gpus = get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators()
    resources = {"CPU": float(spec.num_cpus or os.cpu_count() or 1), "GPU": float(gpus)}
    cluster.check_resources(resources, cpus_per_trial=spec.cpus_per_trial, gpus_per_trial=spec.gpus_per_trial)


def _checked(spec: SweepSpec):
    _check_embedded_resources(spec)
    aside = check_fresh_run_dir(spec)
    if spec.resume:
        _stored_state(spec)
    plan = make_plan(spec)
    check_stores(spec)
    if aside is not None:
        spec.run_path.rename(aside)
        unlock_run_dir(spec.run_path)  # the lock went aside with the old sweep
        print(f"[flurka] --new: moved the previous sweep to {aside}", flush=True)
    try:  # what check_paths cannot see (root on a pseudo file system, a race)
        spec.run_path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--run-dir {spec.run_path}: cannot create it: {exc.strerror or exc}") from None
    lock_run_dir(spec.run_path)
    engine = open_results(spec.results_url)
    return spec, plan, engine


def open_tracking(spec: SweepSpec, sweep_id: str, ray_address: str):
    """The sweep's MLflow tracker and parent run (created, or found again on ``--resume``); its
    params ``spec.*`` are ``stored_dict``'s: passwords masked. Returns (tracker, parent run id)."""
    uri = spec.mlflow_tracking_uri
    if uri.startswith("sqlite:///") and Path(uri.removeprefix("sqlite:///")).is_file():
        moved = relocate_artifacts(Path(uri.removeprefix("sqlite:///")))   # a resume in a moved run dir
        if moved:
            print(f"[flurka] {moved}", flush=True)
    tracker = SweepTracker(spec.mlflow_tracking_uri, spec.name, sweep_id,
                           artifact_root=artifact_root_for(spec.mlflow_tracking_uri, spec.run_path))
    parent = tracker.start_sweep(sweep_id, {**stored_dict(spec), "ray_address": mask_url(ray_address)})
    return tracker, parent


def _forget(spec: SweepSpec, engine, created: bool) -> None:
    """The cluster refused the sweep before any trial: unlock the run dir and, if this sweep made
    it, remove it, so nothing is left that a plain rerun would refuse as a started sweep."""
    unlock_run_dir(spec.run_path)
    if created:
        engine.dispose()
        shutil.rmtree(spec.run_path, ignore_errors=True)


def run_sweep(spec: SweepSpec) -> SweepOutcome:
    created = not spec.run_path.exists()   # removed again if the cluster refuses the sweep
    spec, plan, engine = preflight(spec)
    for line in password_warnings(spec):      # after the checks: bad input stays one line
        print(f"flurka sweep: {line}", file=sys.stderr, flush=True)
    not_submitted = source.mismatch(cluster.job_runtime_env())
    if not_submitted:
        print(f"flurka sweep: warning: {not_submitted}", file=sys.stderr, flush=True)
    t0, driver = time.perf_counter(), {}
    try:
        with _timed(driver, "ray_start"):
            ctx = cluster.connect(spec.address, run_dir=spec.run_path, num_cpus=spec.num_cpus,
                                  env_vars={**cluster.worker_env(spec.gpus_per_trial), **_storage_env(spec)},
                                  setup_hook=WORKER_SETUP_HOOK)
    except BaseException:
        _forget(spec, engine, created)
        raise
    tracker = None
    signals = contextlib.ExitStack()
    signals.enter_context(sigterm_as_ctrl_c())    # after ray.init, which installs a handler of its own
    refused = True
    try:
        cluster.check_resources(ctx.resources, cpus_per_trial=spec.cpus_per_trial,
                                gpus_per_trial=spec.gpus_per_trial)
        if spec.storage is None:
            cluster.check_shared_dir(spec.run_path, embedded=ctx.embedded)   # forks read <run-dir>/work on any node
        else:   # the nodes share the object storage instead: each must reach it
            object_storage.check_nodes(spec.storage, embedded=ctx.embedded)
        refused = False
        state = _sweep_state(spec)
        sweep_id = state["sweep_id"]
        if spec.storage is not None:
            object_storage.write_json(object_storage.join(spec.storage, STORAGE_STATE),
                                      {"sweep_id": sweep_id, "name": spec.name, "created_at": state["created_at"]})
        run_dir = spec.run_path
        print(f"[flurka] sweep {sweep_id}: {describe(plan)}", flush=True)
        compute = plan.compute()
        with _timed(driver, "mlflow"):
            tracker, parent = open_tracking(spec, sweep_id, ctx.address)
            tracker.log_sweep_metrics(compute)
            planned_runs = [r.to_dict() for r in plan.runs]
            tracker.color_runs(planned_runs)
            tracker.log_sweep_dict({"plan": planned_runs, "compute": compute}, "plan.json")
        storage = object_storage.join(spec.storage, "tune") if spec.storage else run_dir / "tune"
        results: dict[str, dict[str, Any]] = {}
        runs: dict[str, dict[str, Any]] = {}
        failed: list[str] = []
        failures: dict[str, str] = {}   # failed key -> the reason its trial reported
        stopped: list[str] = []
        skipped: dict[str, str] = {}
        name_of = functools.partial(_run_name, several=len(benchmarks_of(spec)) > 1)
        stages = plan.stages(baselines_beside_branches=spec.search == "grid" and spec.scheduler == "none",
                             workers=cluster.concurrent_trials(ctx.resources, spec.cpus_per_trial,
                                                               spec.gpus_per_trial))
        for phase, planned in stages:   # (a chained sweep: pretrain, pretrain-branches, then these two)
            if phase in ("branches", "pretrain-branches", "first"):
                newly = {}
                if phase != "first":
                    newly = unforkable(plan if phase == "branches" else plan.pretrain, results, failed, stopped,
                                       failures)
                elif plan.pretrain is not None:   # fine-tuning starts: each from its pre-training run
                    newly = unpretrained(plan, results, failed, stopped)
                    _report_unpretrained(newly, plan)
                skipped.update(newly)
                # (a resumed sweep whose first phase ran every baseline does not run them twice)
                done = {*skipped, *results, *failed, *stopped}
                planned = tuple(r for r in planned if r.key not in done)
                with _timed(driver, "mlflow"):
                    _log_skipped(tracker, plan, newly, spec, run_dir, name_of)
            if not planned:
                continue
            configs = _trial_configs(planned, spec, run_dir)
            callback = MLflowTrialCallback(tracker, resolve, params_of=_params, name_of=name_of)
            grid = _tuner(spec, phase, configs, storage, f"{sweep_id}-{phase}",
                          [callback]).fit()  # Tune appends to the list: fresh each time
            # its MLflow writes, between the trials' results (a restored Tuner uses its own pickled one)
            driver["mlflow"] += callback.seconds
            check_all_started(grid, phase, spec.run_path)
            if _terminated:   # every trial had started: Tune stopped those running, to resume
                raise SweepInterrupted(f"terminated in the {phase} phase", spec.run_path)
            with _timed(driver, "mlflow"):   # writes an MLflow outage held back; a restored phase's gaps
                callback.settle(grid)
            reported = {}
            for res in grid:
                cfg = resolve(res.config)
                key = cfg["run"]["key"]
                runs[key] = cfg["run"]
                out = trial_result(res.metrics)
                if out is not None:
                    results[key] = out
                elif trial_failure(res.metrics) is not None:   # ended itself, not retried (corrupt checkpoint)
                    failed.append(key)
                    reported[key] = failures[key] = trial_failure(res.metrics)
                elif res.error is not None:
                    failed.append(key)
                else:
                    stopped.append(key)  # early-stopped by ASHA
            _report_failures(reported, lambda key: name_of({"run": runs[key]}))
        trials = [_with_lineage(trial_from_result(k, r, init_from=runs[k].get("init_from")), runs[k])
                  for k, r in results.items() if runs[k]["kind"] != "base"]
        trials += [_unfinished_record(r, ("failed" + (f": {failures[r.key]}" if r.key in failures else ""))
                                      if r.key in failed else "stopped early", run_dir)
                   for r in plan.runs if r.kind != "base" and (r.key in failed or r.key in stopped)]
        trials += [_unfinished_record(r, (f"not started: {skipped[r.key]}" if r.init_from else
                                          f"skipped: {skipped[r.key]}"), run_dir)
                   for r in plan.runs if r.key in skipped]
        with _timed(driver, "results_db"):
            record = SweepRecord.from_dict({
                "sweep_id": sweep_id, "name": spec.name, "created_at": state["created_at"],
                "git_commit": _commit(), "environment": _environment(results), "trials": trials})
            write_record(record, run_dir / RECORD)      # first: kept if the database stays unreachable
            if spec.storage is not None:                # beside the sweep's checkpoints too
                object_storage.write_json(object_storage.join(spec.storage, RECORD), record.to_dict())
            report = db_store(engine).call(ingest_sweep, engine, record)   # retried through a restart
            print(f"[flurka] results DB: {report.added} trials added, {report.skipped} already there", flush=True)
            tables = _tables(engine, spec, sweep_id)
        with _timed(driver, "mlflow"):
            tracker.log_tables(tables)
            tracker.describe(result_markdown(tables, sweep_id))
            for benchmark, key in best_trials(results, runs).items():
                with _model_dir(spec, run_dir, key) as model_dir:
                    tracker.log_model(key, model_dir, benchmark)
        driver["wall"] = time.perf_counter() - t0
        split = time_split(results, driver)
        _log_time_split(tracker, split)
        tracker.end_sweep("FINISHED" if not failed else "FAILED")
        return SweepOutcome(sweep_id, run_dir, spec.mlflow_tracking_uri, spec.results_url, compute, results,
                            failed, tables, parent, stopped, split, skipped, failures)
    except KeyboardInterrupt:   # between Tune's phases (inside one, Tune takes the signal itself)
        if tracker is not None:
            tracker.end_sweep("KILLED")
        raise SweepInterrupted("terminated" if _terminated else "interrupted", spec.run_path) from None
    except BaseException:
        if tracker is not None:
            tracker.end_sweep("KILLED")
        raise
    finally:
        signals.close()
        ctx.close()
        if refused:
            _forget(spec, engine, created)
        else:
            unlock_run_dir(spec.run_path)


def write_record(record, path: Path) -> None:
    """The sweep's results as a file: what it ingested into its results database, which ``flurka
    ingest`` loads into another (a results DB elsewhere, or evidence committed beside the code).
    Written whole or not at all."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record.to_dict(), indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def _commit() -> str | None:
    c = git_commit()
    return None if c == "unknown" else c


def result_parts(tables: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The sweep's result in the order it is shown: per up-training benchmark its task-metric
    tables and eval loss table (``("table", df)``), then Table 5's observations on each
    (``("observations", df)``), then the quality table. :func:`summary` prints them and
    :func:`result_markdown` writes them as the parent MLflow run's description."""
    def bench_of(name: str) -> str:
        name = name.removeprefix("uptraining_")
        return next((name.removesuffix(s) for s in TABLE_SUFFIXES if s and name.endswith(s)), name)

    parts: list[tuple[str, Any]] = []
    for bench in dict.fromkeys(bench_of(n) for n in tables if n.startswith("uptraining_")):
        parts += [("table", tables[f"uptraining_{bench}{s}"]) for s in TABLE_SUFFIXES
                  if f"uptraining_{bench}{s}" in tables]
        parts += [("observations", tables[f"observations_{bench}{s}"]) for s in TABLE_SUFFIXES
                  if f"observations_{bench}{s}" in tables]
    if "quality" in tables:
        parts.append(("table", tables["quality"]))
    return parts


def _title(df) -> str:
    return df.attrs.get("title", "Quality (mean ± 95 % CI over seeds, n)")


def result_markdown(tables: Mapping[str, Any], sweep_id: str) -> list[str]:
    """The result as Markdown blocks (each title, table, note and observations its own), for the
    MLflow UI's run and experiment descriptions, which render them."""
    blocks = [f"**Sweep {sweep_id}**: the terminal's result; the per-row tables behind the observations: "
              "`flurka tables`; the figures: the `report` artifacts (`flurka report`)."]
    for kind, df in result_parts(tables):
        if kind == "observations":
            blocks.append(format_observations(df, table=False))
            continue
        blocks += [f"**{_title(df)}**", format_table(df).rstrip("\n")]
        if df.attrs.get("note"):
            blocks.append(f"*{df.attrs['note']}*")
    return blocks


def summary(outcome: SweepOutcome, verbose: bool = False) -> str:
    """What a sweep prints at its end: :func:`result_parts` (the observations as their lines;
    ``flurka tables`` adds the per-row table behind them), then the trials' count, and last where
    the results are and the commands that show them (``verbose``: the time split before them; it
    is on the parent MLflow run either way)."""
    lines = []
    for kind, df in result_parts(outcome.tables):
        if kind == "observations":
            lines += ["", format_observations(df, table=False)]
        else:
            lines += ["\n" + _title(df) + ":", format_table(df) + (f"{df.attrs['note']}\n" if df.attrs.get("note") else "")]
    c = outcome.compute
    lines += [
        f"\nTrials: {len(outcome.results)} finished, {len(outcome.stopped)} stopped early, "
        f"{len(outcome.failed)} failed{': ' + ', '.join(outcome.failed) if outcome.failed else ''}"
        + (f", {len(outcome.skipped)} skipped (their base cannot be forked: "
           f"{'; '.join(sorted(set(outcome.skipped.values())))})" if outcome.skipped else "")
        + f"; the α branches forked from their bases trained {c['uptrain_steps_executed']} steps, "
          f"{c['uptrain_steps_independent']} trained each from scratch.",
    ]
    if verbose and outcome.time_split:
        lines += ["", format_time_split(outcome.time_split)]
    lines += ["", *next_commands(outcome)]
    return "\n".join(lines)


def next_commands(outcome: SweepOutcome) -> list[str]:
    """Where a sweep's results are and the commands that show them, a line each."""
    db = redact(outcome.results_url)
    default_ui = outcome.mlflow_uri == f"sqlite:///{Path(outcome.run_dir) / 'mlflow.db'}"
    if default_ui:
        ui = f"flurka ui --run-dir {outcome.run_dir}"
    elif outcome.mlflow_uri.startswith(("http://", "https://")):
        ui = f"{mask_url(outcome.mlflow_uri)} (a tracking server: open it in a browser)"
    else:
        ui = f"flurka ui --backend-store-uri {mask_url(outcome.mlflow_uri)}"
    return [f"Sweep {outcome.sweep_id}, run dir {outcome.run_dir}:",
            f"  MLflow runs:    {ui}",
            f"  paper tables:   flurka tables --db {db} --table uptraining",
            f"  HTML report:    flurka report --db {db} --out {Path(outcome.run_dir) / 'report'}",
            f"  results record: {Path(outcome.run_dir) / RECORD} (flurka ingest --db URL FILE)"]


__all__ = ["run_sweep", "preflight", "check_stores", "open_tracking", "summary", "resolve", "SweepOutcome", "PHASES",
           "time_split", "format_time_split"]
