"""Shared by the benchmarks: machine facts, medians with their spread, the table and the
one-line JSON result.

Why ratios and medians: the machines this runs on are shared and noisy (a 2-core CI box
with other test suites on it). An absolute time says more about the neighbours than
about the code; two things measured alternately in one process, round after round,
share the neighbours, and the median of the per-round ratios shrugs off a round that a
neighbour spoiled.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # `python bench/x.py` imports this checkout's engine
    sys.path.insert(0, str(REPO_ROOT))


def machine_info() -> dict[str, Any]:
    """Facts that explain a number: cores, load when the benchmark started, versions."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux/macOS
        load = None
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15_min": load,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    return info


def spread(values: Iterable[float]) -> dict[str, Any]:
    """median / min / max / n of the finite values (None fields when there are none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals)}


def percentile(values: Sequence[float], q: float) -> float | None:
    vals = sorted(float(v) for v in values)
    if not vals:
        return None
    index = min(len(vals) - 1, max(0, math.ceil(q / 100.0 * len(vals)) - 1))
    return vals[index]


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.{digits}g}"
    return str(value)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A plain fixed-width table (readable in a terminal and in a CI log)."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def json_safe(value: Any) -> Any:
    """NaN/inf -> None so the line is strict JSON (json.loads of other tools accepts it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            return json_safe(value.item())
        except (TypeError, ValueError):
            return str(value)
    return value


def emit_json(result: dict[str, Any]) -> None:
    """The last stdout line: one JSON object (the CLI's `--json` contract)."""
    sys.stdout.flush()
    print(json.dumps(json_safe(result), allow_nan=False), flush=True)


class Stopwatch:
    """`with Stopwatch() as sw: ...; sw.s` -> seconds (perf_counter)."""

    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        self.s = float("nan")
        return self

    def __exit__(self, *_exc) -> None:
        self.s = time.perf_counter() - self.start


def subprocess_env(home: Path | None = None, **extra: str) -> dict[str, str]:
    """os.environ plus this checkout on PYTHONPATH (and the data directory, when given)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if home is not None:
        env["PRECISION_LAB_HOME"] = str(home)
    env.update(extra)
    return env
