"""The profiler window's files under a full disk: the run trains on, keeps its metrics and
its outcome, the trace (or the oneDNN log) is dropped with a one-line reason in the
summary, and no temporary file is left. A real 2 MiB tmpfs (needs root; skipped with the
reason elsewhere), filled while the run trains."""

from __future__ import annotations

import pytest

from engine.config import RunConfig
from engine.run.window import window_handler
from engine.schema import PROFILE
from engine.store import Store

pytestmark = pytest.mark.slow

DISK_FULL = "the data directory's disk is full"


def _fill(directory) -> None:
    try:
        with open(directory / "filler", "wb") as handle:
            while True:
                handle.write(b"\0" * 4096)
                handle.flush()
    except OSError:  # ENOSPC: full, as wanted
        pass


def _train_filling_the_disk_at(home, run_dir, fill_at_profile_step: int):
    """A tiny CPU run whose run folder fills up at its `fill_at_profile_step`-th window
    step (1: before the oneDNN evidence step; 3: during the traced steps)."""
    from engine.training.loop import phase_of, train  # torch: only this test needs it

    store = Store(home)
    cfg = RunConfig(model="mlp", size="tiny", precision="fp32", batch_size=8, steps=12,
                    warmup_steps=2, log_interval=2, device="cpu", profile=True,
                    profile_steps=3)
    run_id = store.create_run(cfg, "cpu")
    run_dir.mkdir(parents=True, exist_ok=True)
    step = {"n": 0, "window": 0}

    def should_stop() -> bool:  # called once before each step: the disk fills here
        step["n"] += 1
        if phase_of(step["n"], cfg) == PROFILE:
            step["window"] += 1
            if step["window"] == fill_at_profile_step:
                _fill(run_dir.parent)
        return False

    result = train(cfg, "cpu", lambda rows: store.write_metrics(run_id, rows),
                   should_stop=should_stop, run_dir=run_dir,
                   on_window=window_handler(store, run_id, "cpu"))
    return store, run_id, result


def test_a_full_disk_while_the_trace_is_written_drops_only_the_trace(tmp_path, small_disk):
    run_dir = small_disk / "runs" / "r1"
    store, run_id, result = _train_filling_the_disk_at(tmp_path / "lab", run_dir, 3)
    assert result.status == "finished" and result.trace_path is None
    summary = store.get_run(run_id).summary
    assert summary["profile_error"] == f"the trace could not be written: {DISK_FULL}"
    assert summary.get("cpu_evidence")  # the oneDNN log was written before the disk filled
    assert store.read_metrics(run_id, max_points=None)["step"].max() == 12
    assert sorted(p.name for p in run_dir.iterdir()) == ["onednn_verbose.log"]


def test_a_full_disk_during_the_onednn_log_drops_the_log_and_the_trace(tmp_path, small_disk):
    run_dir = small_disk / "runs" / "r1"
    store, run_id, result = _train_filling_the_disk_at(tmp_path / "lab", run_dir, 1)
    assert result.status == "finished"
    summary = store.get_run(run_id).summary
    assert summary["profile_error"] == (f"the oneDNN log could not be written: {DISK_FULL}; "
                                        f"the trace could not be written: {DISK_FULL}")
    assert "cpu_evidence" not in summary
    assert store.read_metrics(run_id, max_points=None)["step"].max() == 12
    assert list(run_dir.iterdir()) == []
