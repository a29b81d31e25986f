"""The store's own words, whatever breaks: a zero-byte database beside earlier run folders
is reported with the recovery (not silently treated as new), and a database damaged while
the app runs shows the store's message on the page, not a traceback box."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, cli_env
from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.store import Store, StoreError

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def _empty_database_beside_runs(home: Path) -> Store:
    store = Store(home)
    store.create_run(RunConfig(), "cpu")
    store.create_run(RunConfig(), "cpu")
    for suffix in ("-wal", "-shm"):
        Path(f"{store.db_path}{suffix}").unlink(missing_ok=True)
    store.db_path.write_bytes(b"")
    return store


@pytest.mark.slow
def test_a_zero_byte_database_beside_run_folders_is_reported_with_the_recovery(tmp_path):
    store = _empty_database_beside_runs(tmp_path / "home")
    with pytest.raises(StoreError) as info:
        Store(store.home)
    message = str(info.value)
    assert "empty (0 bytes)" in message and "2 run folder(s)" in message
    assert "Restore the file from a backup, or delete the empty file" in message
    result = subprocess.run([sys.executable, "-m", "engine", "list"], cwd=str(REPO_ROOT),
                            env=cli_env(store.home), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "empty (0 bytes)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    store.db_path.unlink()  # the recovery it offers: a new database, the folders kept
    assert Store(store.home).list_runs() == []
    assert len(list(store.runs_dir.iterdir())) == 2


def test_a_fresh_data_directory_is_still_created_silently(tmp_path):
    assert Store(tmp_path / "new").list_runs() == []


@pytest.mark.slow
def test_a_database_damaged_while_the_app_runs_shows_the_stores_message(home):
    store = Store(home)
    store.create_run(RunConfig(model="mlp"), "cpu")
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception and len(at.dataframe) == 1
    # Damaged under the running server (its Store object is cached).
    for suffix in ("-wal", "-shm"):
        Path(f"{store.db_path}{suffix}").unlink(missing_ok=True)
    with open(store.db_path, "r+b") as handle:
        handle.write(os.urandom(4096))
    at.run()
    assert not at.exception, at.exception
    errors = " ".join(e.value for e in at.error)
    assert "The data store cannot be used" in errors and "move it away and restart" in errors
