"""Traces at scale: the streaming reader (engine.traces.reader) against the plain
json path on every real trace, its bounds, GPU work by the step that launched it
(engine.traces.accounting) against an independent computation from the raw events, and
trace sets across ranks (engine.traces.sets), CLI included."""

from __future__ import annotations

import bisect
import gzip
import io
import json
import shutil
import time
import zipfile
from pathlib import Path

import pytest

from engine.traces import reader as trace_reader
from engine.traces.accounting import time_accounting
from engine.traces.parser import _parse_plain, _parse_trace, load_trace
from engine.traces.reader import TraceTooLarge
from engine.traces.sets import analyze_set, set_members

TRACES = Path(__file__).parent / "data" / "traces"
RANK_SET = TRACES / "rank_set_hta"
REAL = sorted(TRACES.glob("*.json.gz")) + sorted(RANK_SET.glob("*.json.gz"))


def _events(path: Path) -> dict:
    with gzip.open(path, "rt") as handle:
        return json.load(handle)


def _write(path: Path, data: dict) -> Path:
    with gzip.open(path, "wt") as handle:
        json.dump(data, handle)
    return path


# ---------------------------------------------------------------------------------------
# the reader

@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_the_streaming_reader_keeps_what_the_plain_reader_keeps(path):
    fast = _parse_trace(path)
    plain = _parse_plain(path, str(path))
    assert fast[0] == plain[0] and fast[1] == plain[1]
    assert fast[2].get("deviceProperties") == plain[2].get("deviceProperties")
    assert fast[2].get("distributedInfo") == plain[2].get("distributedInfo")


def test_pieces_cut_small_read_the_same_as_one(monkeypatch):
    """Cut into 64 kB pieces, the V100 trace crosses hundreds of piece boundaries (and its
    members after the list are read last): the same events either way."""
    path = TRACES / "h100_qwen_tracelens.json.gz"
    whole = _parse_trace(path)
    monkeypatch.setattr(trace_reader, "_CHUNK", 1 << 16)
    monkeypatch.setattr(trace_reader, "_TAIL_GUARD", 1 << 12)
    assert _parse_trace(path) == whole


def test_odd_events_are_read_field_by_field_not_lost(tmp_path, monkeypatch):
    """A ts written as text, a name that is a list, "},{" inside a name: the typed decode
    refuses the piece and it is judged event by event (counted as the plain path does)."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": 2, "pid": 0,
              "tid": 7, "args": {"correlation": 1, "device": 0, "stream": 7}}
    events = [dict(kernel, ts=10 + 5 * i, name=f"k{i}") for i in range(400)]
    events[50]["ts"] = "260"                 # text: a time all the same
    events[100]["name"] = ["not", "text"]    # malformed: counted
    events[150]["name"] = "odd }, { name"    # a false event boundary inside a string
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(trace_reader, "_CHUNK", 4096)
    monkeypatch.setattr(trace_reader, "_TAIL_GUARD", 512)
    fast = _parse_trace(path)
    assert fast[:2] == _parse_plain(path, str(path))[:2]
    trace = load_trace(path)
    assert len(trace.table) == 399 and trace.defects["malformed_events"] == 1
    assert "odd }, { name" in set(trace.table["name"])


def test_an_upload_stream_reads_as_its_file():
    path = TRACES / "a100_alexnet_hta.json.gz"
    stream = io.BytesIO(path.read_bytes())
    stream.name = "upload.json.gz"
    assert _parse_trace(stream)[:2] == _parse_trace(path)[:2]


def test_a_huge_string_is_refused_with_its_limit(tmp_path, monkeypatch):
    """A 2 GiB string stops at the one-event bound (here 1 MiB, read in 256 kB pieces)."""
    monkeypatch.setattr(trace_reader, "MAX_EVENT_MIB", 1)
    monkeypatch.setattr(trace_reader, "_CHUNK", 1 << 18)
    path = tmp_path / "long.json.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "')
        handle.write(b"x" * (3 << 20))
        handle.write(b'", "ts": 1, "dur": 1}]}')
    with pytest.raises(TraceTooLarge, match=r"longer than 1 MiB"):
        load_trace(path)


def test_events_kept_are_bounded_and_the_bound_is_named(tmp_path, monkeypatch):
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 0, "tid": 7}
    path = _write(tmp_path / "many.json.gz", {"traceEvents": [kernel] * 5000})
    monkeypatch.setenv("PRECISION_LAB_MAX_TRACE_EVENTS", "1000")
    monkeypatch.setattr(trace_reader, "_CHUNK", 1 << 14)
    with pytest.raises(TraceTooLarge) as info:
        load_trace(path)
    assert "more than 1,000" in str(info.value) and "PRECISION_LAB_MAX_TRACE_EVENTS" in str(
        info.value)
    monkeypatch.setenv("PRECISION_LAB_MAX_TRACE_EVENTS", "10000")
    assert len(load_trace(path).table) == 5000


def test_the_events_bound_holds_when_the_last_events_are_read_by_the_plain_decoder(
        tmp_path, monkeypatch):
    """A trace small enough to be read at its end (no piece cut) is bounded all the same,
    and so is one the plain path reads."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 0, "tid": 7}
    monkeypatch.setenv("PRECISION_LAB_MAX_TRACE_EVENTS", "5")
    small = _write(tmp_path / "small.json.gz", {"traceEvents": [kernel] * 50})
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"traceEvents": [0] + [kernel] * 50}))  # not all objects
    for path in (small, odd):
        with pytest.raises(TraceTooLarge, match="more than 5 kernel"):
            load_trace(path)


def test_json_as_python_writes_it_is_read_not_refused(tmp_path, monkeypatch):
    """NaN / Infinity literals (json.dump's default) and a 400-digit number: the piece is
    read, the bad times counted, no traceback."""
    kernel = {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": 2, "pid": 0, "tid": 7,
              "args": {"correlation": 1}}
    events = [dict(kernel, ts=10 + i) for i in range(2000)]
    events[500]["dur"] = float("nan")
    events[900]["dur"] = float("inf")
    path = tmp_path / "python.json"
    text = json.dumps({"traceEvents": events}).replace('"ts": 1500,', '"ts": ' + "9" * 400 + ",")
    path.write_text(text)
    monkeypatch.setattr(trace_reader, "_CHUNK", 8192)
    monkeypatch.setattr(trace_reader, "_TAIL_GUARD", 512)
    trace = load_trace(path)
    assert len(trace.table) == 1997
    assert trace.defects["missing_duration"] == 3


def test_a_broken_zip_member_is_one_line_naming_it(tmp_path):
    folder = make_four_ranks(tmp_path / "job")
    archive = tmp_path / "job.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as handle:
        for path in sorted(folder.iterdir()):
            handle.write(path, path.name)
    data = bytearray(archive.read_bytes())
    offset = data.find(b"\x1f\x8b", data.find(b"rank-1.json.gz"))  # inside rank-1's bytes
    data[offset + 200] ^= 0xFF  # its CRC no longer matches
    archive.write_bytes(bytes(data))
    with pytest.raises(ValueError) as info:
        analyze_set(set_members([archive]))
    assert "rank-1.json.gz" in str(info.value) and "\n" not in str(info.value)


def test_identical_ranks_name_no_straggler(tmp_path):
    for rank in (0, 1):
        data = _events(RANK_SET / "rank-0.json.gz")
        data["distributedInfo"] = {**data["distributedInfo"], "rank": rank}
        _write(tmp_path / f"rank-{rank}.json.gz", data)
    result = analyze_set(set_members([tmp_path]))
    assert result["waited_for"]["clear"] is False
    assert "no rank the others wait for" in result["sentence"]
    assert "steps within 1 % of each other" in result["sentence"]


def test_the_collector_is_back_on_after_a_read():
    import gc

    load_trace(TRACES / "a100_alexnet_hta.json.gz")
    assert gc.isenabled()


# ---------------------------------------------------------------------------------------
# GPU work by the step that launched it

def independent_by_launch(path: Path) -> dict:
    """Straight from the raw events: each kernel / memcpy / memset to the ProfilerStep
    whose span holds the runtime call with the same args.correlation; per step the union
    of its work's intervals (unclipped)."""
    events = _events(path)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
                   if e.get("cat") in ("user_annotation", "Operator")
                   and str(e.get("name", "")).startswith("ProfilerStep#"))
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime")
                and isinstance(e.get("args"), dict) and "correlation" in e["args"]}
    work: dict = {number: [] for _, _, number in steps}
    outside = 0
    for e in events:
        if e.get("cat") not in ("kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy",
                                "Memset"):
            continue
        launched = launches.get((e.get("args") or {}).get("correlation"))
        if launched is None:
            outside += 1
            continue
        index = bisect.bisect_right([s[0] for s in steps], launched) - 1
        if index >= 0 and launched <= steps[index][1]:
            work[steps[index][2]].append((e["ts"], e["ts"] + e["dur"]))
        else:
            outside += 1
    busy = {}
    for number, intervals in work.items():
        total, end_so_far = 0.0, float("-inf")
        for start, end in sorted(intervals):
            start = max(start, end_so_far)
            if end > start:
                total += end - start
                end_so_far = end
        busy[number] = (total, len(intervals))
    return {"busy": busy, "outside": outside}


STEPPED = [p for p in REAL if p.name in {"v100_resnet50_kineto_v1.json.gz",
                                          "a100_conv_nccl_hta.json.gz",
                                          "h100_qwen_tracelens.json.gz",
                                          "h100_bert_small_tracelens.json.gz",
                                          "rank-0.json.gz", "rank-1.json.gz"}]


@pytest.mark.parametrize("path", STEPPED, ids=lambda p: p.name)
def test_per_step_busy_by_launch_matches_an_independent_computation(path):
    accounting = time_accounting(load_trace(path))
    expected = independent_by_launch(path)
    assert accounting["steps"]
    for row in accounting["steps"]:
        busy_us, count = expected["busy"][row["step"]]
        assert row["launched"]["busy_us"] == pytest.approx(busy_us, abs=0.01)
        assert row["launched"]["activity_count"] == count
    by_launch = accounting["by_launch"]
    outside = by_launch["outside_steps"]["activity_count"] + \
        by_launch["no_launch_event"]["activity_count"]
    assert outside == expected["outside"]  # reported, not dropped


def test_the_v100_step_lag_is_counted_in_full_by_launch():
    """The V100 trace's GPU runs ~70 ms behind its CPU steps: clipped to each step's CPU
    span the busy time swings 89-107 ms, by launch every step's work is ~100.6 ms."""
    accounting = time_accounting(load_trace(TRACES / "v100_resnet50_kineto_v1.json.gz"))
    launched = [row["launched"] for row in accounting["steps"]]
    clipped = [row["busy_us"] for row in accounting["steps"]]
    assert max(clipped) - min(clipped) > 10_000
    assert max(r["busy_us"] for r in launched) - min(r["busy_us"] for r in launched) < 200
    assert all(r["gpu_lag_us"] > 50_000 for r in launched)
    span = accounting["gpu_span"]
    # idle over the GPU's own span is smaller than idle in the CPU window: both are shown
    assert span["idle_in_gpu_span_share"] < accounting["idle_share"]


# ---------------------------------------------------------------------------------------
# trace sets

def test_the_real_rank_set_gives_a_per_rank_table():
    result = analyze_set(set_members([RANK_SET]))
    assert result["rank_count"] == 2 and [row["rank"] for row in result["ranks"]] == [0, 1]
    assert result["rank_from"] == "the trace (distributedInfo)"
    for row in result["ranks"]:  # every time per step, as the step time
        accounting = time_accounting(load_trace(RANK_SET / row["source"]))
        steps = accounting["window"]["step_count"]
        assert row["step_time_us"] == accounting["step_time_us"]
        assert row["communication_us"] == pytest.approx(accounting["communication_us"] / steps,
                                                        abs=0.001)
        assert row["exposed_communication_us"] == pytest.approx(
            accounting["exposed_communication_us"] / steps, abs=0.001)
        assert row["busy_us"] == pytest.approx(accounting["busy_us"] / steps, abs=0.001)
    assert result["slowest"]["rank"] == max(result["ranks"],
                                            key=lambda r: r["step_time_us"])["rank"]
    assert result["collectives_matched"] > 0
    assert all(row["waiting_us"] >= 0 for row in result["ranks"])
    assert min(row["waiting_us"] for row in result["ranks"]) == 0 or \
        result["waited_for"]["rank"] in (0, 1)


def _slowed(data: dict, rank: int, factor: float) -> dict:
    """The same trace as rank `rank`, every time stretched by `factor` from its start."""
    events = data["traceEvents"]
    origin = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    out = []
    for e in events:
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = origin + (e["ts"] - origin) * factor
        if isinstance(e.get("dur"), (int, float)):
            e["dur"] = e["dur"] * factor
        out.append(e)
    return {**data, "distributedInfo": {**data["distributedInfo"], "rank": rank,
                                        "world_size": 4}, "traceEvents": out}


def make_four_ranks(folder: Path, slow_rank: int = 2, factor: float = 1.3) -> Path:
    folder.mkdir()
    sources = [_events(RANK_SET / "rank-0.json.gz"), _events(RANK_SET / "rank-1.json.gz")]
    for rank in range(4):
        data = _slowed(sources[rank % 2], rank, factor if rank == slow_rank else 1.0)
        _write(folder / f"rank-{rank}.json.gz", data)
    return folder


def test_a_four_rank_set_names_the_slowed_rank(tmp_path):
    folder = make_four_ranks(tmp_path / "job")
    result = analyze_set(set_members([folder]))
    assert [row["rank"] for row in result["ranks"]] == [0, 1, 2, 3]
    assert result["slowest"]["rank"] == 2
    assert result["slowest"]["above_median_share"] == pytest.approx(0.3, abs=0.02)
    assert "slowest rank 2" in result["sentence"]


def test_a_zip_of_ranks_reads_as_the_folder(tmp_path):
    folder = make_four_ranks(tmp_path / "job")
    archive = tmp_path / "job.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for path in sorted(folder.iterdir()):
            handle.write(path, f"traces/{path.name}")
    assert analyze_set(set_members([archive]))["ranks"] == \
        analyze_set(set_members([folder]))["ranks"]


def test_ranks_come_from_file_names_without_distributed_info(tmp_path):
    for rank in (3, 1):
        data = _events(RANK_SET / f"rank-{rank % 2}.json.gz")
        data.pop("distributedInfo")
        _write(tmp_path / f"worker{rank}.json.gz", data)
    result = analyze_set(set_members(sorted(tmp_path.iterdir())))
    assert [row["rank"] for row in result["ranks"]] == [1, 3]
    assert result["rank_from"] == "the file name"


def test_a_set_needs_two_traces_and_names_what_it_got(tmp_path):
    with pytest.raises(ValueError, match="two or more ranks; got 1"):
        analyze_set(set_members([RANK_SET / "rank-0.json.gz"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no trace files in this folder"):
        set_members([tmp_path / "empty"])


@pytest.mark.slow
def test_engine_kernels_on_a_folder_prints_the_rank_table(tmp_path):
    import subprocess
    import sys

    from conftest import REPO_ROOT, cli_env

    folder = make_four_ranks(tmp_path / "job")
    result = subprocess.run([sys.executable, "-m", "engine", "kernels", str(folder), "--json"],
                            cwd=str(REPO_ROOT), env=cli_env(tmp_path), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["trace_set"]["slowest"]["rank"] == 2
    assert len(data["trace_set"]["ranks"]) == 4
    text = subprocess.run([sys.executable, "-m", "engine", "kernels", str(folder)],
                          cwd=str(REPO_ROOT), env=cli_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "slowest rank 2" in text.stdout and "rank-3.json.gz" in text.stdout
    real = subprocess.run([sys.executable, "-m", "engine", "kernels", str(RANK_SET), "--json"],
                          cwd=str(REPO_ROOT), env=cli_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert real.returncode == 0, real.stderr
    real_set = json.loads(real.stdout)["trace_set"]
    assert [row["rank"] for row in real_set["ranks"]] == [0, 1]
    assert real_set["slowest"]["rank"] == 1  # 619.3 ms per step against rank 0's 615.1 ms
    shutil.rmtree(folder)


@pytest.mark.slow
def test_engine_kernels_imports_no_pandas_numpy_or_torch(tmp_path):
    """The CLI's start-up costs what it uses: a trace's analysis needs none of them."""
    import subprocess
    import sys

    from conftest import REPO_ROOT, cli_env

    probe = ("import io, sys, contextlib\n"
             "from engine.cli.main import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    code = main(['kernels', sys.argv[1], '--json'])\n"
             "print(code, sorted(m for m in ('pandas', 'numpy', 'torch') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", probe, str(TRACES / "gp100_pascal_hta.json.gz")],
                            cwd=str(REPO_ROOT), env=cli_env(tmp_path), capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.split() == ["0", "[]"], result.stdout + result.stderr


def test_collective_skew_names_the_rank_that_starts_its_collectives_late(tmp_path):
    """Four copies of one real rank's trace, one shifted 2 ms later: every collective's
    start is spread by exactly 2 ms and that rank arrives last every time."""
    shift_us = 2000.0
    source = _events(RANK_SET / "rank-0.json.gz")
    folder = tmp_path / "job"
    folder.mkdir()
    for rank in range(4):
        data = _slowed(source, rank, 1.0)
        if rank == 3:
            data["traceEvents"] = [{**e, "ts": e["ts"] + shift_us}
                                   if isinstance(e.get("ts"), (int, float)) else e
                                   for e in data["traceEvents"]]
        _write(folder / f"rank-{rank}.json.gz", data)
    result = analyze_set(set_members([folder]))
    skew = result["collective_skew"]
    assert skew["collectives"] == result["collectives_matched"] > 0
    assert skew["median_us"] == pytest.approx(shift_us)
    assert skew["max_us"] == pytest.approx(shift_us)
    assert skew["most_often_last"] == {"rank": 3, "count": skew["collectives"]}
    assert all(entry["last_rank"] == 3 for entry in skew["worst"])


def test_bus_bandwidth_follows_nccl_tests_from_the_collectives_message_sizes(tmp_path):
    """Two ranks of the real A100 NCCL trace (its kernels carry Kineto's collective args):
    an fp32 all-reduce of N elements over 2 ranks moves 4N bytes, bus bandwidth = 4N / t x
    2(n-1)/n, t the shortest rank's kernel time (nccl-tests' PERFORMANCE.md)."""
    source = json.load(gzip.open(TRACES / "a100_conv_nccl_hta.json.gz"))
    for rank in (0, 1):
        data = {**source, "distributedInfo": {**source.get("distributedInfo", {}),
                                              "rank": rank, "world_size": 2}}
        _write(tmp_path / f"rank-{rank}.json.gz", data)
    result = analyze_set(set_members([tmp_path]))
    kernels = [e for e in source["traceEvents"] if e.get("cat") == "kernel"
               and (e.get("args") or {}).get("Collective name") == "allreduce"]
    expected = sorted(4 * e["args"]["In msg nelems"] / (e["dur"] * 1e-6) * 2 * (2 - 1) / 2 / 1e9
                      for e in kernels)
    (row,) = [r for r in result["collective_bandwidth"] if r["collective"] == "allreduce"]
    assert row["count"] <= len(kernels) and row["count"] > 0
    assert expected[0] <= row["median_bus_gb_per_s"] <= expected[-1]
    assert row["max_bus_gb_per_s"] == pytest.approx(expected[-1], rel=1e-3)


def test_workers_follow_cores_and_memory_and_small_sets_stay_in_process(tmp_path):
    from engine.traces.set_workers import PARALLEL_FROM_TEXT_BYTES, workers_for

    small = [TRACES / "h100_bert_small_tracelens.json.gz"] * 4
    assert workers_for(small, cores=8, available_bytes=64 << 30) == 1  # not worth a process
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (PARALLEL_FROM_TEXT_BYTES // 2))
    paths = [big] * 16
    assert workers_for(paths, cores=8, available_bytes=64 << 30) == 8  # the cores
    # 128 MiB of text peaks near 64 MiB a rank: 256 MiB of memory (3/4 usable) fits 3
    assert workers_for(paths, cores=8, available_bytes=256 << 20) == 3
    assert workers_for(paths[:2], cores=8, available_bytes=64 << 30) == 2  # the ranks


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_read_in_worker_processes_match_and_a_killed_worker_is_one_line(tmp_path):
    """Two processes at a time: the same per-rank table as one process; a worker killed
    while it reads is that rank's one line, the other ranks still reported."""
    import threading

    import psutil

    from engine.traces.set_workers import analyze_set_parallel

    folder = make_four_ranks(tmp_path / "job")
    members = set_members([folder])
    assert analyze_set_parallel(members, 2)["ranks"] == analyze_set(members)["ranks"]
    victim = folder / "rank-3.json.gz"
    big = _events(TRACES / "v100_resnet50_kineto_v1.json.gz")  # long enough to be caught
    big["distributedInfo"] = {"rank": 3, "world_size": 4}
    _write(victim, big)
    killed: list[int] = []

    def kill_the_worker_of_rank_3() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for child in psutil.Process().children(recursive=True):
                try:
                    if "set_workers" in " ".join(child.cmdline()) and str(victim) in \
                            " ".join(child.cmdline()):
                        child.kill()
                        killed.append(child.pid)
                except psutil.Error:
                    pass
            time.sleep(0.02)

    killer = threading.Thread(target=kill_the_worker_of_rank_3)
    killer.start()
    result = analyze_set_parallel(set_members([folder]), 2)
    killer.join()
    assert killed
    (failed,) = result["failed_ranks"]
    assert failed["source"] == "rank-3.json.gz" and "killed by signal 9" in failed["error"]
    assert [row["rank"] for row in result["ranks"]] == [0, 1, 2]


def test_a_set_on_ray_refuses_a_client_address_before_anything_starts():
    from engine.cluster.ray_traces import analyze_set_on_ray
    from engine.config import ConfigError

    members = set_members([RANK_SET])
    with pytest.raises(ConfigError, match="Ray Client"):
        analyze_set_on_ray(members, "ray://head:10001")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        analyze_set_on_ray(members, "no-port")


OTHER_KINDS = sorted((TRACES / "other_kinds").glob("*.json.gz"))


@pytest.mark.parametrize("path", REAL + OTHER_KINDS, ids=lambda p: p.name)
def test_every_real_trace_decodes_on_the_typed_path(path, monkeypatch):
    """No piece of a real trace falls back to event-by-event judging: a field type the typed
    structs refuse (a Raw in a union) made every piece slow, unseen by the results."""
    def refuse(objects, kept):
        raise AssertionError(f"{path.name}: a piece fell back to the plain path")

    monkeypatch.setattr(trace_reader, "_judged_one_by_one", refuse)
    _parse_trace(path)
