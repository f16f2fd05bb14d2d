"""The runs table as it opens: saved views of MLflow's UI (columns, filter, sort) kept as
experiment tags, and the links that open them for the questions of docs/tracking.md.

MLflow's UI keeps the columns a user picked in the browser only; a view shared with its "Share"
button or saved from its Views menu is an experiment tag `mlflow.sharedViewState.<key>` holding the
page's state (columns, filter, sort), opened by `?viewStateShareKey=<key>` in the URL. The lab
writes its views (VIEWS) when it creates an experiment: every printed link opens with the figures
as columns instead of none, and the Views menu lists the questions of docs/tracking.md.
"""

from __future__ import annotations

import json
import time
from typing import NamedTuple
from urllib.parse import quote

SHARED_VIEW_PREFIX = "mlflow.sharedViewState."  # MLflow UI's tag prefix for a shared view

# The columns, as the UI names them (`<type>.\`<key>\``): what ran, its figures, how it ended.
FIGURES = ("tags.`math`", "params.`precision`", "metrics.`gflops`", "metrics.`pct_of_cublas`",
           "metrics.`time_ms_median`", "tags.`gpu`", "tags.`status`", "tags.`error`")
FAILURES = ("tags.`status`", "tags.`error`", "tags.`gpu`")  # why, first; no figures


def ui_state(columns=FIGURES, widths: dict | None = None) -> dict:
    """The experiment page's whole UI state (older MLflow versions replace their state with a
    shared one, so every field it reads is given, with MLflow's defaults) showing `columns`."""
    return {
        # MLflow applies a width only to a column named in columnOrder
        "selectedColumns": list(columns), "columnOrder": list(columns) if widths else [],
        "columnWidths": widths or {},
        "runsExpanded": {}, "runsPinned": [], "runsHidden": [], "runsVisibilityMap": {},
        "runsHiddenMode": "FIRST_10_RUNS", "viewMaximized": False, "runListHidden": False,
        "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        "groupBy": None, "groupsExpanded": {}, "autoRefreshEnabled": False,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


class View(NamedTuple):
    name: str                  # in the UI's Views menu
    answers: str               # what it answers, as `sgemm-lab links` prints it
    search: str                # the runs table's search filter
    order: str                 # its sort key
    descending: bool = True
    columns: tuple = FIGURES
    widths: dict = {}          # column -> pixels


# The saved views, by key. MLflow ignores a shared view when the URL also sets a filter or a sort,
# so each view carries its own. Sorted by `attributes.start_time` ("Created"), the UI nests the
# matching jobs under their sweep's run, folded, so a filtered view sorts by a column; other
# attributes show as "Sort: undefined".
AT_4096 = "params.m = '4096' and params.n = '4096' and params.k = '4096'"
EVERY_RUN = "sgemm-lab-runs"
VIEWS = {
    EVERY_RUN: View("Every run", "every run, newest first (a sweep's jobs under it)", "",
                    "attributes.start_time"),
    "sgemm-lab-fp32-4096": View(
        "Fastest FP32-accurate kernels at 4096",
        "fastest FP32-accurate kernels at 4096 (FFMA and 3xTF32; GFLOP/s, % of cuBLAS FP32)",
        AT_4096 + " and params.precision = 'fp32'", "metrics.`gflops`"),
    "sgemm-lab-all-4096": View(
        "Every kernel at 4096 against cuBLAS",
        "every kernel at 4096 against cuBLAS in its own precision", AT_4096,
        "metrics.`pct_of_cublas`"),
    "sgemm-lab-failed": View(
        "Failed jobs and why",
        "failed jobs by status (the error column says why; open one for the whole error)",
        "attributes.status = 'FAILED' and tags.kind = 'job'", "tags.`status`", descending=False,
        columns=FAILURES, widths={"tags.`status`": 170, "tags.`error`": 900}),
}
QUESTIONS = [key for key in VIEWS if key != EVERY_RUN]


def view_tags(now_ms: int | None = None) -> dict[str, str]:
    """The experiment tags that save the views (written when the experiment is made), in the
    envelope MLflow's Views menu lists (name, createdAt, the state as a JSON string); created a
    millisecond apart so that the menu lists them in VIEWS' order (newest first)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    tags = {}
    for order, (key, view) in enumerate(VIEWS.items()):
        state = {**ui_state(view.columns, view.widths), "searchFilter": view.search,
                 "orderByKey": view.order, "orderByAsc": not view.descending}
        created = now_ms - order
        tags[SHARED_VIEW_PREFIX + key] = json.dumps(
            {"name": view.name, "createdAt": created, "updatedAt": created,
             "state": json.dumps(state, sort_keys=True)})
    return tags


def runs_url(base: str, experiment: str, key: str = EVERY_RUN, with_view: bool = True) -> str:
    """The experiment's runs table at `base` (http://host:port, or '' for a link inside the UI)
    as view `key` shows it; without the saved view (`with_view` false: an experiment made
    before the lab saved views), the same filter and sort in the URL, MLflow's columns."""
    url = f"{base}/#/experiments/{experiment}/runs?"
    if with_view:
        return url + f"viewStateShareKey={key}"
    view = VIEWS[key]
    return url + (f"searchFilter={quote(view.search, safe='')}&orderByKey={quote(view.order, safe='')}"
                  f"&orderByAsc={'false' if view.descending else 'true'}")


def question_links(base: str, experiment: str, with_view: bool = True) -> dict[str, str]:
    """The questions of docs/tracking.md: what each answers -> its link."""
    return {VIEWS[key].answers: runs_url(base, experiment, key, with_view) for key in QUESTIONS}
