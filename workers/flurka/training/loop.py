"""The training loop: ``train(config) -> result dict`` (flax examples style, NNX functional API).

* Jitted train step: a pure function of flat ``params``/``other`` dicts, the optax state, the
  batch and a per-step key (dropout key = fold_in(key(seed), step)); batch k is a pure function
  of (seed, k) (data contract). Together these make a resumed run reproduce an uninterrupted one
  bit for bit.
* Periodic evaluation over the eval split (padding examples weighted 0), metrics per task.
* Orbax checkpoints every ``checkpoint_every`` steps under ``workdir/checkpoints``; a run whose
  workdir holds checkpoints resumes from the latest one.
* FLOPs: every history entry carries the cumulative training FLOPs (3 × forward, see
  :mod:`flurka.training.flops`) so runs can be compared at equal compute.
* A non-finite loss ends the run with status ``"diverged at step k"``; history so far is kept.
* Up-training: stages from :func:`flurka.training.uptrain.stages`; at the switch the state is
  carried into the FLuRKA model, whose first ``handover_steps`` steps run hand-over layers that
  blend base and variant with a traced β ramp (recorded as ``handover_beta`` in history and as
  ``handover`` in the switch entry); ``base_checkpoint`` starts right at the switch from another
  run's checkpoint (forking many FLuRKA branches from one base run).
* Time split: the run's wall time by part (``time_split`` in the result, carried by checkpoints
  like ``wall_time_s``): ``data`` (loading, batches), ``setup`` (models, optimizer, switches),
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
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from flurka.attention.base import cast_floating

from flurka.configs.base import TrainConfig, validate
from flurka.training import flops as flops_lib
from flurka.training import memory
from flurka.training import parallel
from flurka.training import state as state_lib
from flurka.training import uptrain
from flurka.training.checkpoints import Checkpointer
from flurka.training.optimizer import make_optimizer
from flurka.training.schedules import from_config as schedule_from_config
from flurka.training.tasks import Task, make_task

# Fields that must agree between a base checkpoint's run and the run forking from it.
_FORK_FIELDS = ("dataset", "task", "model", "d_model", "num_heads", "num_layers", "d_ff", "max_len",
                "num_decoder_layers", "pooling", "patch_size", "t2t", "learning_rate", "schedule",
                "warmup_steps", "weight_decay", "grad_clip", "b1", "b2", "eps", "label_smoothing",
                "batch_size", "steps", "seed", "dropout_rate", "dataset_options")


class Diverged(Exception):
    def __init__(self, step: int):
        super().__init__(f"diverged at step {step}")
        self.step = step


# ------------------------------------------------------------------------------------------------
# Model / data set-up
# ------------------------------------------------------------------------------------------------
def load_dataset(config: TrainConfig):
    from flurka.data import get_dataset
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
    if config.pooling == "cls" and config.task in ("classification", "regression") and info.cls_id is None:
        raise ValueError(f"pooling='cls' but dataset {config.dataset!r} has no [CLS] token; use pooling='mean'")


def build_model(config: TrainConfig, info, attention: str,
                handover_from: str | None = None) -> nnx.Module:
    """The benchmark's model with ``attention``; parameters drawn from ``config.seed``.
    ``handover_from``: the up-training hand-over model (:mod:`flurka.attention.handover`)."""
    from flurka.models import build_model as factory
    options = dict(config.attention_options)
    if handover_from is not None:
        options["handover_from"] = handover_from
    if config.compute_dtype != "float32":  # the attention's projections and products in it too
        options["dtype"] = jnp.dtype(config.compute_dtype)
    model_config = dict(
        attention=attention, attention_options=options,
        d_model=config.d_model, num_heads=config.num_heads, num_layers=config.num_layers,
        d_ff=config.d_ff, dropout_rate=config.dropout_rate, pooling=config.pooling,
        patch_size=config.patch_size, t2t=config.t2t,
        num_decoder_layers=config.num_decoder_layers or None, seed=config.seed)
    return factory(info, model_config, rngs=nnx.Rngs(params=config.seed, dropout=config.seed + 1))


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
_OPT_FIELDS = ("learning_rate", "schedule", "warmup_steps", "steps", "d_model", "weight_decay",
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
           tuple(getattr(config, f) for f in _OPT_FIELDS), config.task, config.beam_size,
           info.target_max_len, info.bos_id, info.eos_id, info.pad_id)
    if key not in _COMPILED:
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[key] = _compile(config, info, parts, task, tx)
    train_step, eval_step, decode = _COMPILED[key]
    phase = Phase(attention, parts, train_step, eval_step, decode, params, other, tx.init(params), mesh,
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

    @jax.jit
    def train_step(params, other, opt_state, batch, key):
        (loss, (aux, other)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, other, batch, key)
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
def evaluate(config: TrainConfig, dataset, task: Task, phase: Phase) -> dict[str, float]:
    stats: dict[str, list] = {}
    hyps, refs = [], []
    for i, batch in enumerate(dataset.eval_batches(config.batch_size)):
        if config.eval_batches and i >= config.eval_batches:
            break
        dev = _device_batch(batch, phase.mesh)
        for k, v in jax.device_get(phase.eval_step(phase.params, phase.other, dev)).items():
            stats.setdefault(k, []).append(np.asarray(v))
        if phase.decode is not None and "bleu" in config.metrics and i < config.bleu_batches:
            out = np.asarray(phase.decode(phase.params, phase.other, dev["inputs"], dev["mask"]))
            for row, target, w in zip(out, batch["targets"], batch["example_weight"]):
                if w > 0:
                    hyps.append(dataset.decode(row))
                    refs.append(dataset.decode(target[1:]))
    if not stats:
        raise ValueError(f"dataset {config.dataset!r} has an empty eval split")
    metrics = task.summarize({k: np.concatenate(v) for k, v in stats.items()})
    if hyps:
        from flurka.training.metrics import bleu
        metrics["bleu"] = bleu(hyps, refs, tokenize=config.bleu_tokenize)
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

    def meta(self, attention: str, wall: float, handover_from: str | None = None,
             time_split: dict[str, float] | None = None) -> dict:
        return {"step": self.step, "attention": attention, "handover_from": handover_from,
                "history": self.history,
                "eval_history": self.eval_history, "window": self.window,
                "train_flops": self.train_flops, "wall_time_s": wall, "time_split": dict(time_split or {}),
                "switches": self.switches, "dataset": self.dataset, "config": config_dict(self.config)}

    def load_meta(self, meta: dict) -> None:
        self.step = int(meta["step"])
        self.history = list(meta["history"])
        self.eval_history = list(meta["eval_history"])
        self.window = list(meta["window"])
        self.train_flops = int(meta["train_flops"])
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


def config_dict(config: TrainConfig) -> dict:
    out = dataclasses.asdict(config)
    out["attention_options"] = dict(config.attention_options)
    out["dataset_options"] = dict(config.dataset_options)
    out["metrics"] = list(config.metrics)
    return out


def _check_fork(config: TrainConfig, meta: dict, base: str, path: str) -> None:
    if meta.get("attention") != base:
        raise ValueError(f"base_checkpoint {path} holds a {meta.get('attention')!r} model at step "
                         f"{meta.get('step')}; this run's base is {base!r}")
    theirs, ours = meta.get("config", {}), config_dict(config)
    differ = [k for k in _FORK_FIELDS if k in theirs and _norm(theirs[k]) != _norm(ours[k])]
    if differ:
        raise ValueError(f"base_checkpoint {path} was trained with different {', '.join(differ)}")


def _norm(v):
    return tuple(v) if isinstance(v, list) else v


def train(config: TrainConfig, *, dataset=None, callback: Callable[[str, dict], None] | None = None,
          progress: bool | None = None, mesh: Any = "auto") -> dict:
    """Train ``config``; return the result dict (see :func:`flurka.training.run`).

    ``callback(kind, entry)`` is called with ``("train", history entry)``, ``("eval", eval
    entry)`` as they happen (sweeps report from it). ``progress``: a tqdm bar (default: only when
    stderr is a terminal). ``mesh``: the data-parallel device mesh; "auto" splits each batch over
    every device (of every process, after ``jax.distributed.initialize``), None uses one device.
    The result's ``time_split`` is the module docstring's; an exception leaving the loop (a
    callback stopping the run) carries the split so far as ``exc.time_split``.
    """
    validate(config)
    mesh = parallel.default_mesh() if mesh == "auto" else mesh
    parallel.check_batch_size(config.batch_size, mesh)
    memory.check_fits(config, devices=1 if mesh is None else mesh.size)
    start = time.perf_counter()
    split: dict[str, float] = {}
    mark = start

    def lap(part: str) -> None:
        """Charge the wall time since the previous lap to ``part``."""
        nonlocal mark
        now = time.perf_counter()
        split[part] = split.get(part, 0.0) + now - mark
        mark = now

    dataset = load_dataset(config) if dataset is None else dataset
    lap("data")
    info = dataset.info
    check_against_data(config, info)
    task = make_task(config)
    tx = make_optimizer(config)
    schedule = schedule_from_config(config)
    plan = uptrain.stages(config)
    run = _Run(config, dataset.describe())
    root_key = jax.random.fold_in(jax.random.key(config.seed), 1)
    lap("setup")

    ckpt = None
    if config.workdir and config.checkpoint_every:
        ckpt = Checkpointer(os.path.join(config.workdir, "checkpoints"),
                            max_to_keep=config.keep_checkpoints)

    # ---- where to start: own checkpoint (resume) > base checkpoint (fork) > scratch -------------
    phase: Phase | None = None
    latest = ckpt.latest_step() if ckpt is not None else None
    if latest is not None:
        meta = ckpt.meta(latest)
        lap("checkpoints")
        phase = make_phase(config, info, meta["attention"], task, tx, mesh, meta.get("handover_from"))
        lap("setup")
        restored, meta = ckpt.restore(latest, phase.state())
        phase.load(restored)
        run.load_meta(meta)
    elif config.base_checkpoint is not None:
        base = plan[0].attention
        with Checkpointer(config.base_checkpoint, read_only=True) as src:
            meta = src.meta(config.switch_step)
            _check_fork(config, meta, base, config.base_checkpoint)
            lap("checkpoints")
            phase = make_phase(config, info, base, task, tx, mesh)
            lap("setup")
            restored, meta = src.restore(config.switch_step, phase.state())
        phase.load(restored)
        run.load_meta(meta)
        run.prior_wall, run.prior_split = 0.0, {}
        run.log(base, schedule)   # an uninterrupted up-training run logs at the switch, too
    lap("checkpoints")
    for k, v in run.prior_split.items():
        split[k] = split.get(k, 0.0) + v

    def emit(kind: str, entry: dict | None, before: str) -> None:
        """``callback(kind, entry)``, its time charged to "report" (the time before it to ``before``)."""
        if entry is not None and callback is not None:
            lap(before)
            callback(kind, entry)
            lap("report")

    def save() -> None:
        if ckpt is not None and (not ckpt.steps() or ckpt.latest_step() != run.step):
            ckpt.save(run.step, phase.state(), run.meta(phase.attention, wall(), phase.handover_from, split))

    def wall() -> float:
        return run.prior_wall + time.perf_counter() - start

    def do_eval() -> None:
        if run.eval_history and run.eval_history[-1]["step"] == run.step:
            return
        metrics = evaluate(config, dataset, task, phase)
        entry = {"step": run.step, "train_flops": run.train_flops, "attention": phase.attention, **metrics}
        if phase.handover_from is not None:     # evaluated mid-hand-over: the blended model
            entry["handover_beta"] = uptrain.handover_beta(config, run.step - 1)
        run.eval_history.append(entry)
        emit("eval", entry, "eval")

    bar = None
    if progress or (progress is None and sys.stderr.isatty()):
        from tqdm.auto import tqdm
        bar = tqdm(total=config.steps, initial=run.step, desc=f"{config.benchmark} {config.attention}",
                   unit="step", file=sys.stderr)

    status, diverged_step = "ok", None
    part = "train_steps"   # what the current step's time is charged to
    try:
        for stage in plan:
            attention, end, handover_from = stage.attention, stage.end, stage.handover_from
            if run.step >= end:
                continue
            if phase is None:
                phase = make_phase(config, info, attention, task, tx, mesh, handover_from)
            elif phase.kind != (attention, handover_from):
                # the up-training switch (base -> variant or its hand-over model), or the end of
                # the hand-over (same parameters and moments; only the β variables are dropped)
                new = make_phase(config, info, attention, task, tx, mesh, handover_from)
                carried, report = uptrain.switch(phase.state(), new.state())
                new.load(carried)
                if phase.attention != attention:
                    run.switches.append({"step": run.step, "from": phase.attention, "to": attention,
                                         "copied": len(report["copied"]), "new": report["new"],
                                         "handover": uptrain.handover_info(config)})
                phase = new
            step_flops: dict[tuple, int] = {}
            batches = dataset.train_batches(config.batch_size, start_step=run.step)
            lap("setup")
            part = f"compile/{handover_from}-to-{attention}" if handover_from else f"compile/{attention}"
            while run.step < end:
                batch = _device_batch(next(batches), mesh)
                lap("data")
                shapes = tuple(sorted((k, v.shape) for k, v in batch.items()))
                if shapes not in step_flops:
                    step_flops[shapes] = flops_lib.train_step_flops(
                        config, info, dict(shapes), attention=attention, handover_from=handover_from)
                key = jax.random.fold_in(root_key, run.step)
                if handover_from is not None:
                    beta = uptrain.handover_beta(config, run.step)
                    phase.other = uptrain.set_beta(
                        phase.other, parallel.replicate(np.float32(beta), phase.mesh))
                phase.params, phase.other, phase.opt_state, metrics = phase.train_step(
                    phase.params, phase.other, phase.opt_state, batch, key)
                if part != "train_steps":   # the phase's first step: compile + run, waited for
                    jax.block_until_ready((phase.params, phase.other, phase.opt_state, metrics))
                if handover_from is not None:
                    metrics = {**metrics, "handover_beta": beta}
                run.step += 1
                run.train_flops += step_flops[shapes]
                run.pending.append((run.step, run.train_flops, metrics))
                if bar is not None:
                    bar.update(1)
                last = run.step == config.steps
                if run.step % config.log_every == 0 or run.step == end:
                    run.flush()
                    entry = run.log(attention, schedule)
                    if bar is not None and entry is not None:
                        bar.set_postfix(loss=f"{entry['loss']:.4f}")
                    emit("train", entry, part)
                if config.eval_every and run.step % config.eval_every == 0 and not last:
                    run.flush()
                    lap(part)
                    do_eval()
                    lap("eval")
                if ckpt is not None and run.step % config.checkpoint_every == 0 and not last:
                    run.flush()
                    lap(part)
                    save()
                    lap("checkpoints")
                lap(part)
                part = "train_steps"
        run.flush()
        lap("train_steps")
        do_eval()
        lap("eval")
        save()
    except Diverged as exc:
        lap(part)
        status, diverged_step = str(exc), exc.step
        run.log(phase.attention, schedule)   # keep the finite steps before the divergence
    except BaseException as exc:
        exc.time_split = split
        raise
    finally:
        if bar is not None:
            bar.close()
        if ckpt is not None:
            ckpt.close()
        lap("checkpoints")

    not_metrics = ("step", "train_flops", "attention", "handover_beta")
    final = {k: v for k, v in run.eval_history[-1].items()
             if k not in not_metrics} if run.eval_history else {}
    return {
        "status": status,
        "benchmark": config.benchmark,
        "attention": config.attention,
        "seed": config.seed,
        "steps": run.step if diverged_step is None else diverged_step,
        "final_metrics": final,
        "history": run.history,
        "eval_history": run.eval_history,
        "train_flops": run.train_flops,
        "wall_time_s": wall(),
        "time_split": dict(split),
        "num_params": int(sum(v.size for v in phase.params.values())) if phase is not None else 0,
        "switches": run.switches,
        "dataset": run.dataset,
        "config": config_dict(config),
    }
