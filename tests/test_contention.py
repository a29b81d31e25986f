"""The busy-machine guard: real /proc readings with a real competing process, and the one
decision (engine.analysis.contention) on rows as the telemetry sampler writes them."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time

import psutil
import pytest

from bench._hog import cpu_hog
from engine.analysis.contention import BUSY_SHARE, assess, sample_causes, sample_is_busy, words
from engine.hardware.contention import ContentionProbe, logical_cores, read_proc_stat


def _samples(probe: ContentionProbe, seconds: float, interval_s: float = 0.3) -> list[dict]:
    rows, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(interval_s)
        rows.append(probe.sample())
    return rows


def test_first_sample_has_no_cpu_share_and_no_share_exceeds_the_cores():
    probe = ContentionProbe()
    first = probe.sample()
    assert first["cpu_pct"] is None and first["others_cpu_cores"] is None  # no interval yet
    # Many very short intervals with this thread busy: never the "2100 %" of a tick/µs.
    shares = []
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        sum(i * i for i in range(20_000))
        shares.append(probe.sample()["cpu_pct"])
    measured = [s for s in shares if s is not None]
    assert measured, "a 1 s loop must yield at least one interval >= 0.2 s"
    assert max(measured) <= 100.0 * logical_cores() + 1e-9
    assert max(measured) > 30.0  # this thread was spinning


def test_proc_stat_is_read_in_cpu_seconds():
    stat = read_proc_stat()
    assert stat is not None and stat["total_s"] > stat["busy_s"] >= 0 and stat["steal_s"] >= 0


@pytest.mark.slow
def test_a_competing_process_marks_the_samples_busy_with_the_evidence():
    cores = logical_cores()
    # The observed "trainer" is a separate idle process: the hog is this test's child, and
    # a trainer's own children (DataLoader workers) count as the trainer's CPU, not others'.
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        probe = ContentionProbe(pid=trainer.pid)
        with cpu_hog(processes=max(1, cores // 2)) as hogs:
            time.sleep(0.3)
            rows = _samples(probe, 2.0)
            pids = [proc.pid for proc in hogs]
    finally:
        trainer.kill()
        trainer.wait(timeout=10)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in pids), "the hog outlived its context"
    judged = [r for r in rows if r["others_cpu_cores"] is not None]
    assert judged and max(r["others_cpu_cores"] for r in judged) >= 0.7
    verdict = assess(rows, cores)
    assert verdict["busy"] is True and verdict["busy_share"] >= BUSY_SHARE
    assert verdict["words"].startswith("measured while the machine was busy (")
    assert "other processes used" in verdict["words"]
    assert verdict["words"].endswith("throughput figures are unreliable")


def test_gpu_evidence_alone_decides_busy():
    quiet = {"gpu_util_pct": 99.0, "sm_clock_mhz": 1980.0, "sm_clock_max_mhz": 1980.0,
             "throttle_reasons": "", "gpu_other_procs": 0}
    assert sample_is_busy(quiet, 16) is False
    assert sample_causes({**quiet, "gpu_other_procs": 2}, 16) == ["other GPU processes"]
    assert sample_causes({**quiet, "throttle_reasons": "sw power cap"}, 16) == [
        "GPU clocks limited"]
    assert sample_causes({**quiet, "sm_clock_mhz": 1400.0}, 16) == ["low SM clock"]
    # An idle GPU at a low clock is not contention: the clock drops when there is no work.
    assert sample_is_busy({**quiet, "gpu_util_pct": 3.0, "sm_clock_mhz": 345.0}, 16) is False


def test_thresholds_scale_with_the_cores_and_nothing_measured_says_so():
    assert sample_is_busy({"others_cpu_cores": 0.6}, 2) is True
    assert sample_is_busy({"others_cpu_cores": 0.6}, 64) is False  # 1 % of a 64-core host
    assert sample_is_busy({"others_cpu_cores": 16.0}, 64) is True
    assert sample_is_busy({"steal_pct": 12.0, "others_cpu_cores": 0.0}, 8) is True
    assert sample_is_busy({"rss_bytes": 10}, 8) is None
    verdict = assess([{"rss_bytes": 1}], 4)
    assert verdict["busy"] is None and words(verdict) == "machine load not measured"
    quiet = assess([{"others_cpu_cores": 0.05, "cpu_pct": 190.0, "load_per_core": 0.9}] * 4, 2)
    assert quiet["busy"] is False
    # no load average: it counts the trainer's own threads (load 1.8 here is the trainer)
    assert quiet["words"] == ("the machine was quiet during the measurement (other processes "
                              "used 0.1 of 2 cores, trainer got 190 % of a core)")


def test_the_busy_sentence_names_what_tipped_it_not_the_overall_medians():
    """29 % of samples with another process on 1.4 cores: the overall median (0.1 cores)
    reads quiet, so the sentence gives each cause's figure over the samples it held in,
    and leaves out the load average (3.0 on 2 cores here is mostly the trainer's threads)."""
    quiet_row = {"others_cpu_cores": 0.1, "cpu_pct": 185.0, "load_per_core": 1.5,
                 "steal_pct": 0.0}
    hog_row = {"others_cpu_cores": 1.4, "cpu_pct": 60.0, "load_per_core": 1.5, "steal_pct": 0.0}
    rows = [quiet_row] * 71 + [hog_row] * 29
    verdict = assess(rows, 2)
    assert verdict["busy"] is True and verdict["others_cpu_cores"] == pytest.approx(0.1)
    assert verdict["words"] == (
        "measured while the machine was busy (other processes used 1.4 of 2 cores in 29 % of "
        "samples; the trainer got 60 % of a core in those samples): throughput figures are "
        "unreliable")
    assert "load" not in verdict["words"]
    stolen = assess([{**quiet_row, "steal_pct": 12.0}] * 5 + [quiet_row] * 5, 2)
    assert stolen["busy"] is True
    assert stolen["tipped"] == [{"cause": "steal", "share": 0.5, "value": 12.0}]
    assert "the hypervisor took 12 % of the CPU time (steal) in 50 % of samples" in \
        stolen["words"]
    # A verdict stored before the causes were kept still reads (its medians).
    old = {key: value for key, value in verdict.items() if key != "tipped"}
    assert words(old).startswith("measured while the machine was busy (other processes used "
                                 "0.1 of 2 cores")


# The "trainer": a child that starts two spinners, its grandchildren (like compile workers).
# Each spinner stops once its parent is gone (reparented), so none outlives a failed test.
_SPIN_WHILE_PARENT = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
_SPINNERS = ("import os, subprocess, sys, time\n"
             f"procs = [subprocess.Popen([sys.executable, '-c', {_SPIN_WHILE_PARENT!r}])"
             " for _ in range(2)]\n"
             "parent = os.getppid()\n"
             "while os.getppid() == parent:\n    time.sleep(0.2)\n")
_TREE = ("import subprocess, sys, time\n"
         f"child = subprocess.Popen([sys.executable, '-c', {_SPINNERS!r}])\n"
         "time.sleep(60)\n")


def _end_tree(root: subprocess.Popen) -> list[int]:
    tree = psutil.Process(root.pid).children(recursive=True)
    for proc in [*tree, psutil.Process(root.pid)]:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    root.wait(timeout=10)
    psutil.wait_procs(tree, timeout=10)
    return [proc.pid for proc in tree]


@pytest.mark.slow
def test_the_trainers_own_process_tree_is_never_other_processes():
    """A trainer whose grandchildren spin both cores loads the machine to 2.0 by itself: the
    load average says busy, the rule says quiet (the tree is the trainer's CPU); a hog
    outside the tree is other processes, and the sentence says how much."""
    cores = logical_cores()
    before = assess(_samples(ContentionProbe(), 1.5), cores)  # the machine without us
    trainer = subprocess.Popen([sys.executable, "-c", _TREE])
    pids: list[int] = []
    try:
        time.sleep(1.0)  # the spinners start
        tree = psutil.Process(trainer.pid).children(recursive=True)
        assert len(tree) == 3  # the child and its two spinners

        def tree_cpu_s() -> float:
            return sum(sum(proc.cpu_times()[:2]) for proc in tree)

        probe = ContentionProbe(pid=trainer.pid)
        start_s, start_cpu_s = time.monotonic(), tree_cpu_s()
        rows = _samples(probe, 2.5)
        tree_pct = 100.0 * (tree_cpu_s() - start_cpu_s) / (time.monotonic() - start_s)
        measured = [r for r in rows if r["cpu_pct"] is not None]
        # the grandchildren's CPU is the trainer's, whatever else the machine runs
        assert measured and statistics.fmean(r["cpu_pct"] for r in measured) >= 0.7 * tree_pct
        assert tree_pct > 40.0
        verdict = assess(rows, cores)
        if not before["busy"]:  # only other work can make it busy: none was running
            assert verdict["busy"] is False, verdict["words"]
        with cpu_hog(processes=1, detached=True) as hogs:
            time.sleep(0.3)
            busy_rows = _samples(probe, 2.5)
            pids += [proc.pid for proc in hogs]
        busy = assess(busy_rows, cores)
        assert busy["busy"] is True, busy["words"]
        assert re.search(r"other processes used \d\.\d of \d+ cores in \d+ % of samples",
                         busy["words"]), busy["words"]
    finally:
        pids += _end_tree(trainer)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in pids)


@pytest.mark.slow
def test_a_trainers_own_children_count_as_the_trainers_cpu():
    probe = ContentionProbe()  # this process: the hog below is its child, like a DataLoader worker
    with cpu_hog():
        time.sleep(0.3)
        rows = _samples(probe, 1.2)
    measured = [r for r in rows if r["cpu_pct"] is not None]
    assert measured and max(r["cpu_pct"] for r in measured) >= 60.0
