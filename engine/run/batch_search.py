"""Find the largest batch size that fits: a bounded search of short training probes.

The search runs in its own subprocess (`python -m engine.run.batch_search CONFIG_JSON DEVICE
MAX_BATCH MAX_PROBES`) so an
OOM, or the memory cap of a CPU run, never touches the caller (the Streamlit server or
the CLI). Inside it, each probe builds the model and optimizer afresh and runs two full
steps (the optimizer state is allocated at the first one); OOM is caught and the
memory released before the next probe, so torch is imported only once.

Protocol: one JSON object per line on stdout: {"probe": N, "fits": bool, "reason": str}
for each probe, then {"result": {...}} last.

The Live page does not wait for it: `start_batch_search` starts
`python -m engine.run.batch_search --background RUN_ID MAX_BATCH MAX_PROBES` in a session
of its own, which runs the same search, records each probe in the run directory's
`batch_search.json` (read back by `batch_search_progress`) and the result in the run
summary; its output and any traceback go to `batch_search.log` beside it. It ends by
itself: the probes are bounded, and it stops at the next probe once its run is deleted.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gc
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from engine.config import MAX_BATCH_SIZE, RunConfig
from engine.proc import (
    PROJECT_ROOT,
    child_env,
    child_setup,
    is_alive,
    open_private_log,
    process_create_time,
    reap_when_done,
)
from engine.store import RunNotFound, Store

PROBE_STEPS = 2
DEFAULT_MAX_PROBES = 10


def next_probe(good: int | None, bad: int | None, start: int, max_batch: int) -> int | None:
    """The next batch size to try, or None when the answer is pinned down.

    Doubling from `start` until the first OOM (halving if `start` itself fails), then
    bisection between the largest size that fit and the smallest that did not.
    """
    if good is None and bad is None:
        return start
    if good is None:
        return None if bad <= 1 else max(1, bad // 2)
    if bad is None:
        return None if good >= max_batch else min(max_batch, good * 2)
    if bad - good <= max(1, good // 16):  # within ~6 %: precise enough to plan with
        return None
    return (good + bad) // 2


def probe_fits(cfg: RunConfig, device_key: str) -> tuple[bool, str]:
    """Two real training steps at cfg.batch_size; (False, reason) on out-of-memory."""
    import torch

    from engine.training.loop import (  # imports torch: only the probe process trains
        Trainer,
        resolve_torch_device,
    )

    trainer = None
    try:
        trainer = Trainer(cfg, resolve_torch_device(device_key))
        for step in range(1, PROBE_STEPS + 1):
            loss, _ = trainer.step(step)
        float(loss.item())  # wait for the device: an asynchronous OOM surfaces here
        return True, "fits"
    except (torch.OutOfMemoryError, MemoryError) as exc:
        return False, _first_line(exc)
    except RuntimeError as exc:
        if "can't allocate memory" in str(exc) or "out of memory" in str(exc).lower():
            return False, _first_line(exc)
        raise
    finally:
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def search_in_process(cfg: RunConfig, device_key: str, max_batch: int,
                      max_probes: int, report: Callable[[dict], None]) -> dict:
    good = bad = None
    probes = []
    for _ in range(max_probes):
        size = next_probe(good, bad, cfg.batch_size, max_batch)
        if size is None:
            break
        fits, reason = probe_fits(dataclasses.replace(cfg, batch_size=size, profile=False),
                                  device_key)
        probes.append({"batch_size": size, "fits": fits, "reason": reason})
        report({"probe": size, "fits": fits, "reason": reason})
        if fits:
            good = size
        else:
            bad = size
    return {"max_batch_fit": good, "first_oom_batch": bad, "probes": probes,
            "complete": next_probe(good, bad, cfg.batch_size, max_batch) is None,
            "max_batch_searched": max_batch}


def find_max_batch(cfg: RunConfig, device_key: str, max_batch: int = 4096,
                   max_probes: int = DEFAULT_MAX_PROBES,
                   progress: Callable[[dict], None] | None = None,
                   cwd: Path | None = None) -> dict:
    """Run the search in a subprocess (memory-capped like the run on CPU) and return it."""
    max_batch = max(1, min(int(max_batch), MAX_BATCH_SIZE))
    if cfg.nprocs > 1:
        # Probes train one process: the answer is the batch per process (each DDP rank
        # holds a full replica; FSDP2 shards, so its ranks fit at least this much).
        cfg = dataclasses.replace(cfg, nprocs=1, sharding="ddp", comm_hook="none")
    args = [sys.executable, "-m", "engine.run.batch_search", cfg.to_json(), device_key,
            str(max_batch), str(max_probes)]
    # The probe dies with this process (a stopped search leaves no trainer behind) and,
    # on a CPU, is capped like the run.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(cwd or PROJECT_ROOT), stdin=subprocess.DEVNULL,
                            preexec_fn=child_setup(os.getpid(), cfg.memory_cap_mb
                                                   if device_key == "cpu" else 0))
    result, probes = None, []
    try:
        for line in proc.stdout:
            message = _parse_line(line)
            if message is None:
                continue
            if "result" in message:
                result = message["result"]
            else:
                probes.append(message)
                if progress:
                    progress(message)  # may raise to end the search (its run was deleted)
        stderr = proc.stderr.read()
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    if result is None:
        # Killed mid-probe (e.g. by the kernel's OOM killer): the probe in flight did not fit.
        good = max((p["probe"] for p in probes if p["fits"]), default=None)
        result = {"max_batch_fit": good, "first_oom_batch": None, "complete": False,
                  "probes": [{"batch_size": p["probe"], "fits": p["fits"], "reason": p["reason"]}
                             for p in probes],
                  "error": f"search process exited with code {code}: "
                           f"{(stderr.strip().splitlines() or [''])[-1][:300]}"}
    return result


def _parse_line(line: str) -> dict | None:
    try:
        message = json.loads(line)
    except json.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None


# ---------------------------------------------------------------------------------------
# in the background, for the Live page

SEARCH_STATE = "batch_search.json"  # in the run's directory: state, probes so far, result
SEARCH_LOG = "batch_search.log"  # the background process's output and tracebacks
START_TIMEOUT_S = 60.0  # a search recorded as starting, with no process after this: failed
RUNNING, DONE, FAILED = "running", "done", "failed"


class SearchAbandoned(Exception):
    """The run was deleted while its search ran: stop probing."""


def start_batch_search(store: Store, run_id: str, max_batch: int = 4096,
                       max_probes: int = DEFAULT_MAX_PROBES) -> dict[str, Any]:
    """Start the search for `run_id` in a background process and return its state (the
    running one's, when a search for this run is still going). RunNotFound when the run
    does not exist."""
    current = batch_search_progress(store, run_id)
    if current and current["state"] == RUNNING:
        return current
    run = store.get_run(run_id)
    run_dir = store.run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    state_path = run_dir / SEARCH_STATE
    _write_state(state_path, {
        "state": RUNNING, "started_at": time.time(), "pid": None, "probes": [],
        "start_batch": run.config.batch_size, "max_batch": max_batch,
        "max_probes": max_probes,
        # The probes run under the cap on a CPU only (find_max_batch), as the run did.
        "memory_cap_mb": run.config.memory_cap_mb if run.device_key == "cpu" else 0,
        "device_key": run.device_key})
    with open_private_log(run_dir / SEARCH_LOG) as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.run.batch_search", "--background", run_id,
             str(max_batch), str(max_probes)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=str(PROJECT_ROOT), env=child_env(store.home), start_new_session=True,
            close_fds=True)
    reap_when_done(proc, "batch-search")
    return _update_state(state_path, pid=proc.pid,
                         pid_create_time=process_create_time(proc.pid)) or {}


def batch_search_progress(store: Store, run_id: str) -> dict[str, Any] | None:
    """The run's latest search: {"state": running|done|failed, "probes": [...], "result":
    {...} when done, "error": one line when failed, ...}; None when none was started.
    A search whose process is gone without a result reads as failed."""
    state = _read_state(store.run_dir(run_id) / SEARCH_STATE)
    if state is None or state.get("state") != RUNNING:
        return state
    pid = state.get("pid")
    if pid and not is_alive(pid, state.get("pid_create_time")):
        return {**state, "state": FAILED,
                "error": f"the search process ended without a result; see {SEARCH_LOG}"}
    if not pid and time.time() - float(state.get("started_at") or 0) > START_TIMEOUT_S:
        return {**state, "state": FAILED, "error": "the search process never started"}
    return state


def search_outcome(state: dict[str, Any]) -> str:
    """One sentence on a finished search: the largest batch, what did not fit, the cap."""
    result = state.get("result") or {}
    fit, oom = result.get("max_batch_fit"), result.get("first_oom_batch")
    cap = state.get("memory_cap_mb")
    where = (f"under this run's memory cap of {cap} MiB" if cap
             else f"on {state.get('device_key') or 'this device'} (no memory cap set)")
    if not fit:
        return f"No batch size fits {where}: even batch {oom or 1} did not."
    text = f"Largest batch that fits {where}: {fit}"
    if oom:
        text += f" ({oom} did not)"
    elif fit >= int(result.get("max_batch_searched") or state.get("max_batch") or fit):
        text += " (the largest searched)"
    if not result.get("complete"):
        text += "; search incomplete (probe limit reached): " + _open_range(fit, oom, result, state)
    return text + "."


def _open_range(fit: int, oom: int | None, result: dict[str, Any], state: dict[str, Any]) -> str:
    """What an incomplete search left untried: between the largest fit and the first OOM,
    or above the largest fit up to the search's limit."""
    if oom:
        if oom - fit <= 1:
            return f"no batch lies between {fit} and {oom}, so the answer is {fit}"
        return f"{fit + 1}-{oom - 1} not tried, the answer lies there or is {fit}"
    limit = int(result.get("max_batch_searched") or state.get("max_batch") or fit)
    return (f"{fit + 1}-{limit} not tried, a larger batch may fit" if limit > fit
            else f"{fit} is the search's limit, so nothing larger was to be tried")


def run_background(run_id: str, max_batch: int, max_probes: int) -> int:
    """The body of `--background`: search, record each probe, then the result."""
    store = Store()  # the data directory from the environment (child_env)
    state_path = store.run_dir(run_id) / SEARCH_STATE
    _update_state(state_path, pid=os.getpid(), pid_create_time=process_create_time(os.getpid()))
    try:
        run = store.get_run(run_id)

        def record(message: dict) -> None:
            _require_run(store, run_id)
            probe = {"batch_size": message["probe"], "fits": message["fits"],
                     "reason": message["reason"]}
            if _update_state(state_path, add_probe=probe) is None:
                raise SearchAbandoned(run_id)

        result = find_max_batch(run.config, run.device_key, max_batch, max_probes, record)
        _require_run(store, run_id)
        store.merge_summary(run_id, {"max_batch_fit": result["max_batch_fit"],
                                     "max_batch_search": result})
        _update_state(state_path, state=DONE, result=result, finished_at=time.time())
        return 0
    except (SearchAbandoned, RunNotFound):
        print(f"run {run_id} was deleted: search stopped", flush=True)
        return 0
    except Exception as exc:  # noqa: BLE001 - recorded as one line, traceback to the log
        traceback.print_exc()
        _update_state(state_path, state=FAILED, finished_at=time.time(),
                      error=f"{type(exc).__name__}: {_first_line(exc)}")
        return 1


def _require_run(store: Store, run_id: str) -> None:
    store.get_run(run_id)  # RunNotFound once deleted


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    os.replace(tmp, path)  # readers see the old state or the new, never half of one


def _update_state(path: Path, add_probe: dict | None = None,
                  **changes: Any) -> dict[str, Any] | None:
    """Read-modify-write under a lock (the page's start and the search both write);
    None when the run directory is gone (the run was deleted)."""
    try:
        lock = os.open(path.with_name(f".{path.name}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _read_state(path)
        if state is None:
            return None
        state.update(changes)
        if add_probe is not None:
            state["probes"] = [*state.get("probes", []), add_probe]
        try:
            _write_state(path, state)
        except FileNotFoundError:
            return None
        return state
    finally:
        os.close(lock)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--background":
        return run_background(argv[1], int(argv[2]), int(argv[3]))
    cfg = RunConfig.from_json(argv[0])
    device_key, max_batch, max_probes = argv[1], int(argv[2]), int(argv[3])

    def report(message: dict) -> None:
        print(json.dumps(message), flush=True)

    result = search_in_process(cfg, device_key, max_batch, max_probes, report)
    report({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
