"""What the report reads besides the results tables: where results came from (sweeps,
devices, speed configurations) and the theory measurements of ``flurka.theory``.

Theory measurements come from the results database (``flurka ingest theory.json`` stores a
``flurka.theory/1`` document as a theory run with its ``approximation_errors`` and
``kernel_ranks`` rows) and from theory JSON files given to ``flurka report --theory FILE``; both
load into the same frames, so either draws the same figures, and a file whose run is already in
the database counts once. Accepted file forms:

.. code-block:: json

    {"device": "NVIDIA H100 80GB HBM3" | {"name": ...}, "config": {"d_model": 64, "seq_len": 128, ...},
     "approximation_errors": [{"mechanism": "flurka-performer", "d_k": 16, "m": 8, "seed": 0,
                               "rel_error": 0.41, "inf_error": 3.2, "kernel_term": 0.3, "lowrank_term": 0.2}],
     "ranks": [{"mechanism": "performer", "layer": 0, "head": 1, "rank": 31, "max_rank": 64}]}

(``approximation_errors`` rows are ``theory.approximation_errors``' rows; a rank row is one head's
``theory.kernel_attention_ranks`` entry, ``example`` optional, ``max_rank`` the full rank
min(N, N_k); ``layer`` on either is the trained model's layer whose captured inputs were used.)
A bare JSON list of such rows is accepted too (device and config then unknown).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from flurka.results.models import ApproximationError, Environment, KernelRank, Sweep, TheoryRun, Trial
from flurka.results.records import theory_key
from flurka.results.speed_tables import EXECUTION, combine_repeats, read_speed
from flurka.speed.profile import KINDS

# Speed configuration columns, in caption order.
SPEED_CONFIG = ["device", "mode", "scope", "dtype", "batch", "N", "d_model", "heads", "d_k", "m", "layers", "ffn",
                *EXECUTION]


def trial_provenance(engine: Engine) -> pd.DataFrame:
    """Per (sweep, benchmark): its name, id, commit, device and number of ok trials."""
    stmt = (sa.select(Sweep.external_id.label("sweep_id"), Sweep.name.label("sweep"), Sweep.git_commit,
                      Environment.device, Trial.benchmark, sa.func.count(Trial.id).label("trials"))
            .join(Sweep, Sweep.id == Trial.sweep_id).join(Environment, Environment.id == Sweep.environment_id)
            .where(Trial.status == "ok")
            .group_by(Sweep.external_id, Sweep.name, Sweep.git_commit, Environment.device, Trial.benchmark))
    with engine.connect() as conn:
        return pd.read_sql(stmt, conn)


def _measurements(engine: Engine) -> tuple[pd.DataFrame, list[dict]]:
    """:func:`read_speed`'s every row, the number of features named ``m`` as in the captions."""
    df, config = read_speed(engine)
    return df.rename(columns={"num_features": "m"}), config


def speed_runs(engine: Engine) -> pd.DataFrame:
    """Every ok or OOM speed measurement, one row per run that timed it (``run``: None where the
    database does not know, a document older than the field), with its full configuration
    (``layers``, ``ffn`` and the speed sweep's name come from the stored ``config`` of a
    ``flurka.speed`` document), how it was timed (``calls_per_sample``; None where the document
    predates it) and, where the run measured
    the card's ceilings, its floor (``floor_s``, ``bound``: compute or memory)."""
    df, config = _measurements(engine)
    for name in ("layers", "ffn", "sweep", "floor_s", "bound", "calls_per_sample"):
        df[name] = [c.get(name) for c in config]
    df.loc[df["scope"] != "model", ["layers", "ffn"]] = None  # a layer has no depth or FFN
    return df


def combine_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`speed_runs`' rows, one per point: repeated runs combined (:func:`combine_repeats`)."""
    return combine_repeats(runs, ["mechanism", *SPEED_CONFIG])


PROFILE_KINDS = KINDS  # the kinds flurka.speed.profile splits a traced step into


def profile_rows(engine: Engine) -> pd.DataFrame:
    """Every ok speed measurement that carries a ``profile`` (``--profile-steps``): its
    configuration, median step time, traced device time per step and the share of each kind
    (``share_<kind>``, :data:`PROFILE_KINDS`)."""
    df, config = _measurements(engine)
    profiles = [c.get("profile") if isinstance(c.get("profile"), dict) else {} for c in config]
    keep = [status == "ok" and bool(p.get("by_kind")) for status, p in zip(df["status"], profiles)]
    df = df.loc[pd.Series(keep, index=df.index, dtype=bool)].reset_index(drop=True)
    profiles = [p for p, k in zip(profiles, keep) if k]
    df["traced_s"] = [p.get("traced_s_per_step") for p in profiles]
    for kind in PROFILE_KINDS:
        df[f"share_{kind}"] = [float(p["by_kind"].get(kind, {}).get("share", 0.0)) for p in profiles]
    df["top_op"] = [(p.get("top_ops") or [{}])[0].get("op") for p in profiles]
    return df


def describe(row: pd.Series | dict, columns: Sequence[str]) -> str:
    """``name=value`` for the given configuration columns that are set (a caption's config)."""
    parts = []
    for c in columns:
        v = row.get(c)
        if v is None or (isinstance(v, float) and v != v):
            continue
        parts.append(f"{c}={int(v) if isinstance(v, float) and v.is_integer() else v}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Theory: database rows and JSON files
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Theory:
    errors: pd.DataFrame  # ERROR_COLUMNS + TAGS (+ whatever else a file's rows carry)
    ranks: pd.DataFrame  # RANK_COLUMNS + TAGS (+ ...)


ERROR_REQUIRED = ("mechanism", "rel_error")
RANK_REQUIRED = ("mechanism", "rank")
ERROR_COLUMNS = ["mechanism", "d_k", "m", "seed", "layer", "rel_error", "inf_error", "kernel_term", "lowrank_term"]
RANK_COLUMNS = ["mechanism", "seed", "example", "layer", "head", "rank", "max_rank", "d_k", "m", "trained"]
# Per theory run: device name, config caption, which inputs (for titles), where from.
TAGS = ["device", "config", "inputs", "source", "run_key"]


def theory_frame(rows: Sequence[dict], columns: Sequence[str]) -> pd.DataFrame:
    """Rows with every standard column (absent ones empty) and numbers as numbers, so file rows
    and database rows group, caption and draw alike."""
    df = pd.DataFrame(list(rows))
    extra = [c for c in df.columns if c not in columns and c not in TAGS]
    df = df.reindex(columns=[*columns, *TAGS, *extra])
    for c in columns[1:]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def inputs_label(config: Any) -> str:
    """What the mechanisms were fed, for a title: "standard normal inputs, N 2048" or "inputs
    captured from <run>" ("" when the config does not say)."""
    if not isinstance(config, dict) or not config.get("inputs"):
        return ""
    inputs = str(config["inputs"])
    if inputs.startswith("captured: "):
        return f"inputs captured from {inputs.removeprefix('captured: ')}"
    return f"{inputs} inputs" + (f", N {config['seq_len']}" if config.get("seq_len") else "")


def _tag(device: Any, config: Any, source: str, key: str | None) -> dict:
    device = (device.get("name") if isinstance(device, dict) else device) or "not recorded"
    config = config or {}
    return {"device": str(device), "config": describe(config, list(config)) if isinstance(config, dict) else str(config),
            "inputs": inputs_label(config), "source": source, "run_key": key}


def _rows(path: str, kind: str, rows: Any, required: Sequence[str]) -> list[dict]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"theory file {path}: {kind} must be a list of objects")
    for i, r in enumerate(rows):
        missing = [k for k in required if r.get(k) is None]
        if missing:
            raise ValueError(f"theory file {path}: {kind}[{i}] lacks {', '.join(missing)} "
                             f"(needs {', '.join(required)})")
    return rows


def _file_key(doc: dict) -> str | None:
    """The database key of the file's theory run (None: no creation time, so never ingestible)."""
    try:
        return theory_key(doc)
    except ValueError:
        return None


def read_theory(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(error rows, rank rows) of one theory file, each row tagged with device, config, source and
    the run's database key."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read theory JSON {path}: {e}") from None
    if isinstance(doc, list):
        doc = {"approximation_errors": [r for r in doc if isinstance(r, dict) and "rel_error" in r],
               "ranks": [r for r in doc if isinstance(r, dict) and "rank" in r]}
    if not isinstance(doc, dict) or not ({"approximation_errors", "ranks"} & doc.keys()):
        raise ValueError(f"theory file {path}: expected an object with 'approximation_errors' and/or 'ranks' "
                         f"(or a list of such rows)")
    tag = _tag(doc.get("device"), doc.get("config") or doc.get("settings"), Path(path).name, _file_key(doc))
    errors = _rows(str(path), "approximation_errors", doc.get("approximation_errors", []), ERROR_REQUIRED)
    ranks = _rows(str(path), "ranks", doc.get("ranks", []), RANK_REQUIRED)
    if not errors and not ranks:
        raise ValueError(f"theory file {path}: holds no approximation_errors or ranks rows")
    return [{**r, **tag} for r in errors], [{**r, **tag} for r in ranks]


def load_theory(paths: Sequence[str | Path] = ()) -> Theory:
    """The rows of theory files (checked before any database work)."""
    errors, ranks = [], []
    for p in paths:
        e, r = read_theory(p)
        errors += e
        ranks += r
    return Theory(theory_frame(errors, ERROR_COLUMNS), theory_frame(ranks, RANK_COLUMNS))


def _utc(t: dt.datetime) -> dt.datetime:
    """A stored time in UTC (PostgreSQL answers in its session's zone; SQLite stores UTC, naive)."""
    return t.astimezone(dt.timezone.utc) if t.tzinfo else t


def stored_theory(engine: Engine) -> Theory:
    """Every theory run's rows from the results database, tagged like a file's, in ingestion order."""
    runs = (sa.select(TheoryRun.id, TheoryRun.key, TheoryRun.created_at, TheoryRun.config, Environment.device)
            .join(Environment, Environment.id == TheoryRun.environment_id))
    frames = []
    with engine.connect() as conn:
        tags = {run.id: _tag(run.device, run.config if isinstance(run.config, dict) else json.loads(run.config),
                             f"results DB (theory run of {_utc(run.created_at):%Y-%m-%d %H:%M} UTC)", run.key)
                for run in conn.execute(runs)}
        for model, columns in ((ApproximationError, ERROR_COLUMNS), (KernelRank, RANK_COLUMNS)):
            stmt = (sa.select(model.theory_run_id, *(getattr(model, c) for c in columns))
                    .order_by(model.theory_run_id, model.id))
            rows = [{**{c: r[i + 1] for i, c in enumerate(columns)}, **tags[r[0]]} for r in conn.execute(stmt)]
            frames.append(theory_frame(rows, columns))
    return Theory(*frames)


def _concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    full = [f for f in frames if not f.empty]
    return pd.concat(full, ignore_index=True) if len(full) > 1 else full[0] if full else frames[0]


def with_stored(engine: Engine, files: Theory) -> Theory:
    """The database's theory rows plus the files' (rows of a file whose run is already in the
    database are left out: one run counts once)."""
    stored = stored_theory(engine)
    keys = set(stored.errors["run_key"]) | set(stored.ranks["run_key"])
    fresh = lambda df: df[~df["run_key"].isin(keys)]  # noqa: E731
    return Theory(_concat([stored.errors, fresh(files.errors)]), _concat([stored.ranks, fresh(files.ranks)]))
