"""One job's rank traces read in parallel worker processes on this machine, as many at a
time as memory allows: each rank is `python -m engine.traces.set_workers LABEL PATH` in its
own process (a crash, a kill or an unreadable file is that rank's one line; the rest are
still reported), its row back as JSON on stdout.

Why processes: reading and accounting a trace is CPU-bound Python (the GIL), and one 1 GiB
trace peaks near 0.5 GiB, so a set of large traces is bounded by memory, not cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.traces.sets import finish_set, rank_row

# Peak memory of one rank's analysis per byte of decompressed trace (measured on the 1 GiB
# V100 trace: 510 MiB), and a gzip file's usual ratio to its text: a bound, not a figure.
PEAK_PER_TEXT_BYTE = 0.5
GZIP_RATIO = 10
WORKER_TIMEOUT_S = 1800
# Below this much trace text in all, one process reads the set: a worker's start (Python,
# the engine's imports) costs more than the parallel reading gains.
PARALLEL_FROM_TEXT_BYTES = 256 << 20


def workers_for(paths: list[Path], cores: int | None = None,
                available_bytes: int | None = None) -> int:
    """How many ranks to read at once: the cores, the ranks, and memory for the largest
    trace's peak each (a quarter of the available memory left for everything else)."""
    import psutil  # the app's dependency; only a parallel read asks

    cores = cores or os.cpu_count() or 1
    available = available_bytes if available_bytes is not None \
        else psutil.virtual_memory().available
    sizes = [p.stat().st_size * (GZIP_RATIO if p.suffix == ".gz" else 1) for p in paths]
    if sum(sizes) < PARALLEL_FROM_TEXT_BYTES:
        return 1
    largest = max(sizes, default=0)
    per_rank = max(1, int(largest * PEAK_PER_TEXT_BYTE))
    by_memory = max(1, int(available * 0.75) // per_rank)
    return max(1, min(cores, len(paths), by_memory))


def _start(label: str, path: Path, out_dir: Path) -> tuple[subprocess.Popen, Path, Any]:
    out = out_dir / f"{len(list(out_dir.iterdir()))}.json"
    handle = out.open("wb")
    process = subprocess.Popen([sys.executable, "-m", "engine.traces.set_workers", label,
                                str(path)], stdout=handle, stderr=subprocess.PIPE,
                               start_new_session=True)
    return process, out, handle


def _finished(label: str, path: Path, process: subprocess.Popen, out: Path, handle: Any,
              rows: list, failed: list) -> None:
    handle.close()
    error = process.stderr.read().decode(errors="replace").strip() if process.stderr else ""
    if process.returncode == 0:
        rows.append(json.loads(out.read_text()))
        return
    reason = (f"the worker was killed by signal {-process.returncode}"
              if process.returncode < 0 else (error.splitlines() or ["failed"])[-1])
    failed.append({"source": label, "file": str(path), "error": reason[:300]})


def rank_rows_parallel(members: list[tuple[str, Path]], workers: int
                       ) -> tuple[list[dict], list[dict]]:
    """(rows, failed) of the ranks read `workers` at a time in their own processes."""
    rows: list[dict] = []
    failed: list[dict] = []
    pending = list(members)
    running: list[tuple[str, Path, subprocess.Popen, Path, Any, float]] = []
    with tempfile.TemporaryDirectory(prefix="precision-lab-set-") as folder:
        out_dir = Path(folder)
        while pending or running:
            while pending and len(running) < workers:
                label, path = pending.pop(0)
                running.append((label, path, *_start(label, path, out_dir), time.monotonic()))
            time.sleep(0.05)
            for entry in list(running):
                label, path, process, out, handle, started = entry
                if process.poll() is None and time.monotonic() - started < WORKER_TIMEOUT_S:
                    continue
                if process.poll() is None:
                    process.kill()
                    process.wait()
                _finished(label, path, process, out, handle, rows, failed)
                running.remove(entry)
    return rows, failed


def analyze_set_parallel(members: list[tuple[str, Path]], workers: int) -> dict:
    """engine.traces.sets.analyze_set's view, the ranks read `workers` at a time in their
    own processes; a rank that fails (or whose worker is killed) is one line in
    `failed_ranks`, the rest still reported."""
    rows, failed = rank_rows_parallel(members, workers)
    paths = {label: str(source) for label, source in members}
    return finish_set(rows, [paths[row["source"]] for row in rows], failed)


def main(argv: list[str]) -> int:
    """The worker: one rank's row as JSON on stdout; a failure's message on stderr."""
    label, path = argv
    try:
        row = rank_row(label, Path(path))
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    sys.stdout.write(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
