"""The training loop: ``train(config) -> result dict`` (flax examples style, NNX functional API).

* Jitted train step: a pure function of flat ``params``/``other`` dicts, the optax state, the
  batch and a per-step key (dropout key = fold_in(key(seed), step)); batch k is a pure function
  of (seed, k) (data contract). Together these make a resumed run reproduce an uninterrupted one
  bit for bit.
* Periodic evaluation over the eval split (padding examples weighted 0), metrics per task.
* Orbax checkpoints every ``checkpoint_every`` steps under ``workdir/checkpoints``; a run whose
  workdir holds checkpoints resumes from the latest one.
* FLOPs: every history entry carries the cumulative training FLOPs (forward + backward by the
  attention FLOP model's convention, :mod:`flurka.training.flops`) so runs compare at equal compute.
* A non-finite loss ends the run with status ``"diverged at step k"``; history so far is kept.
* Up-training: stages from :func:`flurka.training.uptrain.stages`; at the switch the state is
  carried into the FLuRKA model, whose first ``handover_steps`` steps run hand-over layers that
  blend base and variant with a traced β ramp (recorded as ``handover_beta`` in history and as
  ``handover`` in the switch entry); ``base_checkpoint`` starts right at the switch from another
  run's checkpoint (forking many FLuRKA branches from one base run).
* Time split: the run's wall time by part (``time_split`` in the result, carried by checkpoints
  like ``wall_time_s``): ``data`` (loading, batches; with ``prefetch``, the wait for the next one),
  ``setup`` (models, optimizer, switches),
  ``compile/<phase>`` (each phase's first step in this process, waited for: trace + compile, a
  load from JAX's persistent cache, or nothing for a step this process has compiled already, +
  its run), ``train_steps`` (the other steps; async dispatch moves a step's device time to the
  next fetch of its metrics, every ``log_every`` steps), ``eval`` (its first call compiles),
  ``checkpoints`` (restores, saves) and ``report`` (the callback: a sweep's reports to Tune).
  Consecutive laps, so the parts sum to the wall time.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from flurka.attention.base import cast_floating

from flurka.configs.base import CURVE_POINT, TrainConfig, as_dict, from_dict, validate
from flurka.data import get_dataset
from flurka.data.core import split_metric
from flurka.models import build_model as build_network
from flurka.training import flops as flops_lib
from flurka.training import memory
from flurka.training import parallel
from flurka.training import state as state_lib
from flurka.training import uptrain
from flurka.training.checkpoints import Checkpointer
from flurka.training.metrics import bleu, exact_match
from flurka.training.optimizer import make_optimizer
from flurka.training.schedules import from_config as schedule_from_config
from flurka.training import init_from
from flurka.training.tasks import Task, make_task

# Fields that must agree between a base checkpoint's run and the run forking from it: these, and
# the model's except its mechanism and how it runs (_FORK_FREE_MODEL_FIELDS).
_FORK_FIELDS = ("dataset", "task", "max_len", "learning_rate", "schedule", "warmup_steps", "weight_decay",
                "grad_clip", "b1", "b2", "eps", "label_smoothing", "batch_size", "steps", "seed",
                "dataset_options")
_FORK_FREE_MODEL_FIELDS = ("attention", "attention_options", "remat", "fused_ffn")


class Diverged(Exception):
    def __init__(self, step: int):
        super().__init__(f"diverged at step {step}")
        self.step = step


class Stopped(Exception):
    """The run stopped between two steps because ``stop`` was set (a signal the caller took),
    after checkpointing that step where the run has a work dir; ``saved`` says whether it did."""

    def __init__(self, step: int, saved: bool):
        super().__init__(f"stopped at step {step}")
        self.step, self.saved = step, saved


# ------------------------------------------------------------------------------------------------
# Model / data set-up
# ------------------------------------------------------------------------------------------------
def load_dataset(config: TrainConfig):
    return get_dataset(config.dataset, seed=config.seed, data_dir=config.data_dir,
                       **dict(config.dataset_options))


def check_against_data(config: TrainConfig, info) -> None:
    """Config/data mismatches, as one-line errors before anything is compiled."""
    if info.task != config.task:
        raise ValueError(f"benchmark {config.benchmark!r} expects task {config.task!r} but dataset "
                         f"{config.dataset!r} is {info.task!r}")
    if config.task != "image" and info.max_len != config.max_len:
        raise ValueError(f"config max_len={config.max_len} but dataset {config.dataset!r} has "
                         f"max_len={info.max_len}; set max_len={info.max_len}")
    if config.model.pooling == "cls" and config.task in ("classification", "regression") and info.cls_id is None:
        raise ValueError(f"pooling='cls' but dataset {config.dataset!r} has no [CLS] token; use pooling='mean'")


def build_model(config: TrainConfig, info, attention: str,
                handover_from: str | None = None) -> nnx.Module:
    """The benchmark's model with ``attention``; parameters drawn from ``config.seed``.
    ``handover_from``: the up-training hand-over model (:mod:`flurka.attention.handover`)."""
    options = dict(config.model.attention_options)
    if handover_from is not None:
        options["handover_from"] = handover_from
    if config.compute_dtype != "float32":  # the attention's projections and products in it too
        options["dtype"] = jnp.dtype(config.compute_dtype)
    if options.get("fused") or options.get("fused_projections") or config.model.fused_ffn:
        # registers the Pallas kernels these settings run (flurka.attention.execution); imported
        # only then: Pallas and Triton add a quarter second to every other run's start
        import flurka.kernels  # noqa: F401
    model_config = config.model.replace(attention=attention, attention_options=options)
    return build_network(info, model_config, rngs=nnx.Rngs(params=config.seed, dropout=config.seed + 1))


def _device_batch(batch: dict, mesh=None) -> dict:
    """The numeric arrays of a batch (strings and other extras stay on the host), split over
    ``mesh``'s devices (eval batches, which carry ``example_weight``, are replicated instead so
    their per-example stats can be fetched on every process)."""
    out = {k: v for k, v in batch.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
    return parallel.shard_batch(out, mesh, replicated="example_weight" in batch)


@dataclasses.dataclass
class Phase:
    """One mechanism's jitted functions and training state."""

    attention: str
    parts: state_lib.ModelParts
    train_step: Callable
    eval_step: Callable
    decode: Callable | None
    params: dict
    other: dict
    opt_state: Any
    mesh: Any = None   # data-parallel mesh (flurka.training.parallel); None = one device
    handover_from: str | None = None   # hand-over layers blending in this base mechanism

    @property
    def kind(self) -> tuple[str, str | None]:
        return self.attention, self.handover_from

    def state(self) -> dict:
        return {"params": self.params, "other": self.other, "opt_state": self.opt_state}

    def load(self, state: dict) -> None:
        if self.mesh is None:
            # Commit every leaf to the one device: restored (committed) arrays mixed with fresh
            # (uncommitted) ones would make the first step compile once for the mix and again
            # for its all-committed outputs.
            state = jax.device_put(state, next(iter(jax.numpy.zeros(()).devices())))
        state = parallel.replicate(state, self.mesh)
        self.params, self.other, self.opt_state = state["params"], state["other"], state["opt_state"]


# Fields the compiled step depends on besides the model graph (the rest — seed, logging,
# checkpointing, workdir — only changes values, not the program).
_OPT_FIELDS = ("learning_rate", "schedule", "warmup_steps", "steps", "weight_decay", "grad_accumulation",
               "grad_clip", "b1", "b2", "eps", "compute_dtype")
_COMPILED: dict[tuple, tuple] = {}
_COMPILED_MAX = 32


def make_phase(config: TrainConfig, info, attention: str, task: Task, tx, mesh=None,
               handover_from: str | None = None) -> Phase:
    model = build_model(config, info, attention, handover_from)
    parts, params, other = state_lib.split(model)
    del model
    # Reuse jitted steps across runs of the same program in one process (resume, sweeps, tests):
    # each new closure would otherwise be traced and compiled again.
    key = (parts.graphdef, parts.param_treedef, parts.other_treedef, parts.rng_treedef,
           parts.rng_leaves, type(task), task.metrics, task.label_smoothing,
           tuple(getattr(config, f) for f in _OPT_FIELDS), config.model.d_model, config.task, config.beam_size,
           info.target_max_len, info.bos_id, info.eos_id, info.pad_id)
    if key not in _COMPILED:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        # the optimizer's zeros (AdamW's mu, nu, its count) as one program: eagerly, one per
        # distinct parameter shape (zeros either way)
        _COMPILED[key] = (*_compile(config, info, parts, task, tx), jax.jit(tx.init))
    train_step, eval_step, decode, init_opt = _COMPILED[key]
    phase = Phase(attention, parts, train_step, eval_step, decode, params, other, init_opt(params), mesh,
                  handover_from)
    phase.load(phase.state())   # replicated over the mesh (no-op on one device)
    return phase


def _compute(config: TrainConfig):
    """(params, batch) -> their compute copies: identity in float32; with ``compute_dtype``
    bfloat16, bf16 copies of the float32 parameters and of floating inputs (images), so every
    product runs in bf16 while gradients arrive in float32 (the cast's transpose) for AdamW.
    ``other`` (random features, β) stays float32: the layers round it where they use it."""
    if config.compute_dtype == "float32":
        return lambda params, batch: (params, batch)
    dtype = jnp.dtype(config.compute_dtype)
    return lambda params, batch: (cast_floating(params, dtype),
                                  {k: cast_floating(v, dtype) if k in ("inputs", "inputs2") else v
                                   for k, v in batch.items()})


def _compile(config: TrainConfig, info, parts: state_lib.ModelParts, task: Task, tx):
    compute = _compute(config)

    def loss_fn(params, other, batch, key):
        params, batch = compute(params, batch)
        model = parts.merge(params, other, key)
        loss, aux = task.loss(model, batch, deterministic=False)
        return loss, (aux, parts.other_of(model))

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def accumulated(params, other, batch, key):
        """The batch's loss, metrics and gradient as ``config.grad_accumulation`` equal slices,
        one after another (a scan: one slice's activations live at a time), averaged; each slice
        its own dropout key."""
        k = config.grad_accumulation
        slices = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)

        def one(carry, xs):
            other, total = carry
            i, piece = xs
            (loss, (aux, other)), grads = grad_fn(params, other, piece, jax.random.fold_in(key, i))
            return (other, jax.tree.map(jnp.add, total, (loss, aux, grads))), None

        first = jax.tree.map(lambda x: x[0], slices)
        (loss_shape, (aux_shape, _)), grad_shape = jax.eval_shape(lambda: grad_fn(params, other, first, key))
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss_shape, aux_shape, grad_shape))
        (other, total), _ = jax.lax.scan(one, (other, zeros), (jnp.arange(k), slices))
        loss, aux, grads = jax.tree.map(lambda t: t / k, total)
        return (loss, (aux, other)), grads

    @jax.jit
    def train_step(params, other, opt_state, batch, key):
        if config.grad_accumulation > 1:
            (loss, (aux, other)), grads = accumulated(params, other, batch, key)
        else:
            (loss, (aux, other)), grads = grad_fn(params, other, batch, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, other, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads), **aux}

    def eval_model(params, other):
        """The model in evaluation mode: ``deterministic`` layers drop their random terms
        (EVA's ε: ω = μ), as dropout is off."""
        model = parts.merge(params, other)
        model.eval()
        return model

    @jax.jit
    def eval_step(params, other, batch):
        params, batch = compute(params, batch)
        return task.eval_stats(eval_model(params, other), batch)

    decode = None
    if config.task == "translation":
        max_len = info.target_max_len - 1

        @jax.jit
        def decode(params, other, inputs, mask):
            model = eval_model(compute(params, {})[0], other)
            ids = dict(bos_id=info.bos_id, eos_id=info.eos_id, pad_id=info.pad_id)
            if config.beam_size > 1:
                return model.beam_search(inputs, mask, beam_size=config.beam_size, max_len=max_len, **ids)
            return model.greedy_decode(inputs, mask, max_len=max_len, **ids)

    return train_step, eval_step, decode


# ------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------
def evaluate(config: TrainConfig, dataset, task: Task, phase: Phase, curve: bool = False) -> dict[str, float]:
    """The eval split's metrics, over at most ``eval_batches`` batches (BLEU over ``bleu_batches``),
    and the config's metrics on each of the data set's ``extra_evals``, also over at most
    ``eval_batches`` batches, named by ``split_metric`` (MNLI's mismatched dev set: ``accuracy_mismatched``).
    ``curve`` (an evaluation before the last) with ``curve_batches``: that many batches, no decoding."""
    metrics = _evaluate_split(config, dataset, task, phase, curve=curve)
    for split in dataset.extra_evals:
        on_split = _evaluate_split(config, dataset, task, phase, split, curve=curve)
        metrics.update({split_metric(m, split): on_split[m] for m in config.metrics if m in on_split})
    return metrics


def _evaluate_split(config: TrainConfig, dataset, task: Task, phase: Phase, split: str | None = None,
                    curve: bool = False) -> dict[str, float]:
    """The task's metrics on the eval split (``split``: one of the data set's ``extra_evals``, no BLEU)."""
    stats: dict[str, list] = {}
    hyps, refs = [], []
    cheap = curve and config.curve_batches > 0
    limit = config.curve_batches if cheap else config.eval_batches
    for i, batch in enumerate(dataset.eval_batches(config.batch_size, split)):
        if limit and i >= limit:
            break
        dev = _device_batch(batch, phase.mesh)
        for k, v in jax.device_get(phase.eval_step(phase.params, phase.other, dev)).items():
            stats.setdefault(k, []).append(np.asarray(v))
        if (split is None and not cheap and phase.decode is not None and "bleu" in config.metrics
                and i < config.bleu_batches):
            out = np.asarray(phase.decode(phase.params, phase.other, dev["inputs"], dev["mask"]))
            for row, target, w in zip(out, batch["targets"], batch["example_weight"]):
                if w > 0:
                    hyps.append(dataset.decode(row))
                    refs.append(dataset.decode(target[1:]))
    if not stats:
        raise ValueError(f"dataset {config.dataset!r} has an empty eval split{f' {split!r}' if split else ''}")
    metrics = task.summarize({k: np.concatenate(v) for k, v in stats.items()})
    if hyps:
        metrics["bleu"] = bleu(hyps, refs, tokenize=config.bleu_tokenize)
        metrics["exact_match"] = exact_match(hyps, refs)
    return metrics


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------
class _Run:
    """Mutable bookkeeping of one run (history, FLOPs, the not-yet-logged window of steps)."""

    def __init__(self, config: TrainConfig, dataset: dict):
        self.config = config
        self.dataset = dataset                # what it trains on (flurka.data.Dataset.describe)
        self.step = 0
        self.history: list[dict] = []
        self.eval_history: list[dict] = []
        self.window: list[dict] = []          # host metrics of steps since the last log entry
        self.pending: list[tuple[int, int, dict]] = []   # (step, FLOPs so far, device metrics)
        self.train_flops = 0
        self.prior_wall = 0.0
        self.prior_split: dict[str, float] = {}   # time split of the runs before a resume
        self.switches: list[dict] = []
        self.init_from: dict | None = None      # the pre-trained run it started from (lineage)

    def meta(self, attention: str, wall: float, handover_from: str | None = None,
             time_split: dict[str, float] | None = None) -> dict:
        return {"step": self.step, "attention": attention, "handover_from": handover_from,
                "history": self.history,
                "eval_history": self.eval_history, "window": self.window,
                "train_flops": self.train_flops, "wall_time_s": wall, "time_split": dict(time_split or {}),
                "switches": self.switches, "init_from": self.init_from, "dataset": self.dataset,
                "config": as_dict(self.config)}

    def load_meta(self, meta: dict) -> None:
        self.step = int(meta["step"])
        self.history = list(meta["history"])
        self.eval_history = list(meta["eval_history"])
        self.window = list(meta["window"])
        self.train_flops = int(meta["train_flops"])
        self.init_from = meta.get("init_from")
        self.prior_wall = float(meta.get("wall_time_s", 0.0))
        self.prior_split = {k: float(v) for k, v in (meta.get("time_split") or {}).items()}
        self.switches = list(meta.get("switches", []))

    def flush(self) -> None:
        """Fetch pending step metrics; raise :class:`Diverged` at the first non-finite loss."""
        if not self.pending:
            return
        fetched = jax.device_get([m for _, _, m in self.pending])
        for (step, flops, _), m in zip(self.pending, fetched):
            entry = {"step": step, "train_flops": flops, **{k: float(v) for k, v in m.items()}}
            if not math.isfinite(entry["loss"]):
                self.pending = []
                raise Diverged(step)
            self.window.append(entry)
        self.pending = []

    def log(self, attention: str, schedule) -> dict | None:
        """One history entry: the mean of the window's step metrics, at its last step."""
        if not self.window:
            return None
        keys = [k for k in self.window[0] if k not in ("step", "train_flops")]
        last = self.window[-1]
        entry = {"step": last["step"],
                 **{k: float(np.mean([w[k] for w in self.window])) for k in keys},
                 "train_flops": last["train_flops"],
                 "learning_rate": float(schedule(last["step"] - 1)), "attention": attention}
        self.history.append(entry)
        self.window = []
        return entry


def _check_fork(config: TrainConfig, meta: dict, base: str, path: str) -> None:
    if meta.get("attention") != base:
        raise ValueError(f"base_checkpoint {path} holds a {meta.get('attention')!r} model at step "
                         f"{meta.get('step')}; this run's base is {base!r}")
    if not meta.get("config"):
        return
    theirs = from_dict(meta["config"])
    differ = [k for k in _FORK_FIELDS if getattr(theirs, k) != getattr(config, k)]
    differ += [f"model.{f.name}" for f in dataclasses.fields(config.model) if f.name not in _FORK_FREE_MODEL_FIELDS
               and getattr(theirs.model, f.name) != getattr(config.model, f.name)]
    if differ:
        raise ValueError(f"base_checkpoint {path} was trained with different {', '.join(differ)}")


@dataclasses.dataclass
class _Clock:
    """The run's wall time in consecutive laps, each charged to a part: the time split."""

    start: float = dataclasses.field(default_factory=time.perf_counter)
    split: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mark = self.start

    def lap(self, part: str) -> None:
        """Charge the wall time since the previous lap to ``part``."""
        now = time.perf_counter()
        self.split[part] = self.split.get(part, 0.0) + now - self.mark
        self.mark = now

    def add(self, split: dict[str, float]) -> None:
        """Add the split of the runs before a resume."""
        for k, v in split.items():
            self.split[k] = self.split.get(k, 0.0) + v


@dataclasses.dataclass
class _Loop:
    """One call of :func:`train`: what it set up, and the phase and part that change as it runs."""

    config: TrainConfig
    dataset: Any
    info: Any
    task: Task
    tx: Any
    schedule: Callable
    plan: list[uptrain.Stage]
    mesh: Any
    root_key: Any
    run: _Run
    clock: _Clock
    callback: Callable[[str, dict], None] | None
    stop: threading.Event | None = None
    ckpt: Checkpointer | None = None
    bar: Any = None
    phase: Phase | None = None
    part: str = "train_steps"   # what the current step's time is charged to

    def make_phase(self, attention: str, handover_from: str | None = None) -> Phase:
        return make_phase(self.config, self.info, attention, self.task, self.tx, self.mesh, handover_from)

    def wall(self) -> float:
        return self.run.prior_wall + time.perf_counter() - self.clock.start


def train(config: TrainConfig, *, dataset=None, callback: Callable[[str, dict], None] | None = None,
          progress: bool | None = None, mesh: Any = "auto", stop: threading.Event | None = None) -> dict:
    """Train ``config``; return the result dict (see :func:`flurka.training.run`).

    ``callback(kind, entry)`` is called with ``("train", history entry)``, ``("eval", eval
    entry)`` as they happen (sweeps report from it). ``progress``: a tqdm bar (default: only when
    stderr is a terminal). ``mesh``: the data-parallel device mesh; "auto" splits each batch over
    every device (of every process, after ``jax.distributed.initialize``), None uses one device.
    The result's ``time_split`` is the module docstring's; an exception leaving the loop (a
    callback stopping the run) carries the split so far as ``exc.time_split``. ``stop``: once set,
    the run checkpoints the step it finished and raises :class:`Stopped` (``flurka train``'s
    Ctrl-C and SIGTERM).
    """
    validate(config)
    mesh = parallel.default_mesh() if mesh == "auto" else mesh
    parallel.check_batch_size(config.batch_size, mesh)
    memory.check_fits(config, devices=1 if mesh is None else mesh.size)
    loop = _set_up(config, dataset, mesh, callback)
    loop.stop = stop
    _restore_or_fork(loop)
    loop.bar = _progress_bar(config, progress, initial=loop.run.step)
    status, diverged_step = "ok", None
    try:
        for stage in loop.plan:
            if loop.run.step < stage.end:
                _train_stage(loop, stage)
        _between_steps(loop, _evaluate, "eval")   # the last evaluation and checkpoint
        _save(loop)
    except Diverged as exc:
        loop.clock.lap(loop.part)
        status, diverged_step = str(exc), exc.step
        loop.run.log(loop.phase.attention, loop.schedule)   # keep the finite steps before the divergence
    except BaseException as exc:
        exc.time_split = loop.clock.split
        raise
    finally:
        _close(loop)
    return _result(loop, status, diverged_step)


# ---- set-up: data, model parts, optimizer; where to start ---------------------------------------
def _set_up(config: TrainConfig, dataset, mesh, callback) -> _Loop:
    clock = _Clock()
    dataset = load_dataset(config) if dataset is None else dataset
    clock.lap("data")
    check_against_data(config, dataset.info)
    loop = _Loop(config=config, dataset=dataset, info=dataset.info, task=make_task(config, dataset.info),
                 tx=make_optimizer(config), schedule=schedule_from_config(config), plan=uptrain.stages(config),
                 mesh=mesh, root_key=jax.random.fold_in(jax.random.key(config.seed), 1),
                 run=_Run(config, dataset.describe()), clock=clock, callback=callback)
    clock.lap("setup")
    if config.workdir and config.checkpoint_every:
        loop.ckpt = Checkpointer(os.path.join(config.workdir, "checkpoints"), max_to_keep=config.keep_checkpoints)
    return loop


def _restore_or_fork(loop: _Loop) -> None:
    """Where the run starts: its own latest checkpoint (resume) > ``base_checkpoint`` (fork) >
    ``init_from`` (a pre-trained trunk, new head) > scratch."""
    config, run = loop.config, loop.run
    latest = loop.ckpt.latest_step() if loop.ckpt is not None else None
    if latest is not None:
        meta = loop.ckpt.meta(latest)
        _restore(loop, loop.ckpt, latest, meta["attention"], meta.get("handover_from"))
    elif config.base_checkpoint is not None:
        base = loop.plan[0].attention
        with Checkpointer(config.base_checkpoint, read_only=True) as src:
            _check_fork(config, src.meta(config.switch_step), base, config.base_checkpoint)
            _restore(loop, src, config.switch_step, base)
        run.prior_wall, run.prior_split = 0.0, {}
        run.log(base, loop.schedule)   # an uninterrupted up-training run logs at the switch, too
    elif config.init_from is not None:
        _init_from(loop)
    loop.clock.lap("checkpoints")
    loop.clock.add(run.prior_split)


def _init_from(loop: _Loop) -> None:
    """Step 0 with ``init_from``'s embedding and encoder (:mod:`flurka.training.init_from`)."""
    loop.clock.lap("setup")
    trunk, step, meta = init_from.load_trunk(loop.config.init_from)
    loop.clock.lap("checkpoints")
    loop.phase = loop.make_phase(loop.plan[0].attention)
    state = loop.phase.state()
    params, new = init_from.with_trunk(state["params"], trunk, loop.config.init_from)
    loop.phase.load({**state, "params": params})
    loop.run.init_from = {"workdir": loop.config.init_from, "step": step, "benchmark": meta["config"]["benchmark"],
                          "attention": meta["attention"], "copied": len(trunk), "new": new}
    loop.clock.lap("setup")


def _restore(loop: _Loop, source: Checkpointer, step: int, attention: str, handover_from: str | None = None) -> None:
    """A new ``attention`` phase holding ``source``'s checkpoint at ``step``, its bookkeeping in ``loop.run``."""
    loop.clock.lap("checkpoints")
    loop.phase = loop.make_phase(attention, handover_from)
    loop.clock.lap("setup")
    restored, meta = source.restore(step, loop.phase.state())
    loop.phase.load(restored)
    loop.run.load_meta(meta)


def _progress_bar(config: TrainConfig, progress: bool | None, initial: int):
    if not (progress or (progress is None and sys.stderr.isatty())):
        return None
    return tqdm(total=config.steps, initial=initial, desc=f"{config.benchmark} {config.model.attention}",
                unit="step", file=sys.stderr)


# ---- training: stages of steps, with logs, evaluations and checkpoints at their intervals -------
def _train_stage(loop: _Loop, stage: uptrain.Stage) -> None:
    """The steps from the current one to ``stage.end``, in ``stage``'s phase."""
    _enter_phase(loop, stage.attention, stage.handover_from)
    step_flops: dict[tuple, int] = {}   # a step's FLOPs by its batch's shapes
    with _train_batches(loop, stage) as batches:   # closed (its threads joined) however the stage ends
        loop.clock.lap("setup")
        loop.part = _compile_part(stage)
        while loop.run.step < stage.end:
            batch = next(batches)
            loop.clock.lap("data")
            _train_step(loop, stage, batch, step_flops)
            _at_intervals(loop, stage)
            loop.clock.lap(loop.part)
            loop.part = "train_steps"
            if loop.stop is not None and loop.stop.is_set():
                _save(loop)
                raise Stopped(loop.run.step, saved=loop.ckpt is not None)


def _train_batches(loop: _Loop, stage: uptrain.Stage):
    """The stage's training batches, device-ready: with ``config.prefetch`` > 0 built that many
    steps ahead by worker threads, which also put them on the device (the copy overlaps the running
    step); else on this thread when due. The same batches either way (batch k is pure in (seed, k))."""
    mesh, ahead = loop.mesh, loop.config.prefetch > 0

    def place(batch: dict) -> dict:
        batch = _device_batch(batch, mesh)
        return jax.device_put(batch) if ahead and mesh is None else batch

    return loop.dataset.train_batches(loop.config.batch_size, start_step=loop.run.step, stop_step=stage.end,
                                      prefetch=loop.config.prefetch, place=place)


def _compile_part(stage: uptrain.Stage) -> str:
    """The time split's part for the first step of ``stage``'s phase."""
    if stage.handover_from:
        return f"compile/{stage.handover_from}-to-{stage.attention}"
    return f"compile/{stage.attention}"


def _enter_phase(loop: _Loop, attention: str, handover_from: str | None) -> None:
    """Make the phase training ``attention`` (with hand-over layers from ``handover_from``) current."""
    old = loop.phase
    if old is None:
        loop.phase = loop.make_phase(attention, handover_from)
    elif old.kind != (attention, handover_from):
        # the up-training switch (base -> variant or its hand-over model), or the end of the
        # hand-over (same parameters and moments; only the β variables are dropped)
        new = loop.make_phase(attention, handover_from)
        carried, report = uptrain.switch(old.state(), new.state())
        new.load(carried)
        if old.attention != attention:
            loop.run.switches.append({"step": loop.run.step, "from": old.attention, "to": attention,
                                      "copied": len(report["copied"]), "new": report["new"],
                                      "handover": uptrain.handover_info(loop.config)})
        loop.phase = new


def _train_step(loop: _Loop, stage: uptrain.Stage, batch: dict, step_flops: dict[tuple, int]) -> None:
    """One step on ``batch``; its metrics stay on the device (``run.pending``) until the next flush."""
    config, run, phase = loop.config, loop.run, loop.phase
    shapes = tuple(sorted((k, v.shape) for k, v in batch.items()))
    if shapes not in step_flops:
        step_flops[shapes] = flops_lib.train_step_flops(
            config, loop.info, dict(shapes), attention=stage.attention, handover_from=stage.handover_from)
    key = jax.random.fold_in(loop.root_key, run.step)
    if stage.handover_from is not None:
        beta = uptrain.handover_beta(config, run.step)
        phase.other = uptrain.set_beta(phase.other, parallel.replicate(np.float32(beta), phase.mesh))
    phase.params, phase.other, phase.opt_state, metrics = phase.train_step(
        phase.params, phase.other, phase.opt_state, batch, key)
    if loop.part != "train_steps":   # the phase's first step: compile + run, waited for
        jax.block_until_ready((phase.params, phase.other, phase.opt_state, metrics))
    if stage.handover_from is not None:
        metrics = {**metrics, "handover_beta": beta}
    run.step += 1
    run.train_flops += step_flops[shapes]
    run.pending.append((run.step, run.train_flops, metrics))
    if loop.bar is not None:
        loop.bar.update(1)


def _at_intervals(loop: _Loop, stage: uptrain.Stage) -> None:
    """After a step: a history entry, an evaluation, a checkpoint where their intervals (or the
    stage's end, for the log) fall (the run's last step leaves evaluation and checkpoint to the end)."""
    config, step = loop.config, loop.run.step
    last = step == config.steps
    if step % config.log_every == 0 or step == stage.end:
        _log(loop)
    if config.eval_every and step % config.eval_every == 0 and not last:
        _between_steps(loop, _curve_point, "eval")
    if loop.ckpt is not None and (step % config.checkpoint_every == 0 or step in config.checkpoint_steps) and not last:
        _between_steps(loop, _save, "checkpoints")


def _between_steps(loop: _Loop, action: Callable[[_Loop], None], part: str) -> None:
    """``action(loop)`` (an evaluation, a checkpoint) after the pending steps' metrics are in, its time charged to ``part``."""
    loop.run.flush()
    loop.clock.lap(loop.part)
    action(loop)
    loop.clock.lap(part)


def _log(loop: _Loop) -> None:
    """A history entry of the steps since the last one, reported to the callback."""
    loop.run.flush()
    entry = loop.run.log(loop.phase.attention, loop.schedule)
    if loop.bar is not None and entry is not None:
        loop.bar.set_postfix(loss=f"{entry['loss']:.4f}")
    _emit(loop, "train", entry, loop.part)


def _curve_point(loop: _Loop) -> None:
    """An evaluation before the last: a point of the eval curve (``curve_batches``)."""
    _evaluate(loop, curve=True)


def _evaluate(loop: _Loop, curve: bool = False) -> None:
    """An eval history entry at the current step (once a step), reported to the callback."""
    run, phase = loop.run, loop.phase
    if run.eval_history and run.eval_history[-1]["step"] == run.step:
        return
    metrics = evaluate(loop.config, loop.dataset, loop.task, phase, curve=curve)
    entry = {"step": run.step, "train_flops": run.train_flops, "attention": phase.attention, **metrics}
    if curve and loop.config.curve_batches:   # a cheap curve point: never a run's final metrics
        entry[CURVE_POINT] = True
    if phase.handover_from is not None:     # evaluated mid-hand-over: the blended model
        entry["handover_beta"] = uptrain.handover_beta(loop.config, run.step - 1)
    run.eval_history.append(entry)
    _emit(loop, "eval", entry, "eval")


def _save(loop: _Loop) -> None:
    """A checkpoint at the current step, unless the latest one is at it already."""
    ckpt, run, phase = loop.ckpt, loop.run, loop.phase
    if ckpt is not None and (not ckpt.steps() or ckpt.latest_step() != run.step):
        ckpt.save(run.step, phase.state(), run.meta(phase.attention, loop.wall(), phase.handover_from, loop.clock.split))


def _emit(loop: _Loop, kind: str, entry: dict | None, before: str) -> None:
    """``callback(kind, entry)``, its time charged to "report" (the time before it to ``before``)."""
    if entry is not None and loop.callback is not None:
        loop.clock.lap(before)
        loop.callback(kind, entry)
        loop.clock.lap("report")


# ---- the end: close, build the result -----------------------------------------------------------
def _close(loop: _Loop) -> None:
    if loop.bar is not None:
        loop.bar.close()
    if loop.ckpt is not None:
        loop.ckpt.close()
    loop.clock.lap("checkpoints")


def _result(loop: _Loop, status: str, diverged_step: int | None) -> dict:
    config, run, phase = loop.config, loop.run, loop.phase
    not_metrics = ("step", "train_flops", "attention", "handover_beta")
    full = [e for e in run.eval_history if not e.get(CURVE_POINT)]
    final = {k: v for k, v in full[-1].items() if k not in not_metrics} if full else {}
    return {
        "status": status,
        "benchmark": config.benchmark,
        "attention": config.model.attention,
        "seed": config.seed,
        "steps": run.step if diverged_step is None else diverged_step,
        "final_metrics": final,
        "history": run.history,
        "eval_history": run.eval_history,
        "train_flops": run.train_flops,
        "wall_time_s": loop.wall(),
        "time_split": dict(loop.clock.split),
        "num_params": int(sum(v.size for v in phase.params.values())) if phase is not None else 0,
        "switches": run.switches,
        "init_from": run.init_from,
        "dataset": run.dataset,
        "config": as_dict(config),
    }
