"""Real worker processes on the CPU, started by engine.run.launcher, observed through SQLite.

Each test has its own data directory (so its own device queue); leftover workers are
killed by the `home` fixture. Runs are mlp/gpt tiny without profiling: what is tested
here is process life and death, not training.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engine.config import RunConfig
from engine.run.launcher import launch, read_log_tail, reconcile, start_worker, stop
from engine.schema import DIVERGED, FAILED, FINAL_STATUSES, FINISHED, OOM, QUEUED, RUNNING, STOPPED
from engine.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread_workers")]

LONG = RunConfig(model="mlp", batch_size=8, steps=1_000_000, profile=False, device="cpu")
START_TIMEOUT_S = 60  # launch -> first metric row; ~3 s on an idle 2-core box


def short(steps: int, **changes) -> RunConfig:
    return LONG.replace(steps=steps, **changes)


def log_of(store, run_id):
    return lambda: (
        f"run {run_id}: {store.get_run(run_id)}\nworker.log:\n{read_log_tail(run_id, store, 3000)}"
    )


def wait_final(store, run_id, wait_for, timeout_s=120):
    wait_for(lambda: store.get_run(run_id).status in FINAL_STATUSES, timeout_s,
             message=log_of(store, run_id))
    return store.get_run(run_id)


def wait_rows(store, run_id, wait_for, at_least=1, timeout_s=START_TIMEOUT_S):
    wait_for(lambda: store.metrics_count(run_id) >= at_least, timeout_s,
             message=log_of(store, run_id))


# ---------------------------------------------------------------------------------------
# metrics flow and stop


@pytest.mark.timeout(180)
def test_metrics_are_flushed_progressively_then_stop_ends_it_within_5s(
    store, wait_for, group_alive
):
    launched_at = time.monotonic()
    run_id = launch(LONG, store)
    run = store.get_run(run_id)
    assert run.status in (QUEUED, RUNNING) and run.pid and run.device_key == "cpu"
    wait_rows(store, run_id, wait_for)
    first_rows_s = time.monotonic() - launched_at
    assert first_rows_s < 30, first_rows_s  # ~3-7 s measured (interpreter + torch import)

    # Watch the table while the worker runs: rows arrive in batches, about every 0.5 s.
    changes: list[tuple[float, int]] = []
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        count = store.metrics_count(run_id)
        if not changes or count != changes[-1][1]:
            changes.append((time.monotonic(), count))
        time.sleep(0.05)
    assert store.get_run(run_id).status == RUNNING
    counts = [c for _, c in changes]
    assert counts == sorted(counts) and len(set(counts)) >= 4, changes
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:])]
    assert statistics.median(gaps) <= 1.0, gaps  # FLUSH_INTERVAL_S = 0.5
    assert max(b[1] - a[1] for a, b in zip(changes, changes[1:])) > 1, (
        "one transaction per flush, not per row"
    )
    frame = store.read_metrics(run_id, max_points=None)
    assert list(frame["step"]) == list(range(1, len(frame) + 1))
    assert store.get_run(run_id).steps_completed >= len(frame)
    assert frame["loss"].notna().all() and (frame["phase"].iloc[:3] == "warmup").all()

    rows_before = store.metrics_count(run_id)
    pid, train_pid = store.get_run(run_id).pid, store.get_run(run_id).train_pid
    assert train_pid and os.getpgid(train_pid) == pid  # trainer in the supervisor's group
    started = time.monotonic()
    result = stop(run_id, store)
    stop_s = time.monotonic() - started
    assert stop_s < 5.0, stop_s
    assert result.status == STOPPED and "stopped by request at step" in result.reason
    assert not group_alive(pid)
    assert store.metrics_count(run_id) >= rows_before  # metrics kept
    assert store.get_run(run_id).steps_completed == store.metrics_count(run_id)


@pytest.mark.timeout(240)
def test_queue_is_fifo_one_running_and_a_queued_run_can_be_stopped(store, wait_for, group_alive):
    first = launch(short(200), store)
    second = launch(short(20), store)
    third = launch(short(20), store)
    wait_for(lambda: store.get_run(first).status == RUNNING, START_TIMEOUT_S,
             message=log_of(store, first))
    assert [store.get_run(r).status for r in (second, third)] == [QUEUED, QUEUED]
    assert store.queue_position(second) < store.queue_position(third)
    third_pid = wait_for(lambda: store.get_run(third).pid, 30)
    # its supervisor is up and polling (signal handlers installed) before we stop it
    wait_for(lambda: "waiting for device" in read_log_tail(third, store), 30,
             message=log_of(store, third))

    # stop the last queued run: it never starts, the others are untouched
    started = time.monotonic()
    stopped = stop(third, store)
    assert time.monotonic() - started < 5.0
    assert stopped.status == STOPPED and stopped.started_at is None
    assert stopped.reason == "stopped while queued"
    assert not group_alive(third_pid)
    assert store.get_run(first).status in (RUNNING, FINISHED)
    assert store.get_run(second).status in (QUEUED, RUNNING)

    # one running per device, all the way through
    def all_done() -> bool:
        running = store.list_runs(statuses=[RUNNING])  # one SELECT: a consistent snapshot
        assert len(running) <= 1, [r.id for r in running]
        return all(store.get_run(r).status in FINAL_STATUSES for r in (first, second))

    wait_for(all_done, 180, interval_s=0.1, message=log_of(store, second))
    a, b = store.get_run(first), store.get_run(second)
    assert (a.status, b.status) == (FINISHED, FINISHED), (a.reason, b.reason)
    assert a.steps_completed == 200 and b.steps_completed == 20
    assert a.started_at < a.ended_at <= b.started_at < b.ended_at  # FIFO, no overlap
    assert store.get_run(third).status == STOPPED and store.metrics_count(third) == 0


# ---------------------------------------------------------------------------------------
# killed workers


@pytest.mark.timeout(180)
def test_sigkill_of_the_trainer_fails_the_run_naming_signal_and_step(store, wait_for, group_alive):
    run_id = launch(LONG, store)
    wait_rows(store, run_id, wait_for, at_least=50)
    run = store.get_run(run_id)
    assert os.getpgid(run.train_pid) == run.pid  # the trainer this test started
    rows_before = store.metrics_count(run_id)
    os.kill(run.train_pid, signal.SIGKILL)
    run = wait_final(store, run_id, wait_for, timeout_s=30)
    assert run.status == FAILED
    assert "signal 9" in run.reason and "SIGKILL" in run.reason
    assert f"at step {run.steps_completed}" in run.reason
    assert store.metrics_count(run_id) >= rows_before  # rows flushed before the kill survive
    assert store.last_metric(run_id)["step"] == run.steps_completed
    wait_for(lambda: not group_alive(run.pid), 10)  # the supervisor exits after recording


@pytest.mark.timeout(180)
def test_sigkill_of_the_whole_group_is_failed_by_the_next_reconcile(store, wait_for, group_alive):
    run_id = launch(LONG, store)
    wait_rows(store, run_id, wait_for, at_least=20)
    run = store.get_run(run_id)
    os.killpg(run.pid, signal.SIGKILL)
    wait_for(lambda: not group_alive(run.pid), 10)
    rows = store.metrics_count(run_id)
    assert store.get_run(run_id).status == RUNNING  # nobody was left to record it
    assert reconcile(store) == [run_id]
    run = store.get_run(run_id)
    assert run.status == FAILED and "gone" in run.reason
    assert f"step {run.steps_completed}" in run.reason and str(run.pid) in run.reason
    assert store.metrics_count(run_id) == rows
    assert reconcile(store) == []  # idempotent


@pytest.mark.timeout(60)
def test_reconcile_fails_runs_whose_pid_was_reused_or_never_started(store):
    # A live process that is not the worker: same pid, different create time.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        real_create_time = psutil.Process(stranger.pid).create_time()
        reused, ours = (store.create_run(LONG, "cpu") for _ in range(2))
        store.update_run(reused, pid=stranger.pid, pid_create_time=real_create_time - 1000.0)
        store.update_run(ours, pid=stranger.pid, pid_create_time=real_create_time)
        assert store.claim_device(reused)
        never = store.create_run(LONG, "cpu")
        with store.connect() as conn:  # created long ago, no worker ever recorded
            conn.execute("UPDATE runs SET created_at = created_at - 3600 WHERE id = ?", (never,))
        assert sorted(reconcile(store)) == sorted([reused, never])
        assert store.get_run(reused).status == FAILED
        assert f"worker process {stranger.pid} is gone" in store.get_run(reused).reason
        assert store.get_run(never).status == FAILED
        assert "never started" in store.get_run(never).reason
        assert store.get_run(ours).status == QUEUED  # alive and really ours: left alone
        assert stranger.poll() is None  # reconcile never signals anything
    finally:
        stranger.kill()
        stranger.wait()


# ---------------------------------------------------------------------------------------
# how runs end badly (four runs started at once, one data directory each)


def _fp8_run_without_launch_checks(store) -> str:
    # fp8 is refused by launch() on a CPU; record it directly, as a stale UI might, so the
    # trainer itself meets the failure (torchao missing) while building the model.
    run_id = store.create_run(short(3, precision="fp8"), "cpu", "test")
    start_worker(run_id, store)
    return run_id


ENDINGS = {
    # Measured: with a 1500 MiB address-space cap torch imports and gpt-tiny trains at
    # batch 8, but batch 4096 cannot allocate its activations.
    "oom": lambda store: launch(RunConfig(model="gpt", batch_size=4096, steps=3, profile=False,
                                          device="cpu", memory_cap_mb=1500), store),
    "cap_too_small": lambda store: launch(short(3, memory_cap_mb=300), store),
    "build_error": _fp8_run_without_launch_checks,
    # Measured: mlp/sgd at lr=10 without warm-up reaches NaN at step 6.
    "diverges": lambda store: launch(short(30, optimizer="sgd", lr=10.0, warmup_steps=0), store),
}


@pytest.fixture(scope="module")
def ended_runs(module_homes):
    started = {}
    for name, start in ENDINGS.items():
        store = Store(module_homes(f"ending_{name}"))
        started[name] = (store, start(store))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not all(
            store.get_run(run_id).status in FINAL_STATUSES for store, run_id in started.values()):
        time.sleep(0.2)
    return started


def ended(ended_runs, name):
    store, run_id = ended_runs[name]
    run = store.get_run(run_id)
    assert run.status in FINAL_STATUSES, log_of(store, run_id)()
    return store, run


@pytest.mark.timeout(300)
def test_out_of_memory_is_an_oom_status_naming_the_batch_size(ended_runs):
    _store, run = ended(ended_runs, "oom")
    assert run.status == OOM, (run.status, run.reason)
    assert "out of memory at batch size 4096" in run.reason
    assert "this run's memory cap was 1500 MiB (memory_cap_mb)" in run.reason
    assert run.summary["oom_batch_size"] == 4096 and run.summary["oom_mem_bytes"] > 0


@pytest.mark.timeout(300)
def test_live_page_of_an_oom_run_says_it_ended_instead_of_waiting(ended_runs, monkeypatch):
    from streamlit.testing.v1 import AppTest

    store, run = ended(ended_runs, "oom")
    assert run.status == OOM
    monkeypatch.setenv("PRECISION_LAB_HOME", str(store.home))
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"),
                           default_timeout=60)
    at.query_params["run"] = run.id
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    infos = [i.value for i in at.info]
    assert not any("Waiting for the first logged step" in i for i in infos), infos
    if store.last_metric(run.id) is None:
        assert any("No step was logged: the run ended (oom)" in i for i in infos), infos
    assert any("memory cap was 1500 MiB" in e.value.replace("\\", "") for e in at.error)


@pytest.mark.timeout(300)
def test_memory_cap_too_small_to_start_says_so(ended_runs):
    _store, run = ended(ended_runs, "cap_too_small")
    assert run.status in (OOM, FAILED)
    assert run.status == OOM or "memory" in run.reason.lower(), run.reason


@pytest.mark.timeout(300)
def test_exception_while_building_fails_the_run_with_its_message(ended_runs):
    try:
        import torchao  # noqa: F401
        pytest.skip("torchao installed: fp8 conversion would not fail at build time")
    except ImportError:
        pass
    store, run = ended(ended_runs, "build_error")
    assert run.status == FAILED
    assert run.reason.startswith("RuntimeError: fp8 needs the optional package torchao")
    assert "Traceback" in read_log_tail(run.id, store)  # the details are in the log


@pytest.mark.timeout(300)
def test_divergence_in_a_worker_is_a_diverged_status_with_the_step(ended_runs):
    store, run = ended(ended_runs, "diverges")
    assert run.status == DIVERGED, run.reason
    step = run.steps_completed
    assert 1 <= step < 30 and f"at step {step}" in run.reason
    last = store.last_metric(run.id)
    assert last["step"] == step and last["loss"] is None  # NaN is stored as NULL
    assert store.metrics_count(run.id) == step


# ---------------------------------------------------------------------------------------
# a stored config that no longer parses


def _break_config(store, run_id: str, config_json: str) -> None:
    with store.connect() as conn:
        conn.execute("UPDATE runs SET config_json = ? WHERE id = ?", (config_json, run_id))


def test_a_stored_config_that_does_not_parse_is_shown_with_the_reason_not_silently_replaced(store):
    run_id = store.create_run(short(5), "cpu", "test")
    _break_config(store, run_id, short(5).to_json().replace('"mlp"', '"mlp-from-the-future"'))
    run = store.get_run(run_id)
    assert run.config_error is not None and "mlp-from-the-future" in run.config_error
    assert "does not parse" in run.config_error


@pytest.mark.parametrize("config_json", ['{"model": "mlp-from-the-future"}', "not json",
                                         '{"batch_size": 0}', '["a list"]'])
def test_a_run_whose_stored_config_does_not_parse_fails_with_that_reason_and_never_trains(
        store, wait_for, config_json):
    run_id = store.create_run(short(5), "cpu", "test")
    _break_config(store, run_id, config_json)
    start_worker(run_id, store)
    run = wait_final(store, run_id, wait_for, timeout_s=60)
    assert run.status == FAILED
    assert "the stored config does not parse" in run.reason and "re-launch" in run.reason
    assert store.metrics_count(run_id) == 0  # nothing trained: never RunConfig() defaults
    assert "[trainer]" not in read_log_tail(run_id, store)


@pytest.mark.timeout(180)
def test_a_run_directory_deleted_mid_run_is_recreated_and_the_run_finishes(store, wait_for):
    import shutil

    # The profiler window comes after 3000 warm-up steps: seconds after the first rows.
    cfg = short(3200, profile=True, warmup_steps=3000, log_interval=1)
    run_id = launch(cfg, store)
    wait_rows(store, run_id, wait_for, at_least=2)
    shutil.rmtree(store.run_dir(run_id))
    assert store.metrics_count(run_id) < 3000, "the window may have passed already"
    run = wait_final(store, run_id, wait_for)
    assert run.status == FINISHED, run.reason
    assert store.metrics_count(run_id) == 3200
    assert (store.run_dir(run_id) / "trace.json.gz").is_file()
    assert "profile_error" not in run.summary, run.summary.get("profile_error")


def test_a_memory_cap_too_small_for_the_interpreter_is_refused_with_the_minimum():
    from engine.config import MIN_MEMORY_CAP_MB, ConfigError

    for cap in (3, 5, 10, MIN_MEMORY_CAP_MB - 1):
        with pytest.raises(ConfigError) as info:
            short(3, memory_cap_mb=cap)
        assert f"at least {MIN_MEMORY_CAP_MB}" in str(info.value)
    assert short(3, memory_cap_mb=MIN_MEMORY_CAP_MB).memory_cap_mb == MIN_MEMORY_CAP_MB


def test_an_exit_after_a_full_disk_is_named_in_the_reason(store):
    from engine.run.worker import _record_exit

    run_id = store.create_run(short(5), "cpu")
    store.set_status(run_id, RUNNING)
    (store.run_dir(run_id) / "worker.log").write_text(
        "Traceback (most recent call last):\n  ...\n"
        "engine.store.db.StoreError: precision_lab.sqlite3: the data directory's disk is "
        "full (database or disk is full)\n")
    _record_exit(store, run_id, 1, stop_requested=False)
    reason = store.get_run(run_id).reason
    assert reason.startswith("worker exited with code 1 at step 0: the data directory's disk "
                             "is full"), reason
