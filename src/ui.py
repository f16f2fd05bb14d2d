"""UI step: MLflow's UI on a local store, light and quiet (`sgemm-lab ui`).

`mlflow ui` starts its CLI process, a uvicorn supervisor with four workers (each importing all of
MLflow, seconds apiece) and a job runner with seven huey consumers for GenAI jobs: 15 processes,
about 2.3 GB, 16-43 s before it answers on a shared machine, and ~30 log lines. Reading runs needs
one process: this serves MLflow's own app (mlflow.server.fastapi_app) with one uvicorn worker in
this process, configured as `mlflow server` configures it (the store's URI through the variables
mlflow.server.constants names), without the job runner, logging warnings only.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

APP = "mlflow.server.fastapi_app:app"
HOST = "127.0.0.1"  # this machine only, as `mlflow ui`
# MLflow's import of starlette's WSGI bridge warns that starlette will drop it: nothing a reader of
# the runs can act on
QUIET = (r"starlette\.middleware\.wsgi is deprecated",)


def server_env(uri: str) -> dict[str, str]:
    """What `mlflow server --backend-store-uri URI` hands its workers, for a store of runs only:
    the store (also the model registry's, as MLflow defaults it) and no job execution (the
    GenAI job runner starts processes nobody here uses)."""
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR, REGISTRY_STORE_URI_ENV_VAR

    return {BACKEND_STORE_URI_ENV_VAR: uri, REGISTRY_STORE_URI_ENV_VAR: uri,
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def uvicorn_options(port: int) -> dict:
    return {"host": HOST, "port": port, "workers": 1, "log_level": "warning"}


def quiet_warnings() -> None:
    for message in QUIET:
        warnings.filterwarnings("ignore", message=message)


def serve(db: Path, port: int) -> int:
    """MLflow's UI on the sqlite store `db` until Ctrl-C or SIGTERM, in this process."""
    quiet_warnings()
    os.environ.update(server_env(f"sqlite:///{db.resolve()}"))
    import uvicorn

    print(f"MLflow UI: http://{HOST}:{port} (one process; Ctrl-C stops it)", flush=True)
    uvicorn.run(APP, **uvicorn_options(port))
    return 0
