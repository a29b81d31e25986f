"""Send a finished run to MLflow, where many teams keep their results.

One MLflow run per Precision Lab run, in the experiment "precision-lab" (or the one
given): the config as params, every metric column as a metric by step under the same
name (`loss`, `samples_per_s`, `step_time_ms`, ...), telemetry as MLflow system metrics
(`system/gpu_util_pct`, `system/cpu_pct`, ... by sample), the summary figures as
metrics without a step, the profiler trace, worker log, numerics file and a one-run
HTML report as artifacts, and the run's status as MLflow's (FINISHED, FAILED, KILLED).
The Precision Lab run id is the tag `precision_lab.run_id`: exporting the run again
replaces its earlier export in that experiment.

MLflow is an optional extra (requirements-export.txt); without it the CLI says so.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from engine.report.export import metrics_frame
from engine.schema import (
    FAILED,
    FINISHED,
    NUMERICS_FILENAME,
    ONEDNN_LOG_FILENAME,
    OOM,
    STOPPED,
    TRACE_FILENAME,
    WORKER_LOG,
)
from engine.store import RunRecord, Store

DEFAULT_EXPERIMENT = "precision-lab"
# A tracking server that accepts and never answers must fail the export within a bound,
# not hang it (MLflow's own defaults: 120 s per request, 7 retries with backoff: minutes).
DEFAULT_TIMEOUT_S = 10.0  # connect and each request; `export --mlflow-timeout-s` changes it
HTTP_RETRIES = 1
BATCH = 1000  # MLflow's log_batch limit on metrics per call (params: 100)
PARAM_BATCH = 100
SUMMARY_METRICS = ("samples_per_s", "tokens_per_s", "step_time_ms", "peak_mem_bytes",
                   "tensor_peak_bytes", "process_peak_bytes", "final_loss", "first_loss", "mfu",
                   "achieved_tflops", "skipped_steps",
                   "loss_scale_final", "flops_per_step", "param_count", "peak_flops")
_STATUS = {FINISHED: "FINISHED", STOPPED: "KILLED", FAILED: "FAILED", OOM: "FAILED",
           "diverged": "FAILED"}


class MlflowMissing(RuntimeError):
    """The mlflow package is not installed here."""


def mlflow_problem() -> str | None:
    """Why an MLflow export cannot run here, or None."""
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        return "MLflow is not installed: pip install -r requirements-export.txt"
    return None


class TrackingServerUnreachable(RuntimeError):
    """The http(s) tracking server did not answer within the timeout."""


def within(bound_s: float, call, *args, **kwargs):
    """`call(*args, **kwargs)`, given at most `bound_s` seconds in all.

    A socket timeout bounds each read, not the request: a server that sends one byte every
    few seconds never trips it (an export ran past 400 s). The call runs in a daemon thread
    and is abandoned at the bound (its socket closes when the process ends); TimeoutError."""
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="mlflow-request", daemon=True)
    worker.start()
    worker.join(bound_s)
    if worker.is_alive():
        raise TimeoutError(f"no complete answer within {bound_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def check_tracking_server(tracking_uri: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """For an http(s) URI: the server answers its health endpoint within `timeout_s`
    (connect and the whole response), else TrackingServerUnreachable naming the URI and the
    bound. Other URIs (file:, databases) are not network calls of this kind: nothing to do."""
    import urllib.error
    import urllib.request

    if not tracking_uri.startswith(("http://", "https://")):
        return
    url = tracking_uri.rstrip("/") + "/health"

    def health() -> None:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - http(s) only
            response.read(64)

    try:
        within(timeout_s, health)
    except urllib.error.HTTPError:
        return  # it answered (an older server without /health): MLflow's calls decide
    except (urllib.error.URLError, OSError) as exc:  # TimeoutError is an OSError
        reason = getattr(exc, "reason", exc)
        raise TrackingServerUnreachable(
            f"{tracking_uri} did not answer within {timeout_s:g} s ({reason}); check the "
            "server, or raise the bound with --mlflow-timeout-s") from None


class _BoundedClient:
    """An MlflowClient whose every call (one request and its retry) ends within a bound,
    else TrackingServerUnreachable naming the server and the bound."""

    def __init__(self, client, tracking_uri: str, timeout_s: float):
        self._client, self._uri = client, tracking_uri
        # connect + answer, once more on the retry, and the backoff between them
        self._bound_s = timeout_s * (HTTP_RETRIES + 1) + 2.0

    def __getattr__(self, name: str):
        method = getattr(self._client, name)

        def bounded(*args, **kwargs):
            try:
                return within(self._bound_s, method, *args, **kwargs)
            except TimeoutError:
                raise TrackingServerUnreachable(
                    f"{self._uri} did not complete {name} within {self._bound_s:g} s (a "
                    "server answering too slowly); check the server, or raise the bound "
                    "with --mlflow-timeout-s") from None

        return bounded


def _bound_http_calls(timeout_s: float) -> None:
    """MLflow's HTTP client reads its timeout and retries from the environment."""
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, int(math.ceil(timeout_s))))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(HTTP_RETRIES)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"


def export_to_mlflow(store: Store, run_id: str, tracking_uri: str,
                     experiment: str = DEFAULT_EXPERIMENT,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Export one run; the MLflow run id. The run must have ended. An http(s) server
    must answer within `timeout_s` (connect and each request, one retry)."""
    problem = mlflow_problem()
    if problem:
        raise MlflowMissing(problem)
    check_tracking_server(tracking_uri, timeout_s)
    _bound_http_calls(timeout_s)
    if tracking_uri.startswith("file:"):
        # MLflow 3 keeps its file store in maintenance mode and refuses it unless asked;
        # a file: URI given here is that request (no server, no database needed).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Metric, Param, RunTag  # optional extra
    from mlflow.tracking import MlflowClient

    run = store.get_run(run_id)
    client = MlflowClient(tracking_uri=tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        client = _BoundedClient(client, tracking_uri, timeout_s)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    # Exporting again replaces the earlier export of this run (one MLflow run per run).
    for earlier in client.search_runs([experiment_id],
                                      filter_string=f"tags.`precision_lab.run_id` = '{run.id}'"):
        client.delete_run(earlier.info.run_id)
    started_ms = int((run.started_at or run.created_at) * 1000)
    mlflow_run = client.create_run(experiment_id, start_time=started_ms, run_name=run.config.label,
                                   tags=_tags(run))
    mlflow_id = mlflow_run.info.run_id
    try:
        params = [Param(key, value) for key, value in _params(run)]
        for start in range(0, len(params), PARAM_BATCH):
            client.log_batch(mlflow_id, params=params[start:start + PARAM_BATCH])
        metrics = [Metric(key, value, timestamp, step)
                   for key, value, timestamp, step in _metric_points(store, run)]
        for start in range(0, len(metrics), BATCH):
            client.log_batch(mlflow_id, metrics=metrics[start:start + BATCH])
        if run.note:
            client.log_batch(mlflow_id, tags=[RunTag("mlflow.note.content", run.note)])
        _log_artifacts(client, mlflow_id, store, run)
    except BaseException:
        # A half-exported run must not look like a live one in MLflow (when the server
        # still answers: a slow one's failure is the error to report).
        with contextlib.suppress(Exception):
            client.set_terminated(mlflow_id, status="FAILED")
        raise
    ended_ms = int((run.ended_at or run.started_at or run.created_at) * 1000)
    client.set_terminated(mlflow_id, status=_STATUS.get(run.status, "FAILED"), end_time=ended_ms)
    return mlflow_id


def _tags(run: RunRecord) -> dict[str, str]:
    tags = {f"precision_lab.tag.{k}": v for k, v in run.tags.items()}
    tags.update({"precision_lab.run_id": run.id, "precision_lab.status": run.status,
                 "precision_lab.device": run.device_key,
                 "precision_lab.device_name": run.device_name or ""})
    if run.reason:
        tags["precision_lab.reason"] = run.reason[:5000]
    return tags


def _params(run: RunRecord) -> Iterable[tuple[str, str]]:
    for key, value in sorted(run.config.to_dict().items()):
        yield key, str(value)[:500]
    yield "device_key", run.device_key  # where it ran; config's `device` is what was asked


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _metric_points(store: Store, run: RunRecord) -> Iterable[tuple[str, float, int, int]]:
    """(key, value, timestamp ms, step) of every finite value worth a chart."""
    frame = metrics_frame(store, run.id)
    start_s = run.started_at or run.created_at
    for row in frame.itertuples(index=False):
        record = row._asdict()
        step = int(record["step"])
        wall = _finite(record.get("wall_time_s")) or 0.0
        timestamp = int((start_s + wall) * 1000)
        for key, value in record.items():
            value = _finite(value)
            if key not in ("step", "phase") and value is not None:
                yield key, value, timestamp, step
    telemetry = store.read_telemetry(run.id, max_points=None)
    for index, row in enumerate(telemetry.itertuples(index=False)):
        record = row._asdict()
        timestamp = int((_finite(record.get("t_s")) or start_s) * 1000)
        prefix = "system/" if not record.get("rank") else f"system/rank{record['rank']}/"
        for key, value in record.items():
            value = _finite(value)
            if key not in ("t_s", "rank", "throttle_reasons") and value is not None:
                yield prefix + key, value, timestamp, index
    ended_ms = int((run.ended_at or start_s) * 1000)
    for key in SUMMARY_METRICS:
        value = _finite(run.summary.get(key))
        if value is not None:
            yield f"summary/{key}", value, ended_ms, 0


def _log_artifacts(client, mlflow_id: str, store: Store, run: RunRecord) -> None:
    run_dir = store.run_dir(run.id)
    for name in (TRACE_FILENAME, ONEDNN_LOG_FILENAME, NUMERICS_FILENAME, WORKER_LOG):
        if (run_dir / name).is_file():
            client.log_artifact(mlflow_id, str(run_dir / name))
    from engine.report.html import build_html  # plotly: only the report needs it

    with tempfile.TemporaryDirectory(prefix="precision-lab-mlflow-") as tmp:
        report = Path(tmp) / "report.html"
        report.write_text(build_html(store, [run.id]), encoding="utf-8")
        client.log_artifact(mlflow_id, str(report))
