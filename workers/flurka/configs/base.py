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
from flurka.catalogue.mechanisms import BASES, E_INITS, FLURKA, MECHANISMS, SETTINGS
from flurka.catalogue.metrics import METRICS, SEQUENCE_METRICS, TASK_METRICS
from flurka.cli import one_line
from flurka.data.prefetch import MAX_PREFETCH

# The key of an eval history entry made with ``curve_batches`` (a subset, no decoding): such an
# entry is a point of the eval curve, never a run's final metrics.
CURVE_POINT = "curve_point"
TASKS = ("classification", "regression", "mlm", "translation", "image")
MODELS = ("classifier", "mlm", "seq2seq", "vit")
SCHEDULES = ("linear", "inverse_sqrt", "cosine", "constant")
COMPUTE_DTYPES = ("float32", "bfloat16")
BLEU_TOKENIZERS = ("13a", "intl", "char", "none", "zh")  # sacrebleu's, without extra dependencies
HANDOVER_SHAPES = ("linear", "ease-out")
POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs. ``dataset`` names a :mod:`flurka.data` data set."""

    benchmark: str
    dataset: str
    task: str
    model: str
    metrics: tuple[str, ...]
    # model
    d_model: int
    num_heads: int
    num_layers: int
    d_ff: int
    max_len: int                       # the encoder's sequence length (tokens, pixels, patches)
    num_decoder_layers: int = 0        # seq2seq only
    dropout_rate: float = 0.1
    pooling: str = "mean"
    patch_size: int = 16               # vit only
    t2t: bool = False                  # vit only: Tokens-to-Token stem
    attention: str = "full"
    attention_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Mixed precision: "bfloat16" runs every forward/backward product on bf16 copies of the
    # float32 parameters (gradients, AdamW state and checkpoints stay float32); "float32" (TF32 on
    # GPUs at JAX's default matmul precision) is the paper's setting and the default.
    compute_dtype: str = "float32"
    # Memory for the paper's sizes on one card: each step's gradient summed over this many equal
    # slices of its batch, one after another (the step, its batch and its update unchanged; the
    # activations of one slice), and remat: each encoder block's activations recomputed in the
    # backward pass instead of kept (jax.checkpoint; more FLOPs, the same maths).
    grad_accumulation: int = 1
    remat: bool = False
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
        return dataclasses.replace(self, **overrides)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

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
    """The named benchmark's config with ``overrides`` applied, validated.

    ``attention_options`` and ``dataset_options`` overrides are merged into the benchmark's
    defaults (so ``attention_options={"d_k": 64}`` keeps ``num_features``); ``None`` values
    in them remove a default. Overriding ``steps`` alone scales ``warmup_steps`` with it (linear
    and cosine schedules), so the warm-up stays the same fraction of training.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; valid: {', '.join(sorted(BENCHMARKS))}")
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ValueError(one_line(f"unknown config field(s) {unknown}; valid: {', '.join(FIELDS)}", bare=False))
    config = BENCHMARKS[benchmark].config()
    if "steps" in overrides and "warmup_steps" not in overrides and config.schedule != "inverse_sqrt":
        # warm-up keeps its fraction of training when only the length changes
        steps = overrides["steps"]
        if isinstance(steps, int) and steps > 0:
            overrides["warmup_steps"] = round(config.warmup_steps * steps / config.steps)
    for key in ("attention_options", "dataset_options"):
        if key in overrides and overrides[key] is not None:
            if not isinstance(overrides[key], Mapping):
                raise ValueError(f"{key} must be a mapping such as {{'d_k': 16}}, got {repr(overrides[key])[:80]}")
            merged = {**getattr(config, key), **overrides[key]}
            overrides[key] = {k: v for k, v in merged.items() if v is not None}
    config = dataclasses.replace(config, **overrides)
    validate(config)
    return config


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------
def _choice(name: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(str, valid))}")


MAX_INT = 2**31 - 1    # sizes and step counts reach the device as int32


def _positive(name: str, value: Any, *, zero_ok: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if zero_ok else value > 0)
    if not ok or value > MAX_INT:
        raise ValueError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} int of at most "
                         f"{MAX_INT}, got {repr(value)[:80]}")


def validate(config: TrainConfig) -> TrainConfig:
    """Check ``config``; raise a one-line ValueError naming the valid choices. Returns it."""
    c = config
    _choice("task", c.task, TASKS)
    _choice("model", c.model, MODELS)
    _choice("attention mechanism", c.attention, MECHANISMS)
    _choice("schedule", c.schedule, SCHEDULES)
    _choice("pooling", c.pooling, POOLINGS)
    _choice("up-training base", c.base, BASES)
    _choice("handover_shape", c.handover_shape, HANDOVER_SHAPES)
    _choice("bleu_tokenize", c.bleu_tokenize, BLEU_TOKENIZERS)
    _choice("compute_dtype", c.compute_dtype, COMPUTE_DTYPES)
    for m in c.metrics:
        _choice("metric", m, TASK_METRICS)
    for name in ("d_model", "num_heads", "num_layers", "d_ff", "max_len", "batch_size", "steps",
                 "log_every", "bleu_batches", "beam_size"):
        _positive(name, getattr(c, name))
    _positive("grad_accumulation", c.grad_accumulation)
    if c.batch_size % c.grad_accumulation:
        raise ValueError(f"grad_accumulation={c.grad_accumulation} must divide batch_size={c.batch_size} "
                         "(equal slices of each batch)")
    for name in ("warmup_steps", "eval_every", "eval_batches", "curve_batches", "checkpoint_every", "num_decoder_layers",
                 "handover_steps"):
        _positive(name, getattr(c, name), zero_ok=True)
    _positive("prefetch", c.prefetch, zero_ok=True)
    if c.prefetch > MAX_PREFETCH:
        raise ValueError(f"prefetch={c.prefetch} exceeds {MAX_PREFETCH} batches ahead (each one held in memory)")
    for step in c.checkpoint_steps:
        _positive("checkpoint_steps", step)
    if c.checkpoint_steps and not c.checkpoint_every:
        raise ValueError("checkpoint_steps needs checkpoint_every > 0 (a run saves only with a checkpointer)")
    if c.d_model % c.num_heads:
        raise ValueError(f"num_heads={c.num_heads} must divide d_model={c.d_model}")
    if not (isinstance(c.learning_rate, (int, float)) and c.learning_rate > 0):
        raise ValueError(f"learning_rate must be > 0, got {c.learning_rate!r}")
    if c.schedule == "inverse_sqrt" and c.warmup_steps == 0:
        raise ValueError("the inverse_sqrt schedule needs warmup_steps > 0")
    if c.warmup_steps > c.steps and c.schedule in ("linear", "cosine"):
        raise ValueError(f"warmup_steps={c.warmup_steps} exceeds steps={c.steps}")
    if not 0.0 <= c.dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {c.dropout_rate}")
    if c.grad_clip is not None and not c.grad_clip > 0:
        raise ValueError(f"grad_clip must be > 0 or None, got {c.grad_clip}")
    opts = dict(c.attention_options)
    bad = sorted(set(opts) - set(ATTENTION_OPTIONS))
    if bad:
        raise ValueError(f"unknown attention option(s) {bad}; valid: {', '.join(ATTENTION_OPTIONS)}")
    if opts.get("e_init", E_INITS[0]) not in E_INITS:
        raise ValueError(f"attention_options.e_init must be one of {', '.join(E_INITS)}, "
                         f"got {opts['e_init']!r}")
    d_k = opts.get("d_k")
    if d_k is not None:
        _positive("attention_options.d_k", d_k)
        if d_k > c.max_len:
            raise ValueError(f"d_k={d_k} exceeds the benchmark's max_len={c.max_len}")
    # up-training
    if not isinstance(c.alpha, (int, float)) or not 0.0 <= c.alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {c.alpha!r}")
    if c.alpha > 0 and c.attention not in FLURKA:
        raise ValueError(f"alpha > 0 (up-training) needs a FLuRKA attention; valid: {', '.join(FLURKA)}")
    if c.base_checkpoint is not None and not 0 < c.switch_step < c.steps:
        raise ValueError("base_checkpoint needs 0 < round(alpha*steps) < steps (a switch inside the run)")
    return c
