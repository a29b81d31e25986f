"""A broken data directory gives a clear error in the UI, not a crash loop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.store import DB_FILENAME, Store

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _run_page(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    if page != "pages/launch.py":
        at.switch_page(page).run()
    return at


@pytest.mark.parametrize("page", ["pages/launch.py", "pages/live.py", "pages/runs.py"])
def test_corrupted_database_is_reported_and_runs_dir_kept(tmp_path, monkeypatch, page):
    home = tmp_path / "lab"
    store = Store(home)
    run_id = store.create_run(RunConfig(), "cpu")
    (home / DB_FILENAME).write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (home / (DB_FILENAME + suffix)).unlink(missing_ok=True)
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    at = _run_page(page)
    assert not at.exception, at.exception
    message = " ".join(err.value for err in at.error)
    assert "cannot open the database" in message and "move it away" in message
    assert (home / "runs" / run_id).is_dir()  # existing runs' artifacts untouched


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_data_dir_is_reported(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    monkeypatch.setenv("PRECISION_LAB_HOME", str(parent / "lab"))
    try:
        at = _run_page("pages/launch.py")
        assert not at.exception
        assert any("PRECISION_LAB_HOME" in err.value for err in at.error)
    finally:
        parent.chmod(0o700)


def test_data_dir_on_a_file_is_reported(tmp_path, monkeypatch):
    """Works as root too: a path under a regular file can never be created."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("PRECISION_LAB_HOME", str(blocker / "lab"))
    at = _run_page("pages/launch.py")
    assert not at.exception, at.exception
    assert any("PRECISION_LAB_HOME" in err.value and "writable" in err.value for err in at.error)
