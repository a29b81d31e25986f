"""The rank processes of a multi-process run, on record in runs/<id>/ranks/: one file per
rank process (pid + create time, so stop and reconcile can signal ranks that torchrun
started in sessions of their own), each failed rank's own error, and the fault injection
the fault tests use. Torch-free: the supervisor, the launcher and each rank use it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil

from engine.schema import RANKS_DIRNAME

FAULT_ENV = "PRECISION_LAB_INJECT_FAULT"  # "rank=1,step=3": raise there (fault tests)


def ranks_dir(run_dir: Path) -> Path:
    return Path(run_dir) / RANKS_DIRNAME


def record_rank_process(run_dir: Path, pid: int, create_time: float | None,
                        rank: int | None = None) -> None:
    """Remember a rank process (written atomically: readers never see half a file)."""
    folder = ranks_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pid}.json"
    if rank is None and path.exists():
        return  # the rank's own record (with its rank number) wins
    write_json(path, {"pid": pid, "create_time": create_time, "rank": rank})


def recorded_rank_processes(run_dir: Path) -> list[dict[str, Any]]:
    folder = ranks_dir(run_dir)
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.stem.isdigit():
            record = read_json(path)
            if record and isinstance(record.get("pid"), int):
                records.append(record)
    return records


def live_rank_pids(run_dir: Path) -> list[int]:
    """Recorded rank processes still running (same create time: not a reused pid)."""
    alive = []
    for record in recorded_rank_processes(run_dir):
        try:
            proc = psutil.Process(record["pid"])
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            expected = record.get("create_time")
            if expected is not None and abs(proc.create_time() - expected) > 1.0:
                continue
            alive.append(record["pid"])
        except (psutil.Error, OSError):
            continue
    return alive


def signal_rank_processes(run_dir: Path, sig: int) -> int:
    """Send `sig` to every live recorded rank and its own session's group; how many."""
    pids = live_rank_pids(run_dir)
    for pid in pids:
        try:
            # torchrun made each rank a session leader: its group holds its own children
            # (e.g. torch.compile workers) and nothing else.
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return len(pids)


def wait_ranks_gone(run_dir: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while live_rank_pids(run_dir):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True



def write_rank_error(run_dir: Path, rank: int, status: str, reason: str,
                     step: int | None) -> None:
    write_json(ranks_dir(run_dir) / f"rank{rank}.error.json",
                {"rank": rank, "status": status, "reason": reason[:2000], "step": step,
                 "time_s": time.time()})


def read_rank_errors(run_dir: Path) -> dict[int, dict[str, Any]]:
    errors = {}
    for path in ranks_dir(run_dir).glob("rank*.error.json"):
        record = read_json(path)
        if record and isinstance(record.get("rank"), int) and record.get("reason"):
            errors[record["rank"]] = record
    return errors


def injected_fault(rank: int) -> int | None:
    """The step at which this rank must raise, from PRECISION_LAB_INJECT_FAULT
    ("rank=1,step=3"), for fault tests of the real process tree; None normally."""
    spec = os.environ.get(FAULT_ENV, "")
    try:
        fields = dict(part.split("=", 1) for part in spec.split(",") if part)
        return int(fields["step"]) if int(fields["rank"]) == rank else None
    except (KeyError, ValueError):
        return None



def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
