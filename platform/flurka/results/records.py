"""What producers hand to ingestion: a *sweep record* and *speed records*.

Plain dataclasses, each with ``from_dict`` (the JSON form, validated into one readable
``ValueError`` line before anything touches the database) and ``to_dict``. A sweep record:

.. code-block:: json

    {"sweep_id": "uptrain-2024-05-01-a1b2", "name": "uptrain nmt", "created_at": "2024-05-01T12:00:00+00:00",
     "git_commit": "f5764a2", "environment": {"device": "NVIDIA H100", "host": "node-3",
                                              "versions": {"jax": "0.11.0", "flax": "0.12.8"}},
     "trials": [{"trial_key": "t0001", "attention": "flurka-performer", "benchmark": "nmt-wmt14-ende",
                 "seed": 0, "status": "ok", "steps": 128000, "alpha": 0.375, "base": "low-rank",
                 "d_k": 128, "num_features": 64, "train_flops": 2.4e19, "wall_time_s": 5400.0,
                 "metrics": {"bleu": 28.0}, "curve": [{"step": 1000, "loss": 3.2, "train_flops": 1.9e17}],
                 "config": {...}, "node": "node-5", "device": "NVIDIA H100 80GB HBM3", "device_count": 1,
                 "peak_host_bytes": 6100000000, "peak_device_bytes": 42000000000}]}

Fraction metrics (accuracy, f1, matthews, pearson, spearman, top5) are fractions in [-1, 1],
not percent; BLEU is sacreBLEU's 0-100; perplexity and loss are raw. ``status`` is ``"ok"`` or a
short reason (``"diverged at step 812"``); tables use only ``"ok"`` trials. ``alpha`` is the
up-training fraction of steps spent on ``base``, spelled as ``--base`` spells it ("low-rank":
Linformer, "kernel": the variant's kernel constituent; None with ``alpha``: trained from scratch).
Where the trial itself ran (optional; unknown for a trial without a result and in older files):
its ``node`` (hostname), ``device`` (JAX's device kind, "cpu" on CPU) and ``device_count``, and its
peak memory in bytes: the trial process's resident set (``peak_host_bytes``) and the most any one
device's allocator held (``peak_device_bytes``; None on CPU). The sweep's ``environment`` is the
nodes and devices its trials ran on.

A speed record (one measurement; the speed benchmarks write a JSON list of these):

.. code-block:: json

    {"device": "NVIDIA H100", "versions": {"jax": "0.11.0"}, "host": "node-3", "mechanism": "flurka-eva",
     "mode": "train", "N": 16384, "d_model": 512, "heads": 8, "d_k": 256, "m": 64, "batch": 1,
     "dtype": "bfloat16", "status": "ok", "median_s": 0.0123, "spread_s": 0.0004, "flops": 1.1e12,
     "config": {...}, "run": "2026-11-29T03:02:00+00:00"}

``status`` is ``"ok"`` (then ``median_s`` is required), ``"oom"`` or ``"error"``; ``scope`` is
``"layer"`` or ``"model"``; ``run`` (optional) names the run that timed it, so that two
mechanisms' ratio is taken within one. ``speed_records_from_document`` reads the JSON document that
``flurka.speed`` writes (``{"device": {...}, "versions": {...}, "results": [...]}``).

A theory record is the document ``python -m flurka.theory`` writes (schema
``"flurka.theory/1"``): ``created``, ``device``, ``versions``, ``config`` (kept as opaque JSON)
and its ``approximation_errors`` and ``ranks`` rows (:class:`ErrorRow`, :class:`RankRow`; ``layer``
set where the inputs were a trained model's captured layer inputs). One document is one theory
run, keyed by its time, device and config.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
from typing import Any

from flurka.catalogue.metrics import FRACTION_METRICS   # plain Python too
from flurka.catalogue.mechanisms import BASES, MECHANISMS, base_family, has_setting   # plain Python: no JAX
from flurka.configs import BENCHMARKS as _REGISTERED   # plain Python too: the benchmark configs
from flurka.configs.base import model_of

BENCHMARKS: tuple[str, ...] = tuple(_REGISTERED)      # every registered benchmark can be stored
SPEED_MODES = ("forward", "train")
SPEED_STATUSES = ("ok", "oom", "error")
SPEED_SCOPES = ("layer", "model")


def _fail(where: str, msg: str) -> None:
    raise ValueError(f"{where}: {msg}")


def _choice(where: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        _fail(where, f"{name} {value!r} is not one of {', '.join(choices)}")
    return value


INT32 = 2**31 - 1  # PostgreSQL's INTEGER
INT64 = 2**63 - 1  # its BIGINT (byte counts)


def _int(where: str, name: str, value: Any, *, optional: bool = False, minimum: int = 0,
         maximum: int = INT32) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(where, f"{name} must be an int >= {minimum}, got {value!r}")
    if value > maximum:
        _fail(where, f"{name} must be an int <= {maximum}, got {value!r}")
    return value


def _bool(where: str, name: str, value: Any, *, optional: bool = False) -> bool | None:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        _fail(where, f"{name} must be true or false, got {value!r}")
    return value


def _float(where: str, name: str, value: Any, *, optional: bool = False,
           minimum: float | None = None) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(where, f"{name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        _fail(where, f"{name} must be >= {minimum:g}, got {value!r}")
    return float(value)


def _str(where: str, name: str, value: Any, *, optional: bool = False, max_len: int = 255) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > max_len:
        _fail(where, f"{name} must be a non-empty string of at most {max_len} characters, got {value!r}")
    return value


def _keys(where: str, d: Any, required: set[str], optional: set[str]) -> None:
    if not isinstance(d, dict):
        _fail(where, f"expected a JSON object, got {type(d).__name__}")
    missing, unknown = required - d.keys(), d.keys() - required - optional
    if missing:
        _fail(where, f"missing {', '.join(sorted(missing))}")
    if unknown:
        _fail(where, f"unknown {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(required | optional))})")


def _metric(where: str, name: str, value: Any) -> float:
    value = _float(where, f"metric {name!r}", value)
    if name in FRACTION_METRICS and not -1.0 <= value <= 1.0:
        _fail(where, f"metric {name!r}={value} must be a fraction in [-1, 1], not percent")
    return value


@dataclasses.dataclass(frozen=True)
class EnvironmentRecord:
    device: str
    host: str = "unknown"
    versions: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, where: str = "environment") -> EnvironmentRecord:
        _keys(where, d, {"device"}, {"host", "versions"})
        versions = d.get("versions") or {}
        if not isinstance(versions, dict) or not all(isinstance(v, str) for v in versions.values()):
            _fail(where, f"versions must map package names to version strings, got {versions!r}")
        return cls(_str(where, "device", d["device"]), _str(where, "host", d.get("host", "unknown")),
                   dict(sorted(versions.items())))

    @property
    def fingerprint(self) -> str:
        """Natural key: the same device, host and versions are one environment row."""
        blob = json.dumps([self.device, self.host, self.versions], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def _checked(check, *, default: Any = dataclasses.MISSING, **options) -> Any:
    """A record field whose JSON value ``check(where, name, value, **options)`` validates; a field
    made with it is also a column of its table, stored as it is (:data:`TRIAL_COLUMNS`)."""
    return dataclasses.field(default=default, metadata={"check": lambda where, name, value: check(
        where, name, value, **options)})


def _bytes(where: str, name: str, value: Any, optional: bool = True) -> int | None:
    """A byte count: an int (or a whole float, as JSON writers may give a large one) >= 0, or None."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return _int(where, name, value, optional=optional, maximum=INT64)


def _opaque(where: str, name: str, value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial. A field made with :func:`_checked` is validated by its check and stored in the
    ``trials`` column of its name: a new one is this line, the ORM column and its migration."""
    trial_key: str = _checked(_str)
    attention: str = _checked(_choice, choices=MECHANISMS)
    benchmark: str = _checked(_choice, choices=BENCHMARKS)
    seed: int = _checked(_int)
    status: str = _checked(_str)
    steps: int = _checked(_int)
    alpha: float | None = _checked(_float, default=None, optional=True)       # in [0, 1]: from_dict
    base: str | None = _checked(_choice, default=None, choices=BASES)          # older spellings: from_dict
    d_k: int | None = _checked(_int, default=None, optional=True, minimum=1)
    num_features: int | None = _checked(_int, default=None, optional=True, minimum=1)
    train_flops: float | None = _checked(_float, default=None, optional=True)
    wall_time_s: float | None = _checked(_float, default=None, optional=True)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    curve: list[dict[str, float]] = dataclasses.field(default_factory=list)
    config: dict[str, Any] | None = _checked(_opaque, default=None)
    node: str | None = _checked(_str, default=None, optional=True)
    device: str | None = _checked(_str, default=None, optional=True)
    device_count: int | None = _checked(_int, default=None, optional=True, minimum=1)
    peak_host_bytes: int | None = _checked(_bytes, default=None)
    peak_device_bytes: int | None = _checked(_bytes, default=None)
    init_from: str | None = _checked(_str, default=None, optional=True, max_len=1024)   # lineage: the run it was fine-tuned from

    @classmethod
    def from_dict(cls, d: Any, where: str = "trial") -> TrialRecord:
        fields = dataclasses.fields(cls)
        required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        _keys(where, d, required, {f.name for f in fields} - required)
        where = f"{where} {d['trial_key']!r}"
        d = dict(d)
        if d.get("base") in MECHANISMS:       # files written before the base was stored as --base spells it
            try:
                d["base"] = base_family(d["base"])
            except ValueError as e:
                _fail(where, str(e))
        columns = {f.name: f.metadata["check"](where, f.name, d.get(f.name)) for f in fields
                   if "check" in f.metadata and (f.name in required or d.get(f.name) is not None)}
        if columns.get("alpha") is not None and not 0.0 <= columns["alpha"] <= 1.0:
            _fail(where, f"alpha must be in [0, 1], got {columns['alpha']}")
        metrics = d.get("metrics") or {}
        if not isinstance(metrics, dict):
            _fail(where, f"metrics must be an object name -> value, got {metrics!r}")
        curve = [cls._point(where, p) for p in d.get("curve") or []]
        if len({p["step"] for p in curve}) != len(curve):
            _fail(where, "curve has repeated steps")
        return cls(**columns, curve=curve,
                   metrics={_str(where, "metric name", k, max_len=64): _metric(where, k, v) for k, v in metrics.items()})

    @staticmethod
    def _point(where: str, p: Any) -> dict[str, float]:
        if not isinstance(p, dict) or "step" not in p:
            _fail(where, f"curve points must be objects with a 'step', got {p!r}")
        point: dict[str, float] = {"step": _int(where, "curve step", p["step"])}
        for name, value in p.items():
            if name != "step":
                point[_str(where, "curve metric name", name, max_len=64)] = _float(where, f"curve {name!r}", value)
        return point


TRIAL_COLUMNS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrialRecord) if "check" in f.metadata)
PLACEMENT = ("node", "device", "device_count", "peak_host_bytes", "peak_device_bytes")   # where a trial ran


def trial_from_result(trial_key: str, result: dict[str, Any], *, init_from: str | None = None) -> TrialRecord:
    """A trial record from what ``flurka.training.run(config)`` returns inside a Tune trial.

    Non-finite final metrics (a diverged run's perplexity) and history points are dropped; the
    status says why the trial has none. A knob the mechanism does not have (a kernel's d_k,
    Linformer's or rnn's feature count, which every benchmark config carries) is not recorded, so
    that no table or figure reads a Performer baseline as "d_k=16"; the trial's config keeps it.
    Where the trial ran comes from its ``placement`` (none in a result from before it had one).
    Its lineage (``init_from``): the run it was fine-tuned from — a sweep passes that run's trial
    key; else the pre-trained work dir its result names, if any.
    """
    config = result.get("config") or {}
    options = model_of(config).get("attention_options") or {}
    attention = result.get("attention")
    finite = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    curve = [{k: v for k, v in p.items() if finite(v)} for p in result.get("history") or []]
    where = result.get("placement") or {}
    return TrialRecord.from_dict({
        "trial_key": trial_key,
        "attention": attention,
        "benchmark": result.get("benchmark"),
        "seed": result.get("seed"),
        "status": result.get("status"),
        "steps": result.get("steps"),
        "alpha": config.get("alpha"),
        "base": config.get("base") if (config.get("alpha") or 0) > 0 else None,   # up-trained only
        **{s: options.get(s) if attention in MECHANISMS and has_setting(attention, s) else None
           for s in ("d_k", "num_features")},
        "train_flops": result.get("train_flops"),
        "wall_time_s": result.get("wall_time_s"),
        "metrics": {k: v for k, v in (result.get("final_metrics") or {}).items() if finite(v)},
        "curve": [p for p in curve if "step" in p],
        "config": config,
        **{k: where.get(k) for k in PLACEMENT},
        "init_from": init_from or (result.get("init_from") or {}).get("workdir"),
    }, where=f"trial result {trial_key!r}")


@dataclasses.dataclass(frozen=True)
class SweepRecord:
    sweep_id: str
    name: str
    created_at: dt.datetime
    environment: EnvironmentRecord
    trials: list[TrialRecord]
    git_commit: str | None = None

    @classmethod
    def from_dict(cls, d: Any) -> SweepRecord:
        _keys("sweep", d, {"sweep_id", "name", "created_at", "environment", "trials"}, {"git_commit"})
        where = f"sweep {d['sweep_id']!r}"
        created = d["created_at"]
        if isinstance(created, str):
            try:
                created = dt.datetime.fromisoformat(created)
            except ValueError:
                _fail(where, f"created_at must be an ISO 8601 time, got {created!r}")
        if not isinstance(created, dt.datetime):
            _fail(where, f"created_at must be an ISO 8601 time, got {created!r}")
        if not isinstance(d["trials"], list):
            _fail(where, "trials must be a list")
        trials = [t if isinstance(t, TrialRecord) else TrialRecord.from_dict(t, f"{where} trials[{i}]")
                  for i, t in enumerate(d["trials"])]
        keys = [t.trial_key for t in trials]
        if len(set(keys)) != len(keys):
            _fail(where, f"repeated trial_key {sorted({k for k in keys if keys.count(k) > 1})}")
        env = d["environment"]
        return cls(
            sweep_id=_str(where, "sweep_id", d["sweep_id"]),
            name=_str(where, "name", d["name"]),
            created_at=created if created.tzinfo else created.replace(tzinfo=dt.timezone.utc),
            environment=env if isinstance(env, EnvironmentRecord) else EnvironmentRecord.from_dict(env, f"{where} environment"),
            trials=trials,
            git_commit=_str(where, "git_commit", d.get("git_commit"), optional=True, max_len=64),
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["created_at"] = self.created_at.isoformat()
        return d


@dataclasses.dataclass(frozen=True)
class SpeedRecord:
    environment: EnvironmentRecord
    mechanism: str
    mode: str
    N: int
    d_model: int
    heads: int
    status: str
    scope: str | None = None
    d_k: int | None = None
    m: int | None = None
    batch: int = 1
    dtype: str | None = None
    median_s: float | None = None
    spread_s: float | None = None
    flops: float | None = None
    config: dict[str, Any] | None = None
    run: str | None = None  # which run timed it; not part of the key

    @classmethod
    def from_dict(cls, d: Any, where: str = "speed record") -> SpeedRecord:
        env_keys = {"device", "host", "versions"}
        fields = {f.name for f in dataclasses.fields(cls)} - {"environment"}
        required = {"device", "mechanism", "mode", "N", "d_model", "heads", "status"}
        _keys(where, d, required, (fields | env_keys) - required)
        status = _choice(where, "status", d["status"], SPEED_STATUSES)
        median = _float(where, "median_s", d.get("median_s"), optional=True, minimum=0)
        if status == "ok" and median is None:
            _fail(where, "status 'ok' needs median_s")
        return cls(
            environment=EnvironmentRecord.from_dict({k: d[k] for k in env_keys if k in d}, where),
            mechanism=_choice(where, "mechanism", d["mechanism"], MECHANISMS),
            mode=_choice(where, "mode", d["mode"], SPEED_MODES),
            N=_int(where, "N", d["N"], minimum=1),
            d_model=_int(where, "d_model", d["d_model"], minimum=1),
            heads=_int(where, "heads", d["heads"], minimum=1),
            status=status,
            scope=None if d.get("scope") is None else _choice(where, "scope", d["scope"], SPEED_SCOPES),
            d_k=_int(where, "d_k", d.get("d_k"), optional=True, minimum=1),
            m=_int(where, "m", d.get("m"), optional=True, minimum=1),
            batch=_int(where, "batch", d.get("batch", 1), minimum=1),
            dtype=_str(where, "dtype", d.get("dtype"), optional=True, max_len=32),
            median_s=median,
            spread_s=_float(where, "spread_s", d.get("spread_s"), optional=True, minimum=0),
            flops=_float(where, "flops", d.get("flops"), optional=True, minimum=0),
            config=d.get("config"),
            run=_str(where, "run", d.get("run"), optional=True, max_len=64),
        )

    @property
    def key(self) -> str:
        """Natural key: one measurement per configuration (config included) per environment."""
        ident = [self.environment.fingerprint, self.mechanism, self.mode, self.scope, self.N, self.d_model,
                 self.heads, self.d_k, self.m, self.batch, self.dtype, self.config]
        return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()


# A speed result's fields the FLOP model derives (flurka.speed.bench.rederive): a document whose
# rows were re-derived holds the same measurements, which ingest updates rather than adds again.
DERIVED = ("floor_s", "compute_floor_s", "memory_floor_s", "bound", "ratio_to_floor")


def measured_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A speed row's stored config without the fields the FLOP model derives (:data:`DERIVED`)."""
    return {k: v for k, v in (config or {}).items() if k not in DERIVED}


def _document_environment(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The environment fields of a ``flurka.speed`` or ``flurka.theory`` document: device
    name and host from ``device`` ({name, host, ...} or a bare name), versions as strings."""
    device = doc.get("device") or {}
    versions = doc.get("versions") or {}
    if not isinstance(versions, dict):
        _fail(where, f"versions must be an object, got {versions!r}")
    return {"device": device.get("name") if isinstance(device, dict) else device,
            "host": (device.get("host") if isinstance(device, dict) else None) or "unknown",
            "versions": {k: str(v) for k, v in versions.items() if v is not None}}


def _spread(timing: dict[str, Any]) -> float | None:
    """p90 − p10 of a benchmark's timing summary, or None where either is missing."""
    p10, p90 = timing.get("p10_s"), timing.get("p90_s")
    return p90 - p10 if p10 is not None and p90 is not None else None


SPEED_SCHEMA = "flurka.speed/1"
PLAIN_SCHEMA = "flurka.speed.plain/1"   # python -m flurka.speed.plain: layers beside plain jnp


def speed_records_from_plain_document(doc: dict[str, Any]) -> list[SpeedRecord]:
    """Speed records from ``flurka.speed.plain``'s document: each row two layer-scope records
    of one shape, the project's layer and its plain ``jnp`` form (``config.form`` "layer" or
    "plain", with the row's size name, padding and the paired ratio), float32."""
    env = _document_environment(doc, "plain document")
    run = doc.get("created")
    records = []
    for i, r in enumerate(doc["results"]):
        where = f"plain document results[{i}]"
        if not isinstance(r, dict):
            _fail(where, f"expected an object, got {type(r).__name__}")
        for form in ("layer", "plain"):
            t = r.get(form)
            if not isinstance(t, dict):
                _fail(where, f"{form!r} must be an object of timings, got {t!r}")
            records.append(SpeedRecord.from_dict({
                **env, "mechanism": r.get("mechanism"), "mode": r.get("mode"), "scope": "layer",
                "N": r.get("seq_len"), "d_model": r.get("d_model"), "heads": r.get("num_heads"),
                "d_k": r.get("d_k"), "m": r.get("num_features"), "batch": r.get("batch", 1),
                "dtype": "float32", "status": "ok", "median_s": t.get("median_s"),
                "spread_s": _spread(t), "run": run,
                "config": {"form": form, "size": r.get("size"), "padded": r.get("padded"),
                           "ratio": r.get("ratio")}}, f"{where} {form}"))
    return records


def speed_records_from_document(doc: dict[str, Any]) -> list[SpeedRecord]:
    """Speed records from the document ``flurka.speed`` writes: its ``results`` entries (Point
    fields seq_len/num_heads/num_features + status/median_s/p10_s/p90_s/flops), its ``device``
    and ``versions``. ``spread_s`` is p90 - p10; every other result field is kept in ``config``;
    the document's ``created`` names the run, with the row's ``task`` where a Ray sweep's tasks
    timed its rows on several cards."""
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ValueError("speed document: expected an object with a 'results' list")
    schema = doc.get("schema")
    if schema == PLAIN_SCHEMA:
        return speed_records_from_plain_document(doc)
    if schema not in (SPEED_SCHEMA, 1, None):   # the early documents: 1, or no schema field
        _fail("speed document", f"schema {schema!r} is not one the results database reads "
                                f"({SPEED_SCHEMA}, {PLAIN_SCHEMA}, flurka.theory/1, sweep records)")
    env = _document_environment(doc, "speed document")
    run = doc.get("created")
    own = {"mechanism", "mode", "scope", "seq_len", "d_model", "num_heads", "d_k", "num_features", "batch",
           "dtype", "status", "median_s", "flops"}
    records = []
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict):
            raise ValueError(f"speed document results[{i}]: expected an object, got {type(r).__name__}")
        records.append(SpeedRecord.from_dict({
            **env, "mechanism": r.get("mechanism"), "mode": r.get("mode"), "scope": r.get("scope"),
            "N": r.get("seq_len"), "d_model": r.get("d_model"), "heads": r.get("num_heads"),
            "d_k": r.get("d_k"), "m": r.get("num_features"), "batch": r.get("batch", 1), "dtype": r.get("dtype"),
            "status": r.get("status"), "median_s": r.get("median_s"), "spread_s": _spread(r),
            "flops": r.get("flops"), "config": {k: v for k, v in r.items() if k not in own} or None,
            "run": run if run is None or r.get("task") is None else f"{run} task {r['task']}",
        }, f"speed document results[{i}]"))
    return records


# ---------------------------------------------------------------------------------------------
# Theory documents (python -m flurka.theory)
# ---------------------------------------------------------------------------------------------
THEORY_SCHEMA = "flurka.theory/1"


def _nonnegative(where: str, name: str, value: Any, *, optional: bool = False) -> float | None:
    value = _float(where, name, value, optional=optional)
    if value is not None and value < 0:
        _fail(where, f"{name} must be >= 0, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class ErrorRow:
    """One ``approximation_errors`` row: a mechanism's error vs full attention at one seed."""

    mechanism: str
    seed: int
    rel_error: float
    inf_error: float
    d_k: int | None = None
    m: int | None = None
    layer: int | None = None
    kernel_term: float | None = None
    lowrank_term: float | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str = "approximation error") -> ErrorRow:
        required = {"mechanism", "seed", "rel_error", "inf_error"}
        _keys(where, d, required, {f.name for f in dataclasses.fields(cls)} - required)
        return cls(
            mechanism=_choice(where, "mechanism", d["mechanism"], MECHANISMS),
            seed=_int(where, "seed", d["seed"], minimum=-INT32),
            rel_error=_nonnegative(where, "rel_error", d["rel_error"]),
            inf_error=_nonnegative(where, "inf_error", d["inf_error"]),
            d_k=_int(where, "d_k", d.get("d_k"), optional=True, minimum=1),
            m=_int(where, "m", d.get("m"), optional=True, minimum=1),
            layer=_int(where, "layer", d.get("layer"), optional=True),
            kernel_term=_nonnegative(where, "kernel_term", d.get("kernel_term"), optional=True),
            lowrank_term=_nonnegative(where, "lowrank_term", d.get("lowrank_term"), optional=True),
        )


@dataclasses.dataclass(frozen=True)
class RankRow:
    """One ``ranks`` row: the numerical rank of φ(Q)φ(K)ᵀ of one head (of one example, seed, layer)."""

    mechanism: str
    head: int
    rank: int
    max_rank: int
    seed: int | None = None
    example: int | None = None
    layer: int | None = None
    d_k: int | None = None
    m: int | None = None
    trained: bool | None = None   # the trained model's own layer (``--from-run``)

    @classmethod
    def from_dict(cls, d: Any, where: str = "rank") -> RankRow:
        required = {"mechanism", "head", "rank", "max_rank"}
        _keys(where, d, required, {f.name for f in dataclasses.fields(cls)} - required)
        rank, max_rank = _int(where, "rank", d["rank"]), _int(where, "max_rank", d["max_rank"], minimum=1)
        if rank > max_rank:
            _fail(where, f"rank {rank} exceeds max_rank {max_rank}")
        return cls(
            mechanism=_choice(where, "mechanism", d["mechanism"], MECHANISMS),
            head=_int(where, "head", d["head"]),
            rank=rank,
            max_rank=max_rank,
            seed=_int(where, "seed", d.get("seed"), optional=True, minimum=-INT32),
            example=_int(where, "example", d.get("example"), optional=True),
            layer=_int(where, "layer", d.get("layer"), optional=True),
            d_k=_int(where, "d_k", d.get("d_k"), optional=True, minimum=1),
            m=_int(where, "m", d.get("m"), optional=True, minimum=1),
            trained=_bool(where, "trained", d.get("trained"), optional=True),
        )


def _time(where: str, name: str, value: Any) -> dt.datetime:
    """An ISO 8601 time, in UTC (naive means UTC), so SQLite and PostgreSQL store the same instant."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            pass
    if not isinstance(value, dt.datetime):
        _fail(where, f"{name} must be an ISO 8601 time, got {value!r}")
    return value.astimezone(dt.timezone.utc) if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def theory_key(doc: dict[str, Any], where: str = "theory document") -> str:
    """Natural key of a theory run: its document's time, device and config (canonical JSON), so
    the same document ingested twice (or also passed to the report as a file) counts once."""
    created = _time(where, "created", doc.get("created")).isoformat()
    blob = json.dumps([created, doc.get("device"), doc.get("config")], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def is_theory_document(data: Any) -> bool:
    """A ``flurka.theory/*`` schema, or (older or hand-written files) theory rows without one."""
    if not isinstance(data, dict):
        return False
    schema = data.get("schema")
    if isinstance(schema, str) and schema.startswith("flurka.theory/"):
        return True
    return schema is None and bool({"approximation_errors", "ranks"} & data.keys())


@dataclasses.dataclass(frozen=True)
class TheoryRecord:
    key: str
    created_at: dt.datetime
    environment: EnvironmentRecord
    config: dict[str, Any]
    errors: list[ErrorRow]
    ranks: list[RankRow]

    @classmethod
    def from_dict(cls, doc: Any, where: str = "theory document") -> TheoryRecord:
        """Validate a whole document (every row) into one record; ValueError (one line) naming the
        first bad field."""
        if isinstance(doc, dict) and doc.get("schema", THEORY_SCHEMA) != THEORY_SCHEMA:
            _fail(where, f"schema {doc['schema']!r} is not {THEORY_SCHEMA!r}")
        _keys(where, doc, {"created", "device", "config"}, {"schema", "versions", "approximation_errors", "ranks"})
        created = _time(where, "created", doc["created"])
        if not isinstance(doc["config"], dict):
            _fail(where, f"config must be a JSON object, got {type(doc['config']).__name__}")
        env = EnvironmentRecord.from_dict(_document_environment(doc, where), where)
        lists = {}
        for name in ("approximation_errors", "ranks"):
            lists[name] = doc.get(name) or []
            if not isinstance(lists[name], list):
                _fail(where, f"{name} must be a list, got {type(lists[name]).__name__}")
        errors = [ErrorRow.from_dict(r, f"{where} approximation_errors[{i}]")
                  for i, r in enumerate(lists["approximation_errors"])]
        ranks = [RankRow.from_dict(r, f"{where} ranks[{i}]") for i, r in enumerate(lists["ranks"])]
        if not errors and not ranks:
            _fail(where, "holds no approximation_errors or ranks rows")
        return cls(theory_key(doc, where), created, env, doc["config"], errors, ranks)
