"""Write a run as TensorBoard event files: `tensorboard --logdir DIR` then shows it.

One subdirectory per run (`DIR/<label>_<run id>`, replaced when exported again), scalars
by step under the metric names (`loss`, `samples_per_s`, `step_time_ms`, ...), telemetry
under `system/` by sample, and the config and summary as a text summary (a Markdown code
block: shown as written, never rendered). Written in this thread with TensorBoard's record
format and protocol buffers (the `tensorboard` package, an optional extra): no
TensorFlow, no torch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from engine.report.export import metrics_frame
from engine.store import RunRecord, Store


class TensorboardMissing(RuntimeError):
    """The tensorboard package is not installed here."""


class TensorboardWriteError(OSError):
    """The event file could not be written (a full disk, a folder gone): one line naming
    the folder and the reason; nothing half-written is left."""


def tensorboard_problem() -> str | None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        return "TensorBoard is not installed: pip install -r requirements-export.txt"
    return None


def run_logdir_name(run: RunRecord) -> str:
    """A directory name TensorBoard lists readably: label and id, filesystem-safe."""
    label = re.sub(r"[^\w.+\-]", "_", run.config.label)[:80].strip("_")
    return f"{label}_{run.id}"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def export_to_tensorboard(store: Store, run_id: str, logdir: str | Path) -> Path:
    """Write the run's event file under `logdir`; the run's directory."""
    problem = tensorboard_problem()
    if problem:
        raise TensorboardMissing(problem)
    # the optional extra's protocol buffers and record format
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    run = store.get_run(run_id)
    out = Path(logdir) / run_logdir_name(run)
    event_file = out / (f"events.out.tfevents.{int(time.time()):010d}."
                        f"{socket.gethostname()}.{os.getpid()}.0")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("events.out.tfevents.*"):  # exporting again replaces, never doubles
            old.unlink()
        with open(event_file, "wb") as handle:
            _write_events(store, run, _Writer(handle), Event, Summary)
    except OSError as exc:
        # Written here, not by TensorBoard's writer thread: its failure printed a thread
        # traceback of 60 lines besides the error.
        with contextlib.suppress(OSError):
            event_file.unlink()
        reason = exc.strerror or str(exc)
        raise TensorboardWriteError(exc.errno, f"{out}: cannot write the TensorBoard event file "
                                    f"({reason}); free space there or choose another "
                                    "folder") from None
    return out


class _Writer:
    """TensorBoard's record framing over a plain file, written in this thread."""

    def __init__(self, handle):
        from tensorboard.summary.writer.record_writer import RecordWriter  # optional extra

        self._records = RecordWriter(handle)

    def add_event(self, event) -> None:
        self._records.write(event.SerializeToString())


def _write_events(store: Store, run: RunRecord, writer: _Writer, Event, Summary) -> None:
    run_id = run.id
    writer.add_event(Event(wall_time=time.time(), file_version="brain.Event:2"))
    start_s = run.started_at or run.created_at

    def scalar(tag: str, value: float, step: int, wall_s: float) -> None:
        writer.add_event(Event(wall_time=wall_s, step=step, summary=Summary(
            value=[Summary.Value(tag=tag, simple_value=value)])))

    for row in metrics_frame(store, run_id).itertuples(index=False):
        record = row._asdict()
        wall_s = start_s + (_finite(record.get("wall_time_s")) or 0.0)
        for key, value in record.items():
            value = _finite(value)
            if key not in ("step", "phase") and value is not None:
                scalar(key, value, int(record["step"]), wall_s)
    telemetry = store.read_telemetry(run_id, max_points=None)
    for index, row in enumerate(telemetry.itertuples(index=False)):
        record = row._asdict()
        prefix = "system/" if not record.get("rank") else f"system/rank{record['rank']}/"
        for key, value in record.items():
            value = _finite(value)
            if key not in ("t_s", "rank") and value is not None:
                scalar(prefix + key, value, index, _finite(record["t_s"]) or start_s)
    text = json.dumps({"run_id": run.id, "status": run.status, "reason": run.reason,
                       "device": run.device_key, "config": run.config.to_dict(),
                       "tags": run.tags, "note": run.note}, indent=2, default=str)
    _text(writer, Event, Summary, "precision_lab/run", literal_markdown(text),
          run.ended_at or start_s)


def literal_markdown(text: str) -> str:
    """`text` as a Markdown code block, every line indented four spaces: TensorBoard's Text
    tab renders Markdown, and a note or tag "![x](http://...)" would be fetched as an image.
    No line of an indented block can leave it (a fence could be closed by the text)."""
    return "\n".join("    " + line for line in text.splitlines())


def _text(writer, Event, Summary, tag: str, text: str, wall_s: float) -> None:
    """A text summary (TensorBoard's Text tab): the text plugin's tensor encoding."""
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, string_val=[text.encode("utf-8")],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[]))
    from tensorboard.compat.proto.summary_pb2 import SummaryMetadata

    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    writer.add_event(Event(wall_time=wall_s, step=0, summary=Summary(
        value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])))
