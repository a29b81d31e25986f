"""Was the machine busy? One decision for every run, step and speedup check.

Inputs are telemetry rows (engine.hardware.contention and the NVML fields). A sample is
busy when any of these held over its interval (thresholds and why:
docs/precision-reference.md#contention):

- other processes (everything outside the trainer's own process tree) used at least a
  quarter of the logical cores and at least half a core (a quiet machine's daemons use a
  few % of one core); the load average is no evidence: it counts the trainer's threads;
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
from engine.hardware.contention import (  # noqa: F401 - re-exported: one rule
    BUSY_GPU_UTIL_PCT,
    LIMIT_REASONS,
    LOW_CLOCK_FRACTION,
    MIN_OTHERS_CORES,
    OTHERS_SHARE_OF_CORES,
    STEAL_PCT,
    others_limit_cores,
    sample_causes,
    sample_is_busy,
)
from engine.hardware.contention import (
    number as _number,
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
        "tipped": _tipped(rows, verdicts, cores),
        # what the trainer got while it was busy: the overall median hides the squeeze
        "trainer_cpu_pct_busy": _median([r for r, v in zip(rows, verdicts) if v], "cpu_pct"),
    }
    result["words"] = words(result)
    return result


# Per cause: the figure that shows it, from the samples where it held.
_CAUSE_FIGURE = {"other processes": "others_cpu_cores", "steal": "steal_pct",
                 "other GPU processes": "gpu_other_procs", "GPU clocks limited": None,
                 "low SM clock": "sm_clock_mhz"}


def _tipped(rows: list[Mapping[str, Any]], verdicts: list[bool | None],
            cores: int) -> list[dict[str, Any]]:
    """What made the busy samples busy: per cause, the share of the judged samples where it
    held and the median of its figure over those samples (not over all samples: a burst
    in 29 % of them is invisible in an overall median of 0.1 cores)."""
    judged = sum(v is not None for v in verdicts)
    tipped = []
    for cause, key in _CAUSE_FIGURE.items():
        held = [row for row, v in zip(rows, verdicts) if v and cause in sample_causes(row, cores)]
        if held and judged:
            tipped.append({"cause": cause, "share": len(held) / judged,
                           "value": _median(held, key) if key else None})
    return sorted(tipped, key=lambda entry: -entry["share"])


def _cause_words(entry: Mapping[str, Any], cores: int) -> str:
    value, share = entry.get("value"), f"in {entry['share'] * 100:.0f} % of samples"
    cause = entry["cause"]
    if cause == "other processes" and value is not None:
        return f"other processes used {value:.1f} of {cores} cores {share}"
    if cause == "steal" and value is not None:
        return f"the hypervisor took {value:.0f} % of the CPU time (steal) {share}"
    if cause == "other GPU processes" and value is not None:
        return f"{value:.0f} other process(es) on the GPU {share}"
    if cause == "GPU clocks limited":
        return f"GPU clocks limited by power/thermal {share}"
    if cause == "low SM clock":
        return f"SM clock below 90 % of max while busy {share}"
    return f"{cause} {share}"


def _evidence(result: Mapping[str, Any]) -> str:
    """The medians over every sample. The load average is left out: it counts the
    trainer's own threads (a trainer on 2 threads alone reads load 2.0 on 2 cores)."""
    parts = []
    cores = result.get("cores") or 1
    if result.get("others_cpu_cores") is not None:
        parts.append(f"other processes used {result['others_cpu_cores']:.1f} of {cores} "
                     f"core{'s' if cores != 1 else ''}")
    if result.get("steal_pct"):
        parts.append(f"steal {result['steal_pct']:.0f} %")
    if result.get("trainer_cpu_pct") is not None:
        parts.append(f"trainer got {result['trainer_cpu_pct']:.0f} % of a core")
    if result.get("gpu_other_procs"):
        parts.append(f"{result['gpu_other_procs']:.0f} other process(es) on the GPU")
    if "GPU clocks limited" in (result.get("causes") or ()):
        parts.append("GPU clocks limited by power/thermal")
    if "low SM clock" in (result.get("causes") or ()):
        parts.append("SM clock below 90 % of max")
    return ", ".join(parts)


def words(result: Mapping[str, Any]) -> str:
    """'measured while the machine was busy (other processes used 1.4 of 2 cores in 29 % of
    samples; the trainer got 120 % of a core): throughput figures are unreliable', 'the
    machine was quiet during the measurement (...)', or that nothing was measured. A busy
    sentence names what tipped it: each cause with its figure over the samples it held in."""
    busy = result.get("busy")
    if busy is None:
        return "machine load not measured"
    if busy:
        cores = result.get("cores") or 1
        causes = [_cause_words(entry, cores) for entry in result.get("tipped") or []]
        trainer = result.get("trainer_cpu_pct_busy")
        context = (f"; the trainer got {trainer:.0f} % of a core in those samples"
                   if trainer is not None else "")
        if not causes:  # a verdict stored before the causes were kept: its medians
            share = result.get("busy_share") or 0.0
            causes = [f"{_evidence(result)}; {share * 100:.0f} % of samples"]
            context = ""
        return f"measured while the machine was busy ({', '.join(causes)}{context}): {UNRELIABLE}"
    return f"the machine was quiet during the measurement ({_evidence(result)})"


def is_busy(summary_contention: Mapping[str, Any] | None) -> bool:
    """True for a stored contention verdict that says busy (missing: not busy)."""
    return bool(summary_contention and summary_contention.get("busy"))
