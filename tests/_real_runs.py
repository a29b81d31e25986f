"""Real tiny CPU runs recorded in a store the way the worker records them, in-process.

The comparison, report and Compare-page tests need finished runs with real metric rows
(phases, timings, losses) and real summaries; training in this process (no worker
subprocess, no profiler) keeps that to about a second per run.
"""

from __future__ import annotations

from typing import Any

from engine.config import RunConfig
from engine.run.finalize import finalize_run_data
from engine.schema import FINISHED, RUNNING
from engine.store import Store


def tiny_config(precision: str, **changes: Any) -> RunConfig:
    fields = dict(model="mlp", size="tiny", precision=precision, batch_size=16, steps=10,
                  warmup_steps=2, profile=False, device="cpu")
    fields.update(changes)
    return RunConfig(**fields)


def record_run(store: Store, cfg: RunConfig, summary_extra: dict[str, Any] | None = None,
               device_name: str = "test cpu", status: str = FINISHED,
               reason: str | None = None) -> str:
    """Train `cfg` on the CPU in this process and store it as a worker would."""
    from engine.training.loop import train

    run_id = store.create_run(cfg, "cpu", device_name)
    store.set_status(run_id, RUNNING)
    rows: list[dict[str, Any]] = []
    result = train(cfg, "cpu", emit=rows.extend, run_dir=store.run_dir(run_id))
    store.write_metrics(run_id, rows)
    store.merge_summary(run_id, {**result.to_dict(), **(summary_extra or {})})
    finalize_run_data(store, run_id)
    store.set_status(run_id, status, reason)
    return run_id


def write_rows(store: Store, cfg: RunConfig, rows: list[dict[str, Any]],
               summary: dict[str, Any] | None = None, status: str = FINISHED,
               device_key: str = "cpu", reason: str | None = None) -> str:
    """A run with hand-written metric rows (exact expected numbers)."""
    run_id = store.create_run(cfg, device_key, "test device")
    store.set_status(run_id, RUNNING)
    store.write_metrics(run_id, rows)
    if summary:
        store.merge_summary(run_id, summary)
    store.set_status(run_id, status, reason)
    return run_id


def speed_word(row, base=None) -> str:
    """The words the findings must use for one summary-table row against its baseline row:
    a difference only when its interval excludes 1.0 and neither run was measured on a
    busy machine (a loaded CI machine makes either one busy)."""
    if row.get("busy") or (base is not None and base.get("busy")):
        return "not a speedup figure"
    if row.get("throughput_x_low") is None:
        return "no speedup is stated"
    if not row.get("throughput_significant"):
        return "no measurable difference"
    return "faster" if row["throughput_x"] > 1.0 else "slower"
