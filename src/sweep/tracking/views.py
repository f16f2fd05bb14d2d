"""The runs table as it opens: saved views of MLflow's UI (columns, filter, sort) kept as
experiment tags, and the links that open them for the README's questions.

MLflow's UI keeps the columns a user picked in the browser only; a view shared with its "Share"
button or saved from its Views menu is an experiment tag `mlflow.sharedViewState.<key>` holding the
page's state (columns, filter, sort), opened by `?viewStateShareKey=<key>` in the URL. The lab
writes its views (VIEWS) when it creates an experiment: every printed link opens with the figures
as columns instead of none, and the Views menu lists the README's questions.
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote

SHARED_VIEW_PREFIX = "mlflow.sharedViewState."  # MLflow UI's tag prefix for a shared view

# The columns, as the UI names them (`<type>.\`<key>\``): what ran, its figures, how it ended.
COLUMNS = ("tags.`math`", "params.`precision`", "metrics.`gflops`", "metrics.`pct_of_cublas`",
           "metrics.`time_ms_median`", "tags.`gpu`", "tags.`status`", "tags.`error`")


def ui_state() -> dict:
    """The experiment page's whole UI state (older MLflow versions replace their state with a
    shared one, so every field it reads is given, with MLflow's defaults) with COLUMNS selected."""
    return {
        "selectedColumns": list(COLUMNS), "columnOrder": [], "columnWidths": {},
        "runsExpanded": {}, "runsPinned": [], "runsHidden": [], "runsVisibilityMap": {},
        "runsHiddenMode": "FIRST_10_RUNS", "viewMaximized": False, "runListHidden": False,
        "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        "groupBy": None, "groupsExpanded": {}, "autoRefreshEnabled": False,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


# The saved views: key -> (name in the UI's Views menu, what it answers, search filter, sort key,
# descending). MLflow ignores a shared view when the URL also sets a filter or a sort, so each view
# carries its own. Sorted by `attributes.start_time` ("Created"), the UI nests the matching jobs
# under their sweep's run, folded, so a filtered view sorts by a column; other attributes show as
# "Sort: undefined".
EVERY_RUN = "sgemm-lab-runs"
VIEWS = {
    EVERY_RUN: ("Every run", "every run, newest first (a sweep's jobs under it)", "",
                "attributes.start_time", True),
    "sgemm-lab-fp32-4096": (
        "Fastest FP32-accurate kernels at 4096",
        "fastest FP32-accurate kernels at 4096 (FFMA and 3xTF32; GFLOP/s, % of cuBLAS FP32)",
        "params.m = '4096' and params.n = '4096' and params.k = '4096' and params.precision = 'fp32'",
        "metrics.`gflops`", True),
    "sgemm-lab-all-4096": (
        "Every kernel at 4096 against cuBLAS",
        "every kernel at 4096 against cuBLAS in its own precision",
        "params.m = '4096' and params.n = '4096' and params.k = '4096'", "metrics.`pct_of_cublas`", True),
    "sgemm-lab-failed": (
        "Failed jobs and why",
        "failed jobs by status (the error column says why; open one for the whole error)",
        "attributes.status = 'FAILED' and tags.kind = 'job'", "tags.`status`", False),
}
QUESTIONS = [key for key in VIEWS if key != EVERY_RUN]


def view_tags(now_ms: int | None = None) -> dict[str, str]:
    """The experiment tags that save the views (written when the experiment is made), in the
    envelope MLflow's Views menu lists (name, createdAt, the state as a JSON string); created a
    millisecond apart so that the menu lists them in VIEWS' order (newest first)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    tags = {}
    for order, (key, (name, _, search, sort, descending)) in enumerate(VIEWS.items()):
        state = {**ui_state(), "searchFilter": search, "orderByKey": sort, "orderByAsc": not descending}
        created = now_ms - order
        tags[SHARED_VIEW_PREFIX + key] = json.dumps(
            {"name": name, "createdAt": created, "updatedAt": created,
             "state": json.dumps(state, sort_keys=True)})
    return tags


def runs_url(base: str, experiment: str, key: str = EVERY_RUN, with_view: bool = True) -> str:
    """The experiment's runs table at `base` (http://host:port, or '' for a link inside the UI)
    as view `key` shows it; without the saved view (`with_view` false: an experiment made
    before the lab saved views), the same filter and sort in the URL, MLflow's columns."""
    url = f"{base}/#/experiments/{experiment}/runs?"
    if with_view:
        return url + f"viewStateShareKey={key}"
    _, _, search, order, descending = VIEWS[key]
    return url + (f"searchFilter={quote(search, safe='')}&orderByKey={quote(order, safe='')}"
                  f"&orderByAsc={'false' if descending else 'true'}")


def question_links(base: str, experiment: str, with_view: bool = True) -> dict[str, str]:
    """The README's questions: what each answers -> its link."""
    return {VIEWS[key][1]: runs_url(base, experiment, key, with_view) for key in QUESTIONS}
