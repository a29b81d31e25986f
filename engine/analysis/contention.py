"""Was the machine busy? One decision for every run, step and speedup check.

Inputs are telemetry rows (engine.hardware.contention and the NVML fields). A sample is
busy when any of these held over its interval (thresholds and why:
docs/precision-reference.md#contention):

- other processes used at least a quarter of the logical cores and at least half a core
  (a quiet machine's daemons use a few % of one core);
- the hypervisor stole >= 5 % of the CPU time (a neighbouring VM is running);
- another process has a context on the run's GPU (NVML);
- the GPU's clocks were held down by thermal or power limits, or the SM clock was below
  90 % of its maximum while the GPU was busy.

A run (or the steady part of one) is marked busy when at least BUSY_SHARE of its samples
were; then every surface says "measured while the machine was busy (...): throughput
figures are unreliable" instead of stating a speedup from it.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

# The per-sample rule lives beside the probe that measures it (engine.hardware.contention),
# so the peak microbenchmark below this wing can ask it too; the verdict over a set of
# samples and its sentence are here.
from engine.hardware.contention import (  # noqa: E402 - re-exported: one rule
    BUSY_GPU_UTIL_PCT,
    LIMIT_REASONS,
    LOW_CLOCK_FRACTION,
    MIN_OTHERS_CORES,
    OTHERS_SHARE_OF_CORES,
    STEAL_PCT,
    number as _number,
    others_limit_cores,
    sample_causes,
    sample_is_busy,
)

BUSY_SHARE = 0.2
UNRELIABLE = "throughput figures are unreliable"


def _median(rows: list[Mapping[str, Any]], key: str) -> float | None:
    values = [v for v in (_number(row, key) for row in rows) if v is not None]
    return statistics.median(values) if values else None


def assess(rows: Iterable[Mapping[str, Any]], cores: int) -> dict[str, Any]:
    """The contention verdict over a set of samples.

    Returns busy (bool, or None without evidence), busy_share, samples, the medians behind
    it (load, load_per_core, others_cpu_cores, trainer_cpu_pct, steal_pct, gpu_other_procs),
    the causes seen, and `words`: the sentence every surface shows.
    """
    rows = list(rows)
    verdicts = [sample_is_busy(row, cores) for row in rows]
    judged = [v for v in verdicts if v is not None]
    busy_share = sum(judged) / len(judged) if judged else None
    causes = sorted({c for row, v in zip(rows, verdicts) if v for c in sample_causes(row, cores)})
    load_per_core = _median(rows, "load_per_core")
    result = {
        "busy": None if busy_share is None else busy_share >= BUSY_SHARE,
        "busy_share": busy_share, "samples": len(judged), "cores": cores,
        "load": load_per_core * cores if load_per_core is not None else None,
        "load_per_core": load_per_core,
        "others_cpu_cores": _median(rows, "others_cpu_cores"),
        "trainer_cpu_pct": _median(rows, "cpu_pct"),
        "steal_pct": _median(rows, "steal_pct"),
        "gpu_other_procs": _median(rows, "gpu_other_procs"),
        "causes": causes,
    }
    result["words"] = words(result)
    return result


def _evidence(result: Mapping[str, Any]) -> str:
    parts = []
    cores = result.get("cores") or 1
    if result.get("load") is not None:
        parts.append(f"load {result['load']:.1f} on {cores} core{'s' if cores != 1 else ''}")
    if result.get("others_cpu_cores") is not None:
        parts.append(f"other processes used {result['others_cpu_cores']:.1f} cores")
    if result.get("trainer_cpu_pct") is not None:
        parts.append(f"trainer got {result['trainer_cpu_pct']:.0f} % of a core")
    if result.get("steal_pct"):
        parts.append(f"steal {result['steal_pct']:.0f} %")
    if result.get("gpu_other_procs"):
        parts.append(f"{result['gpu_other_procs']:.0f} other process(es) on the GPU")
    if "GPU clocks limited" in (result.get("causes") or ()):
        parts.append("GPU clocks limited by power/thermal")
    if "low SM clock" in (result.get("causes") or ()):
        parts.append("SM clock below 90 % of max")
    return ", ".join(parts)


def words(result: Mapping[str, Any]) -> str:
    """'measured while the machine was busy (load 6.2 on 2 cores, ...): throughput figures
    are unreliable', 'the machine was quiet (...)', or that nothing was measured."""
    busy = result.get("busy")
    if busy is None:
        return "machine load not measured"
    evidence = _evidence(result)
    share = result.get("busy_share") or 0.0
    if busy:
        return (f"measured while the machine was busy ({evidence}; {share * 100:.0f} % of "
                f"samples): "
                f"{UNRELIABLE}")
    return f"the machine was quiet during the measurement ({evidence})"


def is_busy(summary_contention: Mapping[str, Any] | None) -> bool:
    """True for a stored contention verdict that says busy (missing: not busy)."""
    return bool(summary_contention and summary_contention.get("busy"))
