"""MLflow layout of a sweep: one parent run, one nested run per trial, tables on the parent.

Every write goes through one :class:`SweepTracker` in one process (the sweep's driver), so a
SQLite tracking store never sees two writers. Writes are idempotent across retries and
``--resume``: runs are found again by tag, a step already logged is not logged twice, a
finished trial is not finished twice, and a table logged again replaces the first one. So each
is retried through a server's restart (:mod:`flurka.tracking.retrying`); a run is found or
created as one retried unit, so a lost answer to its creation never makes a second one.

What the MLflow UI shows (the names are made here, in one place):

* **Run names** (:func:`trial_run_name`) start with what differs between a sweep's trials:
  ``flurka-rnn a=0.25 dk=16 s0`` (an α branch), ``linformer dk=16 s0`` (the Linformer baseline,
  which branches fork from), ``rnn s0`` (a kernel baseline), ``linformer dk=16 s0 base`` (a
  separate base run, stopped after its last fork step: no final evaluation); the benchmark comes
  last when the sweep has several. The planned run's key (``flurka.trial_key`` tag, ``run.*``
  params) stays the identifier: resume finds runs by it, never by name.
* **Metrics** (:func:`metric_name`): one name per quantity, grouped by stream — ``train/loss``,
  ``train/accuracy``, ``train/grad_norm``, ``train/learning_rate``, ``train/tflop`` (the
  training TFLOPs so far); ``eval/loss``, ``eval/accuracy``, ``eval/bleu`` ... The final value of
  a metric is the last point of its ``eval/`` series (training evaluates at its last step; the
  run's metric summary shows exactly that), not a copy under another name. What compiling cost:
  ``compilation.<name>``, once.
* **Table columns** (:func:`table_column`): MLflow's table viewer reads a column name with a dot
  as a nested path (TanStack ``accessorKey``) and shows it blank, so a decimal point between
  digits becomes a middle dot (``12.5%`` -> ``12·5%``) and any other dot an underscore. Only
  the viewer's JSON table is renamed; the CSV beside it keeps the table's own names.
* **The runs table** (:meth:`SweepTracker.share_view`, at the sweep's end): a saved view of the
  experiment — the metrics and α, d_k, seed as columns, best first — that ``flurka ui``'s URL
  opens (:mod:`flurka.tracking.view`). A sweep's own SQLite store lists no empty "Default"
  experiment (:func:`hide_default_experiment`).
"""

from __future__ import annotations

import functools
import getpass
import json
import logging
import math
import platform as _stdlib_platform
import re
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import unquote, urlparse

import mlflow
import pandas as pd
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunStatus, RunTag, ViewType
from mlflow.entities.lifecycle_stage import LifecycleStage
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import (MLFLOW_DATASET_CONTEXT, MLFLOW_GIT_COMMIT, MLFLOW_LOGGED_ARTIFACTS, MLFLOW_RUN_NOTE,
                                      MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE, MLFLOW_USER)
from mlflow.utils.validation import MAX_EXPERIMENT_TAG_VAL_LENGTH, MAX_TAG_VAL_LENGTH

from flurka import source as code_source
from flurka.catalogue.mechanisms import is_control
from flurka.catalogue.metrics import TASK_METRICS, lower_is_better
from flurka.configs.base import CURVE_POINT
from flurka.results.db import mask_url
from flurka.results.retry import StoreUnavailable
from flurka.tracking import view
from flurka.tracking.retrying import RetryingClient, mlflow_store

EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")   # the UI's model-training view

# A new SQLite store announces its tables at INFO (two lines in every sweep's output): not news.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)


def experiment_id(client, name: str, artifact_location: str | None = None) -> str:
    """The experiment of that name (created if missing), marked as model training, so the UI
    opens its runs and charts rather than the GenAI view."""
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(
        name, artifact_location=artifact_location)
    if exp is None or exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
        client.set_experiment_tag(exp_id, *EXPERIMENT_KIND)
    return exp_id


DEFAULT_EXPERIMENT = ("0", "Default")


def own_sqlite_store(tracking_uri: str, artifact_root: str | None) -> Path | None:
    """The SQLite file of a sweep's own store — ``<run dir>/mlflow.db`` beside the run dir's
    artifact root (:func:`artifact_root_for`) — else None (a server, or a store of someone else's)."""
    if not tracking_uri.startswith("sqlite:///") or not (artifact_root or "").startswith("file:"):
        return None
    db = Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
    root = Path(unquote(urlparse(artifact_root).path))
    return db if db.parent.resolve() == root.parent.resolve() else None


def create_sqlite_store(tracking_uri: str, artifact_root: str) -> None:
    """Create a new SQLite store whose default root is ``artifact_root``: MLflow puts its
    experiment 0 at the default root's ``0`` (the cwd's ``./mlruns/0`` unless told)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(tracking_uri, artifact_root)     # its engine is MLflow's, shared with the client's


def hide_default_experiment(client) -> bool:
    """Soft-delete MLflow's ``Default`` experiment (id 0, which every SQL store gets) while it is
    empty, so a sweep's own store lists only the sweep's experiment. MLflow 3.17 tolerates it: the
    store finds a deleted experiment 0 on opening and does not make another; the UI's home page and
    experiment list show active experiments only. Returns whether it deleted it."""
    exp_id, name = DEFAULT_EXPERIMENT
    try:
        exp = client.get_experiment(exp_id)
    except MlflowException:
        return False
    if exp.lifecycle_stage != LifecycleStage.ACTIVE or exp.name != name:
        return False
    if client.search_runs([exp_id], run_view_type=ViewType.ALL, max_results=1):
        return False            # someone logged a run there: it stays
    client.delete_experiment(exp_id)
    return True


GIT_DIRTY_TAG = "flurka.git_dirty"   # "true" / "false": the tree differed from mlflow.source.git.commit
SWEEP_TAG = "flurka.sweep_id"
TRIAL_TAG = "flurka.trial_key"
KIND_TAG = "flurka.kind"
BENCHMARK_TAG = "flurka.benchmark"
INIT_FROM_TAG = "flurka.init_from"     # a fine-tuning run's lineage: the trial key of the run it started from
PARENT_TAG = "mlflow.parentRunId"
RUN_COLOR_TAG = "mlflow.runColor"       # the colour MLflow's UI draws a run in (its own palette repeats)
PACKAGES = ("flurka", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "ray", "mlflow", "numpy", "optuna")


def lineage_tags(run: Mapping[str, Any]) -> dict[str, str]:
    """A planned run's lineage tag: the pre-training run it starts from (a chained sweep), or none."""
    return {INIT_FROM_TAG: str(run["init_from"])} if run.get("init_from") else {}


def source_tags(source: str) -> dict[str, str]:
    """MLflow's own Source, git and user fields of a run."""
    tags = {MLFLOW_SOURCE_NAME: source, MLFLOW_SOURCE_TYPE: "LOCAL"}
    try:
        tags[MLFLOW_USER] = getpass.getuser()
    except (KeyError, OSError):
        pass
    src = code_source.describe()
    if src.commit:
        tags[MLFLOW_GIT_COMMIT] = src.commit
        if src.dirty is not None:
            tags[GIT_DIRTY_TAG] = str(src.dirty).lower()
    return tags


def git_commit() -> str:
    """The commit of the code that runs, ``-dirty`` where its tree differed from it: git's in a
    checkout; in a Ray job's unpacked working dir (no ``.git``) what ``flurka submit`` recorded at
    submit time (:mod:`flurka.source`); else 'unknown'."""
    return code_source.describe().describe()


@functools.cache
def package_versions() -> dict[str, str]:
    out = {"python": _stdlib_platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> MLflow params ``a.b.c`` (values as text, at most MLflow's 6000 chars)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            text = json.dumps(v) if isinstance(v, (list, tuple, Mapping)) else str(v)
            out[key] = text[:6000]
    return out


# -- names: runs, metrics, table columns (see the module docstring) ---------------------------------

STREAMS = ("train", "eval")
# MLflow prints a metric's float as it is (axis ticks, the runs table, a run's overview): the
# training FLOPs go in TFLOP (2.1, not 2100000000000), and values are rounded where logged
# (:func:`shown`). The results database keeps every value whole.
METRIC_UNITS = {"train_flops": ("tflop", 1e-12)}
SHOWN_DIGITS = 5                                  # significant digits of a logged metric
SECONDS_DECIMALS = 3                              # a duration (``*_s``) to the millisecond
# Entries of an evaluation that describe the training state, not the evaluation: already in the
# train stream (one name per quantity), so not logged again under eval/.
EVAL_CONTEXT = ("train_flops", "handover_beta", CURVE_POINT)   # curve_point: a cheap evaluation (curve_batches)
DECIMAL_POINT = "\u00b7"                          # "·": 12.5% -> 12·5% in a table column


def metric_name(stream: str, key: str) -> str | None:
    """The MLflow name of training's metric ``key`` in ``stream`` ("train" | "eval"); None for an
    evaluation entry that repeats the train stream (:data:`EVAL_CONTEXT`). A trial's ``system/``
    samples (CPU, memory, device) keep their name: MLflow's UI groups ``system/`` as its own."""
    if stream not in STREAMS:
        raise ValueError(f"unknown metric stream {stream!r}; one of {STREAMS}")
    if stream == "eval" and key in EVAL_CONTEXT:
        return None
    if key.startswith("system/"):
        return key
    return f"{stream}/{METRIC_UNITS.get(key, (key,))[0]}"


def shown(key: str, value: float) -> float:
    """Training's metric ``key`` as MLflow shows it: in its unit (:data:`METRIC_UNITS`), a duration to
    the millisecond, anything else to :data:`SHOWN_DIGITS` significant digits."""
    value *= METRIC_UNITS.get(key, (key, 1.0))[1]
    if key.endswith("_s"):
        return round(value, SECONDS_DECIMALS)
    return float(f"{value:.{SHOWN_DIGITS}g}")


def trial_run_name(run: Mapping[str, Any], *, benchmark: bool = True) -> str:
    """A planned run's MLflow run name: mechanism, α, d_k, seed (what differs between trials),
    "base" for a separate base run, and the benchmark when ``benchmark`` (sweeps of several); the
    no-attention control says it is: "no attention (linformer dk=1) s0"."""
    if is_control(run["attention"], run.get("d_k")):
        return " ".join([f"no attention ({run['attention']} dk={run['d_k']})", f"s{run['seed']}",
                         *([str(run["benchmark"])] if benchmark else [])])
    parts = [str(run["attention"])]
    if run.get("alpha") is not None:
        parts.append(f"a={float(run['alpha']):g}")
    if run.get("d_k") is not None:
        parts.append(f"dk={run['d_k']}")
    parts.append(f"s{run['seed']}")
    if run.get("kind") == "base":
        parts.append("base")
    if benchmark:
        parts.append(str(run["benchmark"]))
    return " ".join(parts)


# Hues of matplotlib's tab20 (its dark half, then its light half; the greys left for the control).
HUES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
        "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
CONTROL_HUE = "#7f7f7f"
LIGHTEST_SEED = 0.6                       # the last seed's mix with white


def run_colors(runs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """A colour per planned run (by key) for MLflow's charts: one hue per configuration (benchmark,
    mechanism, α, d_k: a base run shares its baseline's) in plan order, each further seed lighter,
    so a configuration's seeds read as one band; the no-attention control grey."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["benchmark"], run["attention"], run.get("alpha"), run.get("d_k")), []).append(run)
    colors, hue = {}, 0
    for (_, attention, _, d_k), members in groups.items():
        if is_control(attention, d_k):
            base = CONTROL_HUE
        else:
            base, hue = HUES[hue % len(HUES)], hue + 1
        seeds = sorted({r["seed"] for r in members})
        for run in members:
            i = seeds.index(run["seed"])
            colors[run["key"]] = _lighter(base, LIGHTEST_SEED * i / max(1, len(seeds) - 1))
    return colors


def _lighter(hex_color: str, white: float) -> str:
    rgb = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * white):02x}" for c in rgb)


def table_column(name: Any) -> str:
    """A table column name MLflow's table viewer displays: no dots (see the module docstring)."""
    return re.sub(r"(?<=\d)\.(?=\d)", DECIMAL_POINT, _column_text(name)).replace(".", "_")


def _column_text(name: Any) -> str:
    return " ".join(map(str, name)).strip() if isinstance(name, tuple) else str(name)


def _flat_table(df):
    """The index as columns, a column's levels joined by spaces."""
    flat = (df.reset_index() if not _default_index(df) else df).copy()
    flat.columns = [_column_text(c) for c in flat.columns]
    return flat


def viewer_table(df):
    """``df`` as the parent run shows it: index as columns, :func:`table_column` names (made
    unique), missing cells blank; every other cell (numbers, "97.2 ± 1.7 (n=3)") unchanged."""
    flat = _flat_table(df)
    names: list[str] = []
    for col in flat.columns:
        name, n = table_column(col), 2
        while name in names:
            name, n = f"{table_column(col)} ({n})", n + 1
        names.append(name)
    flat.columns = names
    return flat.astype(object).where(flat.notna(), "")


def log_tables(client, run_id: str, tables: Mapping[str, Any]) -> None:
    """Tables on a run: ``tables/<name>.json`` in MLflow's table format under viewer-safe column
    names (:func:`viewer_table`), and ``tables/<name>.csv`` as the table has them. Logging a table
    again (``--resume``) replaces it (``MlflowClient.log_table`` would append its rows to the
    first ones)."""
    for name, df in tables.items():
        if df is None or len(df) == 0:
            continue
        path = f"tables/{name}.json"
        # MlflowClient.log_table's format (pandas "split", no index) and its tag, which makes
        # the UI open the artifact in its table viewer.
        client.log_text(run_id, viewer_table(df).to_json(orient="split", index=False, date_format="iso"), path)
        logged = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
        if {"path": path, "type": "table"} not in logged:
            client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps([*logged, {"path": path, "type": "table"}]))
        client.log_text(run_id, _flat_table(df).to_csv(index=False), f"tables/{name}.csv")


def note(blocks: list[str], limit: int) -> str:
    """Markdown blocks joined, as many as fit MLflow's ``limit`` on a tag's value, then a line
    that says where the rest is (a big sweep's tables outgrow a run's 8000 characters)."""
    cut = "*The rest: the `tables/` artifacts of the sweep's parent run, or `flurka tables`.*"
    whole = "\n\n".join(blocks) + "\n"
    if len(whole) <= limit:
        return whole
    kept: list[str] = []
    for block in blocks:   # each kept block leaves room for the cut line
        if len("\n\n".join([*kept, block, cut])) >= limit:
            break
        kept.append(block)
    return "\n\n".join([*kept, cut]) + "\n"


def dataset_input(described: Mapping[str, Any], context: str = "training") -> DatasetInput:
    """MLflow's data-set input for what a run trained on (``flurka.data.Dataset.describe``): the
    Datasets column of the runs table and the run page show its name and digest; the source is how
    to get it back (``flurka.data.get_dataset(name)``)."""
    described = dict(described)
    name, digest = str(described.pop("name")), str(described.pop("digest"))
    dataset = Dataset(name=name, digest=digest, source_type="flurka", source=json.dumps({"get_dataset": name}),
                      profile=json.dumps(described, sort_keys=True))
    return DatasetInput(dataset=dataset, tags=[InputTag(key=MLFLOW_DATASET_CONTEXT, value=context)])


def _finite_numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics``, each as MLflow shows it (:func:`shown`)."""
    return {k: shown(k, float(v)) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _batched(items: list, n: int) -> Iterable[list]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


# The real tracking URIs of this process by their masked form. Tune pickles the tracker (its
# callback's) into tuner.pkl for --resume: only the masked URI goes there, and the tracker gets
# the real one back from here (the resumed driver's own tracker, made from the flag, put it here).
_REAL_URIS: dict[str, str] = {}


class SweepTracker:
    """The sweep's MLflow writer (driver side). Pickled (by Tune, for ``--resume``) it keeps no
    password: see ``_REAL_URIS``."""

    def __init__(self, tracking_uri: str, experiment: str, sweep_id: str, *, artifact_root: str | None = None):
        self.uri = tracking_uri
        if mask_url(tracking_uri) != tracking_uri:
            _REAL_URIS[mask_url(tracking_uri)] = tracking_uri
        # The sweep's own SQLite store (in its run dir): MLflow's "Default" experiment, made with
        # every store, goes under the run dir's artifacts, and is hidden (hide_default_experiment).
        own = own_sqlite_store(tracking_uri, artifact_root)
        if own is not None and not own.exists():        # before MlflowClient, which creates it
            create_sqlite_store(tracking_uri, artifact_root)
        self.client = self._client()
        self.sweep_id = sweep_id
        # MLflow 3 refuses ./mlruns; with a SQLite store artifacts go next to it (absolute).
        self.experiment_id = self.store.call(experiment_id, self.client, experiment, artifact_root)
        if own is not None:
            self.store.call(hide_default_experiment, self.client.raw)
        self.parent_id: str | None = None
        self._runs: dict[str, str] = {}        # trial key -> run id
        self._colors: dict[str, str] = {}      # trial key -> its colour in the UI (color_runs)
        self._last_step: dict[tuple[str, str], int] = {}   # (run id, stream) -> last step logged
        self._finished: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("client", None)           # it holds the URI too; made again on unpickling
        state.pop("store", None)
        state["uri"] = mask_url(self.uri)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.uri = _REAL_URIS.get(state["uri"], state["uri"])
        self.client = self._client()

    def _client(self) -> RetryingClient:
        """The MLflow client, each call retried through an outage of the store (``self.store``)."""
        scheme = self.uri.split(":", 1)[0].lower()
        what = "MLflow server at" if scheme in ("http", "https") else "MLflow store"
        self.store = mlflow_store(f"{what} {mask_url(self.uri)}")
        return RetryingClient(MlflowClient(tracking_uri=self.uri), self.store)

    # -- runs ---------------------------------------------------------------------------------
    def _trial_runs(self, trial_key: str) -> list:
        """This sweep's MLflow runs of ``trial_key`` (one, or none yet)."""
        return self._find(f"tags.`{TRIAL_TAG}` = '{trial_key}' and tags.`{SWEEP_TAG}` = '{self.sweep_id}'")

    def _find(self, filter_string: str) -> list:
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, max_results=1000)

    def start_sweep(self, name: str, params: Mapping[str, Any]) -> str:
        """The sweep's parent run: created once, found again on --resume."""
        created = []

        def find_or_create():
            found = [r for r in self._find(f"tags.`{SWEEP_TAG}` = '{self.sweep_id}'")
                     if PARENT_TAG not in r.data.tags]
            if found:
                return found[0]
            created.append(True)
            return self.client.create_run(self.experiment_id, run_name=name, tags={
                SWEEP_TAG: self.sweep_id, KIND_TAG: "sweep", **source_tags("flurka sweep")})

        run = self.store.call(find_or_create)
        self.parent_id = run.info.run_id
        if not created:
            if run.info.status != "RUNNING":
                self.client.update_run(self.parent_id, status="RUNNING")
            return self.parent_id
        self._log_params(self.parent_id, {**flatten(params, "spec."), "git_commit": git_commit(),
                                          **{f"version.{k}": v for k, v in package_versions().items()}})
        return self.parent_id

    def color_runs(self, runs: Iterable[Mapping[str, Any]]) -> None:
        """Give the planned ``runs`` (dicts with key, benchmark, attention, alpha, d_k, seed) their
        colours (:func:`run_colors`), set as each run is created."""
        self._colors = run_colors(runs)

    def trial_run(self, trial_key: str, kind: str, params: Mapping[str, Any], *, name: str | None = None,
                  tags: Mapping[str, Any] | None = None) -> str:
        """The nested run of one planned trial (one per key, however often Tune retries it), named
        ``name`` (default: the key; sweeps pass :func:`trial_run_name`) and found again by key."""
        if trial_key in self._runs:
            return self._runs[trial_key]
        assert self.parent_id, "start_sweep first"
        created = []     # a creation tried (its answer may have been lost: then the retry finds it)

        def find_or_create():
            found = self._trial_runs(trial_key)
            if found:
                return found[0]
            created.append(True)
            color = getattr(self, "_colors", {}).get(trial_key)   # (a tracker pickled before colours had none)
            return self.client.create_run(self.experiment_id, run_name=name or trial_key, tags={
                **({RUN_COLOR_TAG: color} if color else {}),
                **{k: str(v) for k, v in (tags or {}).items()},
                PARENT_TAG: self.parent_id, SWEEP_TAG: self.sweep_id, TRIAL_TAG: trial_key, KIND_TAG: kind,
                **source_tags("flurka sweep")})

        run = self.store.call(find_or_create)
        run_id = run.info.run_id
        if created:      # params logged again are the same params: nothing changes
            self._log_params(run_id, {**flatten(params), "git_commit": git_commit(),
                                      **{f"version.{k}": v for k, v in package_versions().items()}})
        else:
            for stream in STREAMS:
                self._last_step[run_id, stream] = self._max_logged_step(run_id, run.data.metrics, stream)
            if run.info.status == "FINISHED":
                self._finished.add(run_id)
        self._runs[trial_key] = run_id
        return run_id

    def _max_logged_step(self, run_id: str, metrics: Mapping[str, float], stream: str) -> int:
        keys = [k for k in metrics if k.startswith(f"{stream}/")]
        steps = [m.step for key in keys for m in self.client.get_metric_history(run_id, key)]
        return max(steps, default=-1)

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        items = [Param(k[:250], v) for k, v in sorted(params.items())]
        for chunk in _batched(items, 100):
            self.client.log_batch(run_id, params=chunk)

    # -- metrics / artifacts ------------------------------------------------------------------
    def log_step(self, run_id: str, step: int, metrics: Mapping[str, Any], timestamp_ms: int,
                 stream: str = "train") -> bool:
        """One entry of a stream ("train": a history entry, "eval": an evaluation), with training's
        own metric names, logged under :func:`metric_name`'s; a step at or before the last one
        logged (a retried trial replaying from its checkpoint) is skipped so nothing is counted
        twice."""
        if step <= self._last_step.get((run_id, stream), -1):
            return False
        values = {metric_name(stream, k): v for k, v in _finite_numbers(metrics).items() if k != "step"}
        values.pop(None, None)
        if values:
            self.client.log_batch(run_id, metrics=[Metric(k, v, timestamp_ms, step) for k, v in values.items()])
        self._last_step[run_id, stream] = step
        return True

    def set_tags(self, run_id: str, tags: Mapping[str, Any]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def finish_trial(self, run_id: str, result: Mapping[str, Any] | None, *, status: str = "FINISHED",
                     extra_params: Mapping[str, Any] | None = None) -> None:
        """What the trial spent compiling, the training result as JSON, its config and curves; once
        per run. History and evaluations not yet logged (the driver missed reports, e.g. before a
        ``--resume``) are logged from the result first, so the final evaluation is always the last
        point of the ``eval/`` series — the run's final metrics, under no other name."""
        if run_id in self._finished:
            return
        if extra_params:
            existing = self.client.get_run(run_id).data.params
            self._log_params(run_id, {k: v for k, v in flatten(extra_params).items() if k not in existing})
        if result:
            now = int(time.time() * 1000)
            for stream, entries in (("train", result.get("history")), ("eval", result.get("eval_history"))):
                for entry in entries or []:
                    if "step" in entry:
                        self.log_step(run_id, int(entry["step"]), entry, now, stream=stream)
            step = int(result.get("steps") or 0)
            compiled = {f"compilation.{k}": v for k, v in _finite_numbers(result.get("compilation") or {}).items()}
            if compiled:
                self.client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in compiled.items()])
            self.client.log_dict(run_id, _jsonable(result), "result.json")
            if result.get("config") is not None:
                self.client.log_dict(run_id, _jsonable(result["config"]), "config.json")
            if result.get("dataset"):
                self.client.log_inputs(run_id, datasets=[dataset_input(result["dataset"])])
            history = result.get("history") or []
            if history:
                curve = pd.DataFrame(history)
                self.client.log_text(run_id, curve.to_csv(index=False), "curves.csv")
                self._log_curve_figure(run_id, curve)
            if result.get("status"):
                self.set_tags(run_id, {"flurka.status": result["status"]})
        self.client.set_terminated(run_id, status=status)
        self._finished.add(run_id)

    def log_model(self, trial_key: str, workdir: str | Path, benchmark: str) -> str | None:
        """The trial's trained model — its work dir's latest checkpoint — as the artifact
        ``model`` of its run, named on the parent by the tag ``flurka.model.<benchmark>``
        (``runs:/<run id>/model``). Downloaded (``mlflow.artifacts.download_artifacts``), the
        directory is what :func:`flurka.training.load_run` reads. None where the trial left no
        checkpoint or no run."""
        from flurka.training.restore import checkpoint_meta   # JAX, Orbax: 2 s that flurka ui / ingest do not pay

        try:
            step, _ = checkpoint_meta(str(workdir))
        except ValueError:
            return None
        run_id = self._runs.get(trial_key) or next((r.info.run_id for r in self._trial_runs(trial_key)), None)
        if run_id is None:
            return None
        self.client.log_artifacts(run_id, str(Path(workdir) / "checkpoints" / str(step)),
                                  f"model/checkpoints/{step}")
        uri = f"runs:/{run_id}/model"
        self.set_tags(run_id, {"flurka.model": f"best {benchmark} trial, step {step}"})
        self.set_tags(self.parent_id, {f"flurka.model.{benchmark}": uri})
        return uri

    def _log_curve_figure(self, run_id: str, curve) -> None:
        # matplotlib: 0.4 s, and its headless backend chosen only when a figure is drawn, so that
        # importing flurka.tracking leaves a notebook's backend alone
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cols = [c for c in curve.columns if c != "step" and curve[c].notna().any()]
        if "step" not in curve.columns or not cols:
            return
        fig, axes = plt.subplots(len(cols), 1, figsize=(6, 2.2 * len(cols)), squeeze=False, sharex=True)
        for ax, col in zip(axes[:, 0], cols):
            sub = curve[["step", col]].dropna()
            ax.plot(sub["step"], sub[col])
            ax.set_ylabel(col)
        axes[-1, 0].set_xlabel("step")
        fig.tight_layout()
        self.client.log_figure(run_id, fig, "curves.png")
        plt.close(fig)

    def log_tables(self, tables: Mapping[str, Any]) -> None:
        """The paper's tables on the parent run, so the UI alone shows them (:func:`log_tables`)."""
        log_tables(self.client, self.parent_id, tables)

    def describe(self, blocks: list[str]) -> None:
        """The result as the parent run's description and the experiment's (MLflow renders both
        as Markdown on the pages a user opens first; where several sweeps share the experiment,
        the newest's): :func:`note`."""
        self.client.set_tag(self.parent_id, MLFLOW_RUN_NOTE, note(blocks, MAX_TAG_VAL_LENGTH))
        self.client.set_experiment_tag(self.experiment_id, MLFLOW_RUN_NOTE, note(blocks, MAX_EXPERIMENT_TAG_VAL_LENGTH))

    def log_sweep_metrics(self, metrics: Mapping[str, Any]) -> None:
        values = _finite_numbers(metrics)
        if values:
            self.client.log_batch(self.parent_id, metrics=[Metric(k, v, 0, 0) for k, v in values.items()])

    def log_sweep_dict(self, d: Mapping[str, Any], name: str) -> None:
        self.client.log_dict(self.parent_id, _jsonable(d), name)

    def share_view(self) -> str | None:
        """The runs table of the sweep's experiment as a saved view (:mod:`flurka.tracking.view`),
        under the experiment's one key (:data:`~flurka.tracking.view.VIEW_KEY`): written again
        (``--resume``, the next sweep) it replaces the value and keeps its creation time. The
        columns: each benchmark's task metrics as its trials' config lists them (the catalogue's,
        where a run has no ``config.metrics``), those logged, then ``eval/loss``; the α, d_k and
        seed params where a run has one; sorted by the first benchmark's primary metric, best
        first. Returns the tag's key, or None where the sweep has no trial run yet."""
        runs = sorted(self.nested_runs(), key=lambda r: r.info.start_time or 0)
        if not runs:
            return None
        logged = {k for r in runs for k in r.data.metrics}
        declared: list[str] = []
        for r in runs:
            for m in _listed(r.data.params.get("config.metrics")):
                if m not in declared:
                    declared.append(m)
        task = [m for m in declared or TASK_METRICS if metric_name("eval", m) in logged]
        shown = [metric_name("eval", m) for m in task]
        if metric_name("eval", "loss") in logged:
            shown.append(metric_name("eval", "loss"))
        primary = task[0] if task else ("loss" if shown else None)
        params = [p for p in view.SHOWN_PARAMS if any(r.data.params.get(p, "None") not in ("None", "") for r in runs)]
        names = [r.info.run_name or "" for r in runs]
        if self.parent_id:
            names.append(self.client.get_run(self.parent_id).info.run_name or "")
        state = view.sweep_view_state(shown, primary and metric_name("eval", primary),
                                      bool(primary) and lower_is_better(primary), params, names)
        now = int(time.time() * 1000)
        old = self.client.get_experiment(self.experiment_id).tags.get(view.VIEW_TAG)
        try:
            created = int(view.read_envelope(old)[0].get("createdAt", now)) if old else now
        except (ValueError, TypeError):
            created = now
        title = f"Result: {primary and metric_name('eval', primary)}, best first" if primary else "Result"
        self.client.set_experiment_tag(self.experiment_id, view.VIEW_TAG, view.envelope(title, state, created, now))
        return view.VIEW_TAG

    def end_sweep(self, status: str = "FINISHED") -> None:
        """The parent run ended with ``status``; a sweep that ran to its end (FINISHED, FAILED)
        first writes the runs table's view (:meth:`share_view`)."""
        if self.parent_id:
            try:
                if status != "KILLED":
                    try:
                        self.share_view()
                    except MlflowException as exc:   # a refused write (not an outage): said, not fatal
                        print(f"[flurka] MLflow: the runs table's saved view was not written: "
                              f"{' '.join(str(exc.message).split())[:300]}", file=sys.stderr, flush=True)
                self.client.set_terminated(self.parent_id, status=status)
            except StoreUnavailable:
                if status == "FINISHED":
                    raise
                # a sweep failing already (perhaps on this outage): its own error says what happened

    # -- reading back -------------------------------------------------------------------------
    def nested_runs(self) -> list:
        return [r for r in self._find(f"tags.`{SWEEP_TAG}` = '{self.sweep_id}'") if PARENT_TAG in r.data.tags]


def _listed(text: str | None) -> list[str]:
    """A param logged from a list (``config.metrics``: '["bleu", "exact_match"]'), as the list."""
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _default_index(df) -> bool:
    return isinstance(df.index, pd.RangeIndex) and df.index.name is None


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def artifact_root_for(tracking_uri: str, run_dir: Path) -> str | None:
    """Artifacts of a SQLite store go under the run dir (absolute); a server keeps its own."""
    return (Path(run_dir) / "mlartifacts").resolve().as_uri() if tracking_uri.startswith("sqlite:") else None


__all__ = ["SweepTracker", "log_tables", "hide_default_experiment", "own_sqlite_store",
           "git_commit", "package_versions", "flatten", "artifact_root_for", "metric_name",
           "trial_run_name", "table_column", "viewer_table", "SWEEP_TAG", "TRIAL_TAG", "KIND_TAG",
           "BENCHMARK_TAG", "INIT_FROM_TAG", "lineage_tags", "PARENT_TAG", "GIT_DIRTY_TAG", "RunStatus", "mlflow"]
