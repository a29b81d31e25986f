"""The profiler window is left whatever ends the loop: a step that raises inside it (on a
CPU the first one runs with oneDNN verbose on and fd 1 sent to the oneDNN log) puts fd 1
back and stops the profiler, so the run's traceback lands in worker.log, not in the oneDNN
log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from engine.config import RunConfig
from engine.run.launcher import launch, read_log_tail
from engine.schema import FAILED, FINAL_STATUSES, ONEDNN_LOG_FILENAME, WORKER_LOG
from engine.training.loop import train
from engine.training.workload import WorkloadError

WORKLOADS = Path(__file__).resolve().parent / "data" / "workloads"
FAILING = WORKLOADS / "fails_in_profiler_window.py"
FAILURE = "the batches failed inside the profiler window on purpose"
# two warm-up steps, then the window: step 3 with oneDNN verbose on, steps 4-5 traced
CFG = RunConfig(model="custom", workload=str(FAILING), batch_size=8, steps=8, warmup_steps=2,
                profile=True, profile_steps=2, log_interval=1, device="cpu")


def _fd1_file() -> tuple[int, int]:
    info = os.fstat(1)
    return info.st_dev, info.st_ino


@pytest.mark.parametrize("window_step", [0, 1], ids=["oneDNN verbose step", "traced step"])
def test_a_step_that_raises_inside_the_window_leaves_fd1_and_the_profiler_as_they_were(
        tmp_path, monkeypatch, capfd, window_step):
    monkeypatch.setenv("FAIL_AT_WINDOW_STEP", str(window_step))
    run_dir = tmp_path / "run"
    fd1_before = _fd1_file()
    with pytest.raises(WorkloadError, match="raised RuntimeError") as raised:
        train(CFG, "cpu", emit=lambda rows: None, run_dir=run_dir)
    assert FAILURE in str(raised.value.__cause__)
    assert _fd1_file() == fd1_before  # fd 1 is the test's stdout again, not the oneDNN log
    assert not torch._C._autograd._profiler_enabled()
    os.write(1, b"written after the failure\n")  # where the session prints the traceback
    assert "written after the failure" in capfd.readouterr().out
    onednn_log = run_dir / ONEDNN_LOG_FILENAME
    assert onednn_log.exists()  # the window had begun: its first step ran with verbose on
    assert "written after the failure" not in onednn_log.read_text(errors="replace")


def test_a_window_closed_twice_or_never_opened_is_left_quietly(tmp_path):
    from engine.training.loop import ProfilerWindow

    with ProfilerWindow(CFG, torch.device("cpu"), tmp_path) as window:
        pass
    window.close()
    assert window.prof is None and window.verbose is None and window.trace_path is None


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("one_thread_workers")
def test_a_cpu_run_that_fails_inside_the_window_writes_its_traceback_to_worker_log(
        store, wait_for):
    run_id = launch(CFG, store)
    wait_for(lambda: store.get_run(run_id).status in FINAL_STATUSES, 180,
             message=lambda: f"run {run_id}: {store.get_run(run_id)}\n"
                             f"{read_log_tail(run_id, store, 3000)}")
    run = store.get_run(run_id)
    assert run.status == FAILED and "raised RuntimeError" in run.reason, run
    run_dir = store.run_dir(run_id)
    worker_log = (run_dir / WORKER_LOG).read_text(errors="replace")
    assert "Traceback (most recent call last)" in worker_log and FAILURE in worker_log
    onednn_log = run_dir / ONEDNN_LOG_FILENAME
    assert onednn_log.exists(), worker_log  # the failing step ran with verbose on
    onednn_text = onednn_log.read_text(errors="replace")
    assert "Traceback" not in onednn_text and FAILURE not in onednn_text
    # what the trainer printed after the window (its outcome) is in worker.log too
    assert "[trainer] run" in worker_log.split(FAILURE, 1)[1], worker_log
