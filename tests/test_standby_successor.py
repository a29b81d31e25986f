"""The app's next launch finds a standby, whatever happened to the last run: stopped while
queued, while its trainer starts, while it trains, or its supervisor killed outright. With
a competing CPU hog, a standby must be serving within 10 s of the stop.

The test plays the app's part (`standby.want` with this process as the server, as
pages/ui.py does) and drives runs through the launcher, as the pages do."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from test_standby_lifecycle import _standby_processes as _standbys

from bench._hog import cpu_hog
from engine.config import RunConfig
from engine.run import standby
from engine.run.launcher import launch, reconcile, stop
from engine.schema import FINAL_STATUSES, STANDBY_WANTED
from engine.store import Store

pytestmark = pytest.mark.slow
SERVING_WITHIN_S = 10.0


@pytest.fixture
def app_store(home, monkeypatch):
    monkeypatch.setenv(standby.ENABLE_ENV, "1")  # the default outside the test suite
    store = Store(home)
    standby.want(store, os.getpid())
    yield store
    # Not wanted any more first: a supervisor still ending must not start a successor
    # that would outlive the test.
    (home / STANDBY_WANTED).unlink(missing_ok=True)
    standby.shutdown(home)
    for proc in _standbys(home):
        proc.kill()
    psutil.wait_procs(_standbys(home), timeout=10)
    assert not _standbys(home), "a standby outlived the test"


def _wait_serving(home, timeout_s: float) -> float:
    """Seconds until a standby answers a ping (fails past `timeout_s`)."""
    start = time.monotonic()
    while standby.ping(home) is None:
        assert time.monotonic() - start < timeout_s, (
            f"no standby serving {timeout_s:.0f} s after the stop; standby processes: "
            f"{[p.pid for p in _standbys(home)]}")
        time.sleep(0.1)
    return time.monotonic() - start


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _config(steps: int = 100000) -> RunConfig:
    return RunConfig(model="mlp", device="cpu", steps=steps, batch_size=32, profile=False,
                     numerics=False)


@pytest.mark.timeout(300)
def test_after_a_stop_at_any_phase_a_standby_serves_within_10_s_under_a_hog(app_store):
    store, home = app_store, app_store.home
    standby.ensure(store)
    _wait_serving(home, 60)  # the app's first standby (a quiet start)
    with cpu_hog(processes=1):
        # training (from the standby's fork): stopped from the page's Stop button
        running = launch(_config(), store)
        _wait(lambda: store.get_run(running).steps_completed > 0, 90, "the first steps")
        stop(running, store)
        assert store.get_run(running).status == "stopped"
        took_s = _wait_serving(home, SERVING_WITHIN_S)
        print(f"training -> serving in {took_s:.1f} s")

        # queued behind another run on the same device, then stopped
        first = launch(_config(), store)
        _wait(lambda: store.get_run(first).status == "running", 60, "the first run to start")
        queued = launch(_config(), store)
        _wait(lambda: store.get_run(queued).pid is not None, 30, "the queued run's supervisor")
        stop(queued, store)
        assert store.get_run(queued).status == "stopped"
        # ... and the run ahead of it stopped right after its trainer started
        stop(first, store)
        took_s = _wait_serving(home, SERVING_WITHIN_S)
        print(f"starting -> serving in {took_s:.1f} s")

        # the supervisor killed outright (SIGKILL to its group: no Python code runs there):
        # the next reconcile, which every page does, leaves the successor
        killed = launch(_config(), store)
        _wait(lambda: store.get_run(killed).steps_completed > 0, 90, "the killed run's steps")
        os.killpg(store.get_run(killed).pid, signal.SIGKILL)
        _wait(lambda: reconcile(store) or store.get_run(killed).status in FINAL_STATUSES, 30,
              "reconcile to mark the killed run")
        took_s = _wait_serving(home, SERVING_WITHIN_S)
        print(f"killed -> serving in {took_s:.1f} s")
    assert len(_standbys(home)) == 1  # one successor, never two importing side by side


@pytest.mark.timeout(120)
def test_a_terminal_run_without_the_app_still_leaves_no_standby(home, monkeypatch):
    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    store = Store(home)
    assert not standby.wanted(home)
    run_id = launch(_config(steps=5), store)
    _wait(lambda: store.get_run(run_id).status in FINAL_STATUSES, 90, "the run to end")
    time.sleep(2.0)
    assert standby.ping(home) is None and _standbys(home) == []


def test_wanted_ends_with_the_process_that_asked(home):
    import subprocess
    import sys

    store = Store(home)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        standby.want(store, owner.pid)
        assert standby.wanted(home)
    finally:
        owner.kill()
        owner.wait()
    assert not standby.wanted(home)  # a dead server keeps no standby ready


@pytest.mark.timeout(120)
def test_the_apps_standby_ends_when_the_apps_server_ends(home, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    store = Store(home)
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        standby.want(store, server.pid)  # what the app's server does at its start
        standby.ensure(store)
        _wait_serving(home, 60)
    finally:
        server.kill()
        server.wait()
    # It checks its owner every HOME_CHECK_S (5 s): gone well within 15 s.
    _wait(lambda: standby.ping(home) is None and not _standbys(home), 15,
          "the standby to exit after its server")
