"""What a fresh browser sees of a sweep in MLflow's UI: the runs table opened on the result.

Left alone, MLflow 3's runs table shows Run Name, Created, Dataset, Duration, Source, Models and
"Show more columns (150 total)", the trials collapsed under their parent, the result nowhere.
The UI applies a *saved view* named in the page's URL (``#/experiments/<id>/runs?viewStateShareKey=<key>``)
and kept as the experiment tag ``mlflow.sharedViewState.<key>``. The format is what MLflow 3.17's
own "Views" → "Save as new view" writes (its JS bundle, ``encodeSavedViewEnvelope`` and the runs
page's save modal; checked by saving a view in the UI and reading the tag back): a JSON envelope
``{"name", "createdAt", "updatedAt", "state"}`` (ms since the epoch) whose ``state`` is the page's
view state as JSON, deflated (zlib) and base64'd behind ``"deflate;"``. Its keys are the search
facets (``orderByKey``, ``orderByAsc``, ``searchFilter``, ...) and the UI state (``selectedColumns``,
``columnOrder``, ``columnWidths``, ``runsHiddenMode``, ...); a column is ``<type>.`<name>` ``
(``metrics.`eval/bleu` ``, ``params.`run.alpha` ``, ``attributes.`Run Name` ``).

The sweep's view (:func:`sweep_view_state`): the benchmark's task metrics and the α, d_k, seed
params as columns, sorted by the primary metric, best first — sorted by anything but its start
time the table lists every run flat, so each trial's value shows without expanding its parent
(the UI drops ``runsExpanded`` from a shared view: it cannot be opened expanded) — the name
column wide enough for the longest run name, every run on the charts (``SHOW_ALL``, not the first 10).
A URL that also carries search facets (``orderByKey=`` ...) makes the UI ignore the view, and
``#/experiments/<id>`` without ``/runs`` loses the key in its redirect: :func:`view_url`.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any, Iterable

VIEW_KEY = "flurka-result"                       # one per experiment: the newest sweep's replaces it
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
VIEW_TAG = f"{SHARED_VIEW_PREFIX}{VIEW_KEY}"
SHARE_PARAM = "viewStateShareKey"
RUN_NAME_COLUMN = "attributes.`Run Name`"
DEFLATE = "deflate;"                             # the UI's marker of a compressed state
SHOWN_PARAMS = ("run.alpha", "run.d_k", "run.seed")
_NAME_WIDTH = (190, 480)                          # the UI's default and a cap, in px


def column(kind: str, name: str) -> str:
    """A runs-table column as the UI keys it: ``metrics.`eval/bleu` ``."""
    return f"{kind}.`{name}`"


def name_width(names: Iterable[str]) -> int:
    """Pixels that show the longest run name whole (13 px type: ~6.5 px a character, the colour
    dot and padding ~60 px), at least the UI's default 190."""
    longest = max((len(n) for n in names), default=0)
    return max(_NAME_WIDTH[0], min(_NAME_WIDTH[1], 60 + round(6.5 * longest)))


def sweep_view_state(metrics: list[str], primary: str | None, ascending: bool, params: list[str],
                     run_names: Iterable[str]) -> dict[str, Any]:
    """The runs page's state: ``metrics`` (MLflow names, ``eval/bleu``) then ``params`` as columns,
    sorted by ``primary`` (``ascending`` where lower is better; None: the UI's default order)."""
    width = name_width(run_names)
    return {
        # the search facets
        "searchFilter": "", "orderByKey": column("metrics", primary) if primary else "attributes.start_time",
        "orderByAsc": bool(ascending) if primary else False, "startTime": "ALL", "lifecycleFilter": "Active",
        "datasetsFilter": [], "modelVersionFilter": "All Runs",
        # the UI state (the keys and defaults the UI writes itself)
        "selectedColumns": [*(column("metrics", m) for m in metrics), *(column("params", p) for p in params)],
        "columnOrder": [RUN_NAME_COLUMN], "columnWidths": {RUN_NAME_COLUMN: width},
        "runsHiddenMode": "SHOW_ALL", "viewMaximized": False, "runListHidden": False, "isAccordionReordered": False,
        "useGroupedValuesInCharts": True, "hideEmptyCharts": True, "groupBy": None, "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def envelope(name: str, state: dict[str, Any], created_ms: int, updated_ms: int | None = None) -> str:
    """The tag's value: the saved-view envelope around the deflated state."""
    packed = DEFLATE + base64.b64encode(zlib.compress(json.dumps(state, separators=(",", ":")).encode())).decode()
    return json.dumps({"name": name, "createdAt": int(created_ms),
                       "updatedAt": int(updated_ms if updated_ms is not None else created_ms), "state": packed})


def read_envelope(value: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(envelope, state) of a tag's value as the UI reads it: an envelope whose state is deflated
    or plain JSON, or (a share link of older UIs) the plain state itself."""
    outer = json.loads(value)
    if not isinstance(outer, dict) or not isinstance(outer.get("state"), str):
        return {}, outer
    state = outer["state"]
    if state.startswith(DEFLATE):
        state = zlib.decompress(base64.b64decode(state.removeprefix(DEFLATE))).decode()
    return outer, json.loads(state)


def view_url(base: str, experiment_id: str, query: str, key: str | None = VIEW_KEY) -> str:
    """The runs page of an experiment opened on the saved view ``key`` (None: the page alone);
    ``query``: more of the URL's parameters (``workflowType=machine_learning``)."""
    if key is None:
        return f"{base}/#/experiments/{experiment_id}?{query}"
    return f"{base}/#/experiments/{experiment_id}/runs?{SHARE_PARAM}={key}&{query}"


__all__ = ["VIEW_KEY", "VIEW_TAG", "SHARED_VIEW_PREFIX", "SHARE_PARAM", "column", "name_width", "sweep_view_state",
           "envelope", "read_envelope", "view_url"]
