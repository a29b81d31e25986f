"""One job's rank traces read where the files are, on a Ray cluster: one task per rank,
each reading and accounting its trace (engine.traces.sets.rank_row) on a node, the rows
merged here into the same set view as the local path. A trace path the workers cannot read
is shipped to them once (ray.put of the file's bytes); a task that fails or whose worker
dies is that rank's one line in `failed_ranks`, the rest still reported."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Callable

from engine.cluster.ray_env import ray_installed, ray_problem, validate_ray_address
from engine.traces.sets import finish_set

# The engine package, shipped to the nodes with each job (as the sweeps do).
ENGINE_DIR = Path(__file__).resolve().parents[1]
RANK_TASK_CPUS = 1


def _read_rank(label: str, path: str, data: bytes | None) -> dict:
    """On a node: one rank's row from the path, or from the shipped bytes."""
    from engine.traces.sets import rank_row  # on the node: the shipped engine package

    if data is not None:
        return rank_row(label, io.BytesIO(data))
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is not readable on this node")
    return rank_row(label, Path(path))


def analyze_set_on_ray(members: list[tuple[str, Path]], address: str,
                       on_progress: Callable[[str], None] | None = None) -> dict:
    """The set view of `members` read on the Ray cluster at `address` ('auto': the one
    this machine joined). ValueError naming the address when Ray is missing or the cluster
    does not answer."""
    address = validate_ray_address(address)
    if not ray_installed():
        raise ValueError("--ray: Ray is not installed here: pip install -r "
                         "requirements-ray.txt (or analyse the set without --ray)")
    problem = ray_problem(address)  # ray.init retries for minutes against a wrong port
    if problem:
        raise ValueError(f"--ray {address}: {problem}")
    import ray  # late: an optional extra

    say = on_progress or (lambda _text: None)
    ray.init(address=address, log_to_driver=False, ignore_reinit_error=True,
             runtime_env={"py_modules": [str(ENGINE_DIR)],
                          "excludes": ["__pycache__", "*.pyc"]})
    try:
        remote = ray.remote(num_cpus=RANK_TASK_CPUS, max_retries=0)(_read_rank)
        tasks = {label: (path, remote.remote(label, str(path), None))
                 for label, path in members}
        rows, failed = [], []
        for label, (path, ref) in tasks.items():
            row, error = _collect(ray, remote, label, path, ref)
            if row is not None:
                rows.append(row)
                say(f"rank trace {label}: read")
            else:
                failed.append({"source": label, "file": str(path), "error": error})
                say(f"rank trace {label}: {error}")
    finally:
        ray.shutdown()
    paths = {label: str(path) for label, path in members}
    result = finish_set(rows, [paths[row["source"]] for row in rows], failed)
    result["analysed_on"] = f"Ray cluster at {address}"
    return result


def _collect(ray, remote, label: str, path: Path, ref) -> tuple[dict | None, str]:
    try:
        return ray.get(ref), ""
    except Exception as exc:  # noqa: BLE001 - a rank's failure is its line, not the set's
        if "is not readable on this node" in str(exc) and path.exists():
            started = time.monotonic()
            shipped = remote.remote(label, str(path), ray.put(path.read_bytes()))
            try:
                return ray.get(shipped), f"shipped in {time.monotonic() - started:.1f} s"
            except Exception as again:  # noqa: BLE001 - as above
                exc = again
        return None, _one_line(exc)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if "WorkerCrashedError" in type(exc).__name__ or "worker died" in text.lower():
        return "the Ray worker reading it died (killed, or out of memory)"
    for marker in ("ValueError: ", "OSError: ", "FileNotFoundError: "):
        if marker in text:
            text = text[text.rindex(marker) + len(marker):]
    return text[:300]
