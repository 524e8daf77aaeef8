"""A speed or theory document in MLflow: one run per document, so the MLflow UI shows the speed
and theory measurements beside the sweeps' quality tables.

The run sits in the experiment ``flurka-speed`` or ``flurka-theory``, is named after the file
and the device, carries the card and the schema in its tags (``flurka.device``,
``flurka.schema``), the stack in its params, the document itself as the artifact
``document.json`` and its rows as tables (``tables/<part>.csv`` and ``.json``, MLflow's table
viewer). A document is identified by its content's SHA-256 (tag ``flurka.document_sha256``):
logging it again adds nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from sqlalchemy.engine import make_url

from flurka.tracking.mlflow_runs import artifact_root_for, experiment_id, flatten, log_tables, source_tags

EXPERIMENTS = {"flurka.speed": "flurka-speed", "flurka.theory": "flurka-theory"}
SHA_TAG = "flurka.document_sha256"
# the rows of each kind of document, as tables
PARTS = {"flurka-speed": ("results",), "flurka-theory": ("approximation_errors", "ranks")}


def experiment_of(doc: Any) -> str | None:
    """The experiment a document goes to (None: not a speed or theory document)."""
    schema = str(doc.get("schema", "")) if isinstance(doc, dict) else ""
    family = schema.split("/", 1)[0]
    if family.startswith("flurka.speed"):
        family = "flurka.speed"
    return EXPERIMENTS.get(family)


def _table(rows: list[dict[str, Any]]):
    """The rows' scalar columns (nested dicts stay in document.json)."""
    df = pd.DataFrame(rows)
    keep = [c for c in df.columns if not df[c].map(lambda v: isinstance(v, (dict, list))).any()]
    return df[keep]


def log_document(tracking_uri: str, path: str | Path, text: str) -> tuple[str, bool] | None:
    """Log the document in ``text`` (read from ``path``) as its run; returns (run id, whether it
    was new), or None for a document that is neither speed nor theory (a sweep's records)."""
    doc = json.loads(text)
    experiment = experiment_of(doc)
    if experiment is None:
        return None
    client = MlflowClient(tracking_uri=tracking_uri)
    # a SQLite store's artifacts beside it, as a sweep's (MLflow's default is ./mlruns of the cwd)
    root = (artifact_root_for(tracking_uri, Path(make_url(tracking_uri).database).parent)
            if tracking_uri.startswith("sqlite:") else None)
    exp_id = experiment_id(client, experiment, root)
    sha = hashlib.sha256(text.encode()).hexdigest()
    found = client.search_runs([exp_id], filter_string=f"tags.`{SHA_TAG}` = '{sha}'", max_results=1)
    if found:
        return found[0].info.run_id, False
    device = doc.get("device") or {}
    card = str(device.get("name") or device.get("platform") or "unknown")
    name = f"{Path(path).stem} ({card})"
    run = client.create_run(exp_id, run_name=name, tags={
        SHA_TAG: sha, "flurka.schema": str(doc.get("schema")), "flurka.device": card,
        "flurka.source_file": str(Path(path).name), "flurka.sweep": str(doc.get("sweep", "")),
        **source_tags("flurka ingest")})
    run_id = run.info.run_id
    params = {**flatten(doc.get("versions") or {}, "version."), **flatten(doc.get("settings") or {}, "settings."),
              **flatten(doc.get("config") or {}, "config.")}
    for key, value in list(params.items())[:100]:
        client.log_param(run_id, key, str(value)[:500])
    client.log_text(run_id, text, "document.json")
    log_tables(client, run_id, {part: _table(doc[part]) for part in PARTS[experiment] if doc.get(part)})
    client.set_terminated(run_id)
    return run_id, True
