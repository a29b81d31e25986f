"""Runs after launch: delete, archive, tags, notes, filters, and exports to CSV, Parquet,
a real MLflow file store and real TensorBoard event files, read back with their own
readers. Store and CLI; the pages are in tests/test_manage_pages.py."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import sqlite3
import subprocess
import sys

import pandas as pd
import pytest
from _real_runs import record_run, tiny_config
from conftest import REPO_ROOT, cli_env

from engine.analysis.runs import RunFilter, filter_runs, parse_tag_filter, parse_tags_text
from engine.cli import main as cli_main
from engine.config import ConfigError, RunConfig
from engine.report.export import metrics_csv, metrics_parquet
from engine.schema import FAILED, FINISHED, METRIC_COLUMNS, METRIC_UNITS, RUNNING
from engine.store import RunActive, RunNotFound, Store


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Two real finished tiny runs (metrics, overview, telemetry, files) in one store."""
    home = tmp_path_factory.mktemp("manage_lab")
    store = Store(home)
    ids = [record_run(store, tiny_config("fp32", steps=8)),
           record_run(store, tiny_config("bf16-amp", steps=8))]
    for run_id in ids:
        store.write_telemetry(run_id, [{"t_s": 1.0e9 + i, "cpu_pct": 50.0 + i, "rss_bytes": 1 << 28}
                                       for i in range(3)])
        store.write_kernels(run_id, [{"name": "k", "category": "gemm", "tensor_core": "no",
                                      "dtype": "fp32", "total_us": 1.0, "count": 1}])
        (store.run_dir(run_id) / "worker.log").write_text("log of " + run_id)
    return home, store, ids


def _counts(store: Store, run_id: str) -> dict[str, int]:
    with store.connect() as conn:
        return {table: conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?",
                                    (run_id,)).fetchone()[0]
                for table in ("metrics", "metrics_overview", "telemetry", "kernels")}


# ---------------------------------------------------------------------------------------
# store


def test_delete_removes_that_runs_rows_and_files_and_nothing_else(tmp_path):
    store = Store(tmp_path / "home")
    keep, gone = (record_run(store, tiny_config("fp32", steps=6)) for _ in range(2))
    for run_id in (keep, gone):
        store.write_telemetry(run_id, [{"t_s": 1.0e9, "cpu_pct": 10.0}])
        store.write_kernels(run_id, [{"name": "k", "total_us": 1.0, "count": 1}])
        (store.run_dir(run_id) / "worker.log").write_text("x")
    before_keep = _counts(store, keep)
    assert all(before_keep.values()) and all(_counts(store, gone).values())
    store.delete_run(gone)
    with pytest.raises(RunNotFound):
        store.get_run(gone)
    assert _counts(store, gone) == {t: 0 for t in before_keep}
    assert not store.run_dir(gone).exists()
    assert _counts(store, keep) == before_keep  # the other run untouched
    assert (store.run_dir(keep) / "worker.log").read_text() == "x"
    assert [r.id for r in store.list_runs()] == [keep]


@pytest.mark.parametrize("status", ["queued", RUNNING])
def test_delete_of_a_queued_or_running_run_is_refused_with_the_reason(tmp_path, status):
    store = Store(tmp_path / "home")
    run_id = store.create_run(RunConfig(), "cpu")
    if status == RUNNING:
        store.set_status(run_id, RUNNING)
    with pytest.raises(RunActive) as info:
        store.delete_run(run_id)
    assert f"is {status}: stop it first" in str(info.value) and "engine stop" in str(info.value)
    assert store.get_run(run_id).status == status and store.run_dir(run_id).exists()


def test_archive_tags_and_note_are_kept_and_validated(tmp_path):
    store = Store(tmp_path / "home")
    run_id = store.create_run(RunConfig(), "cpu")
    store.set_archived(run_id)
    assert store.update_tags(run_id, {"team": "infra", "goal": "bf16"}) == {
        "team": "infra", "goal": "bf16"}
    assert store.update_tags(run_id, {"goal": "fp8"}, remove=["team"]) == {"goal": "fp8"}
    store.set_note(run_id, "first line\nsecond line")
    run = Store(tmp_path / "home").get_run(run_id)  # a fresh store: really persisted
    assert (run.archived, run.tags, run.note) == (True, {"goal": "fp8"}, "first line\nsecond line")
    store.set_archived(run_id, False)
    assert not store.get_run(run_id).archived
    with pytest.raises(ConfigError, match="tag='bad key!'"):
        store.set_tags(run_id, {"bad key!": "x"})
    with pytest.raises(ConfigError, match="tag goal"):
        store.set_tags(run_id, {"goal": "x" * 201})
    with pytest.raises(ConfigError, match="note"):
        store.set_note(run_id, "\x00")
    with pytest.raises(RunNotFound):
        store.set_note("no-such-run", "x")


def test_an_old_database_gains_the_annotation_columns(tmp_path):
    home = tmp_path / "home"
    store = Store(home)
    run_id = store.create_run(RunConfig(), "cpu")
    with sqlite3.connect(store.db_path) as conn:  # as written before annotations existed
        for column in ("archived", "tags_json", "note"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    run = Store(home).get_run(run_id)
    assert (run.archived, run.tags, run.note) == (False, {}, "")


def test_filters_by_text_tag_model_precision_status_date_and_archive(lab):
    _home, store, (fp32_id, bf16_id) = lab
    store.set_tags(fp32_id, {"team": "infra"})
    store.set_note(bf16_id, "the BF16 candidate")
    runs = store.list_runs()
    ids = lambda flt: {r.id for r in filter_runs(runs, flt)}  # noqa: E731
    assert ids(RunFilter()) == {fp32_id, bf16_id}
    assert ids(RunFilter(text="bf16 candidate")) == {bf16_id}
    assert ids(RunFilter(tags=parse_tag_filter("team=infra"))) == {fp32_id}
    assert ids(RunFilter(tags=parse_tag_filter("team"))) == {fp32_id}
    assert ids(RunFilter(tags=parse_tag_filter("team=other"))) == set()
    assert ids(RunFilter(precisions=("bf16-amp",))) == {bf16_id}
    assert ids(RunFilter(models=("gpt",))) == set()
    assert ids(RunFilter(statuses=(FAILED,))) == set()
    today = dt.date.today()
    assert ids(RunFilter(since=today, until=today)) == {fp32_id, bf16_id}
    assert ids(RunFilter(since=today + dt.timedelta(days=1))) == set()
    store.set_archived(bf16_id)
    try:
        runs = store.list_runs()
        assert ids(RunFilter()) == {fp32_id}
        assert ids(RunFilter(archived=True)) == {fp32_id, bf16_id}
    finally:
        store.set_archived(bf16_id, False)
        store.set_tags(fp32_id, {})
        store.set_note(bf16_id, "")
    assert parse_tags_text("a=1, b = two ,c") == {"a": "1", "b": "two", "c": ""}


# ---------------------------------------------------------------------------------------
# CSV and Parquet


def test_csv_has_every_logged_step_and_column_with_units(lab):
    _home, store, (run_id, _) = lab
    frame = pd.read_csv(io.BytesIO(metrics_csv(store, run_id)))
    stored = store.read_metrics(run_id, max_points=None, columns=METRIC_COLUMNS)
    expected_header = [f"{c} [{METRIC_UNITS[c]}]" if c in METRIC_UNITS else c
                       for c in METRIC_COLUMNS]
    assert list(frame.columns) == expected_header
    assert "loss [nats (cross-entropy)]" in frame.columns and "step_time_ms" in frame.columns
    assert frame["step [optimizer step]"].tolist() == stored["step"].tolist() == list(range(1, 9))
    assert frame["loss [nats (cross-entropy)]"].tolist() == pytest.approx(stored["loss"].tolist())


def test_a_workloads_loss_is_not_labelled_cross_entropy(tmp_path):
    """A workload brings its own loss function: its units are its own."""
    from _real_runs import write_rows

    from engine.report.export import WORKLOAD_LOSS_UNIT
    store = Store(tmp_path / "lab")
    cfg = RunConfig(model="custom", workload=str(REPO_ROOT / "examples" / "workloads" /
                                                 "tiny_transformer.py"))
    run_id = write_rows(store, cfg, [{"step": 1, "loss": 0.5, "step_time_ms": 10.0}])
    frame = pd.read_csv(io.BytesIO(metrics_csv(store, run_id)))
    assert f"loss [{WORKLOAD_LOSS_UNIT}]" in frame.columns
    assert not any("cross-entropy" in column for column in frame.columns)


def test_parquet_round_trips_with_units_in_the_metadata(lab):
    import pyarrow.parquet as pq

    _home, store, (run_id, _) = lab
    table = pq.read_table(io.BytesIO(metrics_parquet(store, run_id)))
    assert table.column_names == list(METRIC_COLUMNS)
    assert table.num_rows == 8
    metadata = table.schema.metadata
    assert metadata[b"precision_lab.run_id"].decode() == run_id
    assert json.loads(metadata[b"precision_lab.units"])["loss"] == "nats (cross-entropy)"
    stored = store.read_metrics(run_id, max_points=None)
    assert table.column("loss").to_pylist() == pytest.approx(stored["loss"].tolist())


# ---------------------------------------------------------------------------------------
# CLI


def _cli(home, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=str(REPO_ROOT),
                          env=cli_env(home), capture_output=True, text=True, timeout=120,
                          input=stdin)


@pytest.mark.slow
def test_cli_tag_note_archive_list_and_delete(tmp_path):
    home = tmp_path / "home"
    store = Store(home)
    a, b = (record_run(store, tiny_config("fp32", steps=4)) for _ in range(2))
    assert _cli(home, "tag", a, "team=infra", "goal=bf16", "--json").returncode == 0
    assert json.loads(_cli(home, "tag", a, "--remove", "goal", "--json").stdout)["tags"] == {
        "team": "infra"}
    assert _cli(home, "note", b, "compare with fp32").returncode == 0
    listed = json.loads(_cli(home, "list", "--tag", "team=infra", "--json").stdout)
    assert [r["run_id"] for r in listed] == [a] and listed[0]["tags"] == {"team": "infra"}
    assert [r["run_id"] for r in json.loads(_cli(home, "list", "--search", "with fp32",
                                                 "--json").stdout)] == [b]
    assert _cli(home, "archive", b).returncode == 0
    assert [r["run_id"] for r in json.loads(_cli(home, "list", "--json").stdout)] == [a]
    both = json.loads(_cli(home, "list", "--archived", "--json").stdout)
    assert {r["run_id"] for r in both} == {a, b}
    assert _cli(home, "archive", b, "--undo").returncode == 0
    # No terminal and no --yes: nothing is deleted.
    refused = _cli(home, "delete", b)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert Store(home).get_run(b)
    deleted = _cli(home, "delete", b, "--yes", "--json")
    assert deleted.returncode == 0 and json.loads(deleted.stdout) == {"deleted": [b]}
    assert [r.id for r in Store(home).list_runs()] == [a]


@pytest.mark.parametrize(
    "args, starts",
    [
        (["tag", "RUN", "no-equals-sign"], "error: tag 'no-equals-sign': key=value"),
        (["tag", "RUN", "bad key!=1"], "error: tag 'bad key!': a key of letters"),
        (["tag", "RUN"], "error: tag: give KEY=VALUE"),
        (["note", "no-such-run", "x"], "error: run_id='no-such-run': no such run"),
        (["delete", "bad id!", "--yes"], "error: run_id='bad id!': not a valid run id"),
        (
            ["list", "--since", "yesterday"],
            "error: argument --since: --since 'yesterday': expected a date",
        ),
        (["list", "--tag", "=x"], "error: --tag '=x': key=value or key"),
        (
            ["export", "RUN", "--csv", "/no/such/dir/m.csv"],
            "error: --csv '/no/such/dir/m.csv': folder",
        ),
        (["export", "RUN", "RUN", "--csv", "m.csv"], "error: --csv: one run per file"),
        (
            ["export", "RUN", "--html", "r.html", "--experiment", "x"],
            "error: --experiment 'x': applies",
        ),
        (
            ["export", "RUN", "--mlflow", "ftp://host"],
            "error: --mlflow 'ftp://host': expected a tracking URI",
        ),
    ],
)
def test_cli_bad_input_is_one_line_naming_the_field(home, capsys, args, starts):
    store = Store(home)
    run_id = store.create_run(RunConfig(), "cpu")
    store.set_status(run_id, FINISHED)
    argv = [run_id if a == "RUN" else a for a in args]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(starts.replace("RUN", run_id)), err
    assert len(err.strip().splitlines()) == 1


def test_cli_refuses_to_delete_a_running_run(home, capsys):
    store = Store(home)
    run_id = store.create_run(RunConfig(), "cpu")
    store.set_status(run_id, RUNNING)
    assert cli_main(["delete", run_id, "--yes"]) == 2
    assert "is running: stop it first" in capsys.readouterr().err
    assert store.get_run(run_id).status == RUNNING


@pytest.mark.slow
def test_cli_csv_and_parquet_exports(lab, tmp_path):
    home, store, (run_id, _) = lab
    out = _cli(home, "export", run_id, "--csv", str(tmp_path / "m.csv"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"] == 8
    assert pd.read_csv(tmp_path / "m.csv").shape[0] == 8
    out = _cli(home, "export", run_id, "--parquet", str(tmp_path / "m.parquet"))
    assert out.returncode == 0 and pd.read_parquet(tmp_path / "m.parquet").shape[0] == 8


# ---------------------------------------------------------------------------------------
# MLflow (a real local file store) and TensorBoard (real event files)


@pytest.mark.slow
def test_mlflow_export_to_a_real_file_store(lab, tmp_path, monkeypatch):
    pytest.importorskip(
        "mlflow", reason="MLflow not installed: pip install -r requirements-export.txt"
    )
    home, store, (run_id, _) = lab
    store.set_tags(run_id, {"team": "infra"})
    store.set_note(run_id, "exported")
    uri = f"file:{tmp_path / 'mlruns'}"
    out = _cli(home, "export", run_id, "--mlflow", uri, "--json")
    assert out.returncode == 0, out.stderr
    mlflow_id = json.loads(out.stdout)["runs"][run_id]

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the reader, like the export
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exported = client.get_run(mlflow_id)
    run = store.get_run(run_id)
    assert exported.info.status == "FINISHED"
    assert exported.info.run_name == run.config.label
    assert exported.data.params["precision"] == "fp32"
    assert exported.data.params["batch_size"] == str(run.config.batch_size)
    assert exported.data.tags["precision_lab.run_id"] == run_id
    assert exported.data.tags["precision_lab.tag.team"] == "infra"
    assert exported.data.tags["mlflow.note.content"] == "exported"
    stored = store.read_metrics(run_id, max_points=None)
    history = sorted(client.get_metric_history(mlflow_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in history] == stored["step"].tolist()
    assert [m.value for m in history] == pytest.approx(stored["loss"].tolist())
    assert len(client.get_metric_history(mlflow_id, "step_time_ms")) == 8
    assert [m.value for m in client.get_metric_history(mlflow_id, "system/cpu_pct")] == [
        50.0, 51.0, 52.0]
    assert exported.data.metrics["summary/final_loss"] == pytest.approx(run.summary["final_loss"])
    artifacts = {a.path for a in client.list_artifacts(mlflow_id)}
    assert {"report.html", "worker.log"} <= artifacts
    # Exporting again replaces the earlier export: still one MLflow run for this run.
    again = json.loads(_cli(home, "export", run_id, "--mlflow", uri, "--json").stdout)
    experiment = client.get_experiment_by_name("precision-lab")
    live = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`precision_lab.run_id` = '{run_id}'")
    assert [r.info.run_id for r in live] == [again["runs"][run_id]]


@pytest.mark.slow
def test_tensorboard_export_reads_back_with_tensorboards_reader(lab, tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard not installed: pip install -r "
                                              "requirements-export.txt")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    home, store, (run_id, bf16_id) = lab
    out = _cli(home, "export", run_id, bf16_id, "--tensorboard", str(tmp_path / "tb"), "--json")
    assert out.returncode == 0, out.stderr
    folders = json.loads(out.stdout)["runs"]
    assert set(folders) == {run_id, bf16_id}
    accumulator = EventAccumulator(folders[run_id], size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    assert {"loss", "step_time_ms", "samples_per_s", "system/cpu_pct"} <= set(tags["scalars"])
    assert "precision_lab/run" in tags["tensors"]
    stored = store.read_metrics(run_id, max_points=None)
    loss = accumulator.Scalars("loss")
    assert [e.step for e in loss] == stored["step"].tolist()
    assert [e.value for e in loss] == pytest.approx(stored["loss"].tolist(), rel=1e-6)
    assert os.path.basename(folders[run_id]).endswith(run_id)
    assert " " not in os.path.basename(folders[run_id])
    # Exporting again replaces the run's events: still one point per step.
    _cli(home, "export", run_id, "--tensorboard", str(tmp_path / "tb"))
    again = EventAccumulator(folders[run_id], size_guidance={"scalars": 0})
    again.Reload()
    assert len(again.Scalars("loss")) == len(stored)


def test_exports_elsewhere_refuse_a_run_that_has_not_ended(home, capsys, tmp_path):
    store = Store(home)
    run_id = store.create_run(RunConfig(), "cpu")
    assert cli_main(["export", run_id, "--tensorboard", str(tmp_path)]) == 2
    assert "still queued" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_launch_from_a_run_reuses_its_config_with_overrides(home, capsys, wait_for):
    store = Store(home)
    source = store.create_run(tiny_config("bf16-amp", batch_size=24, steps=50, name="source"),
                              "cpu")
    store.set_status(source, FINISHED)
    assert cli_main(["launch", "--from-run", source, "--steps", "3", "--json"]) == 0
    new_id = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_id"]
    new = store.get_run(new_id).config
    assert new == store.get_run(source).config.replace(steps=3)
    wait_for(lambda: not store.get_run(new_id).is_active, 120, message="the re-launched run")
    assert cli_main(["launch", "--from-run", "no-such-run"]) == 2
    assert "--from-run 'no-such-run': no such run" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# exports write regular files only


@pytest.mark.slow
def test_exports_refuse_devices_fifos_sockets_and_links_and_say_when_they_replace(lab, tmp_path):
    import os
    import socket
    import stat

    home, store, (run_id, _) = lab
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    target = tmp_path / "real.csv"
    target.write_text("keep me")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    sock_path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock_path))
    try:
        for path, words in ((fifo, "is a FIFO (named pipe)"), (link, "is a symbolic link"),
                            (sock_path, "is a socket")):
            for flag in ("--csv", "--parquet", "--html"):
                out = _cli(home, "export", run_id, flag, str(path))
                lines = out.stderr.strip().splitlines()
                assert out.returncode == 2 and len(lines) == 1, (flag, path, out.stderr)
                assert lines[0].startswith(f"error: {flag} '{path}': {words}"), lines[0]
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # untouched
        assert link.is_symlink() and target.read_text() == "keep me"
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    finally:
        listener.close()
    # An empty path is one line too (it used to be a traceback).
    for flag in ("--csv", "--parquet", "--html"):
        out = _cli(home, "export", run_id, flag, "")
        assert out.returncode == 2 and out.stderr.strip() == (
            f"error: {flag} '': empty; give a file name, e.g. "
            f"{ {'--html': 'report.html', '--csv': 'metrics.csv'}.get(flag, 'metrics.parquet') }"
        ), out.stderr
    # An existing regular file is replaced, keeps its permissions, and the user is told.
    os.chmod(target, 0o640)
    out = _cli(home, "export", run_id, "--csv", str(target), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["replaced"] is True
    assert f"note: --csv '{target}': replaced the existing file" in out.stderr
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert pd.read_csv(target).shape[0] == 8
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]  # no temp left


def test_the_writer_itself_refuses_a_device_node(tmp_path):
    """Never a real /dev path: a FIFO made here stands for any non-regular target."""
    import os

    from engine.report.export import ExportTargetError, write_file_atomically

    node = tmp_path / "node"
    os.mkfifo(node)
    with pytest.raises(ExportTargetError, match="FIFO"):
        write_file_atomically(node, b"x")
    fresh = tmp_path / "fresh.csv"
    assert write_file_atomically(fresh, b"a,b\n") is False
    assert write_file_atomically(fresh, b"a,b\n1,2\n") is True
    assert fresh.read_bytes() == b"a,b\n1,2\n"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mlflow_export_to_a_server_that_never_answers_fails_within_its_timeout(lab):
    """A loopback server that accepts connections and never answers (and a closed port):
    the export ends within its bound with one line naming the URI and the timeout."""
    import socket
    import threading
    import time

    pytest.importorskip("mlflow")
    home, _store, (run_id, _) = lab
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    held, stop = [], threading.Event()

    def accept_and_sleep() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # never answered
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_sleep, daemon=True)
    thread.start()
    try:
        uri = f"http://127.0.0.1:{port}"
        for extra, bound_s in ((["--mlflow-timeout-s", "2"], 2.0), ([], 10.0)):
            started = time.monotonic()
            out = _cli(home, "export", run_id, "--mlflow", uri, *extra)
            took_s = time.monotonic() - started
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2 and len(lines) == 1, out.stderr
            assert lines[0].startswith(f"error: --mlflow '{uri}': {uri} did not answer within "
                                       f"{bound_s:g} s"), lines[0]
            assert took_s < bound_s + 15, took_s  # the bound plus the CLI's start-up
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    started = time.monotonic()
    out = _cli(home, "export", run_id, "--mlflow", f"http://127.0.0.1:{closed_port}")
    assert out.returncode == 2 and "did not answer within 10 s" in out.stderr
    assert time.monotonic() - started < 20


def test_list_shows_a_speedup_check_by_its_rounds_not_zero_steps(tmp_path, monkeypatch, capsys):
    from _real_runs import write_rows

    home = tmp_path / "lab"
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    store = Store(home)
    cfg = RunConfig(model="mlp", speedup_modes="fp32,bf16-amp", steps=60)
    run_id = write_rows(store, cfg, [], summary={"speedup": {"rounds": 23}})
    assert cli_main(["list"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if run_id in line)
    assert "23 rounds, 2 modes" in line and "0/60" not in line
    assert cli_main(["list", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["progress"] == "23 rounds, 2 modes"
