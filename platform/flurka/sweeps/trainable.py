"""The Tune trainable: one planned run (baseline, base or α branch) through ``flurka.training.run``.

Each planned run owns a work dir under the sweep's run dir (absolute: Tune chdirs trials; on a
multi-node cluster the run dir must be shared storage). flurka.training writes its orbax
checkpoints there and resumes from the latest one by itself, so a trial whose process is killed
is retried by Tune (``FailureConfig.max_failures``) and continues from its last checkpoint, and
an interrupted sweep restored with ``Tuner.restore`` does the same. A run that branches fork
from keeps the checkpoints at its fork steps; the α branches start from them through
``TrainConfig.base_checkpoint``.

One process trains a work dir at a time (an exclusive ``flock`` on ``<work dir>/.lock``, released
by the kernel if the process dies): Optuna draws with replacement, so two trials can be the same
planned run, and two trainings writing one checkpoint directory collide (orbax's "Directory not
empty" on the shared temporary checkpoint). The repeated trial waits, then resumes from the first
one's checkpoints — the same deterministic run — and reports its result.

A damaged checkpoint (the trial's own on a retry or ``--resume``, or the base's that an α branch
forks from) cannot be read on any retry: the trial ends at once, reporting the one-line
:class:`~flurka.training.checkpoints.CorruptCheckpoint` under ``failure`` (no result), rather
than raising: Tune retries every error a trial raises (``FailureConfig`` has no per-error
choice) and logs each one's traceback. The driver records the trial as failed with that reason.

Each training entry's report carries the trial's system metrics (``system/…``: CPU use and resident
set of its process; on a GPU its allocator's bytes in use and, with ``pynvml``, the card's
utilisation), which the driver's MLflow callback logs beside the training metrics; the final
result says where the trial ran and its peak memory (``placement``:
:func:`flurka.sweeps.system_metrics.placement`), which the results database keeps per trial.

A CPU-only trial first pins its process to as many cores of its own as it was given
(``flurka.cluster.cores``): Ray counts CPUs but does not assign them.

With object storage (``--storage s3://…``, :mod:`flurka.cluster.storage`) the work dir is a
staging dir on the trial's node (the run dir's path where the node can create it, else under its
temp dir) mirrored at ``<storage>/work/<key>``: the trial fetches the checkpoints uploaded there
before it starts (a retry or ``--resume`` on any node goes on from them), uploads each new one at
its next report and all at its end, and an α branch fetches its base's fork step first. The
``flock`` then guards one node's staging dir only.

This module is what Tune's workers import (:func:`_trainable`); the driver's MLflow and results
database stay in :mod:`flurka.sweeps.runner`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import ray
from ray import tune

from flurka import training
from flurka.cluster import cores, quiet_termination
from flurka.configs import get_config
from flurka.sweeps.branching import PlannedRun
from flurka.sweeps.system_metrics import Sampler, placement
from flurka.sweeps.trial_report import EVAL_PREFIX, FAILURE_KEY, RESULT_KEY
from flurka.training import compilation
from flurka.training.checkpoints import Checkpointer, CorruptCheckpoint



def work_dir(run_dir: str | os.PathLike, run_key: str) -> Path:
    """Where one planned run's checkpoints live (stable across retries and --resume)."""
    return Path(run_dir) / "work" / run_key.replace("/", "__")


def storage_work_dir(storage: str, run_key: str) -> str:
    """Where one planned run's checkpoints are mirrored in the sweep's object storage."""
    from flurka.cluster.storage import join

    return join(storage, "work", work_dir("", run_key).name)


def train_overrides(run: PlannedRun, spec_overrides: dict[str, Any], *, run_dir: str,
                    steps: int | None, checkpoint_every: int | None) -> dict[str, Any]:
    """The ``get_config`` overrides that make a benchmark config into this planned run
    (:meth:`PlannedRun.overrides`), where it writes and what it starts from.

    Checkpoints (for retries) every ``checkpoint_every`` steps, default T/8; a run branches fork
    from also at each fork step (``checkpoint_steps``, not every gcd of the two, which can be a
    save every few steps)."""
    o = run.overrides(spec_overrides, steps)
    o.update(workdir=str(work_dir(run_dir, run.key)), keep_checkpoints=None if run.fork_steps else 2)
    every = checkpoint_every or max(1, run.steps // 8)
    o["checkpoint_every"] = every
    if run.fork_steps:
        o["checkpoint_steps"] = tuple(run.fork_steps)
    if run.kind == "branch" and run.base_key is not None:
        o["base_checkpoint"] = str(checkpoint_dir(run_dir, run.base_key))
    if run.init_from is not None:    # a chained sweep's fine-tuning run: its pre-training run's work dir
        o["init_from"] = str(work_dir(run_dir, run.init_from))
    return o


def checkpoint_dir(run_dir: str | os.PathLike, run_key: str) -> Path:
    """flurka.training keeps a run's orbax checkpoints in ``<workdir>/checkpoints``."""
    return work_dir(run_dir, run_key) / "checkpoints"


def build_config(trial_config: dict[str, Any]):
    run = PlannedRun.from_dict(trial_config["run"])
    return run, get_config(run.benchmark, **trial_config["train"])


def device_name() -> str:
    d = jax.devices()[0]
    return f"{getattr(d, 'device_kind', d.platform)} x{jax.device_count()}"


@contextlib.contextmanager
def exclusive(workdir: Path) -> Iterator[None]:
    """Hold ``<workdir>/.lock`` exclusively (blocking) for the block."""
    with open(workdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def staged(cfg):
    """``cfg`` with work dirs this node can write: the run dir's paths where it can create them,
    else the same layout under its temp dir (a node without the driver's run-dir path). Only with
    object storage, where the work dir is a node's own staging copy."""
    try:
        Path(cfg.workdir).mkdir(parents=True, exist_ok=True)
        return cfg
    except OSError:
        pass
    run_dir = Path(cfg.workdir).parent.parent
    root = Path(tempfile.gettempdir()) / "flurka-staging" / hashlib.sha1(str(run_dir).encode()).hexdigest()[:12]
    moved = {"workdir": str(root / "work" / Path(cfg.workdir).name)}
    if cfg.base_checkpoint is not None:
        moved["base_checkpoint"] = str(root / "work" / Path(cfg.base_checkpoint).parent.name / "checkpoints")
    if getattr(cfg, "init_from", None) is not None:
        moved["init_from"] = str(root / "work" / Path(cfg.init_from).name)
    Path(moved["workdir"]).mkdir(parents=True, exist_ok=True)
    return cfg.replace(**moved)


def _mirrors(run: PlannedRun, cfg, storage: str | None):
    """With object storage: the run's own mirrored work dir, and what it starts from, as (mirror,
    step) pairs: its base's fork step (an α branch), its pre-training run's latest step (a
    fine-tuning run, ``init_from``; step None). (None, []) without."""
    if storage is None:
        return None, []
    from flurka.cluster.storage import WorkDir

    own = WorkDir(storage_work_dir(storage, run.key), cfg.workdir)
    sources = []
    if cfg.base_checkpoint is not None and run.base_key is not None:
        sources.append((WorkDir(storage_work_dir(storage, run.base_key), Path(cfg.base_checkpoint).parent),
                        cfg.switch_step))
    if getattr(run, "init_from", None) is not None and getattr(cfg, "init_from", None) is not None:
        sources.append((WorkDir(storage_work_dir(storage, run.init_from), cfg.init_from), None))
    return own, sources


class _StopAfterFork(Exception):
    """Raised from the training callback once a base run's last fork checkpoint is written."""


WORKER_SETUP_HOOK = f"{quiet_termination.__module__}.{quiet_termination.__qualname__}"   # for Ray's runtime_env


def resolve(trial_config: dict[str, Any]) -> dict[str, Any]:
    """The planned-run config of a trial (grid: given; Optuna: looked up from its sample)."""
    if "cfg" in trial_config:
        return trial_config["cfg"]
    c = trial_config
    return c["table"][branch_id(c["benchmark"], c["variant"], c["alpha"], c["d_k"], c["seed"])]


def branch_id(benchmark: str, attention: str, alpha: float, d_k: int | None, seed: int) -> str:
    """An α branch's key in an Optuna search's table: what a sample draws (:func:`resolve`)."""
    return f"{benchmark}|{attention}|{alpha:g}|{d_k}|{seed}"


def _trainable(trial_config: dict[str, Any]) -> None:
    """What Tune runs per trial (its name is the one ``Tuner.restore`` checks on ``--resume``)."""
    tune_trainable(resolve(trial_config))


def tune_trainable(trial_config: dict[str, Any]) -> None:
    """Function trainable: trains one planned run, reporting every history and eval entry.

    Its final report says what the trial spent compiling and how much of it the sweep's
    persistent compilation cache (``compilation_cache``, shared by the sweep's trials) served,
    and carries the loop's ``time_split`` (a base run stopped after its last fork too).

    A retried trial (its process was killed) finds its own checkpoints in its work dir and
    flurka.training resumes from the latest one, bit for bit; steps it replays are reported again
    and the driver's MLflow logger skips them.
    """
    quiet_termination()
    assigned = ray.get_runtime_context().get_assigned_resources()
    pinned = None   # before JAX starts its backend: XLA's pool takes these cores
    if not assigned.get("GPU"):
        pinned = cores.pin(int(assigned.get("CPU", 0)))
    run, cfg = build_config(trial_config)
    storage = trial_config.get("storage")   # object storage the work dir is mirrored in, or None
    if storage is not None:
        cfg = staged(cfg)
    Path(cfg.workdir).mkdir(parents=True, exist_ok=True)
    mirror, sources = _mirrors(run, cfg, storage)
    device = device_name()
    sampler = Sampler(jax.devices())
    stop = run.stop_step
    last = {"step": 0}

    def on_entry(kind: str, entry: dict[str, Any]) -> None:
        step = int(entry["step"])
        if stop is not None and kind == "train" and step > stop:
            raise _StopAfterFork  # the checkpoint at `stop` was saved after the previous entry
        values = {k: v for k, v in entry.items() if k != "step" and isinstance(v, (int, float))}
        if kind == "eval":
            values = {f"{EVAL_PREFIX}{k}": v for k, v in values.items()}
        last["step"] = step
        if mirror is not None and kind == "train":
            mirror.push()      # the checkpoint saved since the last report, if any
        system = sampler.sample() if kind == "train" else {}
        tune.report({**values, **system, "step": step, "stream": kind, "device": device})

    start = time.time()
    with exclusive(Path(cfg.workdir)), \
            compilation.accounting(trial_config.get("compilation_cache")) as compiled:
        if mirror is not None:         # what a killed or earlier trial of this run uploaded
            mirror.pull()
        for source, step in sources:   # the base's fork step, the pre-training's latest (here already
            if step is None:           # where that run ran on this node)
                uploaded = source.remote_steps()
                step = uploaded[-1] if uploaded else None
            if step is not None:
                source.pull({step})
        try:
            result = training.run(cfg, callback=on_entry)
        except _StopAfterFork as exc:   # the loop's time split so far rides on the exception
            result = _base_result(run, cfg, last["step"], time.time() - start, getattr(exc, "time_split", None))
        except CorruptCheckpoint as exc:   # no retry can read it: end the trial, saying why
            tune.report({"step": last["step"], "stream": "final", "device": device, FAILURE_KEY: str(exc)})
            return
        finally:
            if mirror is not None:     # every checkpoint it saved, before its result is reported
                mirror.push()
    where = placement(jax.devices(), node_ip=ray.util.get_node_ip_address(),
                      node_id=ray.get_runtime_context().get_node_id())
    tune.report({"step": last["step"], "stream": "final", "device": device,
                 **{f"final_{k}": v for k, v in (result.get("final_metrics") or {}).items()
                    if isinstance(v, (int, float))},
                 RESULT_KEY: json.dumps({**result, "device": device, "placement": where, "compilation": compiled,
                                          "cores": list(pinned) if pinned else None})})


def _base_result(run: PlannedRun, cfg, step: int, wall: float,
                 time_split: dict[str, float] | None = None) -> dict[str, Any]:
    """A stopped base run has no final metrics; its record is the checkpoint it leaves."""
    with Checkpointer(Path(cfg.workdir) / "checkpoints", read_only=True) as ck:
        kept = ck.steps()
        meta = ck.meta(max(kept))
    missing = sorted(set(run.fork_steps) - set(kept))
    if missing:
        raise RuntimeError(f"base run {run.key} lacks fork checkpoints {missing}")
    return {"status": "ok", "benchmark": cfg.benchmark, "attention": cfg.model.attention, "seed": cfg.seed,
            "steps": int(meta["step"]), "final_metrics": {}, "history": meta["history"],
            "eval_history": meta["eval_history"], "train_flops": meta["train_flops"], "wall_time_s": wall,
            "time_split": dict(time_split or meta.get("time_split") or {}),
            "fork_checkpoints": kept, "steps_executed": step, "dataset": meta.get("dataset"),
            "config": meta["config"]}


__all__ = ["tune_trainable", "train_overrides", "work_dir", "checkpoint_dir", "storage_work_dir", "staged",
           "build_config", "resolve"]
