"""The soak benchmark, short: runs with random SIGKILLs of supervisor, standby and trainer
leave no orphan process, no run left running, no metric row after a final status and no
run with two trainers' rows (bench/soak.py has the full 30-run version)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)
def test_random_sigkills_leave_no_orphan_no_active_run_no_late_or_mixed_rows():
    result = subprocess.run([sys.executable, "-m", "bench.soak", "--runs", "8", "--seed", "1",
                             "--json"], cwd=str(REPO_ROOT), capture_output=True, text=True,
                            timeout=400)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["orphan_processes"] == []
    assert report["runs_left_active"] == []
    assert report["rows_after_final_status"] == {}
    assert report["runs_with_two_trainers"] == []
    assert report["ok"] and sum(report["killed"].values()) >= 4, report


@pytest.mark.timeout(420)
def test_random_sigkills_of_runs_whose_workloads_fork_leave_no_process_behind():
    """Each workload starts an os.fork child, a setsid'd Popen and a double-forked daemon in
    build(); whichever process of the run is killed, none of them survives the run."""
    result = subprocess.run([sys.executable, "-m", "bench.soak", "--runs", "8", "--seed", "0",
                             "--forking", "--json"], cwd=str(REPO_ROOT), capture_output=True,
                            text=True, timeout=400)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["forking"] is True
    assert report["orphan_processes"] == [], report
    assert report["runs_left_active"] == [] and report["ok"], report
    assert all(report["killed"][victim] for victim in ("supervisor", "trainer", "standby")), report
