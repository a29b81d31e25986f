"""Write a run as TensorBoard event files: `tensorboard --logdir DIR` then shows it.

One subdirectory per run (`DIR/<label>_<run id>`, replaced when exported again), scalars by step under the metric
names (`loss`, `samples_per_s`, `step_time_ms`, ...), telemetry under `system/` by
sample, and the config and summary as a text summary. Written with TensorBoard's own
event writer and protocol buffers (the `tensorboard` package, an optional extra): no
TensorFlow, no torch.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from engine.report.export import metrics_frame
from engine.store import RunRecord, Store


class TensorboardMissing(RuntimeError):
    """The tensorboard package is not installed here."""


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
    # the optional extra's protocol buffers and writer
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    run = store.get_run(run_id)
    out = Path(logdir) / run_logdir_name(run)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("events.out.tfevents.*"):  # exporting again replaces, never doubles
        old.unlink()
    writer = EventFileWriter(str(out))
    start_s = run.started_at or run.created_at

    def scalar(tag: str, value: float, step: int, wall_s: float) -> None:
        writer.add_event(Event(wall_time=wall_s, step=step, summary=Summary(
            value=[Summary.Value(tag=tag, simple_value=value)])))

    try:
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
        _text(writer, Event, Summary, "precision_lab/run", text, run.ended_at or start_s)
    finally:
        writer.close()
    return out


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
