"""The store and the exports under misuse: an export aimed inside the data directory, many
concurrent tag commands."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from engine.cli.main import main
from engine.config import RunConfig
from engine.report.export import ExportTargetError, write_file_atomically, write_metrics_file
from engine.schema import FINISHED
from engine.store import Store
from engine.store.db import DB_FILENAME


def _ended_run(store: Store) -> str:
    run_id = store.create_run(RunConfig(model="mlp"), "cpu")
    store.write_metrics(run_id, [{"step": 1, "loss": 1.0}])
    store.set_status(run_id, FINISHED)
    return run_id


def _run_files(home) -> dict:
    """The runs' files and their bytes (the database is checked by reading it back: opening
    it may write its journal)."""
    return {p: p.read_bytes() for p in (home / "runs").rglob("*") if p.is_file()}


@pytest.mark.parametrize("target", [DB_FILENAME, "runs/{run}/worker.log", "runs/{run}/trace.json",
                                    "new.csv", "runs/{run}/metrics.csv"])
def test_csv_export_into_the_data_directory_is_refused_and_the_store_lives(home, target, capsys):
    store = Store(home)
    run_id = _ended_run(store)
    path = home / target.format(run=run_id)
    (store.run_dir(run_id) / "worker.log").write_text("the run's own log\n")
    before = _run_files(home)
    assert main(["export", run_id, "--csv", str(path)]) == 2
    err = capsys.readouterr().err
    assert "inside the data directory" in err and "exports write outside it" in err
    assert _run_files(home) == before
    assert [r.id for r in store.list_runs()] == [run_id]


def test_the_writers_refuse_the_data_directory_through_a_symbolic_link(home, tmp_path):
    store = Store(home)
    run_id = _ended_run(store)
    alias = tmp_path / "alias"
    alias.symlink_to(home)
    with pytest.raises(ExportTargetError, match="inside the data directory"):
        write_metrics_file(store, run_id, alias / DB_FILENAME, "csv")
    with pytest.raises(ExportTargetError, match="inside the data directory"):
        write_file_atomically(alias / "report.html", b"<html>")  # the HTML report's writer
    assert store.get_run(run_id).status == FINISHED
    outside = tmp_path / "metrics.csv"
    write_metrics_file(store, run_id, outside, "csv")
    assert outside.read_bytes().startswith(b"step")
    assert os.listdir(home)  # untouched


def test_concurrent_tag_updates_keep_every_tag(home):
    store = Store(home)
    run_id = _ended_run(store)
    count = 12
    start = threading.Barrier(count)

    def tag(index: int) -> None:
        own = Store(home)  # its own connections, as each `engine tag` process has
        start.wait()
        own.update_tags(run_id, {f"k{index}": str(index)})

    threads = [threading.Thread(target=tag, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert store.get_run(run_id).tags == {f"k{i}": str(i) for i in range(count)}


@pytest.mark.slow
def test_twelve_concurrent_tag_commands_keep_twelve_tags(home):
    store = Store(home)
    run_id = _ended_run(store)
    commands = [subprocess.Popen([sys.executable, "-m", "engine", "tag", run_id, f"k{i}={i}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for i in range(12)]
    for command in commands:
        _, err = command.communicate(timeout=120)
        assert command.returncode == 0, err
    assert store.get_run(run_id).tags == {f"k{i}": str(i) for i in range(12)}


@pytest.mark.slow
def test_a_read_only_data_directory_is_called_read_only_not_corrupted(tmp_path, monkeypatch):
    from pathlib import Path

    from conftest import mounted_tmpfs
    from streamlit.testing.v1 import AppTest

    from engine.store import StoreError

    with mounted_tmpfs(tmp_path / "ro", "4m") as mount_point:
        home = mount_point / "lab"
        run_id = _ended_run(Store(home))
        subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
        with pytest.raises(StoreError) as raised:
            Store(home)
        message = str(raised.value)
        assert "read-only" in message and "Nothing is damaged" in message
        assert "corrupted" not in message and "damaged:" not in message
        monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
        at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"),
                               default_timeout=60)
        at.run()
        at.switch_page("pages/runs.py").run()
        assert not at.exception, at.exception
        assert any("read-only" in e.value for e in at.error)
        assert (home / "runs" / run_id).is_dir()  # nothing touched

