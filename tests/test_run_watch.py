"""What the supervisor watches while a run trains: worker.log stays under its cap (the
start and the newest output kept, one line saying what was cut) and a run that logs no
step for a while says so, in the log and on Live, before its first step too."""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path

import pytest

from engine.analysis.speedup import setup_words
from engine.analysis.stall import STALL_ENV, stall_of, stall_words
from engine.config import RunConfig, env_number
from engine.run.launcher import launch
from engine.run.watch import MAX_LOG_ENV, LogCap, RunWatch, StallWatch
from engine.schema import FINAL_STATUSES, WORKER_LOG

MIB = 2**20


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------
# the log cap, in process


def test_a_log_over_its_cap_keeps_its_start_and_newest_lines_with_one_marker(tmp_path):
    path = tmp_path / WORKER_LOG
    _append(path, b"[supervisor] run x: waiting for device\n")
    lines = b"".join(f"line {i:06d} {'x' * 60}\n".encode() for i in range(60_000))
    _append(path, lines)  # ~4 MiB
    cap = LogCap(path, max_bytes=1 * MIB, head_bytes=64 * 1024)
    assert cap.check() > 0
    text = path.read_text()
    assert path.stat().st_size <= MIB
    assert text.startswith("[supervisor] run x: waiting for device\n")
    assert text.count("[log] ") == 1 and "capped at 1 MiB (PRECISION_LAB_MAX_LOG_MIB)" in text
    assert text.endswith(f"line {59_999:06d} {'x' * 60}\n")
    assert all(line.startswith(("[supervisor]", "line ", "[log]")) and
               (line.startswith("[") or len(line) == 72) for line in text.splitlines())
    # a second cut replaces the marker, with the total so far
    _append(path, lines)
    assert cap.check() > 0
    text = path.read_text()
    assert text.count("[log] ") == 1 and path.stat().st_size <= MIB
    assert float(text.split("[log] ")[1].split(" MiB")[0]) > 6.0
    assert cap.check() == 0  # under the cap now: nothing cut


def test_every_cut_keeps_the_same_head_and_one_marker(tmp_path):
    """The head is fixed at the first cut: a later cut never reads past it into the old
    marker (lines of 300 bytes end the 64 KiB head far past a marker's length)."""
    path = tmp_path / WORKER_LOG
    line = lambda i: f"{i:08d} {'y' * 290}\n".encode()  # noqa: E731
    cap = LogCap(path, max_bytes=MIB, head_bytes=64 * 1024)
    for round_index in range(4):
        _append(path, b"".join(line(round_index * 10_000 + i) for i in range(8_000)))
        cap.check()
        text = path.read_text()
        assert text.count("[log] ") == 1, round_index
        assert text.startswith(line(0).decode())
        assert text.endswith(line(round_index * 10_000 + 7_999).decode())


def test_writers_keep_appending_at_the_end_while_the_log_is_cut(tmp_path):
    """Every writer holds the log with O_APPEND (the supervisor, its trainer, what the
    workload starts): after a cut they write at the new end, never past a hole."""
    path = tmp_path / WORKER_LOG
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            os.write(fd, f"w {i:08d}\n".encode() * 200)
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    cap = LogCap(path, max_bytes=MIB, head_bytes=16 * 1024)
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            cap.check()
            time.sleep(0.01)
    finally:
        stop.set()
        writer.join()
        os.close(fd)
    cap.check()
    data = path.read_bytes()
    assert b"\0" not in data  # no hole: nobody wrote at a stale offset
    assert len(data) <= MIB and cap.cut_bytes > 0


def test_settings_out_of_range_fall_back_to_the_default_with_the_reason(monkeypatch):
    for bad in ("lots", "0", "inf", "nan", "-3"):
        monkeypatch.setenv(MAX_LOG_ENV, bad)
        value, problem = env_number(MAX_LOG_ENV, 20.0, 1, 100_000, "MiB")
        assert value == 20.0 and f"PRECISION_LAB_MAX_LOG_MIB={bad!r}" in problem
        assert "[1, 100000]; using 20" in problem
    monkeypatch.setenv(MAX_LOG_ENV, "64")
    assert env_number(MAX_LOG_ENV, 20.0, 1, 100_000, "MiB") == (64.0, None)
    monkeypatch.delenv(MAX_LOG_ENV)
    assert env_number(MAX_LOG_ENV, 20.0, 1, 100_000, "MiB") == (20.0, None)


# ---------------------------------------------------------------------------------------
# the stall warning, in process on a real store


def _run(store) -> str:
    return store.create_run(RunConfig(model="mlp", size="tiny", steps=50, profile=False,
                                      device="cpu"), "cpu", "CPU")


def test_a_run_with_no_step_for_the_bound_is_said_stalled_then_cleared(store, monkeypatch):
    run_id = _run(store)
    clock = [time.time()]  # one clock for the watch and the sentence it writes
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "time", lambda: clock[0])
    watch = StallWatch(store, run_id, warn_after_s=5.0)
    assert watch.check() is None  # the first look
    clock[0] += 4.0
    assert watch.check() is None  # under the bound
    clock[0] += 2.0
    line = watch.check()
    assert line and "No step yet, 6 s after the trainer started" in line and "build()" in line
    stall = store.get_run(run_id).summary["stall"]
    assert stall["at_step"] == 0 and stall["warn_after_s"] == 5.0
    assert watch.check() is None  # said once
    store.update_run(run_id, steps_completed=3)
    assert "progress again (step 3)" in watch.check()
    assert store.get_run(run_id).summary["stall"] is None
    clock[0] += 6.0
    line = watch.check()
    assert line and "No progress for 6 s: no step logged since step 3" in line


def test_steps_made_after_the_last_check_are_said_when_the_watch_closes(store, monkeypatch,
                                                                         capsys):
    """A long build, then a few quick steps and the end, all between two 2 s checks."""
    run_id = _run(store)
    clock = [time.time()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "time", lambda: clock[0])
    monkeypatch.setenv(STALL_ENV, "5")
    watch = RunWatch(store, run_id)
    assert watch.stall.check() is None
    clock[0] += 6.0
    assert "No step yet" in watch.stall.check()
    store.update_run(run_id, steps_completed=5)  # the whole run, before the next check
    watch.close()
    assert "progress again (step 5)" in capsys.readouterr().out
    assert store.get_run(run_id).summary["stall"] is None


def test_the_stall_sentence_counts_from_the_last_progress():
    stall = {"since_unix_s": 1000.0, "at_step": 0, "warn_after_s": 60}
    assert stall_words(stall, now_s=1125.0).startswith("No step yet, 2 min 5 s after")
    stall["at_step"] = 40
    assert stall_words(stall, now_s=1030.0).startswith(
        "No progress for 30 s: no step logged since step 40")


def test_a_watched_run_is_judged_by_its_supervisor_an_unwatched_one_by_its_rows(store):
    """One rule on every surface: the supervisor's record when it watches the run (its
    own clock, the build included), else the time since the last metric row."""
    run_id = _run(store)
    store.set_status(run_id, "running")
    store.update_run(run_id, started_at=time.time() - 300)
    store.write_metrics(run_id, [{"step": 1, "loss": 1.0, "wall_time_s": 10.0}])
    stall = stall_of(store, store.get_run(run_id))  # nobody watches it: from its rows
    assert stall["at_step"] == store.get_run(run_id).steps_completed
    assert 285 < time.time() - stall["since_unix_s"] < 295
    store.merge_summary(run_id, {"stall": None})  # a supervisor watches it: all is well
    assert stall_of(store, store.get_run(run_id)) is None
    recorded = {"since_unix_s": time.time() - 90, "at_step": 1, "warn_after_s": 60}
    store.merge_summary(run_id, {"stall": recorded})
    assert stall_of(store, store.get_run(run_id)) == recorded
    store.set_status(run_id, "finished")
    assert stall_of(store, store.get_run(run_id)) is None  # an ended run is not stalled


def test_a_stalled_speedup_check_is_said_by_its_rounds(store, monkeypatch):
    run_id = _run(store)
    clock = [time.time()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "time", lambda: clock[0])
    watch = StallWatch(store, run_id, warn_after_s=5.0)
    store.merge_summary(run_id, {"speedup": {"rounds": 23, "running": True}})
    watch.check()
    clock[0] += 6.0
    line = watch.check()
    assert "No progress for 6 s: no round finished since round 23" in line
    store.merge_summary(run_id, {"speedup": {"rounds": 24, "running": True}})
    assert watch.check().endswith("progress again (round 24)")


def test_a_watch_that_fails_says_so_once_and_never_ends_the_run(store, capsys, tmp_path):
    watch = RunWatch(store, _run(store))
    watch.stall.store = None  # every store call now raises (what a locked or lost store does)
    watch.next_stall_s = 0
    watch.tick()
    watch.next_stall_s = 0
    watch.tick()
    watch.close()
    said = capsys.readouterr().out
    assert said.count("watch: AttributeError") == 1, said


def test_a_speedup_checks_rounds_count_as_progress(store, monkeypatch):
    run_id = _run(store)
    clock = [time.time()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    watch = StallWatch(store, run_id, warn_after_s=5.0)
    watch.check()
    for rounds in range(1, 4):
        clock[0] += 4.0
        store.merge_summary(run_id, {"speedup": {"rounds": rounds, "running": True}})
        assert watch.check() is None
    assert store.get_run(run_id).summary["stall"] is None


def _setup_progress(stage: str, mode: str, stages_done: int, elapsed_s: float) -> dict:
    """A speedup check's progress while it is in set-up, as the trainer stores it."""
    return {"phase": "setup", "running": True, "rounds": 0, "modes": [], "budget_s": 60.0,
            "elapsed_s": elapsed_s, "target_pct": 3.0, "baseline": "fp32", "dropped": [],
            "setup": {"phase": "setup", "stage": stage, "mode": mode,
                      "stages_done": stages_done,
                      "modes": {"fp32": "ready", "bf16-amp": stage}}}


def test_a_speedup_check_in_set_up_is_not_stalled_within_its_budget(store, monkeypatch):
    """A set-up stage that takes longer than the 60 s bound (a warm-up or the profiled
    memory step of a large model on a CPU) is the check at work: Live says the stage, not
    "No step yet ... build() has not returned"; silent for longer than the whole budget
    (the set-up is part of it), it is stalled, and the sentence names the stage."""
    run_id = _run(store)
    clock = [time.time()]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "time", lambda: clock[0])
    store.set_status(run_id, "running")
    watch = StallWatch(store, run_id, warn_after_s=5.0)
    store.merge_summary(run_id, {"speedup": _setup_progress("warming up", "bf16-amp", 3, 2.0)})
    assert watch.check() is None
    clock[0] += 50.0  # far past the 5 s bound, inside the 60 s budget
    assert watch.check() is None
    run = store.get_run(run_id)
    assert run.summary["stall"] is None and stall_of(store, run) is None
    assert setup_words(run.summary["speedup"]) == (
        "warming up bf16-amp (fp32: ready, bf16-amp: warming up) · 2 / 60 s of the budget, "
        "set-up included")
    store.merge_summary(run_id, {"speedup": _setup_progress("calibrating", "fp32", 4, 52.0)})
    clock[0] += 30.0
    assert watch.check() is None  # a stage finished: progress
    clock[0] += 66.0
    line = watch.check()
    assert line and "the speedup check is still calibrating fp32, longer than its whole budget" \
        in line
    stall = stall_of(store, store.get_run(run_id))
    assert stall["setup"] == {"stage": "calibrating", "mode": "fp32"}
    assert stall["warn_after_s"] == 65.0  # the budget, and the bound for the trainer's start
    # The rounds begin: the ordinary bound again, counted from the last progress.
    store.merge_summary(run_id, {"speedup": {"phase": "rounds", "rounds": 1, "running": True}})
    assert watch.check().endswith("progress again (round 1)")
    clock[0] += 6.0
    assert "no round finished since round 1" in watch.check()


def test_an_unwatched_check_in_set_up_is_judged_by_its_budget(store):
    run_id = _run(store)
    started = time.time() - 90.0
    store.set_status(run_id, "running")
    store.update_run(run_id, started_at=started)
    store.merge_summary(run_id, {"speedup": _setup_progress("warming up", "fp32", 1, 1.0)})
    run = store.get_run(run_id)
    assert stall_of(store, run, now_s=started + 119.0) is None  # budget 60 + the 60 s bound
    assert stall_of(store, run, now_s=started + 121.0) is not None


# ---------------------------------------------------------------------------------------
# end to end: the supervisor of a real run

NOISY_WORKLOAD = '''
import sys, time
import torch
from torch import nn
from engine.workloads import Workload


def build(cfg):
    for i in range({lines}):
        print(f"noise {{i:07d}} " + "n" * 90)
    sys.stdout.flush()
    time.sleep({sleep_s})
    return Workload(model=nn.Linear(4, 3),
                    batches=lambda step: (torch.randn(cfg.batch_size, 4),
                                          torch.randint(0, 3, (cfg.batch_size,))))
'''


def _workload(tmp_path: Path, lines: int, sleep_s: float) -> Path:
    path = tmp_path / "noisy_workload.py"
    path.write_text(textwrap.dedent(NOISY_WORKLOAD.format(lines=lines, sleep_s=sleep_s)))
    return path


def _final(store, run_id, wait_for, timeout_s=150.0):
    return wait_for(lambda: (run := store.get_run(run_id)).status in FINAL_STATUSES and run,
                    timeout_s, message=f"run {run_id} to end")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_workload_printing_30_mib_leaves_a_log_under_the_cap(store, tmp_path, wait_for,
                                                               monkeypatch):
    monkeypatch.setenv(MAX_LOG_ENV, "2")
    path = _workload(tmp_path, lines=300_000, sleep_s=0)  # ~30 MiB of output
    run_id = launch(RunConfig(model="custom", workload=str(path), steps=5, batch_size=4,
                              profile=False, device="cpu"), store=store)
    run = _final(store, run_id, wait_for)
    assert run.status == "finished", run.reason
    log = store.run_dir(run_id) / WORKER_LOG
    text = log.read_text()
    assert log.stat().st_size <= 2 * MIB
    assert "waiting for device" in text.splitlines()[0]  # the start is kept
    assert text.count("[log] ") == 1 and "capped at 2 MiB" in text
    assert "finished after 5 steps" in text[-5000:]  # and the newest output


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_build_that_takes_long_is_said_stalled_on_live_and_in_the_log(store, tmp_path,
                                                                        wait_for, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv(STALL_ENV, "5")
    path = _workload(tmp_path, lines=1, sleep_s=25)
    run_id = launch(RunConfig(model="custom", workload=str(path), steps=5, batch_size=4,
                              profile=False, device="cpu"), store=store)
    stall = wait_for(lambda: store.get_run(run_id).summary.get("stall"), 60,
                     message="the stall to be recorded")
    assert stall["at_step"] == 0
    monkeypatch.setenv("PRECISION_LAB_HOME", str(store.home))
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"),
                           default_timeout=60)
    at.run()
    at.query_params["run"] = run_id
    at.switch_page("pages/live.py").run()
    warnings = [w.value for w in at.warning]
    assert any("No step yet" in w and "build()" in w for w in warnings), warnings
    run = _final(store, run_id, wait_for)
    assert run.status == "finished", run.reason
    # The trainer sets "finished" before it exits; its supervisor clears the stall once it
    # has (a build then 5 quick steps may all fall between two of its 2 s checks).
    wait_for(lambda: store.get_run(run_id).summary.get("stall") is None, 30,
             message="the supervisor to clear the stall once the trainer ended")
    text = (store.run_dir(run_id) / WORKER_LOG).read_text()
    assert "No step yet" in text and "progress again" in text


def test_the_watch_reads_its_settings_from_the_environment(store, monkeypatch, capsys):
    monkeypatch.setenv(MAX_LOG_ENV, "3")
    monkeypatch.setenv(STALL_ENV, "soon")
    run_id = _run(store)
    watch = RunWatch(store, run_id)
    assert watch.log.max_bytes == 3 * MIB and watch.stall.warn_after_s == 60.0
    assert "PRECISION_LAB_STALL_WARN_S='soon' is not a number" in capsys.readouterr().out
    assert store.get_run(run_id).summary["stall"] is None  # watched from now on


def test_live_says_the_set_up_stage_of_a_check_not_a_stall(store):
    """A speedup check 50 s into its set-up, 90 s after its trainer started (past the 60 s
    bound): Live shows the stage and mode with the budget spent, no stall."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    run_id = store.create_run(RunConfig(model="gpt", size="tiny", profile=False, device="cpu",
                                        speedup_modes="fp32,bf16-amp"), "cpu", "CPU")
    store.set_status(run_id, "running")
    store.update_run(run_id, started_at=time.time() - 90.0)
    store.merge_summary(run_id, {"speedup": _setup_progress("warming up", "bf16-amp", 3, 50.0)})
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"),
                           default_timeout=120)
    at.query_params["run"] = run_id
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    texts = [str(e.value) for kind in ("warning", "info", "success") for e in getattr(at, kind)]
    texts += [str(bar.proto.text) for bar in at.get("progress")]
    said = "\n".join(texts)
    assert "warming up bf16-amp (fp32: ready, bf16-amp: warming up) · 50 / 60 s" in said, said
    assert "No step yet" not in said and "No progress" not in said, said
