"""The SQLite store, for real: tmp data directories, several processes, bad files."""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.config import RunConfig
from engine.schema import FAILED, FINISHED, METRIC_COLUMNS, OOM, QUEUED, RUNNING, STOPPED
from engine.store import DB_FILENAME, RunNotFound, Store, StoreError, validate_run_id
from engine.store.migrations import SCHEMA_VERSION

REPO_ROOT = Path(__file__).resolve().parent.parent
CFG = RunConfig(model="mlp", batch_size=8, steps=10)


def make_runs(store: Store, count: int, device_key: str = "cpu") -> list[str]:
    return [store.create_run(CFG, device_key, "test device") for _ in range(count)]


def status_of(store: Store, run_id: str) -> str:
    return store.get_run(run_id).status


# ---------------------------------------------------------------------------------------
# setup


def test_database_is_in_wal_mode_with_current_schema(store, home):
    assert store.db_path == home.resolve() / DB_FILENAME
    with store.connect() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {
            row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
    assert {"runs", "metrics", "telemetry", "kernels"} <= tables
    assert stat.S_IMODE(store.runs_dir.stat().st_mode) == 0o700


def test_store_uses_the_environment_variable(home):
    assert Store().home == home.resolve()


def test_opening_twice_keeps_the_data(store, home):
    run_id = store.create_run(CFG, "cpu")
    assert Store(home).get_run(run_id).config == CFG


# ---------------------------------------------------------------------------------------
# runs


def test_create_get_and_list(store):
    first, second, third = make_runs(store, 3)
    run = store.get_run(first)
    assert run.status == QUEUED and run.reason is None
    assert run.config == CFG and run.total_steps == CFG.steps and run.steps_completed == 0
    assert run.device_key == "cpu" and run.device_name == "test device"
    assert run.pid is None and run.started_at is None and run.ended_at is None
    assert run.created_at == pytest.approx(time.time(), abs=60)
    assert run.is_active and run.summary == {}
    assert store.run_dir(first).is_dir()
    assert [r.id for r in store.list_runs()] == [third, second, first]  # newest first
    assert [r.id for r in store.list_runs(limit=2)] == [third, second]
    store.set_status(second, FINISHED)
    assert [r.id for r in store.list_runs(statuses=[QUEUED])] == [third, first]
    assert [r.id for r in store.list_runs(statuses=[FINISHED])] == [second]
    as_dict = store.get_run(second).to_dict()
    assert as_dict["run_id"] == second and as_dict["status"] == FINISHED
    assert as_dict["config"] == CFG.to_dict()


def test_create_with_a_given_run_id(store):
    assert store.create_run(CFG, "cpu", run_id="my-run_1") == "my-run_1"
    assert store.get_run("my-run_1").id == "my-run_1"


def test_unknown_run_is_run_not_found_with_a_hint(store):
    with pytest.raises(RunNotFound) as info:
        store.get_run("nope")
    assert "nope" in str(info.value) and "python -m engine list" in str(info.value)
    with pytest.raises(RunNotFound):
        store.merge_summary("nope", {"a": 1})


def test_set_status_guards_and_timestamps(store):
    run_id = make_runs(store, 1)[0]
    assert store.set_status(run_id, RUNNING, only_from=[QUEUED])
    run = store.get_run(run_id)
    assert run.status == RUNNING and run.started_at is not None and run.ended_at is None
    # only_from guards: a stopped run is not turned back into "finished" by a late worker.
    assert store.set_status(run_id, STOPPED, "stopped by request at step 3")
    assert not store.set_status(run_id, FINISHED)
    assert not store.set_status(run_id, RUNNING, only_from=[QUEUED])
    run = store.get_run(run_id)
    assert run.status == STOPPED and run.reason == "stopped by request at step 3"
    assert run.ended_at is not None and not run.is_active
    # an explicit only_from can move a final run; a None reason keeps the old one.
    assert store.set_status(run_id, FAILED, only_from=[STOPPED])
    assert store.get_run(run_id).reason == "stopped by request at step 3"
    with pytest.raises(ValueError, match="status='bogus'"):
        store.set_status(run_id, "bogus")


def test_update_run_only_allows_known_fields(store):
    run_id = make_runs(store, 1)[0]
    store.update_run(run_id, pid=123, pid_create_time=1.5, train_pid=456, steps_completed=7)
    run = store.get_run(run_id)
    assert (run.pid, run.pid_create_time, run.train_pid, run.steps_completed) == (123, 1.5, 456, 7)
    with pytest.raises(ValueError, match="status"):
        store.update_run(run_id, status=FINISHED)
    assert status_of(store, run_id) == QUEUED


def test_merge_summary_merges_and_makes_json_safe(store):
    run_id = make_runs(store, 1)[0]
    store.merge_summary(run_id, {"a": 1, "nested": {"x": [1.0, float("nan")]}})
    store.merge_summary(run_id, {"b": np.float32(2.5), "c": float("inf"), "d": float("-inf"),
                                 "e": np.int64(7), "a": 3})
    assert store.get_run(run_id).summary == {"a": 3, "nested": {"x": [1.0, None]}, "b": 2.5,
                                             "c": "inf", "d": "-inf", "e": 7}


def test_a_listing_parses_summaries_only_when_read_and_each_config_once(store):
    """A run picker lists 200 runs and reads none of their summaries: they are parsed on
    first read; a stored config (immutable) is parsed once per process."""
    first, second = make_runs(store, 2)
    store.merge_summary(first, {"final_loss": 1.25, "steps_completed": 10})
    listed = {run.id: run for run in store.list_runs()}
    assert "summary" not in vars(listed[first])  # not parsed yet
    assert listed[first].summary == {"final_loss": 1.25, "steps_completed": 10}
    assert listed[second].summary == {}
    assert "summary" in vars(listed[first])  # parsed once, then kept on the record
    again = {run.id: run for run in store.list_runs()}
    assert again[first].config is listed[first].config == CFG
    assert again[first].summary == listed[first].summary


# ---------------------------------------------------------------------------------------
# device queue


def test_claim_device_is_fifo_and_one_running_per_device(store):
    a, b, c = make_runs(store, 3)
    gpu = store.create_run(CFG, "cuda:0")
    assert not store.claim_device(b), "b is not the oldest queued run"
    assert not store.claim_device(c)
    assert store.claim_device(a)
    assert not store.claim_device(a), "already running"
    assert not store.claim_device(b), "the device is busy"
    assert store.claim_device(gpu), "another device has its own queue"
    assert store.queue_position(b) < store.queue_position(c)
    assert store.queue_position(a) is None
    store.set_status(a, FINISHED)
    assert not store.claim_device(c), "b is still ahead of c"
    assert store.claim_device(b)
    store.set_status(b, OOM, "out of memory at batch size 8")
    assert store.claim_device(c)
    assert not store.claim_device("no-such-run")
    assert [status_of(store, r) for r in (a, b, c, gpu)] == [FINISHED, OOM, RUNNING, RUNNING]


def test_a_stopped_queued_run_leaves_the_queue(store):
    a, b, c = make_runs(store, 3)
    assert store.claim_device(a)
    store.set_status(b, STOPPED, "stopped while queued", only_from=[QUEUED])
    store.set_status(a, FINISHED)
    assert store.claim_device(c)


_RACE_SCRIPT = r"""
import json, random, sys, time
from engine.schema import FINISHED, RUNNING
from engine.store import Store
home, start_at = sys.argv[1], float(sys.argv[2])
store = Store(home)
while time.time() < start_at:
    time.sleep(0.001)
claims = []
deadline = time.time() + 60
while time.time() < deadline:
    queued = [r.id for r in store.list_runs(statuses=["queued"])]
    if not queued:
        break
    random.shuffle(queued)
    for run_id in queued:
        if store.claim_device(run_id):
            with store.connect() as conn:
                running = conn.execute("SELECT COUNT(*) FROM runs WHERE device_key = 'cpu'"
                                       " AND status = 'running'").fetchone()[0]
            claims.append([run_id, running, time.time()])
            time.sleep(0.01)
            store.set_status(run_id, FINISHED, only_from=[RUNNING])
print(json.dumps(claims))
"""


def run_at_once(script: str, home: Path, count: int) -> list[str]:
    """Run `count` copies of `script` (argv: home, start time) that all wait for the same
    moment, so they reach SQLite together; assert each exited 0 and return their stdouts."""
    start_at = time.time() + 2.0  # all processes have imported the store by then
    procs = [subprocess.Popen([sys.executable, "-c", script, str(home), str(start_at)],
                              cwd=str(REPO_ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(count)]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
        outputs.append(out)
    return outputs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_processes_racing_for_the_device_never_run_two_and_keep_fifo(store, home):
    run_ids = make_runs(store, 12)
    claims = []
    for out in run_at_once(_RACE_SCRIPT, home, count=4):
        claims += json.loads(out.strip().splitlines()[-1])
    claimed = [c[0] for c in claims]
    assert sorted(claimed) == sorted(run_ids), "every run claimed exactly once"
    assert all(c[1] == 1 for c in claims), f"two runs were running at once: {claims}"
    assert [c[0] for c in sorted(claims, key=lambda c: c[2])] == run_ids, "FIFO order"
    assert all(status_of(store, r) == FINISHED for r in run_ids)


_CREATE_SCRIPT = r"""
import sys, time
from engine.config import RunConfig
from engine.store import Store
home, start_at = sys.argv[1], float(sys.argv[2])
while time.time() < start_at:
    time.sleep(0.001)
store = Store(home)
for _ in range(15):
    store.create_run(RunConfig(), "cpu")
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_concurrent_first_opens_and_creates_get_distinct_queue_positions(home):
    # No database yet: the processes also race to create it and switch it to WAL.
    run_at_once(_CREATE_SCRIPT, home, count=3)
    store = Store(home)
    with store.connect() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        seqs = [row[0] for row in conn.execute("SELECT seq FROM runs ORDER BY seq")]
    assert seqs == list(range(1, 46))


_OPEN_SCRIPT = r"""
import sys, time
from engine.store import Store
home, start_at = sys.argv[1], float(sys.argv[2])
while time.time() < start_at:
    pass  # spin, not sleep: the processes should hit SQLite within microseconds of each other
Store(home)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_many_processes_opening_a_new_database_at_once_all_succeed(tmp_path):
    # Both sides of the race hold a shared lock and ask for the exclusive one to switch to
    # WAL; SQLite refuses one at once ("database is locked") without waiting. Before the
    # retry, about one open in ten failed here.
    for trial in range(4):
        home = tmp_path / f"home{trial}"
        run_at_once(_OPEN_SCRIPT, home, count=6)
        with Store(home).connect() as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_wal_switch_retries_while_another_connection_holds_the_lock(tmp_path):
    import threading

    from engine.store.migrations import _switch_to_wal
    db_path = tmp_path / "fresh.sqlite3"
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    # timeout=0: SQLite answers "locked" at once, as it does in the two-shared-locks race.
    opener = sqlite3.connect(db_path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        opener.execute("PRAGMA journal_mode=WAL")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    _switch_to_wal(opener)
    release.join()
    assert time.monotonic() - started >= 0.25, "switched while the lock was still held?"
    assert opener.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    opener.close()
    holder.close()


# ---------------------------------------------------------------------------------------
# metrics


def metric_rows(steps, **overrides):
    rows = []
    for step in steps:
        row = {"step": step, "wall_time_s": step * 0.01, "loss": 1.0 / step, "lr": 1e-3,
               "step_time_ms": 10.0, "samples_per_s": 800.0, "phase": "steady"}
        row.update(overrides)
        rows.append(row)
    return rows


def test_write_and_read_metrics_incrementally(store):
    run_id = make_runs(store, 1)[0]
    store.write_metrics(run_id, metric_rows(range(1, 6)))
    first = store.read_metrics(run_id)
    assert list(first["step"]) == [1, 2, 3, 4, 5]
    assert list(first.columns) == list(METRIC_COLUMNS)
    assert first["loss"].tolist() == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    assert store.get_run(run_id).steps_completed == 5
    store.write_metrics(run_id, metric_rows(range(6, 9)))
    newer = store.read_metrics(run_id, after_step=int(first["step"].max()))
    assert list(newer["step"]) == [6, 7, 8]
    assert store.read_metrics(run_id, after_step=8).empty
    assert store.metrics_count(run_id) == 8
    assert store.last_metric(run_id)["step"] == 8
    assert store.get_run(run_id).steps_completed == 8
    # a rewrite of an old step replaces it and never moves steps_completed back
    store.write_metrics(run_id, metric_rows([3], loss=9.0))
    assert store.metrics_count(run_id) == 8
    assert store.read_metrics(run_id).set_index("step").loc[3, "loss"] == 9.0
    assert store.get_run(run_id).steps_completed == 8
    store.write_metrics(run_id, [])  # nothing to do, no error
    assert store.last_metric(make_runs(store, 1)[0]) is None


def test_metrics_of_runs_are_separate(store):
    a, b = make_runs(store, 2)
    store.write_metrics(a, metric_rows(range(1, 4)))
    store.write_metrics(b, metric_rows(range(1, 11)))
    assert store.metrics_count(a) == 3 and store.metrics_count(b) == 10


def test_metric_values_nan_inf_numpy_and_nulls(store):
    run_id = make_runs(store, 1)[0]
    store.write_metrics(
        run_id,
        [
            {
                "step": np.int64(1),
                "loss": np.float32(2.5),
                "loss_scale": 65536.0,
                "skipped_steps": np.int64(2),
            },
            {"step": 2, "loss": float("nan")},
            {"step": 3, "loss": float("inf")},
        ],
    )
    frame = store.read_metrics(run_id, max_points=None)
    assert frame["loss"].iloc[0] == 2.5 and frame["skipped_steps"].iloc[0] == 2
    assert math.isnan(frame["loss"].iloc[1])  # SQLite stores NaN as NULL
    assert frame["loss"].iloc[2] == math.inf
    assert frame["loss_scale"].iloc[0] == 65536.0 and frame["loss_scale"].isna().sum() == 2


def test_read_metrics_columns(store):
    run_id = make_runs(store, 1)[0]
    store.write_metrics(run_id, metric_rows(range(1, 4)))
    frame = store.read_metrics(run_id, columns=["loss", "phase"])
    assert list(frame.columns) == ["step", "loss", "phase"]
    with pytest.raises(ValueError, match="bogus"):
        store.read_metrics(run_id, columns=["loss", "bogus"])


@pytest.mark.timeout(120)
def test_downsampled_read_keeps_a_single_spike_in_100k_rows(store):
    run_id = make_runs(store, 1)[0]
    n = 100_000
    rng = np.random.default_rng(1)
    losses = 2.0 + 0.01 * rng.random(n)
    spike_step, dip_step = 61_803, 31_415
    losses[spike_step - 1] = 1e6
    rates = np.full(n, 800.0)
    rates[dip_step - 1] = 1.0
    rows = [{"step": i + 1, "loss": float(losses[i]), "samples_per_s": float(rates[i]),
             "lr": 1e-3, "phase": "steady"} for i in range(n)]
    for start in range(0, n, 25_000):  # the worker writes in batches too
        store.write_metrics(run_id, rows[start:start + 25_000])
    assert store.get_run(run_id).steps_completed == n

    for columns in (["loss"], ["loss", "samples_per_s"], None):
        frame = store.read_metrics(run_id, max_points=2000, columns=columns)
        assert len(frame) <= 2002, (columns, len(frame))  # ~2000: first/last row may add 2
        assert spike_step in set(frame["step"]), columns
        assert frame["loss"].max() == 1e6
        assert frame["step"].is_monotonic_increasing
    frame = store.read_metrics(run_id, columns=["samples_per_s"])
    assert dip_step in set(frame["step"]) and frame["samples_per_s"].min() == 1.0
    # incremental reads downsample only what is new
    tail = store.read_metrics(run_id, after_step=n - 50, columns=["loss"])
    assert list(tail["step"]) == list(range(n - 49, n + 1))
    assert len(store.read_metrics(run_id, max_points=None, columns=["loss"])) == n


def test_telemetry_and_kernels_round_trip(store):
    run_id = make_runs(store, 1)[0]
    store.write_telemetry(run_id, [{"t_s": 10.0 + i, "cpu_pct": 50.0 + i, "rss_bytes": 1000}
                                   for i in range(5)])
    telemetry = store.read_telemetry(run_id, after_t_s=11.0)
    assert list(telemetry["t_s"]) == [12.0, 13.0, 14.0]
    store.write_kernels(run_id, [{"name": "gemm", "total_us": 5.0, "count": 2},
                                 {"name": "add", "total_us": 9.0, "count": 1}])
    store.write_kernels(run_id, [{"name": "gemm", "total_us": 7.0, "count": 3}])  # replaces
    kernels = store.read_kernels(run_id)
    assert kernels[["name", "total_us", "count"]].values.tolist() == [["gemm", 7.0, 3]]


# ---------------------------------------------------------------------------------------
# run ids


BAD_RUN_IDS = ["../x", "..", "../../etc/passwd", "a/b", "/abs", "x; rm -rf /", "$(id)",
               "`id`", "a b", "a|b", "a&b", "", "-rf", "_x", "x" * 65, "caf\u00e9", "a\x00b"]


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_invalid_run_ids_are_refused(store, run_id):
    with pytest.raises(ValueError, match="not a valid run id"):
        validate_run_id(run_id)
    with pytest.raises(ValueError):
        store.get_run(run_id)
    with pytest.raises(ValueError):
        store.run_dir(run_id)
    if run_id:  # an empty id means "none given": create_run makes one up
        with pytest.raises(ValueError):
            store.create_run(CFG, "cpu", run_id=run_id)
        assert store.list_runs() == []
    assert not (store.home.parent / "x").exists()


def test_valid_run_ids_pass(store):
    for run_id in ("a", "20261130-205834-3d3d0e", "Run_1-b", "x" * 64):
        assert validate_run_id(run_id) == run_id
    assert validate_run_id(store.create_run(CFG, "cpu"))


def test_run_id_with_trailing_newline_is_refused():
    with pytest.raises(ValueError):
        validate_run_id("abc\n")


# ---------------------------------------------------------------------------------------
# bad data directories and files


def test_garbage_database_file_is_a_store_error(home):
    home.mkdir(parents=True)
    (home / DB_FILENAME).write_bytes(b"this is not a database, it is a shopping list\n" * 200)
    with pytest.raises(StoreError) as info:
        Store(home)
    message = str(info.value)
    assert DB_FILENAME in message and "file is not a database" in message
    assert "move it away" in message


def test_database_from_a_newer_version_is_a_store_error(store, home):
    with store.connect() as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        Store(home)


def _corrupt_pages_after_the_header(store: Store) -> None:
    run_id = store.create_run(CFG, "cpu", run_id="r1")
    store.write_metrics(run_id, metric_rows(range(1, 3000)))
    with store.connect() as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = store.db_path.stat().st_size
    with open(store.db_path, "r+b") as handle:
        handle.seek(4096)  # keep page 1 (header + schema), destroy the rest
        handle.write(b"\xff" * (size - 4096))


def test_corrupted_pages_are_a_store_error_not_a_crash(store, home):
    _corrupt_pages_after_the_header(store)
    with pytest.raises(StoreError, match="malformed"):
        Store(home).list_runs()


def test_data_directory_under_a_file_is_a_store_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError) as info:
        Store(blocker / "home")
    assert "PRECISION_LAB_HOME" in str(info.value) and "writable folder" in str(info.value)


_READ_ONLY_PROBE = r"""
import sys
from engine.config import RunConfig
from engine.store import Store, StoreError
try:
    store = Store(sys.argv[1])
    store.create_run(RunConfig(), "cpu")
except StoreError as exc:
    print("StoreError:", exc)
    sys.exit(0)
except BaseException as exc:
    print("OTHER:", type(exc).__name__, exc)
    sys.exit(3)
print("WROTE")
sys.exit(4)
"""


def _run_without_write_override(home: Path) -> subprocess.CompletedProcess:
    """Run the probe so file permissions apply: as root, drop CAP_DAC_OVERRIDE & co."""
    command = [sys.executable, "-c", _READ_ONLY_PROBE, str(home)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: permissions cannot make a dir read-only")
        command = [setpriv, "--inh-caps=-all",
                   "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", *command]
    return subprocess.run(command, cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("existing_store", [False, True], ids=["empty-dir", "existing-store"])
def test_read_only_data_directory_is_a_store_error(tmp_path, existing_store):
    home = tmp_path / "ro_home"
    home.mkdir()
    if existing_store:
        Store(home).create_run(CFG, "cpu")
        (home / DB_FILENAME).chmod(0o444)
    home.chmod(0o555)
    try:
        result = _run_without_write_override(home)
    finally:
        home.chmod(0o755)
    if "WROTE" in result.stdout and os.geteuid() == 0:  # pragma: no cover - odd sandbox
        pytest.skip("this sandbox ignores file permissions even without CAP_DAC_OVERRIDE")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("StoreError:")
    assert str(home) in result.stdout
