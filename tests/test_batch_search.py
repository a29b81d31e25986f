"""Largest-batch search: the probe sequence, and a real memory-capped search on CPU."""

from __future__ import annotations

import pytest

from engine.config import RunConfig
from engine.run.batch_search import find_max_batch, next_probe


def test_probe_sequence_doubles_then_bisects():
    assert next_probe(None, None, 16, 4096) == 16
    assert next_probe(16, None, 16, 4096) == 32
    assert next_probe(None, 16, 16, 4096) == 8          # start did not fit: halve
    assert next_probe(256, 512, 16, 4096) == 384        # bisect
    assert next_probe(384, 400, 16, 4096) is None       # within ~6 %: done
    assert next_probe(4096, None, 16, 4096) is None     # hit the bound
    assert next_probe(None, 1, 1, 4096) is None         # nothing fits


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_capped_cpu_search_finds_a_real_limit():
    # 1200 MiB of address space: torch plus gpt-tiny fits at small batches, not at 2048.
    cfg = RunConfig(model="gpt", size="tiny", batch_size=64, memory_cap_mb=1200, device="cpu")
    seen = []
    result = find_max_batch(cfg, "cpu", max_batch=2048, max_probes=6, progress=seen.append)
    assert result["max_batch_fit"] is not None and result["max_batch_fit"] >= 64
    assert result["first_oom_batch"] is not None
    assert result["max_batch_fit"] < result["first_oom_batch"] <= 2048
    assert [p["probe"] for p in seen] == [p["batch_size"] for p in result["probes"]]
    failed = [p for p in result["probes"] if not p["fits"]]
    assert failed and all("allocate" in p["reason"] for p in failed)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_search_for_a_multi_process_run_measures_the_batch_per_process():
    # An FSDP2 2-process config: the probes train one process, so they need no ranks.
    cfg = RunConfig(model="mlp", size="tiny", batch_size=16, nprocs=2, sharding="fsdp2",
                    precision="bf16-amp", comm_hook="bf16", device="cpu")
    result = find_max_batch(cfg, "cpu", max_batch=64, max_probes=3)
    assert result["max_batch_fit"] == 64, result
    assert all(p["fits"] for p in result["probes"])


# ---------------------------------------------------------------------------------------
# in the background (the Live page's search)


def search_processes(run_id: str) -> list:
    """Live (non-zombie) processes of `run_id`'s background search and its probes."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if (proc.info["status"] != psutil.STATUS_ZOMBIE and "engine.run.batch_search" in cmdline
                and (run_id in cmdline or any(run_id in arg for arg in cmdline))):
            found.append(proc)
    return found


def ended_run(store, **config) -> str:
    from engine.config import RunConfig

    run_id = store.create_run(RunConfig(device="cpu", **config), "cpu", "test cpu")
    store.set_status(run_id, "running")
    store.set_status(run_id, "oom", "out of memory")
    return run_id


@pytest.fixture
def store(tmp_path):
    from engine.store import Store

    return Store(tmp_path / "home")


@pytest.fixture
def no_search_left(store):
    """Every test here ends with no search or probe process of its store left."""
    started: list[str] = []
    yield started
    import psutil

    left = [p for run_id in started for p in search_processes(run_id)]
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"search processes left behind: {left}"


def wait_search(store, run_id: str, timeout_s: float, predicate) -> dict:
    import time

    from engine.run.batch_search import batch_search_progress

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = batch_search_progress(store, run_id)
        if state and predicate(state):
            return state
        time.sleep(0.2)
    log = store.run_dir(run_id) / "batch_search.log"
    raise AssertionError(f"search state {batch_search_progress(store, run_id)}; log: "
                         f"{log.read_text()[-2000:] if log.exists() else '(none)'}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_background_search_records_probes_and_the_result_and_ends(store, no_search_left):
    from engine.run.batch_search import (
        batch_search_progress,
        search_outcome,
        start_batch_search,
    )

    run_id = ended_run(store, model="mlp", size="tiny", batch_size=16, memory_cap_mb=4096)
    no_search_left.append(run_id)
    state = start_batch_search(store, run_id, max_batch=32, max_probes=3)
    assert state["state"] == "running" and state["pid"], state  # returns at once
    assert start_batch_search(store, run_id, max_batch=32)["pid"] == state["pid"]  # one at a time
    done = wait_search(store, run_id, 200, lambda s: s["state"] != "running")
    assert done["state"] == "done", done
    assert [p["batch_size"] for p in done["probes"]] == [16, 32]
    assert done["result"]["max_batch_fit"] == 32
    assert store.get_run(run_id).summary["max_batch_fit"] == 32
    assert search_outcome(done).startswith(
        "Largest batch that fits under this run's memory cap of 4096 MiB: 32")
    import time

    deadline = time.monotonic() + 10
    while search_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not search_processes(run_id)
    assert batch_search_progress(store, run_id)["state"] == "done"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_background_search_stops_by_itself_when_its_run_is_deleted(store, no_search_left):
    import time

    from engine.run.batch_search import start_batch_search

    # gpt-tiny from batch 1024 up: each probe twice as long as the one before (~4, 8,
    # 16 s ... here), so the whole search takes minutes; deleted, it stops at the next.
    run_id = ended_run(store, model="gpt", size="tiny", batch_size=1024, memory_cap_mb=6000)
    no_search_left.append(run_id)
    start_batch_search(store, run_id, max_batch=65536, max_probes=17)
    wait_search(store, run_id, 120, lambda s: s["probes"])  # probing has begun
    store.delete_run(run_id)
    deleted = time.monotonic()
    while search_processes(run_id) and time.monotonic() - deleted < 60:
        time.sleep(0.2)
    assert not search_processes(run_id), "the search outlived its deleted run"
    assert not store.run_dir(run_id).exists(), "the search wrote its deleted run's folder back"


def test_a_search_whose_process_died_reads_as_failed_in_one_line(store):
    import json

    from engine.run.batch_search import SEARCH_STATE, batch_search_progress

    run_id = ended_run(store, model="mlp", size="tiny")
    store.run_dir(run_id).mkdir(parents=True, exist_ok=True)
    (store.run_dir(run_id) / SEARCH_STATE).write_text(json.dumps(
        {"state": "running", "pid": 2**22 + 7, "pid_create_time": 1.0, "probes": [],
         "started_at": 1.0}))
    state = batch_search_progress(store, run_id)
    assert state["state"] == "failed"
    assert "\n" not in state["error"] and "batch_search.log" in state["error"]


def test_an_incomplete_search_says_the_range_it_left_untried():
    from engine.run.batch_search import search_outcome

    def outcome(fit, oom, complete, max_batch=4096):
        return search_outcome({"device_key": "cpu", "max_batch": max_batch, "result": {
            "max_batch_fit": fit, "first_oom_batch": oom, "complete": complete,
            "max_batch_searched": max_batch}})

    assert outcome(1152, 1280, False) == (
        "Largest batch that fits on cpu (no memory cap set): 1152 (1280 did not); search "
        "incomplete (probe limit reached): 1153-1279 not tried, the answer lies there or is "
        "1152.")
    assert outcome(512, None, False).endswith("513-4096 not tried, a larger batch may fit.")
    assert outcome(1152, 1280, True) == (
        "Largest batch that fits on cpu (no memory cap set): 1152 (1280 did not).")
