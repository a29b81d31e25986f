"""How much of the machine the trainer had: host CPU contention measured at run time.

A throughput figure means something only if the trainer had the machine to itself. Per
sample (the telemetry thread, 2 Hz) this reads, over the interval since the last sample:

- cpu_pct: CPU time of the trainer's process tree (its threads, DataLoader and compile
  workers, children that exited) / wall time, 100 = one core; None on the first sample
  and on intervals too short to be meaningful (a 0.1 ms interval with one 10 ms
  scheduler tick would read 10000 %);
- others_cpu_cores: CPU used by every process outside that tree, in cores' worth: the
  machine's busy time from /proc/stat minus the tree's own (a process that starts and
  exits between two samples is counted, which a sum over the processes alive at each
  sample would miss);
- steal_pct: time the hypervisor ran other guests on this VM's CPUs (/proc/stat steal);
- load_per_core: the 1-minute load average over logical cores (lags, and counts the
  trainer's own threads: context only, never a cause).

What counts as busy, per sample, is decided here (`sample_is_busy`, thresholds and why:
docs/precision-reference.md#contention); the verdict over a run's samples and its sentence
are engine.analysis.contention's.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

# Below this interval a CPU-share sample is mostly the scheduler tick's rounding.
MIN_SAMPLE_INTERVAL_S = 0.2
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def logical_cores() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def read_proc_stat(path: str = "/proc/stat") -> dict[str, float] | None:
    """Machine-wide CPU seconds: busy (everything but idle and iowait), steal, total."""
    try:
        with open(path) as handle:
            first = handle.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is in user)
    values = [float(v) / _CLOCK_TICKS for v in first[1:]] + [0.0] * 10
    user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
    busy = user + nice + system + irq + softirq
    return {"busy_s": busy, "steal_s": steal, "total_s": busy + idle + iowait + steal}


def _proc_cpu_s(pid: int, reaped_children: bool = False) -> float | None:
    """utime + stime of one process from /proc/<pid>/stat (fields 14 and 15, all its
    threads), plus cutime + cstime (16, 17: its children that exited and were waited for)
    with `reaped_children`."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name in parentheses may hold spaces
    try:
        ticks = float(fields[11]) + float(fields[12])
        if reaped_children:
            ticks += float(fields[13]) + float(fields[14])
        return ticks / _CLOCK_TICKS
    except (IndexError, ValueError):
        return None


def _child_pids(pid: int) -> list[int]:
    """Direct children of the process, started by any of its threads."""
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                children.extend(int(token) for token in handle.read().split())
        except (OSError, ValueError):
            continue
    return children


def descendant_pids(pid: int, limit: int = 4096) -> list[int]:
    """Every live descendant of `pid` (children, their children, ...): the trainer's own
    process tree (DataLoader workers, compile workers, anything they start)."""
    found, frontier = [], [pid]
    while frontier and len(found) < limit:
        children = [child for parent in frontier for child in _child_pids(parent)]
        found.extend(children)
        frontier = children
    return found[:limit]


class ContentionProbe:
    """Per-interval CPU shares of the trainer (pid, default this process) and the rest.

    Reads /proc directly, a handful of files per sample: psutil's children() scans every
    process on the machine, and each of those reads hands the GIL back to a busy training
    thread, so a 2 Hz sampler could take most of a second per sample.
    """

    def __init__(self, pid: int | None = None):
        self.cores = logical_cores()
        self.pid = pid or os.getpid()
        self.process = None
        try:
            import psutil

            self.process = psutil.Process(self.pid)
        except Exception:  # psutil missing or the process gone: rss reads None
            self.process = None
        self._last: tuple[float, float | None, dict[str, float] | None] = (
            time.monotonic(), self._family_cpu_s(), read_proc_stat())

    def _family_cpu_s(self) -> float | None:
        """CPU seconds of the trainer's whole process tree: its threads, every live
        descendant, and the descendants that already exited (their time moves into their
        parent's reaped-children counters when they are waited for, so it never reads as
        another process's). The load average cannot tell these apart: it counts the
        trainer's own threads as load."""
        own = _proc_cpu_s(self.pid, reaped_children=True)
        if own is None:
            return None
        return own + sum(_proc_cpu_s(child, reaped_children=True) or 0.0
                         for child in descendant_pids(self.pid))

    def sample(self) -> dict[str, Any]:
        now_s, family_s, stat = time.monotonic(), self._family_cpu_s(), read_proc_stat()
        last_s, last_family_s, last_stat = self._last
        wall_s = now_s - last_s
        row: dict[str, Any] = {"cpu_pct": None, "others_cpu_cores": None, "steal_pct": None,
                               "load_per_core": _load_per_core(self.cores)}
        if wall_s < MIN_SAMPLE_INTERVAL_S:
            return row  # keep the old reference point: the next sample spans more time
        self._last = (now_s, family_s, stat)
        ours_s = None
        if family_s is not None and last_family_s is not None:
            # A child that exited takes its CPU time with it: never a negative share.
            ours_s = max(0.0, family_s - last_family_s)
            row["cpu_pct"] = min(100.0 * self.cores, ours_s / wall_s * 100.0)
        if stat is not None and last_stat is not None:
            total_s = stat["total_s"] - last_stat["total_s"]
            busy_s = stat["busy_s"] - last_stat["busy_s"]
            if total_s > 0:
                stolen_s = stat["steal_s"] - last_stat["steal_s"]
                row["steal_pct"] = max(0.0, stolen_s / total_s * 100)
                if ours_s is not None:
                    # busy_s is in CPU seconds over all cores; per wall second = cores used.
                    row["others_cpu_cores"] = min(float(self.cores),
                                                  max(0.0, (busy_s - ours_s) / wall_s))
        return row


def _load_per_core(cores: int) -> float | None:
    try:
        return os.getloadavg()[0] / cores
    except (AttributeError, OSError):
        return None


# ---------------------------------------------------------------------------------------
# the per-sample rule

OTHERS_SHARE_OF_CORES = 0.25
MIN_OTHERS_CORES = 0.5
STEAL_PCT = 5.0
LOW_CLOCK_FRACTION = 0.9
BUSY_GPU_UTIL_PCT = 50.0
# NVML reasons that mean the clocks were lowered by something other than the workload.
LIMIT_REASONS = ("sw power cap", "hw slowdown", "sw thermal", "hw thermal", "hw power brake")


def number(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if value != value else value  # NaN from a pandas frame -> None


def others_limit_cores(cores: int) -> float:
    return max(MIN_OTHERS_CORES, OTHERS_SHARE_OF_CORES * cores)


def sample_causes(row: Mapping[str, Any], cores: int) -> list[str]:
    """Why this one sample was busy (empty: it was not, or nothing was measured)."""
    causes = []
    others = number(row, "others_cpu_cores")
    if others is not None and others >= others_limit_cores(cores):
        causes.append("other processes")
    steal = number(row, "steal_pct")
    if steal is not None and steal >= STEAL_PCT:
        causes.append("steal")
    procs = number(row, "gpu_other_procs")
    if procs:
        causes.append("other GPU processes")
    reasons = row.get("throttle_reasons")
    if isinstance(reasons, str) and any(reason in reasons for reason in LIMIT_REASONS):
        causes.append("GPU clocks limited")
    clock, clock_max = number(row, "sm_clock_mhz"), number(row, "sm_clock_max_mhz")
    util = number(row, "gpu_util_pct")
    if (clock and clock_max and util is not None and util >= BUSY_GPU_UTIL_PCT
            and clock < LOW_CLOCK_FRACTION * clock_max):
        causes.append("low SM clock")
    return causes


def sample_is_busy(row: Mapping[str, Any] | None, cores: int) -> bool | None:
    """True/False for a sample with CPU or GPU evidence; None when it has none."""
    if not row:
        return None
    measured = any(number(row, key) is not None
                   for key in ("others_cpu_cores", "steal_pct", "gpu_other_procs", "sm_clock_mhz"))
    if not measured:
        return None
    return bool(sample_causes(row, cores))
