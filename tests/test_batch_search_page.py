"""The Live page's largest-batch search through Streamlit's AppTest: started in the
background (the page returns at once), probes shown while it runs, the answer against
the run's memory cap with a Launch form filled in with it, a failure in one line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from engine.config import RunConfig
from engine.run.batch_search import SEARCH_STATE
from engine.store import Store

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """An OOM run (memory cap 1500 MiB, batch 64) in a private data directory."""
    home = tmp_path / "lab"
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    store = Store(home)
    run_id = store.create_run(RunConfig(model="mlp", size="tiny", batch_size=64,
                                        memory_cap_mb=1500, device="cpu"), "cpu", "test cpu")
    store.set_status(run_id, "running")
    store.set_status(run_id, "oom", "out of memory at batch 64")
    yield store, run_id
    left = [p for p in psutil.process_iter(["cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE
            and "engine.run.batch_search" in (p.info["cmdline"] or [])
            and run_id in (p.info["cmdline"] or [])]
    for proc in left:
        proc.kill()
    assert not left, f"search processes left behind: {left}"


def live_page(run_id: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.session_state["live_run_id"] = run_id
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    return at


def write_state(store: Store, run_id: str, **state) -> None:
    store.run_dir(run_id).mkdir(parents=True, exist_ok=True)
    base = {"state": "running", "started_at": time.time(), "probes": [], "max_probes": 10,
            "memory_cap_mb": 1500, "device_key": "cpu", "start_batch": 64}
    (store.run_dir(run_id) / SEARCH_STATE).write_text(json.dumps({**base, **state}))


def texts(at: AppTest) -> str:
    return " ".join(e.value for kind in (at.info, at.success, at.error, at.warning) for e in kind)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_find_largest_batch_returns_at_once_and_the_search_runs_in_the_background(lab):
    store, run_id = lab
    at = live_page(run_id)
    started = time.monotonic()
    at.button(key="find_max_batch").click().run()
    assert time.monotonic() - started < 20, "the page waited for the search"
    assert not at.exception, at.exception
    assert "Finding the largest batch that fits, in the background" in texts(at)
    state = json.loads((store.run_dir(run_id) / SEARCH_STATE).read_text())
    assert psutil.pid_exists(state["pid"])
    # The page may close: the search ends by itself, with its result in the summary.
    deadline = time.monotonic() + 200
    while store.get_run(run_id).summary.get("max_batch_fit") is None:
        assert time.monotonic() < deadline, (store.run_dir(run_id) / "batch_search.log"
                                             ).read_text()[-2000:]
        time.sleep(0.5)
    while psutil.pid_exists(state["pid"]) and psutil.Process(state["pid"]).status() \
            != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.2)
    at = live_page(run_id)
    assert "Largest batch that fits under this run's memory cap of 1500 MiB" in texts(at)


def test_probes_so_far_are_shown_while_the_search_runs(lab):
    store, run_id = lab
    me = psutil.Process(os.getpid())  # a live process stands for the search
    write_state(store, run_id, pid=me.pid, pid_create_time=me.create_time(),
                probes=[{"batch_size": 64, "fits": True, "reason": "fits"},
                        {"batch_size": 128, "fits": False, "reason": "can't allocate memory"}])
    at = live_page(run_id)
    assert "2 probed so far: 64 fits, 128 does not fit." in texts(at)
    assert not [b for b in at.button if b.key == "find_max_batch"]  # one search at a time


def test_the_result_names_the_cap_and_launch_with_this_batch_prefills_the_form(lab):
    store, run_id = lab
    write_state(store, run_id, state="done", probes=[], result={
        "max_batch_fit": 48, "first_oom_batch": 64, "complete": True, "probes": []})
    at = live_page(run_id)
    assert ("Largest batch that fits under this run's memory cap of 1500 MiB: 48 "
            "(64 did not).") in texts(at).replace("\\", "")
    at.button(key="launch_with_batch").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Launch a run"
    assert at.text_input(key="batch_size").value == "48"
    assert any(run_id in info.value for info in at.info)
    assert len(store.list_runs()) == 1  # nothing launched by opening the form


def test_a_failed_search_is_one_line_not_a_traceback(lab):
    store, run_id = lab
    write_state(store, run_id, state="failed",
                error="RuntimeError: the probe could not start")
    at = live_page(run_id)
    (error,) = [e.value for e in at.error if "batch-size search failed" in e.value]
    assert "RuntimeError: the probe could not start" in error.replace("\\", "")
    assert "Traceback" not in error and "\n" not in error
    assert not at.exception
