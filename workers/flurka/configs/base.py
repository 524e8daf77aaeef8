"""The training config (configs as code, big_vision style) and its validation.

A benchmark is a function returning a :class:`TrainConfig`; families live one per file
(``lra.py``, ``glue.py``, ``mlm.py``, ``nmt.py``, ``imagenet.py``, ``small.py``) and register
themselves in :data:`BENCHMARKS`. :func:`validate` is the one place bad settings are caught, with a
one-line ``ValueError`` naming the valid choices, before any data is read or anything compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from flurka.catalogue import metrics as metric_catalogue
from flurka.catalogue.mechanisms import BASES, E_INITS, FLURKA, SETTINGS
from flurka.catalogue.metrics import METRICS, SEQUENCE_METRICS, TASK_METRICS
from flurka.cli import one_line
from flurka.configs.checks import choice, positive
from flurka.configs.model import FIELDS as MODEL_FIELDS
from flurka.configs.model import ModelConfig
from flurka.configs.overrides import nested
from flurka.data.prefetch import MAX_PREFETCH

# The key of an eval history entry made with ``curve_batches`` (a subset, no decoding): such an
# entry is a point of the eval curve, never a run's final metrics.
CURVE_POINT = "curve_point"
TASKS = ("classification", "regression", "mlm", "translation", "image")
SCHEDULES = ("linear", "inverse_sqrt", "cosine", "constant")
COMPUTE_DTYPES = ("float32", "bfloat16")
BLEU_TOKENIZERS = ("13a", "intl", "char", "none", "zh")  # sacrebleu's, without extra dependencies
HANDOVER_SHAPES = ("linear", "ease-out")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs. ``dataset`` names a :mod:`flurka.data` data set."""

    benchmark: str
    dataset: str
    task: str
    metrics: tuple[str, ...]
    # the architecture, passed whole to the model (flurka.configs.model): its mechanism, its
    # attention_options (d_k, num_features, ...), sizes, pooling, remat
    model: ModelConfig
    max_len: int                       # the encoder's sequence length (tokens, pixels, patches)
    # Mixed precision: "bfloat16" runs every forward/backward product on bf16 copies of the
    # float32 parameters (gradients, AdamW state and checkpoints stay float32); "float32" (TF32 on
    # GPUs at JAX's default matmul precision) is the paper's setting and the default.
    compute_dtype: str = "float32"
    # Memory for the paper's sizes on one card: each step's gradient summed over this many equal
    # slices of its batch, one after another (the step, its batch and its update unchanged; the
    # activations of one slice); with model.remat, each encoder block's activations recomputed in
    # the backward pass instead of kept (jax.checkpoint; more FLOPs, the same maths).
    grad_accumulation: int = 1
    # optimizer (optax AdamW)
    learning_rate: float = 1e-4
    schedule: str = "linear"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float | None = None     # global-norm clip; None = off
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    label_smoothing: float = 0.0
    # loop
    batch_size: int = 32
    steps: int = 1000
    eval_every: int = 500              # 0 = only at the end
    eval_batches: int = 0              # 0 = the whole eval split
    # Evaluations before the last (every eval_every steps: the eval curve): at most this many eval
    # batches and no decoding, so a curve costs little; 0 = each one as the last (its batches, BLEU).
    curve_batches: int = 0             # its eval history entries carry CURVE_POINT: True
    bleu_batches: int = 1              # translation: eval batches decoded for BLEU
    bleu_tokenize: str = "13a"         # sacrebleu tokenizer ("char" for one-word sentences)
    beam_size: int = 1                 # translation: 1 = greedy decoding
    log_every: int = 50
    # Input pipeline: training batches built this many steps ahead by worker threads and put on the
    # device there (flurka.data.prefetch); 0 = each built on the training thread when it is due.
    # The batches, and so the run, are the same either way (batch k is pure in (seed, k)).
    prefetch: int = 2
    checkpoint_every: int = 0          # 0 = none; checkpoints (and resume) only with a workdir
    checkpoint_steps: tuple[int, ...] = ()   # also these steps (where up-training branches fork)
    keep_checkpoints: int | None = None
    seed: int = 0
    workdir: str | None = None
    dataset_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    data_dir: str | None = None
    # up-training (paper §4.2)
    alpha: float = 0.0
    base: str = "low-rank"
    base_checkpoint: str | None = None  # a base run's checkpoint dir holding step round(alpha*steps)
    # Pre-train then fine-tune: a finished run's work dir whose embedding and encoder this run
    # starts from (flurka.training.init_from; its task head is new)
    init_from: str | None = None
    # Blended hand-over after the switch (flurka.training.uptrain): for this many steps every
    # attention layer outputs (1-β)·base + β·variant from the same parameters, β ramping 0 → 1
    # (``handover_shape``: "linear" β = t, or "ease-out" β = 1-(1-t)², slow near the variant);
    # at most half of the variant's steps are used. 0 = the abrupt switch.
    handover_steps: int = 16
    handover_shape: str = "ease-out"
    notes: str = ""                    # where the settings come from

    def replace(self, **overrides: Any) -> "TrainConfig":
        """This config with ``overrides``: fields, or ``model`` as a ModelConfig (whole) or a
        mapping of its fields merged into this one's (see :func:`apply`)."""
        return apply(self, overrides)

    @property
    def reported_metrics(self) -> tuple[str, ...]:
        """What a table reports of this benchmark: its first metric, and for translation every
        sequence-level one (BLEU, exact match), not the per-token accuracy and perplexity."""
        if self.task == "translation":
            return tuple(m for m in self.metrics if m in SEQUENCE_METRICS) or self.metrics[:1]
        return self.metrics[:1]

    @property
    def switch_step(self) -> int:
        return switch_step(self.alpha, self.steps)


def switch_step(alpha: float, steps: int) -> int:
    """The number of base-model steps before an up-training run switches to the variant (α·steps,
    rounded): where a sweep forks its branches from the base run."""
    return int(round(alpha * steps))


# ------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A registered benchmark: its config (configs as code) and where the paper's tables show it.
    ``columns``: its cells in ``table`` (``glue``, ``lra``, ``lra-small``, ``collective``) as
    (header, metric); a table's columns come in registration order."""

    name: str
    config: Callable[[], TrainConfig]
    family: str                              # the configs file that declares it: glue, lra, nmt, ...
    table: str | None = None
    columns: tuple[tuple[str, str], ...] = ()


BENCHMARKS: dict[str, Benchmark] = {}
TABLES = ("glue", "lra", "lra-small", "collective")   # the paper's quality tables (Tables 2-4; small LRA)


def register(name: str, *, table: str | None = None, columns: tuple[tuple[str, str], ...] = ()):
    """Register the decorated config function as benchmark ``name`` (see :class:`Benchmark`)."""
    if table is not None and table not in TABLES:
        raise ValueError(f"unknown table {table!r}; valid: {', '.join(TABLES)}")
    for _, metric in columns:
        if metric not in METRICS:
            raise ValueError(f"{name}: unknown metric {metric!r} in its columns; valid: {', '.join(METRICS)}")

    def deco(fn: Callable[[], TrainConfig]):
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} registered twice")
        family = fn.__module__.rsplit(".", 1)[-1]
        BENCHMARKS[name] = Benchmark(name, fn, family, table, tuple(columns))
        return fn
    return deco


def table_columns(table: str) -> list[tuple[str, str, str]]:
    """``table``'s columns as (header, benchmark, metric), in registration order."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; valid: {', '.join(TABLES)}")
    return [(label, b.name, metric) for b in BENCHMARKS.values() if b.table == table for label, metric in b.columns]


def family_benchmarks(family: str) -> tuple[str, ...]:
    """The benchmarks one configs file declares (``small``: the CPU-size ones)."""
    return tuple(name for name, b in BENCHMARKS.items() if b.family == family)


def char_bleu(benchmark: str) -> bool:
    """Whether ``benchmark`` scores BLEU over characters (``bleu_tokenize="char"``); False for a name
    this code does not know (an old database's), which then says no more than "BLEU"."""
    return benchmark in BENCHMARKS and BENCHMARKS[benchmark].config().bleu_tokenize == "char"


def metric_label(metric: str, benchmark: str | None = None) -> str:
    """A header for ``metric`` on ``benchmark``: "accuracy (%)", "BLEU (char, 0–100)",
    "perplexity", "eval loss" (:func:`flurka.catalogue.metrics.label`)."""
    return metric_catalogue.label(metric, benchmark is not None and char_bleu(benchmark))


def primary_metric(benchmark: str) -> str:
    """``benchmark``'s headline metric: its config's first ("accuracy" for a name not registered)."""
    return BENCHMARKS[benchmark].config().metrics[0] if benchmark in BENCHMARKS else "accuracy"


FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))
# what a config's attention_options may hold: every mechanism's settings (make_attention takes
# more: speed options)
ATTENTION_OPTIONS = SETTINGS


def get_config(benchmark: str, **overrides: Any) -> TrainConfig:
    """The named benchmark's config with ``overrides`` applied (:func:`apply`), validated.

    Overriding ``steps`` alone scales ``warmup_steps`` with it (linear and cosine schedules), so
    the warm-up stays the same fraction of training.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; valid: {', '.join(sorted(BENCHMARKS))}")
    overrides = nested(overrides)
    config = BENCHMARKS[benchmark].config()
    if "steps" in overrides and "warmup_steps" not in overrides and config.schedule != "inverse_sqrt":
        # warm-up keeps its fraction of training when only the length changes
        steps = overrides["steps"]
        if isinstance(steps, int) and steps > 0:
            overrides["warmup_steps"] = round(config.warmup_steps * steps / config.steps)
    return validate(apply(config, overrides))


def _merged(name: str, defaults: Mapping[str, Any], changes: Any) -> dict[str, Any]:
    """An options mapping with ``changes`` merged in; a None value removes a default."""
    if not isinstance(changes, Mapping):
        raise ValueError(f"{name} must be a mapping such as {{'d_k': 16}}, got {repr(changes)[:80]}")
    return {k: v for k, v in {**defaults, **changes}.items() if v is not None}


def apply(config: TrainConfig, overrides: Mapping[str, Any]) -> TrainConfig:
    """``config`` with ``overrides`` (not validated). ``dataset_options`` and ``model`` are merged
    into the config's own: ``model={"d_model": 64}`` keeps the other model fields, and
    ``model={"attention_options": {"d_k": 64}}`` keeps ``num_features`` (``None`` values in an
    options mapping remove a default); a ``ModelConfig`` replaces the model whole. Dotted keys
    (``model.d_model``, what ``--set`` takes) are the same as nested ones. One line names an
    unknown field, and where a model field was given at the top, the key it has now."""
    overrides = nested(overrides)
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        moved = [k for k in unknown if k in MODEL_FIELDS]
        hint = f"; a model setting goes under model (model.{moved[0]})" if moved else ""
        raise ValueError(one_line(f"unknown config field(s) {unknown}{hint}; valid: {', '.join(FIELDS)}", bare=False))
    changes = dict(overrides)
    if changes.get("dataset_options") is not None:
        changes["dataset_options"] = _merged("dataset_options", config.dataset_options, changes["dataset_options"])
    model = changes.get("model")
    if model is not None and not isinstance(model, ModelConfig):
        if not isinstance(model, Mapping):
            raise ValueError(f"model must be a mapping of model fields such as {{'d_model': 64}}, got {repr(model)[:80]}")
        bad = sorted(set(model) - set(MODEL_FIELDS))
        if bad:
            raise ValueError(one_line(f"unknown model field(s) {bad}; valid: {', '.join(MODEL_FIELDS)}", bare=False))
        model = dict(model)
        if model.get("attention_options") is not None:
            model["attention_options"] = _merged("model.attention_options", config.model.attention_options,
                                                 model["attention_options"])
        changes["model"] = config.model.replace(**model)
    return dataclasses.replace(config, **changes)


def upgraded(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config, or a sweep's stored overrides, in today's layout. Runs and sweeps
    recorded before the model's settings were nested (flat ``d_model``, ``attention``, ...;
    ``model`` then the architecture's name) read the same: a work dir from then resumes, forks
    and loads as it did, a sweep from then resumes, and its trials pool with today's."""
    if isinstance(stored.get("model"), Mapping) or not set(stored) & set(MODEL_FIELDS):
        return dict(stored)
    out = {k: v for k, v in stored.items() if k not in MODEL_FIELDS and k != "model"}
    model = {k: stored[k] for k in MODEL_FIELDS if k in stored}
    if not model.get("num_decoder_layers"):      # 0 then meant "as many as the encoder"
        model.pop("num_decoder_layers", None)
    if stored.get("task") in ("mlm", "translation"):
        model.pop("pooling", None)              # set to "mean" then, read by no model of theirs
    return {**out, "model": model}


def model_of(stored: Mapping[str, Any]) -> dict[str, Any]:
    """The model's settings in a recorded config of either layout (:func:`upgraded`), as data."""
    model = upgraded(stored).get("model")
    return dict(model) if isinstance(model, Mapping) else {}


def from_dict(stored: Mapping[str, Any]) -> TrainConfig:
    """The TrainConfig a run recorded (either layout, :func:`upgraded`); fields this version does
    not know are dropped (a newer writer's)."""
    d = {k: v for k, v in stored.items() if k in FIELDS}
    d["model"] = ModelConfig(**{k: v for k, v in model_of(stored).items() if k in MODEL_FIELDS})
    d["metrics"] = tuple(d.get("metrics", ()))
    d["checkpoint_steps"] = tuple(d.get("checkpoint_steps", ()))
    return TrainConfig(**d)


def as_dict(config: TrainConfig) -> dict[str, Any]:
    """``config`` as JSON-ready data (what a run records; :func:`from_dict` reads it back)."""
    out = dataclasses.asdict(config)
    out["model"]["attention_options"] = dict(config.model.attention_options)
    out["dataset_options"] = dict(config.dataset_options)
    out["metrics"] = list(config.metrics)
    return out


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------
def validate(config: TrainConfig) -> TrainConfig:
    """Check ``config``; raise a one-line ValueError naming the valid choices. Returns it."""
    c = config
    choice("task", c.task, TASKS)
    if not isinstance(c.model, ModelConfig):
        raise ValueError(f"model must be a flurka.configs.ModelConfig, got {type(c.model).__name__}")
    choice("schedule", c.schedule, SCHEDULES)
    choice("up-training base", c.base, BASES)
    choice("handover_shape", c.handover_shape, HANDOVER_SHAPES)
    choice("bleu_tokenize", c.bleu_tokenize, BLEU_TOKENIZERS)
    choice("compute_dtype", c.compute_dtype, COMPUTE_DTYPES)
    for m in c.metrics:
        choice("metric", m, TASK_METRICS)
    for name in ("max_len", "batch_size", "steps",
                 "log_every", "bleu_batches", "beam_size"):
        positive(name, getattr(c, name))
    positive("grad_accumulation", c.grad_accumulation)
    if c.batch_size % c.grad_accumulation:
        raise ValueError(f"grad_accumulation={c.grad_accumulation} must divide batch_size={c.batch_size} "
                         "(equal slices of each batch)")
    for name in ("warmup_steps", "eval_every", "eval_batches", "curve_batches", "checkpoint_every", "handover_steps"):
        positive(name, getattr(c, name), zero_ok=True)
    positive("prefetch", c.prefetch, zero_ok=True)
    if c.prefetch > MAX_PREFETCH:
        raise ValueError(f"prefetch={c.prefetch} exceeds {MAX_PREFETCH} batches ahead (each one held in memory)")
    for step in c.checkpoint_steps:
        positive("checkpoint_steps", step)
    if c.checkpoint_steps and not c.checkpoint_every:
        raise ValueError("checkpoint_steps needs checkpoint_every > 0 (a run saves only with a checkpointer)")
    if not (isinstance(c.learning_rate, (int, float)) and c.learning_rate > 0):
        raise ValueError(f"learning_rate must be > 0, got {c.learning_rate!r}")
    if c.schedule == "inverse_sqrt" and c.warmup_steps == 0:
        raise ValueError("the inverse_sqrt schedule needs warmup_steps > 0")
    if c.warmup_steps > c.steps and c.schedule in ("linear", "cosine"):
        raise ValueError(f"warmup_steps={c.warmup_steps} exceeds steps={c.steps}")
    if c.grad_clip is not None and not c.grad_clip > 0:
        raise ValueError(f"grad_clip must be > 0 or None, got {c.grad_clip}")
    opts = dict(c.model.attention_options)
    bad = sorted(set(opts) - set(ATTENTION_OPTIONS))
    if bad:
        raise ValueError(f"unknown attention option(s) {bad}; valid: {', '.join(ATTENTION_OPTIONS)}")
    if opts.get("e_init", E_INITS[0]) not in E_INITS:
        raise ValueError(f"model.attention_options.e_init must be one of {', '.join(E_INITS)}, "
                         f"got {opts['e_init']!r}")
    d_k = opts.get("d_k")
    if d_k is not None:
        positive("model.attention_options.d_k", d_k)
        if d_k > c.max_len:
            raise ValueError(f"d_k={d_k} exceeds the benchmark's max_len={c.max_len}")
    # up-training
    if not isinstance(c.alpha, (int, float)) or not 0.0 <= c.alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {c.alpha!r}")
    if c.alpha > 0 and c.model.attention not in FLURKA:
        raise ValueError(f"alpha > 0 (up-training) needs a FLuRKA attention; valid: {', '.join(FLURKA)}")
    if c.base_checkpoint is not None and not 0 < c.switch_step < c.steps:
        raise ValueError("base_checkpoint needs 0 < round(alpha*steps) < steps (a switch inside the run)")
    return c
