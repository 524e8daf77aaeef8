"""What the report reads besides ``flurka.results.tables``: where results came from (sweeps,
devices, speed configurations) and the theory measurements of ``flurka.speed.theory``.

The results database has no tables for approximation error or rank; those come from theory JSON
files (``flurka report --theory FILE``). Accepted forms:

.. code-block:: json

    {"device": "NVIDIA H100 80GB HBM3" | {"name": ...}, "config": {"d_model": 64, "seq_len": 128, ...},
     "approximation_errors": [{"mechanism": "flurka-performer", "d_k": 16, "m": 8, "seed": 0,
                               "rel_error": 0.41, "inf_error": 3.2, "kernel_term": 0.3, "lowrank_term": 0.2}],
     "ranks": [{"mechanism": "performer", "layer": 0, "head": 1, "rank": 31, "max_rank": 64}]}

(``approximation_errors`` rows are ``theory.approximation_errors``' rows; a rank row is one head's
``theory.kernel_attention_ranks`` entry, ``example`` optional, ``max_rank`` the full rank
min(N, N_k).) A bare JSON list of such rows is accepted too (device and config then unknown).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from flurka.results.models import Environment, SpeedMeasurement, Sweep, Trial
from flurka.results.tables import EXECUTION, add_execution, combine_repeats, stored_configs

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


def speed_rows(engine: Engine) -> pd.DataFrame:
    """Every ok or OOM speed measurement with its full configuration (``layers``, ``ffn`` and the
    speed sweep's name come from the stored ``config`` of a ``flurka.speed`` document)."""
    stmt = (sa.select(Environment.device, SpeedMeasurement.mechanism, SpeedMeasurement.mode, SpeedMeasurement.scope,
                      SpeedMeasurement.dtype, SpeedMeasurement.batch, SpeedMeasurement.seq_len.label("N"),
                      SpeedMeasurement.d_model, SpeedMeasurement.heads, SpeedMeasurement.d_k,
                      SpeedMeasurement.num_features.label("m"), SpeedMeasurement.status, SpeedMeasurement.median_s,
                      SpeedMeasurement.spread_s, SpeedMeasurement.flops, SpeedMeasurement.config)
            .join(Environment, Environment.id == SpeedMeasurement.environment_id)
            .where(SpeedMeasurement.status != "error"))
    with engine.connect() as conn:
        df = pd.read_sql(stmt, conn)
    config = stored_configs(df.pop("config"))
    for name in ("layers", "ffn", "sweep"):
        df[name] = [c.get(name) for c in config]
    add_execution(df, config)
    df.loc[df["scope"] != "model", ["layers", "ffn"]] = None  # a layer has no depth or FFN
    return combine_repeats(df, ["mechanism", *SPEED_CONFIG])  # repeated runs → their median


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
# Theory JSON
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Theory:
    errors: pd.DataFrame  # approximation_errors rows + device, config, source
    ranks: pd.DataFrame  # rank rows + device, config, source


ERROR_REQUIRED = ("mechanism", "rel_error")
RANK_REQUIRED = ("mechanism", "rank")


def _rows(path: str, kind: str, rows: Any, required: Sequence[str]) -> list[dict]:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"theory file {path}: {kind} must be a list of objects")
    for i, r in enumerate(rows):
        missing = [k for k in required if r.get(k) is None]
        if missing:
            raise ValueError(f"theory file {path}: {kind}[{i}] lacks {', '.join(missing)} "
                             f"(needs {', '.join(required)})")
    return rows


def read_theory(path: str | Path) -> tuple[list[dict], list[dict]]:
    """(error rows, rank rows) of one theory file, each row tagged with device, config and source."""
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
    device = doc.get("device")
    device = (device.get("name") if isinstance(device, dict) else device) or "not recorded"
    config = doc.get("config") or doc.get("settings") or {}
    tag = {"device": str(device), "config": describe(config, list(config)) if isinstance(config, dict) else str(config),
           "source": Path(path).name}
    errors = _rows(str(path), "approximation_errors", doc.get("approximation_errors", []), ERROR_REQUIRED)
    ranks = _rows(str(path), "ranks", doc.get("ranks", []), RANK_REQUIRED)
    if not errors and not ranks:
        raise ValueError(f"theory file {path}: holds no approximation_errors or ranks rows")
    return [{**r, **tag} for r in errors], [{**r, **tag} for r in ranks]


def load_theory(paths: Sequence[str | Path] = ()) -> Theory:
    errors, ranks = [], []
    for p in paths:
        e, r = read_theory(p)
        errors += e
        ranks += r
    return Theory(pd.DataFrame(errors), pd.DataFrame(ranks))
