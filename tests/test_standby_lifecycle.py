"""No daemon nobody asked for: a run from a terminal leaves no standby trainer behind;
`python -m engine standby start|status|stop` manages one on request, and `list` says when
one is running and how to end it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO_ROOT, cli_env

from engine.run import standby

pytestmark = pytest.mark.slow


def _cli(home, *args: str) -> subprocess.CompletedProcess:
    env = cli_env(home)
    env[standby.ENABLE_ENV] = "1"  # the default outside the test suite
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=str(REPO_ROOT), env=env,
                          capture_output=True, text=True, timeout=180)


def _standby_processes(home) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if ("engine.run.standby" in cmdline and str(home) in cmdline
                and proc.info["status"] != psutil.STATUS_ZOMBIE):
            found.append(proc)
    return found


@pytest.fixture
def clean_standby(home):
    yield home
    standby.shutdown(home)
    for proc in _standby_processes(home):
        proc.kill()


@pytest.mark.timeout(200)
def test_a_run_from_the_terminal_leaves_no_standby_behind(clean_standby):
    home = clean_standby
    result = _cli(home, "run", "--model", "mlp", "--steps", "5", "--device", "cpu",
                  "--no-profile", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    time.sleep(3.0)  # a successor would have been started by now
    assert standby.ping(home) is None
    assert _standby_processes(home) == []


@pytest.mark.timeout(200)
def test_standby_on_request_and_list_says_how_to_end_it(clean_standby):
    home = clean_standby
    assert json.loads(_cli(home, "standby", "status", "--json").stdout)["state"] == "not running"
    started = json.loads(_cli(home, "standby", "start", "--json").stdout)
    assert started["state"] == "running" and started["pid"]
    listed = _cli(home, "list", "--json")
    assert json.loads(listed.stdout) == []  # stdout stays one JSON value
    assert f"pid {started['pid']}" in listed.stderr and "standby stop" in listed.stderr
    assert json.loads(_cli(home, "standby", "start", "--json").stdout)["pid"] == started["pid"]
    assert json.loads(_cli(home, "standby", "stop", "--json").stdout)["state"] == "stopped"
    deadline = time.monotonic() + 15
    while _standby_processes(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _standby_processes(home) == []
    assert "note:" not in _cli(home, "list").stderr
