"""Idle time by cause, launch queue and launch delay per stream (engine.traces.gpu_idle),
against an independent computation from the raw events of real traces: the JSON read with
the standard library, each gap, queue and delay computed by brute force."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from engine.traces.accounting import time_accounting
from engine.traces.gpu_idle import KERNEL_WAIT_US

TRACES = Path(__file__).parent / "data" / "traces"
# the V100 trace's 8,772 kernels make the brute-force queue a minute: the slow tier
REAL = ["h100_qwen_tracelens.json.gz", "a100_conv_nccl_hta.json.gz",
        "mi300_qwen_tracelens.json.gz",
        pytest.param("v100_resnet50_kineto_v1.json.gz", marks=pytest.mark.slow)]


def _stream_of(event: dict) -> int | None:
    args = event.get("args") or {}
    if "stream" in args:
        return int(args["stream"])
    tid = str(event.get("tid", ""))
    return int(tid.split()[-1]) if tid.startswith("stream") else None


def _independent(path: Path, lo: float, hi: float) -> dict:
    events = json.load(gzip.open(path))["traceEvents"]
    launches = {}
    for event in events:
        if event.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime"):
            correlation = (event.get("args") or {}).get("correlation")
            if correlation is not None:
                launches[correlation] = event["ts"]
    streams = defaultdict(list)
    for event in events:
        if event.get("cat") in ("kernel", "Kernel"):
            correlation = (event.get("args") or {}).get("correlation")
            streams[_stream_of(event)].append(
                (event["ts"], event["ts"] + event["dur"], launches.get(correlation)))
    out = {}
    for stream, kernels in streams.items():
        kernels.sort()
        inside = [k for k in kernels if k[1] > lo and k[0] < hi]
        if not inside:
            continue
        host = kernel = other = 0.0
        for index in range(1, len(inside)):
            last_end = max(k[1] for k in inside[:index])  # brute force: every earlier end
            start, _end, launch = inside[index]
            gap = min(start, hi) - max(last_end, lo)
            if start <= last_end or gap <= 0:
                continue
            if launch is not None and launch >= last_end:
                host += gap
            elif launch is not None and start - last_end <= KERNEL_WAIT_US:
                kernel += gap
            else:
                other += gap
        queue = []
        for _start, _end, t in kernels:
            if t is not None and lo <= t <= hi:
                queue.append(sum(1 for _s, e, launch in kernels
                                 if launch is not None and launch <= t < e))
        delays = [s - launch for s, _e, launch in inside if launch is not None and s >= launch]
        out[stream] = {"host": host, "kernel": kernel, "other": other,
                       "queue_max": max(queue) if queue else None,
                       "queue_p50": statistics.median(queue) if queue else None,
                       "delay_p50": statistics.median(delays) if delays else None}
    return out


@pytest.mark.parametrize("name", REAL)
def test_idle_by_cause_queue_and_delay_match_an_independent_computation(name):
    path = TRACES / name
    accounting = time_accounting(path)
    window = accounting["window"]
    theirs = _independent(path, window["start_us"], window["end_us"])
    rows = accounting["stream_idle"]
    assert rows and {row["stream"] for row in rows} == set(theirs)
    for row in rows:
        other = theirs[row["stream"]]
        for ours, key in (("host_wait_us", "host"), ("kernel_wait_us", "kernel"),
                          ("other_us", "other")):
            assert row[ours] == pytest.approx(other[key], rel=0.01, abs=0.01), (ours, row)
        assert row["queue_max"] == other["queue_max"]
        assert row["queue_p50"] == pytest.approx(other["queue_p50"], rel=0.01)
        assert row["launch_delay_p50_us"] == pytest.approx(other["delay_p50"], rel=0.01)
        assert row["idle_us"] == pytest.approx(
            row["host_wait_us"] + row["kernel_wait_us"] + row["other_us"], abs=0.01)


def test_a_stream_that_waits_on_the_host_with_a_short_queue_is_launch_bound():
    rows = time_accounting(TRACES / "a100_conv_nccl_hta.json.gz")["stream_idle"]
    compute = next(row for row in rows if row["stream"] == 7)
    assert compute["host_wait_share"] > 0.9 and compute["queue_p50"] <= 1
    assert compute["launch_bound"] is True
    busy = time_accounting(TRACES / "h100_qwen_tracelens.json.gz")["stream_idle"][0]
    assert busy["queue_p50"] > 10 and busy["launch_bound"] is False  # a deep queue
