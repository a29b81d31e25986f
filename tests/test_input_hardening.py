"""Small reliability defects, each reproduced: numbers only in plain ASCII, negative
timeouts refused, a huge value never repeated in full, and a finished standby reaped by
the process that started it (no zombie under the Streamlit server)."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from engine.cli import main as cli_main
from engine.run import standby


@pytest.mark.parametrize("argv", [
    ["run", "--batch-size", " 5 "], ["run", "--batch-size", "1_0"], ["run", "--nprocs", "٣"],
    ["run", "--steps", "１２"], ["run", "--lr", "1_0"], ["run", "--lr", " 0.1"],
    ["maxbatch", "--max-batch", "2_048"],
    ["sweep", "create", "--models", "mlp", "--precisions", "fp32", "--batch-sizes", "8",
     "--steps", "1_0"],
])
def test_number_flags_take_plain_ascii_digits_only(home, capsys, argv):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "expected a whole number" in err or "expected a number" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--timeout-s", "--connect-timeout-s", "--stop-grace-s"])
def test_sweep_timeouts_must_not_be_negative(home, capsys, flag):
    argv = ["sweep", "create", "--models", "mlp", "--precisions", "fp32", "--batch-sizes", "8",
            flag, "-5"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: argument {flag}: {flag} '-5': expected seconds >= "), err


@pytest.mark.parametrize("argv", [
    ["run", "--name", "x" * 100_000], ["run", "--batch-size", "9" * 100_000],
    ["sweep", "create", "--models", "m" * 100_000, "--precisions", "fp32", "--batch-sizes", "8"],
    ["show", "r" * 100_000],
])
def test_an_error_never_repeats_a_huge_value_in_full(home, capsys, argv):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err) < 600 and len(err.strip().splitlines()) == 1, err[:300]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_finished_standby_is_reaped_by_the_process_that_started_it(store, monkeypatch,
                                                                      wait_for):
    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    pid = standby.ensure(store)
    wait_for(lambda: standby.ping(store.home) == pid, 60, interval_s=0.2,
             message="the standby to listen")
    assert standby.shutdown(store.home)

    def gone() -> bool:  # a zombie still has its process entry: not gone
        try:
            psutil.Process(pid)
            return False
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, 15, message="the standby to exit and be reaped (not a zombie)")
    assert pid not in [child.pid for child in psutil.Process(os.getpid()).children()]
    time.sleep(0.2)
