"""The sweep specification: CLI flags and/or a YAML file, validated in one place.

Every mistake a user can make in a spec (an unknown benchmark or variant, α outside [0, 1],
d_k longer than the benchmark's sequence, ...) is caught by :func:`validate` with one line
naming the valid choices, before Ray, MLflow or any trial starts. Checks that need the outside
world (the cluster's GPUs, the database) live in ``flurka.cluster`` / the runner and run next,
still before any trial.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import yaml

# Table 5's α grid: 12.5% ... 87.5% of the training steps on the base model.
PAPER_ALPHAS: tuple[float, ...] = tuple(i / 8 for i in range(1, 8))
LOW_RANK = "linformer"
FULL = "full"
BASES = ("low-rank", "kernel")
SEARCHES = ("grid", "optuna")
SCHEDULERS = ("none", "asha")


class SpecError(ValueError):
    """A sweep spec that cannot run; the message is one line naming the valid choices."""


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    benchmarks: tuple[str, ...]
    variants: tuple[str, ...] = ()          # () = every FLuRKA variant
    alphas: tuple[float, ...] = PAPER_ALPHAS
    d_k: tuple[int, ...] = ()               # () = each benchmark config's own d_k
    base: str = "low-rank"
    search: str = "grid"
    scheduler: str = "none"
    num_samples: int = 1                    # optuna: samples per (variant, benchmark); grid: repeats
    seeds: tuple[int, ...] = (0,)
    steps: int | None = None                # T; None = the benchmark config's
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # passed to get_config
    baselines: bool = True                  # the constituents (and full) in the same sweep
    full: bool = True                       # full attention among the baselines, as a reference
    e_init: str | None = None               # E1/E2's init (None: the configs' default, pooled)
    branching: bool = True                  # fork α branches from one base run
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_failures: int = 2
    name: str = "uptrain"
    run_dir: str = "runs/uptrain"
    address: str | None = None
    mlflow_uri: str | None = None           # default sqlite:///<run_dir>/mlflow.db
    results_db: str | None = None           # default sqlite:///<run_dir>/results.db
    num_cpus: int | None = None             # embedded Ray only
    resume: bool = False
    checkpoint_every: int | None = None     # extra checkpoints (beyond fork points) for fault recovery
    compilation_cache: str | None = None    # JAX's persistent cache; default below, "off": none

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
            overrides["attention_options"] = {**overrides.get("attention_options", {}),
                                              "e_init": self.e_init}
        return overrides

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- catalogue: what the workers offer ----------------------------------------------------------

def catalogue() -> dict[str, Any]:
    """Benchmarks, FLuRKA variants and their constituents, read from the workers."""
    from flurka import configs
    from flurka.attention.flops import FLURKA, MECHANISMS

    return {"benchmarks": tuple(sorted(configs.BENCHMARKS)), "variants": tuple(FLURKA),
            "mechanisms": tuple(MECHANISMS)}


def kernel_of(variant: str) -> str:
    """The kernel constituent of a FLuRKA variant: flurka-performer -> performer."""
    from flurka.attention.flops import constituents

    return constituents(variant)["kernel"]


def base_mechanism(variant: str, base: str) -> str:
    """The up-training base model (Linformer, or the variant's kernel), as training defines it."""
    from flurka.configs import base_attention

    return base_attention(variant, base)


def benchmark_config(benchmark: str, spec: SweepSpec, **extra: Any):
    from flurka import configs

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
    cat = cat or catalogue()
    if not spec.benchmarks:
        raise SpecError(f"no benchmark given; valid: {', '.join(cat['benchmarks'])}")
    for b in spec.benchmarks:
        _one_of("benchmark", b, cat["benchmarks"])
    variants = spec.variants or cat["variants"]
    for v in variants:
        _one_of("variant", v, cat["variants"])
    _one_of("--base", spec.base, BASES)
    _one_of("--search", spec.search, SEARCHES)
    _one_of("--scheduler", spec.scheduler, SCHEDULERS)
    if not spec.alphas:
        raise SpecError("--alphas is empty; give at least one α in [0, 1]")
    for a in spec.alphas:
        if not 0.0 <= float(a) <= 1.0:
            raise SpecError(f"α={a:g} is outside [0, 1] (α is the fraction of steps on the base model)")
    if len(set(spec.alphas)) != len(spec.alphas):
        raise SpecError(f"--alphas has duplicates: {list(spec.alphas)}")
    if not spec.seeds:
        raise SpecError("--seeds is empty")
    if spec.num_samples < 1:
        raise SpecError(f"--num-samples must be >= 1, got {spec.num_samples}")
    if spec.steps is not None and spec.steps < 1:
        raise SpecError(f"--steps must be >= 1, got {spec.steps}")
    if spec.cpus_per_trial <= 0:
        raise SpecError(f"--cpus-per-trial must be > 0, got {spec.cpus_per_trial:g}")
    if spec.gpus_per_trial < 0 or (spec.gpus_per_trial > 1 and spec.gpus_per_trial != int(spec.gpus_per_trial)):
        raise SpecError(f"--gpus-per-trial must be a fraction in (0, 1] or a whole number, got {spec.gpus_per_trial:g}")
    if spec.max_failures < 0:
        raise SpecError(f"--max-failures must be >= 0, got {spec.max_failures}")
    for b in spec.benchmarks:
        try:
            cfg = benchmark_config(b, spec)
        except (TypeError, ValueError, KeyError) as exc:
            raise SpecError(f"benchmark {b!r}: {str(exc).splitlines()[0]}") from None
        seq_len = seq_len_of(cfg)
        for d in spec.d_k or (d_k_of(cfg),):
            if d is None or int(d) < 1:
                raise SpecError(f"d_k must be a positive integer, got {d!r}")
            if int(d) > seq_len:
                raise SpecError(f"d_k={d} is larger than {b}'s sequence length {seq_len}")
    return dataclasses.replace(spec, variants=tuple(variants), alphas=tuple(float(a) for a in spec.alphas))


def seq_len_of(cfg: Any) -> int:
    """Input sequence length of a benchmark config (what d_k compresses)."""
    return int(cfg.max_len)


def d_k_of(cfg: Any) -> int | None:
    """The config's own d_k (what the sweep uses when ``--d-k`` is not given)."""
    return dict(cfg.attention_options).get("d_k")


# -- CLI / YAML ---------------------------------------------------------------------------------

def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.replace(",", " ").split())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(",", " ").split())


def _strs(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.replace(",", " ").split())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags mirror the YAML keys (dashes for underscores); a flag given wins over the file."""
    S = argparse.SUPPRESS  # absent flags stay absent, so YAML/defaults fill them
    p.add_argument("--config", metavar="YAML", help="sweep spec file with the same keys as the flags")
    p.add_argument("--benchmarks", type=_strs, default=S, help="comma-separated benchmark names")
    p.add_argument("--variants", type=_strs, default=S, help="FLuRKA variants (default: all)")
    p.add_argument("--alphas", type=_floats, default=S, help="up-training fractions (default 0.125..0.875)")
    p.add_argument("--d-k", dest="d_k", type=_ints, default=S, help="low-rank downsampling factors")
    p.add_argument("--base", choices=BASES, default=S, help="base model of the up-training")
    p.add_argument("--search", choices=SEARCHES, default=S)
    p.add_argument("--scheduler", choices=SCHEDULERS, default=S)
    p.add_argument("--num-samples", type=int, default=S, help="optuna samples (grid: repeats)")
    p.add_argument("--seeds", type=_ints, default=S, help="comma-separated seeds")
    p.add_argument("--steps", type=int, default=S, help="training steps T per run")
    p.add_argument("--set", dest="overrides", action="append", default=S, metavar="KEY=VALUE",
                   help="benchmark config override (YAML value), repeatable")
    p.add_argument("--no-baselines", dest="baselines", action="store_false", default=S)
    p.add_argument("--no-full", dest="full", action="store_false", default=S,
                   help="leave full attention out of the baselines")
    p.add_argument("--e-init", choices=("pool", "gaussian"), default=S,
                   help="E1/E2's initialisation (default pool; gaussian: the paper's)")
    p.add_argument("--no-branching", dest="branching", action="store_false", default=S,
                   help="train every α independently (the paper's way)")
    p.add_argument("--cpus-per-trial", type=float, default=S)
    p.add_argument("--gpus-per-trial", type=float, default=S, help="fractions share one GPU")
    p.add_argument("--max-failures", type=int, default=S, help="retries of a failed trial")
    p.add_argument("--name", default=S)
    p.add_argument("--run-dir", default=S, help="where Tune, MLflow and the results DB write")
    p.add_argument("--address", default=S, help="Ray cluster (default: RAY_ADDRESS, else embedded)")
    p.add_argument("--mlflow-uri", default=S)
    p.add_argument("--results-db", default=S, help="SQLAlchemy URL of the results database")
    p.add_argument("--num-cpus", type=int, default=S, help="CPUs of the embedded Ray")
    p.add_argument("--checkpoint-every", type=int, default=S)
    p.add_argument("--compilation-cache", metavar="DIR|off", default=S,
                   help="JAX's persistent compilation cache the trials share (default: "
                        "$JAX_COMPILATION_CACHE_DIR if set, else <run-dir>/jax-cache)")
    p.add_argument("--resume", action="store_true", default=S, help="restore an interrupted sweep")


_FIELDS = {f.name for f in dataclasses.fields(SweepSpec)}
_TUPLE_FIELDS = {"benchmarks": _strs, "variants": _strs, "alphas": _floats, "d_k": _ints, "seeds": _ints}


def _normalize(values: dict[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        key = key.replace("-", "_")
        if key not in _FIELDS:
            raise SpecError(f"{source}: unknown key {key!r}; valid: {', '.join(sorted(_FIELDS))}")
        if key in _TUPLE_FIELDS and value is not None:
            if isinstance(value, str):
                value = _TUPLE_FIELDS[key](value)
            elif isinstance(value, (int, float)):
                value = (value,)
            value = tuple(value)
        if key == "overrides" and isinstance(value, list):  # from --set KEY=VALUE
            value = _parse_overrides(value)
        out[key] = value
    return out


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        if "=" not in item:
            raise SpecError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def from_args(args: argparse.Namespace | dict[str, Any]) -> SweepSpec:
    """Build a SweepSpec from parsed flags, a YAML file (``config``) under them, and defaults."""
    given = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    values: dict[str, Any] = {}
    path = given.pop("config", None)
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise SpecError(f"cannot read sweep file {path}: {exc.strerror}") from None
        if not isinstance(loaded, dict):
            raise SpecError(f"sweep file {path} must hold a mapping of flag names to values")
        values.update(_normalize(loaded, str(path)))
    cli = _normalize({k: v for k, v in given.items() if k in _FIELDS}, "command line")
    if "overrides" in cli and "overrides" in values:
        cli["overrides"] = {**values["overrides"], **cli["overrides"]}
    values.update(cli)
    if "benchmarks" not in values:
        raise SpecError("no --benchmarks given (flag or YAML key 'benchmarks')")
    return SweepSpec(**values)


def parse(argv: Sequence[str] | None = None) -> SweepSpec:
    parser = argparse.ArgumentParser(prog="uptrain_sweep", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return from_args(parser.parse_args(argv))


__all__ = ["SweepSpec", "SpecError", "PAPER_ALPHAS", "validate", "from_args", "parse", "add_arguments",
           "catalogue", "kernel_of", "base_mechanism", "benchmark_config"]
