"""What runs on the Ray cluster for a sweep: the store-writer actor and the training task.

Ray ships this package to the nodes (runtime_env py_modules, see engine/cluster/ray_driver.py),
so a node needs Python, torch and requirements.txt installed, not a checkout. The design
(one writer actor next to the database, rows batched every 0.5 s, stop flag in the
reply) is explained in engine/cluster/ray_driver.py.

Nothing here imports ray at module level: the driver wraps `StoreWriter` and
`execute_run` with `ray.remote` when it has connected.
"""

from __future__ import annotations

import os
import tempfile
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import ConfigError, RunConfig
from engine.run.session import Outcome, finish, run_relative_path
from engine.schema import (
    FAILED,
    NUMERICS_FILENAME,
    ONEDNN_LOG_FILENAME,
    QUEUED,
    RUN_ARTIFACTS,
    RUNNING,
    STOPPED,
    TRACE_FILENAME,
    WORKER_LOG,
)
from engine.store import Store

OUTBOX_FLUSH_S = 0.5  # like the local worker's MetricBuffer: the Live page sees rows within ~1 s
WRITER_CALL_TIMEOUT_S = 120.0
# Files a run leaves in its run directory that the pages read; the actor accepts only these.
ARTIFACT_NAMES = RUN_ARTIFACTS
NODE_CACHE_DIRNAME = "precision-lab-node"


# ---------------------------------------------------------------------------------------
# the actor (runs on the driver's node, next to the database)


class StoreWriter:
    """The cluster side's only writer of the SQLite store; one call at a time."""

    def __init__(self, home: str):
        self.store = Store(home)
        self.conn = self.store.open_connection()  # kept for the metric hot path
        self.stops: set[str] = set()

    def request_stop(self, run_id: str) -> None:
        self.stops.add(run_id)

    def started(self, run_id: str, device_key: str, device_name: str) -> bool:
        """Record where Ray placed the run and mark it running; False when the run was
        stopped meanwhile (the task then ends without training)."""
        if run_id in self.stops or self.store.get_run(run_id).status != QUEUED:
            return False
        self.store.set_run_placement(run_id, device_key, device_name)
        return self.store.set_status(run_id, RUNNING, only_from=(QUEUED,))

    def push(self, run_id: str, metrics: list[dict], telemetry: list[dict],
             log_lines: list[str]) -> bool:
        """Write a batch of the run's rows; return whether the run should stop."""
        if metrics:
            self.store.write_metrics(run_id, metrics, conn=self.conn)
        if telemetry:
            self.store.write_telemetry(run_id, telemetry)
        if log_lines:
            with open(self.store.run_dir(run_id) / WORKER_LOG, "a", encoding="utf-8") as log:
                log.write("".join(line + "\n" for line in log_lines))
        return run_id in self.stops

    def merge_summary(self, run_id: str, values: dict[str, Any]) -> None:
        self.store.merge_summary(run_id, values)

    def write_kernels(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        self.store.write_kernels(run_id, rows)

    def save_artifact(self, run_id: str, name: str, data: bytes) -> None:
        if name not in ARTIFACT_NAMES:  # never a path from the network
            raise ValueError(f"artifact name={name!r}: one of {', '.join(ARTIFACT_NAMES)}")
        path = self.store.run_dir(run_id) / name
        tmp = path.with_suffix(path.suffix + ".part")
        tmp.write_bytes(data)
        tmp.replace(path)  # readers never see half a trace
        if name == TRACE_FILENAME:
            self.store.merge_summary(run_id, {"trace_path": run_relative_path(run_id, path)})

    def finish(self, run_id: str, status: str, reason: str | None) -> bool:
        """The run's last word, as a local run's (engine.run.session.finish)."""
        return finish(self.store, run_id, Outcome(status, reason))


class RemoteStore:
    """The two store calls the run analysis and the peak lookup make, sent to the actor."""

    def __init__(self, writer):
        self.writer = writer

    def merge_summary(self, run_id: str, values: dict[str, Any]) -> None:
        _call(self.writer.merge_summary, run_id, values)

    def write_kernels(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        _call(self.writer.write_kernels, run_id, rows)


def _call(method, *args):
    import ray

    return ray.get(method.remote(*args), timeout=WRITER_CALL_TIMEOUT_S)


# ---------------------------------------------------------------------------------------
# the outbox (task side)


class Outbox:
    """A run's metric, telemetry and log rows, sent to the actor in one call at most every
    0.5 s from a thread of its own, so the training loop never waits on the network.
    The reply carries the run's stop flag: stop polling costs no extra round trip."""

    def __init__(self, writer, run_id: str, interval_s: float = OUTBOX_FLUSH_S):
        self.writer = writer
        self.run_id = run_id
        self.interval_s = interval_s
        self.error: str | None = None
        self._stop_requested = False
        self._lock = threading.Lock()
        self._metrics: list[dict] = []
        self._telemetry: list[dict] = []
        self._log: list[str] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ray-outbox", daemon=True)

    def start(self) -> "Outbox":
        self._thread.start()
        return self

    def add_metrics(self, rows: list[dict]) -> None:
        with self._lock:
            self._metrics.extend(rows)

    def add_telemetry(self, rows: list[dict]) -> None:
        with self._lock:
            self._telemetry.extend(rows)

    def log(self, line: str) -> None:
        print(line, flush=True)  # also in the driver's log (Ray forwards task output)
        with self._lock:
            self._log.append(f"[ray task] {line}")

    def stop_requested(self) -> bool:
        return self._stop_requested

    def _loop(self) -> None:
        while not self._closed.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            batch = (self._metrics, self._telemetry, self._log)
            self._metrics, self._telemetry, self._log = [], [], []
        try:
            if _call(self.writer.push, self.run_id, *batch):
                self._stop_requested = True
        except Exception as exc:  # noqa: BLE001 - see below
            # The actor is gone (its node or the driver died): nothing can record this
            # run any more, so training on would only burn the GPU.
            self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
            self._stop_requested = True

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()


# ---------------------------------------------------------------------------------------
# the task


@dataclass(frozen=True)
class Placement:
    torch_key: str  # what torch trains on here: "cuda:0" (Ray sets CUDA_VISIBLE_DEVICES) | "cpu"
    nvml_key: str  # "cuda:<index Ray assigned>" for NVML telemetry | "cpu"
    device_key: str  # stored with the run: "<device>@<node ip>", e.g. "cuda:3@10.0.0.5"
    device_name: str


def placement(use_gpu: bool) -> Placement:
    import ray

    node_ip = ray.util.get_node_ip_address()
    gpu_ids = ray.get_gpu_ids() if use_gpu else []
    if gpu_ids:
        import torch

        index = str(gpu_ids[0])
        return Placement("cuda:0", f"cuda:{index}", f"cuda:{index}@{node_ip}",
                         f"{torch.cuda.get_device_name(0)} on {node_ip}")
    from engine.hardware.devices import get_device  # on the node, once Ray placed the task

    return Placement("cpu", "cpu", f"cpu@{node_ip}", f"{get_device('cpu').name} on {node_ip}")


def execute_run(run_id: str, config_json: str, writer, use_gpu: bool) -> dict[str, Any]:
    """One run of a sweep, as a Ray task: train here, send everything to `writer`."""
    # Per-node caches (measured matmul peaks) live on the node, never in the dashboard's
    # data directory: the task has no access to it.
    os.environ["PRECISION_LAB_HOME"] = str(Path(tempfile.gettempdir()) / NODE_CACHE_DIRNAME)
    outbox = Outbox(writer, run_id)
    place = placement(use_gpu)
    if not _call(writer.started, run_id, place.device_key, place.device_name):
        return {"run_id": run_id, "status": "not started", "reason": "stopped before it started"}
    outbox.start()
    outbox.log(f"run {run_id}: {config_json} on {place.device_key} ({place.device_name}), "
               f"Ray worker pid {os.getpid()}")
    try:
        status, reason = _train_here(run_id, RunConfig.from_json(config_json), writer, place,
                                     outbox)
    except BaseException as exc:  # noqa: BLE001 - recorded; KeyboardInterrupt = ray.cancel
        outbox.log(traceback.format_exc())
        status, reason = (
            (STOPPED, "stopped by request (Ray task cancelled)")
            if isinstance(exc, KeyboardInterrupt)
            else (FAILED, f"{type(exc).__name__}: {exc}"[:2000])
        )
    outbox.close()
    _call(writer.finish, run_id, status, reason)
    return {"run_id": run_id, "status": status, "reason": reason}


def _train_here(run_id: str, cfg: RunConfig, writer, place: Placement,
                outbox: Outbox) -> tuple[str, str | None]:
    """THE trainer session (engine.run.session) with the store behind the actor."""
    from engine.admission import check_runnable  # on the node: its own devices decide
    from engine.run.session import SessionSpec, run_session  # the trainer side: torch

    cfg = cfg.replace(device=place.torch_key)
    try:
        _device, warnings = check_runnable(cfg)
    except ConfigError as exc:
        return FAILED, f"{exc} (on {place.device_name})"
    for warning in warnings:
        outbox.log(f"warning: {warning}")
    remote = RemoteStore(writer)
    with tempfile.TemporaryDirectory(prefix=f"precision-lab-{run_id}-") as tmp:
        run_dir = Path(tmp)
        spec = SessionSpec(
            run_id=run_id, cfg=cfg, device_key=place.torch_key, sink=remote,
            emit=outbox.add_metrics, telemetry=outbox.add_telemetry,
            should_stop=outbox.stop_requested, run_dir=run_dir,
            on_window=_window_handler(run_id, place, remote, writer, run_dir),
            telemetry_key=place.nvml_key, where=place.device_name, keep_trace_path=False,
            log=outbox.log)
        try:
            # Metric rows leave with the outbox, closed by execute_run after this returns.
            outcome = run_session(spec, close_metrics=lambda: None)
        finally:
            _upload_artifacts(writer, run_id, run_dir, (NUMERICS_FILENAME,))
    return outcome.status, outcome.reason


def _window_handler(run_id: str, place: Placement, remote: RemoteStore, writer, run_dir: Path):
    from engine.run.window import window_handler  # the trainer side only

    # On the node: the CPU evidence depends on this node's ISA flags.
    analyze = window_handler(remote, run_id, place.torch_key)

    def on_window(window, compute_dtype: str) -> None:
        analyze(window, compute_dtype)
        _upload_artifacts(writer, run_id, run_dir, (TRACE_FILENAME, ONEDNN_LOG_FILENAME))

    return on_window


def _upload_artifacts(writer, run_id: str, run_dir: Path, names: tuple[str, ...]) -> None:
    for name in names:
        path = run_dir / name
        if path.is_file():
            _call(writer.save_artifact, run_id, name, path.read_bytes())
