"""The sweep specification: CLI flags and/or a YAML file, validated in one place.

Every mistake a user can make in a spec (malformed YAML, a value of the wrong type, an unknown
benchmark or variant, α outside [0, 1], d_k longer than the benchmark's sequence, a run dir or
compilation cache that cannot be written, ...) is caught by :func:`from_args` / :func:`validate`
with one line naming the key and the valid choices, before Ray, MLflow or any trial starts, and
before anything is created on disk. Checks that need the outside world (the databases, the
cluster's GPUs) live in the runner's ``preflight`` / ``flurka.cluster`` and run next, still
before any trial. What is persisted of a spec (:func:`stored_dict`) never holds a password.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import urllib.parse
from pathlib import Path
from typing import Any, Sequence

import yaml

from flurka import configs
from flurka.cli import OneLineParser as ArgumentParser, one_line, writable_dir   # errors in one line
from flurka.configs.checks import MAX_INT as MAX_STEPS
from flurka.configs.overrides import nested, parse_assignments
from flurka.catalogue.mechanisms import BASES, E_INITS, FLURKA, LENGTH_BOUND, MECHANISMS, base_mechanism

# Table 5's α grid: 12.5% ... 87.5% of the training steps on the base model.
PAPER_ALPHAS: tuple[float, ...] = tuple(i / 8 for i in range(1, 8))
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")   # one path component: Tune's folder, MLflow's experiment
DEFAULT_BASE = "low-rank"   # a variant's up-training base where the spec names none for it
FULL = "full"
SEARCHES = ("grid", "optuna")
SCHEDULERS = ("none", "asha")


class SpecError(ValueError):
    """A sweep spec that cannot run; the message is one line naming the valid choices, a quoted
    value the user gave cut to 80 characters."""

    def __init__(self, message: str):
        super().__init__(one_line(message, bare=False))


def _field(default: Any, kind: str, help: str, **flag: Any) -> Any:
    """A SweepSpec field with what its YAML key and flag need: ``kind`` (the value's type, a row of
    ``_CONVERT``), ``help``, and argparse's ``flag`` options where they differ from ``--NAME``
    (``option``, ``choices``, ``metavar``). A new field is one line here; its flag follows."""
    meta = {"kind": kind, "help": help, "flag": flag}
    if default is dataclasses.MISSING:      # required
        return dataclasses.field(metadata=meta)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """One sweep: its YAML keys and flags are these fields (``--d-k`` is ``d_k``); each field's
    type and help are declared beside it, and :func:`add_arguments` makes the flags from them."""

    benchmarks: tuple[str, ...] = _field(dataclasses.MISSING, "strs", "comma-separated benchmark names")
    variants: tuple[str, ...] = _field((), "strs", "FLuRKA variants (default: all)")
    alphas: tuple[float, ...] | dict[str, tuple[float, ...]] = _field(
        PAPER_ALPHAS, "floats per variant",
        "up-training fractions (default 0.125..0.875); per variant in a sweep file: alphas: {flurka-rnn: [0.64]}")
    d_k: tuple[int, ...] = _field((), "ints", "d_k values to search, comma-separated: the lengths E1, E2 compress "
                                              "the sequence to (default: each benchmark config's own)")
    base: str | dict[str, str] = _field(
        DEFAULT_BASE, "str per variant",
        f"base model of the up-training ({' or '.join(BASES)}), one for every variant or per variant "
        "(flurka-rnn=kernel; a variant not named: low-rank)", metavar="BASE|VARIANT=BASE,...")
    search: str = _field("grid", "str", "grid: every planned α branch; optuna: --num-samples branches chosen by "
                                        "Optuna's TPE on the benchmark's metric (default grid)", choices=SEARCHES)
    scheduler: str = _field("none", "str", "asha stops α branches whose training loss trails the others' "
                                           "(default none: every trial runs its T steps)", choices=SCHEDULERS)
    num_samples: int = _field(1, "int", "optuna samples (grid: repeats)")
    seeds: tuple[int, ...] = _field((0,), "ints", "comma-separated seeds (default 0)")
    steps: int | None = _field(None, "int?", "training steps T per run (default: each benchmark config's own)")
    overrides: dict[str, Any] = _field(
        {}, "overrides", "benchmark config override, repeatable; VALUE as `flurka train --set` reads it "
                         "(a Python literal: 1e6, 16, [1, 2], {'d_k': 16}; else the text)",
        option="--set", action="append", metavar="KEY=VALUE")
    baselines: bool = _field(True, "bool", "train only the FLuRKA variants and their bases, not the constituents, "
                                           "full attention and the control they are judged against")
    full: bool = _field(True, "bool", "leave full attention out of the baselines")
    control: bool = _field(True, "bool", "leave the no-attention control (linformer at d_k 1, each table's floor "
                                         "row) out of the baselines")
    e_init: str | None = _field(None, "str?", "E1/E2's initialisation (default pool; gaussian: the paper's)",
                                choices=E_INITS)
    branching: bool = _field(True, "bool", "train every α independently (the paper's way)")
    cpus_per_trial: float = _field(1.0, "float", "CPU cores reserved per trial (default 1)")
    gpus_per_trial: float = _field(0.0, "float", "fractions share one GPU")
    max_failures: int = _field(2, "int", "retries of a failed trial (default 2)")
    name: str = _field("uptrain", "str", "the sweep's name: its MLflow experiment and results-DB label "
                                         "(default uptrain)")
    run_dir: str = _field("runs/uptrain", "str", "where Tune, MLflow and the results DB write")
    address: str | None = _field(None, "str?", "Ray cluster (default: RAY_ADDRESS, else embedded)")
    mlflow_uri: str | None = _field(None, "str?", "MLflow tracking URI (default sqlite:///<run-dir>/mlflow.db); "
                                                  "a password in it is never stored, as --results-db's")
    results_db: str | None = _field(None, "str?", "SQLAlchemy URL of the results database; a password in it is "
                                                  "never stored (sweep.json and MLflow keep it masked): give the "
                                                  "flag again with --resume")
    num_cpus: int | None = _field(None, "int?", "CPUs of the embedded Ray")
    resume: bool = _field(False, "bool", "restore an interrupted sweep")
    new: bool = _field(False, "bool", "the run dir holds a sweep: move it aside to <run-dir>.<its sweep id> and "
                                      "start afresh")
    checkpoint_every: int | None = _field(None, "int?", "extra checkpoints every this many steps, for recovery "
                                                        "(default: the fork points only)")
    compilation_cache: str | None = _field(None, "str?", "JAX's persistent compilation cache the trials share "
                                                         "(default: $JAX_COMPILATION_CACHE_DIR if set, else "
                                                         "<run-dir>/jax-cache; off: none)", metavar="DIR|off")
    verbose: bool = _field(False, "bool", "Tune's table of every trial as it runs (default: one progress line)")
    pretrain: dict[str, Any] | None = _field(
        None, "pretrain?", "pre-train then fine-tune: an MLM benchmark every run first pre-trains on (its own phase, "
                           "same mechanism, α, d_k and seed), each run of --benchmarks then starting from that run's "
                           "encoder (init_from); in a sweep file a mapping: benchmark, steps, overrides, full_length "
                           "(mechanisms fine-tuned at the pre-training's length)", metavar="BENCHMARK")
    storage: str | None = _field(None, "str?", "object storage the nodes share instead of the run dir: Tune's state "
                                               "and every trial's checkpoints (s3://BUCKET/PREFIX, gs://...; "
                                               "credentials and endpoint from AWS_* / ~/.aws on each node, never "
                                               "in the URI)", metavar="URI")

    # -- derived -----------------------------------------------------------------------------
    @property
    def run_path(self) -> Path:
        return Path(self.run_dir).expanduser().resolve()

    @property
    def mlflow_tracking_uri(self) -> str:
        return self.mlflow_uri or f"sqlite:///{self.run_path / 'mlflow.db'}"

    @property
    def results_url(self) -> str:
        return self.results_db or f"sqlite:///{self.run_path / 'results.db'}"

    @property
    def compilation_cache_dir(self) -> str | None:
        """Where the trials keep their compiled programs (shared storage on a multi-node cluster,
        as the run dir is), or None. Unnamed, it is JAX's own ``$JAX_COMPILATION_CACHE_DIR`` when
        that is set (a user's cache that outlives runs), else ``<run_dir>/jax-cache``."""
        if self.compilation_cache == "off":
            return None
        cache = self.compilation_cache or os.environ.get("JAX_COMPILATION_CACHE_DIR")
        if cache:
            return str(Path(cache).expanduser().resolve())
        return str(self.run_path / "jax-cache")

    @property
    def config_overrides(self) -> dict[str, Any]:
        """What every trial's ``get_config`` gets: ``overrides`` with ``e_init`` merged in."""
        overrides = dict(self.overrides)
        if self.e_init is not None:
            overrides["model.attention_options.e_init"] = self.e_init
        return nested(overrides)

    def base_of(self, variant: str) -> str:
        """``variant``'s up-training base ("low-rank" or "kernel", :data:`BASES`)."""
        return self.base.get(variant, DEFAULT_BASE) if isinstance(self.base, dict) else self.base

    def alphas_of(self, variant: str) -> tuple[float, ...]:
        """``variant``'s α values."""
        return tuple(self.alphas.get(variant, PAPER_ALPHAS) if isinstance(self.alphas, dict) else self.alphas)

    @property
    def all_alphas(self) -> tuple[float, ...]:
        """Every α of the sweep, sorted (what a search over branches chooses from)."""
        return tuple(sorted({a for v in self.variants for a in self.alphas_of(v)}))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- catalogue: what the workers offer ----------------------------------------------------------

def catalogue() -> dict[str, Any]:
    """Benchmarks, FLuRKA variants and their constituents, read from the workers."""
    return {"benchmarks": tuple(sorted(configs.BENCHMARKS)), "variants": tuple(FLURKA),
            "mechanisms": tuple(MECHANISMS)}



def benchmark_config(benchmark: str, spec: SweepSpec, **extra: Any):
    """``benchmark``'s config in this sweep: its phase's overrides and steps (:func:`phase_spec`)."""
    spec = phase_spec(spec, benchmark)
    overrides = spec.config_overrides
    if spec.steps is not None:
        overrides["steps"] = spec.steps
    overrides.update(extra)
    return configs.get_config(benchmark, **overrides)


# -- validation ---------------------------------------------------------------------------------

def _one_of(kind: str, value: Any, valid: Sequence[Any]) -> None:
    if value not in valid:
        raise SpecError(f"unknown {kind} {value!r}; valid: {', '.join(map(str, valid))}")


def validate(spec: SweepSpec, cat: dict[str, Any] | None = None) -> SweepSpec:
    """Return the spec with defaults filled in, or raise SpecError (one line)."""
    _check_types(spec)
    if spec.pretrain is not None:
        spec = dataclasses.replace(spec, pretrain=_pretrain(spec.pretrain))
    cat = cat or catalogue()
    if not spec.benchmarks:
        raise SpecError(f"no benchmark given; valid: {', '.join(cat['benchmarks'])}")
    for b in spec.benchmarks:
        _one_of("benchmark", b, cat["benchmarks"])
    variants = spec.variants or cat["variants"]
    for v in variants:
        _one_of("variant", v, cat["variants"])
    for key, per in (("base", spec.base), ("alphas", spec.alphas)):
        for v in per if isinstance(per, dict) else ():
            if v not in variants:
                raise SpecError(f"{key}: {v!r} is not one of the sweep's variants ({', '.join(variants)})")
    for v, b in (spec.base.items() if isinstance(spec.base, dict) else [("", spec.base)]):
        _one_of(f"base{' of ' + v if v else ''}", b, BASES)
    _one_of("--search", spec.search, SEARCHES)
    _one_of("--scheduler", spec.scheduler, SCHEDULERS)
    for v, alphas in (spec.alphas.items() if isinstance(spec.alphas, dict) else [("", spec.alphas)]):
        of = f" of {v}" if v else ""
        if not alphas:
            raise SpecError(f"--alphas{of} is empty; give at least one α in [0, 1]")
        for a in alphas:
            if not 0.0 <= float(a) <= 1.0:
                raise SpecError(f"α={a:g}{of} is outside [0, 1] (α is the fraction of steps on the base model)")
        if len(set(alphas)) != len(alphas):
            raise SpecError(f"--alphas{of} has duplicates: {list(alphas)}")
    if spec.search == "optuna" and isinstance(spec.alphas, dict):
        raise SpecError("--search optuna samples α for every variant alike: give one α list, not one per variant")
    if not spec.seeds:
        raise SpecError("--seeds is empty")
    if spec.num_samples < 1:
        raise SpecError(f"--num-samples must be >= 1, got {spec.num_samples}")
    if spec.steps is not None and not 1 <= spec.steps <= MAX_STEPS:
        raise SpecError(f"--steps must be in [1, {MAX_STEPS}], got {spec.steps}")
    if not NAME.fullmatch(spec.name):
        raise SpecError(f"--name must be 1-100 letters, digits, '.', '_' or '-' (one folder name), "
                        f"got {spec.name[:80]!r}")
    if spec.cpus_per_trial <= 0:
        raise SpecError(f"--cpus-per-trial must be > 0, got {spec.cpus_per_trial:g}")
    if spec.gpus_per_trial < 0 or (spec.gpus_per_trial > 1 and spec.gpus_per_trial != int(spec.gpus_per_trial)):
        raise SpecError(f"--gpus-per-trial must be a fraction in (0, 1] or a whole number, got {spec.gpus_per_trial:g}")
    if spec.max_failures < 0:
        raise SpecError(f"--max-failures must be >= 0, got {spec.max_failures}")
    if spec.num_cpus is not None and spec.num_cpus < 1:
        raise SpecError(f"--num-cpus must be >= 1, got {spec.num_cpus}")
    if spec.checkpoint_every is not None and spec.checkpoint_every < 0:
        raise SpecError(f"--checkpoint-every must be >= 0, got {spec.checkpoint_every}")
    if len(set(spec.seeds)) != len(spec.seeds):
        raise SpecError(f"--seeds has duplicates: {list(spec.seeds)}")
    for b in spec.benchmarks:
        try:
            cfg = benchmark_config(b, spec)
        except (TypeError, ValueError, KeyError) as exc:
            raise SpecError(f"benchmark {b!r}: {str(exc).splitlines()[0]}") from None
        if spec.address is None and not os.environ.get("RAY_ADDRESS"):   # trials run here
            from flurka.training.memory import check_fits   # JAX, 1.9 s: `flurka sweep --help` stays without it
            try:
                check_fits(cfg, device=None if spec.gpus_per_trial == 0 else math.inf)
            except ValueError as exc:
                raise SpecError(f"benchmark {b!r}: {exc}") from None
        seq_len = seq_len_of(cfg)
        for d in spec.d_k or (d_k_of(cfg),):
            if d is None or int(d) < 1:
                raise SpecError(f"d_k must be a positive integer, got {d!r}")
            if int(d) > seq_len:
                raise SpecError(f"d_k={d} is larger than {b}'s sequence length {seq_len}")
    if spec.storage is not None:
        problem = storage_problem(spec.storage)
        if problem:
            raise SpecError(f"--storage {problem}")
    check_paths(spec)
    alphas = ({v: tuple(float(a) for a in spec.alphas_of(v)) for v in variants} if isinstance(spec.alphas, dict)
              else tuple(float(a) for a in spec.alphas))
    spec = dataclasses.replace(spec, variants=tuple(variants), alphas=alphas)
    if spec.pretrain is not None:
        _check_chain(spec, cat)
    return spec


STORAGE_SCHEMES = ("s3", "gs", "gcs")   # what pyarrow.fs (and so Ray Tune) resolves as object storage


def storage_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a sweep's ``--storage`` (None: it can), never echoing a credential:
    object storage (:data:`STORAGE_SCHEMES`) naming a bucket, with no user, password or query
    string, so that the URI may be stored and logged as it is (the keys and an S3-compatible
    server's endpoint come from each node's AWS settings)."""
    parts = urllib.parse.urlsplit(uri)
    if "@" in parts.netloc:
        return ("holds credentials: give them to every node as the SDK reads them (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, an instance role), never in the URI")
    if parts.scheme not in STORAGE_SCHEMES:
        return (f"must be object storage, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX, got {uri[:80]!r} "
                "(a run dir on this machine or on a shared mount needs no --storage)")
    if not parts.netloc:
        return f"names no bucket: {uri[:80]!r}"
    if parts.query or parts.fragment:
        return "has a query string: give an S3-compatible server's endpoint as AWS_ENDPOINT_URL, its region as AWS_REGION"
    return None


def _writable_dir(path: Path, what: str) -> None:
    """:func:`flurka.cli.writable_dir`, as a SpecError."""
    try:
        writable_dir(path, what)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def check_paths(spec: SweepSpec) -> None:
    """The directories the sweep writes are (or can be made) writable directories, the SQLite
    files it opens sit in them; nothing is created. Whether the files are databases is the
    stores' check (``flurka.sweeps.runner.preflight``)."""
    _writable_dir(spec.run_path, "--run-dir")
    cache = spec.compilation_cache_dir
    if cache is not None:
        what = ("--compilation-cache" if spec.compilation_cache
                else "$JAX_COMPILATION_CACHE_DIR" if os.environ.get("JAX_COMPILATION_CACHE_DIR")
                else "the compilation cache")
        _writable_dir(Path(cache), what)
    from flurka.results.db import sqlite_file   # SQLAlchemy, Alembic: 0.45 s that --help does not pay

    for flag, url in (("--mlflow-uri", spec.mlflow_tracking_uri), ("--results-db", spec.results_url)):
        path = sqlite_file(url) if url.startswith("sqlite:") else None
        if path is None:
            continue
        if path.exists() and not path.is_file():
            raise SpecError(f"{flag} {path} is not a file")
        _writable_dir(path.parent, f"{flag} directory")


# -- secrets: what is stored of a spec ----------------------------------------------------------

SECRET_FIELDS = ("results_db", "mlflow_uri")   # URLs that may carry a password


def mask_url(url: str) -> str:
    """``url`` without its password (``flurka.results.db.mask_url``), unchanged if it has none."""
    from flurka.results.db import mask_url as mask   # SQLAlchemy, Alembic: 0.45 s that --help does not pay

    return mask(url)


def masked_fields(spec: SweepSpec) -> list[str]:
    """The spec's URL fields that carry a password (stored masked)."""
    return [f for f in SECRET_FIELDS if getattr(spec, f) and mask_url(getattr(spec, f)) != getattr(spec, f)]


def password_warnings(spec: SweepSpec) -> list[str]:
    """One line per URL that carries a password: it is on a command line or in a script, where ps,
    shell history and Ray's job records keep it (the sweep prints these once its checks pass)."""
    return [f"warning: the password in --{f.replace('_', '-')} is on a command line or in a script, where ps, "
            "shell history and Ray's job records keep it; give the URL without it and the password in the "
            "environment (PGPASSWORD, a 0600 PGPASSFILE; MLFLOW_TRACKING_PASSWORD)" for f in masked_fields(spec)]


def stored_dict(spec: SweepSpec) -> dict[str, Any]:
    """What is persisted of a spec (``sweep.json``, the MLflow params ``spec.*``): ``to_dict``
    with every password masked. The real URLs live only in memory, from the flags."""
    out = spec.to_dict()
    for f in masked_fields(spec):
        out[f] = mask_url(out[f])
    return out


def seq_len_of(cfg: Any) -> int:
    """Input sequence length of a benchmark config (what d_k compresses)."""
    return int(cfg.max_len)


def d_k_of(cfg: Any) -> int | None:
    """The config's own d_k (what the sweep uses when ``--d-k`` is not given)."""
    return cfg.model.attention_options.get("d_k")


# -- pre-train then fine-tune (``pretrain:``) ---------------------------------------------------
#
# A chained sweep runs two plans: the pre-training plan (the ``pretrain`` benchmark, with the
# sweep's mechanisms, α, seeds and the fine-tuning d_k: E's rows must be the ones fine-tuning
# loads, flurka.training.init_from) and the fine-tuning plan, whose every run starts from the
# pre-training run of its mechanism, α, d_k and seed. Each plan's runs read their own overrides
# and steps (:func:`phase_spec`).

PRETRAIN_KEYS = ("benchmark", "steps", "overrides", "full_length")
PRETRAIN_TASK = "mlm"              # what pre-training trains: the trunk a classifier starts from
ARCHITECTURE = ("d_model", "num_heads", "num_layers", "d_ff")   # the model's trunk shape besides N, d_k, vocabulary


def benchmarks_of(spec: SweepSpec) -> tuple[str, ...]:
    """Every benchmark the sweep trains: the pre-training one first, where the spec chains."""
    return ((spec.pretrain["benchmark"],) if spec.pretrain else ()) + tuple(spec.benchmarks)


def fine_tune_d_ks(spec: SweepSpec) -> tuple[int, ...]:
    """The d_k values the fine-tuning runs use (``--d-k``, else each benchmark config's own)."""
    if spec.d_k:
        return tuple(int(d) for d in spec.d_k)
    found = {d_k_of(benchmark_config(b, spec)) for b in spec.benchmarks}
    return tuple(sorted(int(d) for d in found if d is not None))


def pretrain_spec(spec: SweepSpec) -> SweepSpec | None:
    """The spec of the pre-training plan: its benchmark and steps, the sweep's overrides under its
    own (``pretrain.overrides`` wins), the fine-tuning d_k values; the rest (mechanisms, α,
    seeds, baselines, resources, stores) the sweep's."""
    if not spec.pretrain:
        return None
    p = spec.pretrain
    return dataclasses.replace(spec, benchmarks=(p["benchmark"],), steps=p.get("steps"),
                               overrides=nested(spec.overrides, p.get("overrides") or {}), d_k=fine_tune_d_ks(spec),
                               pretrain=None)


def phase_spec(spec: SweepSpec, benchmark: str) -> SweepSpec:
    """The spec ``benchmark``'s runs are configured by: the pre-training one for its benchmark."""
    if spec.pretrain and benchmark == spec.pretrain["benchmark"]:
        return pretrain_spec(spec)
    return spec


def _vocabulary(cfg: Any) -> tuple:
    options = dict(cfg.dataset_options)
    return options.get("vocab", "bytes"), options.get("vocab_size")


def _check_chain(spec: SweepSpec, cat: dict[str, Any]) -> None:
    """A ``pretrain:`` section that can run: an MLM benchmark outside ``benchmarks``, a valid
    pre-training spec, and every fine-tuning run's encoder loadable from its pre-training run's
    (same depth, width, heads, FFN and vocabulary; a sequence no longer; flurka-eva only at the
    pre-training's length). SpecError in one line, before anything starts."""
    p = spec.pretrain
    bench = p["benchmark"]
    _one_of("pretrain benchmark", bench, cat["benchmarks"])
    for m in p.get("full_length") or ():
        _one_of("pretrain full_length mechanism", m, cat["mechanisms"])
    if bench in spec.benchmarks:
        raise SpecError(f"pretrain: {bench} is also a fine-tuning benchmark; pre-train on one benchmark, "
                        "fine-tune on others")
    if spec.search != "grid" or spec.scheduler != "none":
        raise SpecError("pretrain: a chained sweep trains its whole grid (search grid, scheduler none): "
                        "every fine-tuning run needs its pre-training run")
    try:
        pre = configs.get_config(bench, **{**phase_spec(spec, bench).config_overrides,
                                           **({"steps": p["steps"]} if p.get("steps") is not None else {})})
    except (TypeError, ValueError, KeyError) as exc:
        raise SpecError(f"pretrain: benchmark {bench!r}: {str(exc).splitlines()[0]}") from None
    if pre.task != PRETRAIN_TASK:
        mlm = [b for b in cat["benchmarks"] if configs.get_config(b).task == PRETRAIN_TASK]
        raise SpecError(f"pretrain: {bench} is not masked language modelling (its task is {pre.task}); "
                        f"pre-train on one of: {', '.join(mlm)}")
    try:
        validate(pretrain_spec(spec), cat)
    except SpecError as exc:
        raise SpecError(f"pretrain: {exc}") from None
    # what the fine-tuning runs train that has an E: the variants and their bases (the baselines
    # add full attention, the control and the constituents, whose cut is exact or absent)
    mechanisms = set(spec.variants) | {base_mechanism(v, spec.base_of(v)) for v in spec.variants}
    full_length = set(p.get("full_length") or ())
    for b in spec.benchmarks:
        cfg = benchmark_config(b, spec)
        for field in ARCHITECTURE:
            if getattr(cfg.model, field) != getattr(pre.model, field):
                raise SpecError(f"pretrain: {b} has model.{field}={getattr(cfg.model, field)} but {bench} pre-trains "
                                f"model.{field}={getattr(pre.model, field)}, so no encoder of it fits; give both the "
                                "same (overrides, pretrain.overrides)")
        if _vocabulary(cfg) != _vocabulary(pre):
            raise SpecError(f"pretrain: {b} reads the vocabulary {_vocabulary(cfg)[0]!r} but {bench} pre-trains on "
                            f"{_vocabulary(pre)[0]!r}; fine-tune with the pre-training's tokens (dataset_options vocab)")
        n, big_n = seq_len_of(cfg), seq_len_of(pre)
        if n > big_n:
            raise SpecError(f"pretrain: {b} is {n} tokens long but {bench} pre-trains {big_n}: no position "
                            f"past {big_n} was trained; fine-tune at most at the pre-training's length")
        for m in sorted(set(LENGTH_BOUND) & mechanisms - full_length) if n < big_n else ():
            raise SpecError(f"pretrain: {m} cannot fine-tune {b} at N={n} from pre-training at N={big_n}: its "
                            f"windows and chunks are rows of E in proportion to E's length, so cut to {n} "
                            f"positions it is another layer; add it to pretrain's full_length to fine-tune it "
                            f"at {big_n}")


# -- CLI / YAML ---------------------------------------------------------------------------------
#
# Every field's type (its ``kind``, declared beside it): what a YAML value or a flag's text must
# be. ``_normalize`` converts (a comma-separated string to a tuple, "3" to 3) and refuses anything else in one line
# naming the key; ``validate`` runs the same check on a SweepSpec built in Python.

_KINDS: dict[str, str] = {f.name: f.metadata["kind"] for f in dataclasses.fields(SweepSpec)}
_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
          "str per variant": "a string, or a mapping of variants to strings (flurka-rnn=kernel,flurka-eva=low-rank)",
          "floats per variant": "numbers (a list, or comma-separated), or a mapping of variants to such lists",
          "strs": "names (a list, or comma-separated)", "floats": "numbers (a list, or comma-separated)",
          "ints": "integers (a list, or comma-separated)",
          "overrides": "a mapping of config fields to values (or a list of FIELD=VALUE)",
          "pretrain": "a benchmark name, or a mapping with benchmark, steps, overrides, full_length"}


class _Bad(ValueError):
    """A value of the wrong type (caught by ``_convert``, reported with its key and source)."""


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise _Bad
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            raise _Bad from None
    raise _Bad


def _float(v: Any) -> float:
    if isinstance(v, bool):
        raise _Bad
    if isinstance(v, (int, float)):
        out = float(v)
    elif isinstance(v, str):
        try:
            out = float(v.strip())
        except ValueError:
            raise _Bad from None
    else:
        raise _Bad
    if out != out or out in (float("inf"), float("-inf")):
        raise _Bad
    return out


def _str(v: Any) -> str:
    if isinstance(v, os.PathLike):         # a run dir given as a Path in Python
        v = os.fspath(v)
    if not isinstance(v, str) or not v:
        raise _Bad
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad
    return v


def _items(v: Any, one) -> tuple:
    if isinstance(v, str):
        v = v.replace(",", " ").split()
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise _Bad
    return tuple(one(x) for x in v)


def _overrides(v: Any) -> dict[str, Any]:
    if isinstance(v, (list, tuple)):                    # --set FIELD=VALUE (or a YAML list of them)
        if not all(isinstance(x, str) for x in v):
            raise _Bad
        try:
            return nested(parse_assignments(v))
        except ValueError as exc:
            raise SpecError(str(exc)) from None
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise _Bad
    return nested(v)


def _per_variant(one):
    """A value for every variant (``one`` of it), or a mapping variant -> value; on the command
    line ``variant=value`` pairs, comma-separated (values without commas: a base, not α lists)."""
    def convert(v: Any):
        if isinstance(v, str) and "=" in v:
            pairs = [p.split("=", 1) for p in v.replace(" ", "").split(",") if p]
            return {k: one(x) for k, x in pairs}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise _Bad
            return {k: one(x) for k, x in v.items()}
        return one(v)
    return convert


def _pretrain(v: Any) -> dict[str, Any]:
    """``pretrain``: a benchmark name (the flag), or a mapping of PRETRAIN_KEYS (benchmark required)."""
    if isinstance(v, str):
        v = {"benchmark": v}
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise _Bad
    unknown = sorted(set(v) - set(PRETRAIN_KEYS))
    if unknown or "benchmark" not in v:
        raise SpecError(f"pretrain: {'unknown key ' + repr(unknown[0]) if unknown else 'no benchmark given'}; "
                        f"its keys: {', '.join(PRETRAIN_KEYS)} (benchmark required)")
    try:
        steps = None if v.get("steps") is None else _int(v["steps"])
        out = {"benchmark": _str(v["benchmark"]), "steps": steps,
               "overrides": _overrides(v.get("overrides") or {}),
               "full_length": _items(v.get("full_length") or (), _str)}
    except _Bad:
        raise SpecError("pretrain: benchmark must be a name, steps an integer, overrides a mapping of config "
                        f"fields to values, full_length mechanism names; got {str(v)[:80]}") from None
    if steps is not None and not 1 <= steps <= MAX_STEPS:
        raise SpecError(f"pretrain: steps must be in [1, {MAX_STEPS}], got {steps}")
    return out


_CONVERT = {"str": _str, "pretrain": _pretrain, "int": _int, "float": _float, "bool": _bool, "overrides": _overrides,
            "str per variant": _per_variant(_str), "floats per variant": _per_variant(lambda v: _items(v, _float)),
            "strs": lambda v: _items(v, _str), "floats": lambda v: _items(v, _float),
            "ints": lambda v: _items(v, _int)}
assert set(_KINDS.values()) <= {k.rstrip("?") for k in _CONVERT} | {k + "?" for k in _CONVERT}


def _convert(key: str, value: Any, source: str) -> Any:
    kind = _KINDS[key]
    if value is None and kind.endswith("?"):
        return None
    name = f"--{key.replace('_', '-')}" if source == "command line" else key
    try:
        return _CONVERT[kind.rstrip("?")](value)
    except _Bad:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise SpecError(f"{source}: {name} must be {_WORDS[kind.rstrip('?')]}, got {shown}") from None


def _check_types(spec: SweepSpec) -> None:
    for key in _KINDS:
        _convert(key, getattr(spec, key), "spec")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """A flag per SweepSpec field (``--NAME``, dashes for underscores; a true-by-default switch is
    ``--no-NAME``), mirroring the YAML keys; a flag given wins over the file. Flags are read as
    text and converted with the YAML keys' rules (``_normalize``), so a wrong value is the same
    one line from either."""
    S = argparse.SUPPRESS  # absent flags stay absent, so YAML/defaults fill them
    p.add_argument("--config", metavar="NAME|YAML",
                   help="sweep spec with the same keys as the flags: a YAML file, or the name of one "
                        f"installed with flurka ({', '.join(installed_configs())}; default: none, the "
                        "flags and SweepSpec's defaults)")
    for f in dataclasses.fields(SweepSpec):
        options = dict(f.metadata["flag"])
        option = options.pop("option", "--" + f.name.replace("_", "-"))
        if f.metadata["kind"] == "bool":
            option = option.replace("--", "--no-", 1) if f.default else option
            options["action"] = "store_false" if f.default else "store_true"
        p.add_argument(option, dest=f.name, default=S, help=f.metadata["help"], **options)


_FIELDS = set(_KINDS)


class _Loader(yaml.SafeLoader):
    """safe_load, with YAML 1.2's floats: ``1e6`` is the number (YAML 1.1 reads a string), as
    ``--set learning_rate=1e6`` is."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))


def _unique_keys(loader: _Loader, node: yaml.MappingNode) -> dict:
    """A mapping whose keys are distinct: YAML itself keeps the last of a repeated key, silently."""
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice",
                                                    key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_keys)


CONFIGS = Path(__file__).with_name("configs")   # sweep files installed with the package


def installed_configs() -> tuple[str, ...]:
    """Names of the sweep files shipped in ``flurka/sweeps/configs`` (uptrain-small: make sweep)."""
    return tuple(sorted(p.stem for p in CONFIGS.glob("*.yaml")))


def config_path(config: str | os.PathLike) -> Path:
    """``--config``'s file: a path as given, or a bare name (no directory, no suffix) that is not
    a file here, looked up among the installed sweep files."""
    path = Path(config)
    if path.exists() or path.suffix or path.name != str(config):
        return path
    if (CONFIGS / f"{path.name}.yaml").is_file():
        return CONFIGS / f"{path.name}.yaml"
    raise SpecError(f"--config {config}: no such file, nor a sweep config installed with flurka; "
                    f"installed: {', '.join(installed_configs())}")


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The mapping in a sweep file (a path or an installed name, :func:`config_path`); SpecError
    (one line) for an unreadable, malformed or unsafe file (``safe_load``: a ``!!python/...`` tag
    is refused, never run)."""
    path = config_path(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"cannot read sweep file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"cannot read sweep file {path}: not UTF-8 text") from None
    try:
        loaded = yaml.load(text, Loader=_Loader)  # noqa: S506 (_Loader is a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"sweep file {path} is not valid YAML: {' '.join(str(problem).split())}{where}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SpecError(f"sweep file {path} must hold a mapping of flag names to values, "
                        f"got {type(loaded).__name__}")
    return loaded


def _normalize(values: dict[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise SpecError(f"{source}: keys must be names, got {key!r}; valid: {', '.join(sorted(_FIELDS))}")
        key = key.replace("-", "_")
        if key not in _FIELDS:
            raise SpecError(f"{source}: unknown key {key!r}; valid: {', '.join(sorted(_FIELDS))}")
        out[key] = _convert(key, value, source)
    return out


def from_args(args: argparse.Namespace | dict[str, Any]) -> SweepSpec:
    """Build a SweepSpec from parsed flags, a YAML file (``config``) under them, and defaults."""
    given = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    values: dict[str, Any] = {}
    path = given.pop("config", None)
    if path:
        values.update(_normalize(load_yaml(path), str(path)))
    cli = _normalize({k: v for k, v in given.items() if k in _FIELDS}, "command line")
    if "overrides" in cli and "overrides" in values:
        cli["overrides"] = nested(values["overrides"], cli["overrides"])
    values.update(cli)
    if "benchmarks" not in values:
        raise SpecError("no --benchmarks given (flag or YAML key 'benchmarks')")
    return SweepSpec(**values)


def parse(argv: Sequence[str] | None = None) -> SweepSpec:
    parser = ArgumentParser(prog="uptrain_sweep", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return from_args(parser.parse_args(argv))


__all__ = ["SweepSpec", "SpecError", "PAPER_ALPHAS", "validate", "from_args", "parse", "add_arguments",
           "ArgumentParser", "load_yaml", "config_path", "installed_configs", "check_paths", "stored_dict",
           "masked_fields", "mask_url", "password_warnings", "SECRET_FIELDS",
           "catalogue", "benchmark_config", "storage_problem"]
