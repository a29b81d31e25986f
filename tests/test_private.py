"""Private by default: the data directory and runs/ are 0700, the database (and its WAL
and shared-memory files), logs and the peaks cache 0600, also when an older version made
them 644/755 (fixed on open); summaries and reports carry paths relative to the data
directory, never this machine's absolute ones."""

from __future__ import annotations

import os
import stat

import pytest
from _real_runs import tiny_config

from engine.config import RunConfig
from engine.run.launcher import launch
from engine.schema import FINAL_STATUSES
from engine.store import Store

pytestmark = pytest.mark.usefixtures("one_thread_workers")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_data_directory_is_private(tmp_path):
    old_umask = os.umask(0o022)  # the usual umask: files 644, folders 755 by default
    try:
        store = Store(tmp_path / "home")
        run_id = store.create_run(RunConfig(), "cpu")
        store.write_metrics(run_id, [{"step": 1, "loss": 1.0}])  # the WAL file exists now
    finally:
        os.umask(old_umask)
    assert _mode(store.home) == 0o700 and _mode(store.runs_dir) == 0o700
    assert _mode(store.run_dir(run_id)) == 0o700
    for suffix in ("", "-wal", "-shm"):
        path = f"{store.db_path}{suffix}"
        if os.path.exists(path):
            assert _mode(path) == 0o600, path


def test_an_existing_data_directory_is_fixed_on_open(tmp_path):
    home = tmp_path / "home"
    Store(home)
    for name in ("standby.log", "peaks_cache.json"):
        (home / name).write_text("{}")
    os.chmod(home, 0o755)
    os.chmod(home / "runs", 0o755)
    for name in ("precision_lab.sqlite3", "standby.log", "peaks_cache.json"):
        os.chmod(home / name, 0o644)
    Store(home)
    assert _mode(home) == 0o700 and _mode(home / "runs") == 0o700
    for name in ("precision_lab.sqlite3", "standby.log", "peaks_cache.json"):
        assert _mode(home / name) == 0o600, name


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_runs_logs_and_summary_hold_no_absolute_data_path(store, wait_for):
    run_id = launch(tiny_config("fp32", steps=6, profile=True, warmup_steps=1), store)
    wait_for(lambda: store.get_run(run_id).status in FINAL_STATUSES, 90, message="the run")
    run = store.get_run(run_id)
    assert run.status == "finished", run.reason
    assert _mode(store.run_dir(run_id) / "worker.log") == 0o600
    assert run.summary["trace_path"] == f"runs/{run_id}/trace.json.gz"
    assert (store.home / run.summary["trace_path"]).is_file()
    import json

    assert str(store.home) not in json.dumps(run.summary)
    from engine.report.html import build_html

    assert str(store.home) not in build_html(store, [run_id])
