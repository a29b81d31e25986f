"""Time accounting (engine.traces.accounting), the bound-by verdict (engine.traces.bound)
and the banner (engine.traces.explain.analyze) on real traces and on small synthetic traces
whose figures can be checked by hand.

The real-trace figures are computed twice: by the plain interval code in this file, straight
from the raw JSON events (no engine code), and written out as literals; the module must match
both.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from engine.display import share_text
from engine.traces.accounting import PARTS, cpu_op_part, part_shares, time_accounting
from engine.traces.bound import bound_by
from engine.traces.explain import analyze
from engine.traces.parser import load_trace

TRACES = Path(__file__).parent / "data" / "traces"


# ---------------------------------------------------------------------------------------
# independent figures: merge intervals over the raw events


def _merged(intervals):
    out = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def _length(merged):
    return sum(end - start for start, end in merged)


def _intersection(a, b):
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def independent_figures(path: Path) -> dict:
    """Window = ProfilerStep spans; busy = union of kernel + memcpy + memset events clipped to
    it; communication = kernels with 'nccl' in the name; copy = memcpy + memset events."""
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") in ("user_annotation", "Operator")
             and str(e.get("name", "")).startswith("ProfilerStep#")]
    lo, hi = min(s for s, _ in steps), max(e for _, e in steps)
    gpu = [e for e in events
           if e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset")]

    def clip(event):
        return max(event["ts"], lo), min(event["ts"] + event["dur"], hi)

    kernels = [e for e in gpu if e["cat"] in ("kernel", "Kernel")]
    comm = _merged([clip(e) for e in kernels if "nccl" in e["name"].lower()])
    compute = _merged([clip(e) for e in kernels if "nccl" not in e["name"].lower()])
    busy = _length(_merged([clip(e) for e in gpu]))
    return {"window_us": hi - lo, "busy_us": busy, "idle_us": hi - lo - busy,
            "copy_us": _length(_merged([clip(e) for e in gpu if e["cat"] not in
                                        ("kernel", "Kernel")])),
            "communication_us": _length(comm), "overlap_us": _intersection(comm, compute),
            "compute_us": _length(compute)}


EXPECTED = {
    "a100_conv_nccl_hta.json.gz": dict(
        window_us=667225.958, busy_us=157500.078, idle_us=509725.88, copy_us=2653.57,
        communication_us=46876.492, overlap_us=7317.026, compute_us=115655.843),
    "h100_bert_small_tracelens.json.gz": dict(
        window_us=4426.114, busy_us=309.438, idle_us=4116.676, copy_us=2.24,
        communication_us=0.0, overlap_us=0.0, compute_us=307.198),
    "h100_qwen_tracelens.json.gz": dict(
        window_us=47151.395, busy_us=43274.96, idle_us=3876.435, copy_us=203.052,
        communication_us=0.0, overlap_us=0.0, compute_us=43071.908),
    "v100_resnet50_kineto_v1.json.gz": dict(
        window_us=1049317.0, busy_us=587982.0, idle_us=461335.0, copy_us=12020.0,
        communication_us=0.0, overlap_us=0.0, compute_us=575962.0),
}


@pytest.fixture(scope="module")
def accountings() -> dict[str, dict]:
    return {name: time_accounting(TRACES / name) for name in EXPECTED}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_trace_figures_match_the_independent_computation(name, accountings):
    accounting, expected = accountings[name], EXPECTED[name]
    independent = independent_figures(TRACES / name)
    for key, value in expected.items():
        assert independent[key] == pytest.approx(value, abs=2e-3), key
        assert accounting[key] == pytest.approx(value, abs=2e-3), key
    assert accounting["window"]["source"] == "profiler steps"
    assert accounting["idle_share"] == pytest.approx(expected["idle_us"] / expected["window_us"],
                                                     abs=1e-4)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parts_add_up_to_the_window_and_streams_to_the_kernels(name, accountings):
    accounting = accountings[name]
    assert list(accounting["parts_us"]) == list(PARTS)
    assert sum(accounting["parts_us"].values()) == pytest.approx(accounting["window_us"], abs=0.01)
    assert accounting["parts_us"]["idle"] == pytest.approx(accounting["idle_us"], abs=0.01)
    assert sum(r["kernel_us"] for r in accounting["streams"]) == pytest.approx(
        accounting["kernel_us"], rel=0.01)
    assert json.loads(json.dumps(accounting)) == accounting


def test_a100_nccl_per_stream_and_per_step(accountings):
    accounting = accountings["a100_conv_nccl_hta.json.gz"]
    streams = {row["stream"]: row for row in accounting["streams"]}
    assert set(streams) == {7, 40}
    assert streams[40]["kernel_us"] == pytest.approx(46876.492, abs=1e-3)  # NCCL's stream
    assert [s["step"] for s in accounting["steps"]] == [4, 5, 6]
    assert [s["step_time_us"] for s in accounting["steps"]] == [222442.191, 219726.905, 224936.243]
    assert sum(s["busy_us"] for s in accounting["steps"]) == pytest.approx(
        accounting["busy_us"], abs=0.01)
    [dtod, memset] = accounting["copies"]
    assert (dtod["direction"], dtod["count"], memset["direction"], memset["count"]) == (
        "DtoD", 960, "memset", 114)


def test_step_selection(accountings):
    one = time_accounting(TRACES / "a100_conv_nccl_hta.json.gz", step=5)
    assert one["window_us"] == pytest.approx(219726.905, abs=1e-3)
    assert one["busy_us"] == accountings["a100_conv_nccl_hta.json.gz"]["steps"][1]["busy_us"]
    with pytest.raises(ValueError, match=r"no ProfilerStep#9 .*steps recorded: 4, 5, 6"):
        time_accounting(TRACES / "a100_conv_nccl_hta.json.gz", step=9)


def test_v100_resnet_without_workers_is_input_bound(accountings):
    verdict = bound_by(accountings["v100_resnet50_kineto_v1.json.gz"])
    assert verdict["verdict"] == "input"
    assert verdict["numbers"]["data_wait_share"] == pytest.approx(415791.0 / 1049317.0, abs=1e-4)
    assert any("num_workers" in advice for advice in verdict["advice"])


def test_alexnet_copies_are_read_and_dwarf_its_kernels():
    accounting = time_accounting(TRACES / "a100_alexnet_hta.json.gz")
    with gzip.open(TRACES / "a100_alexnet_hta.json.gz", "rt") as handle:
        events = json.load(handle)["traceEvents"]
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    assert sum(row["count"] for row in accounting["copies"]) == len(copies) == 19
    htod = next(row for row in accounting["copies"] if row["direction"] == "HtoD")
    assert htod["bytes"] == sum(e["args"]["bytes"] for e in copies if "HtoD" in e["name"])
    assert accounting["copy_us"] > 5 * accounting["kernel_us"]


def test_banner_says_how_busy_the_gpu_was():
    result = analyze(TRACES / "a100_conv_nccl_hta.json.gz")
    assert result["banner"]["headline"] == (
        "Tensor Cores: yes, 96 % of matrix time in tf32 tensor-core kernels, but the GPU was "
        "idle 76 % of the step")
    assert result["bound_by"]["verdict"] == "cpu_launch"
    assert result["banner"]["advice"] and result["banner"]["tone"] == "success"
    assert {"bound_by", "busy_us", "idle_us", "copy_us", "overlap_us", "streams", "steps"} <= set(
        result)
    qwen = analyze(TRACES / "h100_qwen_tracelens.json.gz")
    assert qwen["could_have_didnt"]  # an fp32 bmm is listed, so never "100 %"
    assert "99.98 % of matrix time" in qwen["banner"]["headline"]
    assert qwen["banner"]["headline"].endswith("the GPU was busy 92 % of the step")


@pytest.mark.parametrize("share, text", [(0.99978, "99.98 %"), (0.0002, "0.02 %"), (1.0, "100 %"),
                                         (0.42, "42 %"), (0.996, "99.6 %"), (0.0, "0 %")])
def test_share_text_never_rounds_to_all_or_nothing(share, text):
    assert share_text(share) == text


@pytest.mark.parametrize("share, text", [(0.9998, "99.98 %"), (0.00004, "0.004 %"),
                                         (0.42, "42.0 %"), (0.998474, "99.8 %"),
                                         (1.8e-7, "< 0.0001 %"), (1 - 1e-8, "> 99.9999 %")])
def test_share_text_with_one_decimal_for_tables(share, text):
    assert share_text(share, 1) == text


def test_part_shares_are_the_headline_figures():
    """The parts table and the idle figure come from one rounding: the A100 AlexNet trace
    is idle 99.8474 % of its window, which two roundings (0.9985, then one decimal) had
    printed as 99.9 % beside a parts table reading 99.8 %."""
    accounting = time_accounting(TRACES / "a100_alexnet_hta.json.gz")
    shares = part_shares(accounting)
    assert shares["idle"] == accounting["idle_share"]
    assert share_text(shares["idle"], 1) == share_text(accounting["idle_share"], 1) == "99.8 %"
    assert math.fsum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert share_text(shares["elementwise"], 1) == "0.004 %"  # not "0.0 %": it ran
    stored_before = {k: v for k, v in accounting.items() if k != "parts_share"}
    assert part_shares(stored_before) == pytest.approx(shares, abs=1e-8)


# ---------------------------------------------------------------------------------------
# synthetic traces, figures by hand


def _kernel(name, ts, dur, stream=7, correlation=1):
    event = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
             "args": {"stream": stream, "device": 0, "correlation": correlation}}
    if dur is not None:
        event["dur"] = dur
    return event


def _copy(name, ts, dur, size, cat="gpu_memcpy", stream=9):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "device": 0, "bytes": size}}


def _span(name, ts, dur, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def _write(tmp_path, events, name="t.json", properties=None):
    path = tmp_path / name
    path.write_text(json.dumps({"deviceProperties": properties or [
        {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0}],
        "traceEvents": events}))
    return path


def test_two_streams_a_copy_and_a_wait_by_hand(tmp_path):
    events = [
        _span("ProfilerStep#1", 0, 40),
        _kernel("ampere_sgemm_128x64_nn", 0, 10, stream=7),            # compute 0..10
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                5, 15, stream=8),                                       # comm 5..20
        _copy("Memcpy HtoD (Pinned -> Device)", 25, 5, 5000),           # copy 25..30, 1 GB/s
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7,
         "ts": 30, "dur": 9, "args": {"stream": 7}},                    # not GPU work
    ]
    accounting = time_accounting(_write(tmp_path, events))
    assert (accounting["window_us"], accounting["busy_us"], accounting["idle_us"]) == (40, 25, 15)
    assert (accounting["compute_us"], accounting["communication_us"], accounting["overlap_us"],
            accounting["exposed_communication_us"], accounting["copy_us"]) == (10, 15, 5, 10, 5)
    assert accounting["kernel_count"] == 2 and accounting["kernel_us"] == 25
    assert {p: us for p, us in accounting["parts_us"].items() if us} == {
        "matrix": 10, "communication": 10, "copies": 5, "idle": 15}
    assert accounting["copies"] == [{"direction": "HtoD", "count": 1, "bytes": 5000, "us": 5.0,
                                     "gb_per_s": 1.0}]
    busy = {row["stream"]: row["busy_us"] for row in accounting["streams"]}
    assert busy == {7: 10, 8: 15, 9: 5}
    assert accounting["idle_gaps"] == {"count": 1, "median_us": 5.0, "total_us": 5.0}


def test_compute_sharing_an_instant_splits_it(tmp_path):
    events = [_kernel("ampere_sgemm_128x64_nn", 0, 10, stream=7),
              _kernel("void at::native::vectorized_elementwise_kernel<4, at::native::"
                      "CUDAFunctor_add<float> >(int)", 5, 10, stream=8)]
    parts = time_accounting(_write(tmp_path, events))["parts_us"]
    assert (parts["matrix"], parts["elementwise"], parts["idle"]) == (7.5, 7.5, 0)


def test_fractional_timestamps_are_kept(tmp_path):
    events = [_kernel("ampere_sgemm_128x64_nn", 100.25, 0.5),
              _kernel("ampere_sgemm_128x64_nn", 100.875, 0.25)]
    accounting = time_accounting(_write(tmp_path, events))
    assert accounting["busy_us"] == 0.75 and accounting["window_us"] == 0.875


def test_multimem_all_reduce_is_communication(tmp_path):
    events = [_kernel("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
                      "(c10::BFloat16*, unsigned long)", 0, 4)]
    accounting = time_accounting(_write(tmp_path, events))
    assert accounting["communication_us"] == 4 and accounting["compute_us"] == 0


def test_negative_and_missing_durations_are_defects_left_out(tmp_path):
    events = [_kernel("ampere_sgemm_128x64_nn", 0, 10),
              _kernel("ampere_sgemm_128x64_nn", 20, -0.04),
              _kernel("ampere_sgemm_128x64_nn", 30, None),
              _copy("Memset (Device)", 40, -3, 4, cat="gpu_memset")]
    result = analyze(_write(tmp_path, events))
    assert result["trace_defects"] == {"malformed_events": 0, "negative_duration": 2,
                                       "missing_duration": 1}
    assert result["bad_duration_events"] == 3
    assert result["total_kernel_us"] == 10 and result["kernel_count"] == 1
    assert result["busy_us"] == 10 and result["copy_us"] == 0
    assert all(value >= 0 for value in result["accounting"]["parts_us"].values())


def test_copy_kernels_are_not_copy_engine_events(tmp_path):
    events = [
        _kernel(
            "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_"
            "nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>>",
            0,
            6,
        ),
        _copy("Memcpy DtoD (Device -> Device)", 10, 2, 2000),
    ]
    result = analyze(_write(tmp_path, events))
    assert result["categories"]["copy kernel"] == 6 and result["categories"]["memcpy/memset"] == 0
    assert result["copy_us"] == 2 and result["accounting"]["compute_us"] == 6
    assert result["accounting"]["parts_us"]["copies"] == 8


# ---------------------------------------------------------------------------------------
# bound-by verdicts on hand-made accountings


def _accounting(**changes):
    base = {"kind": "gpu", "window": {"step_count": 1}, "step_time_us": 1000.0,
            "idle_share": 0.1, "data_loader_us": 0.0, "exposed_communication_us": 0.0,
            "median_kernel_us": 200.0, "kernel_count": 5, "sync_calls": 0,
            "parts_per_step_us": {"matrix": 600.0, "elementwise": 300.0, "idle": 100.0}}
    base.update(changes)
    return base


@pytest.mark.parametrize("changes, data_wait_ms, verdict", [
    ({}, None, "math"),
    ({"parts_per_step_us": {"matrix": 200.0, "elementwise": 500.0, "normalisation": 200.0,
                            "idle": 100.0}}, None, "memory"),
    ({"data_loader_us": 300.0}, None, "input"),
    ({}, 0.25, "input"),
    ({"exposed_communication_us": 400.0}, None, "communication"),
    ({"idle_share": 0.7, "median_kernel_us": 8.0, "kernel_count": 900}, None, "cpu_launch"),
])
def test_bound_by_rules(changes, data_wait_ms, verdict):
    result = bound_by(_accounting(**changes), data_wait_ms=data_wait_ms)
    assert result["verdict"] == verdict
    assert result["advice"] and result["sentence"]
    assert json.loads(json.dumps(result)) == result


def test_memory_bound_advice_only_where_the_window_shows_its_cause():
    """channels_last only with convolutions in the window, a fused optimizer only where the
    optimizer is a real share of the busy time: no conv advice for an LLM."""
    memory = {"matrix": 200.0, "elementwise": 500.0, "normalisation": 200.0, "idle": 100.0}
    plain = bound_by(_accounting(parts_per_step_us=memory))
    assert plain["verdict"] == "memory"
    assert not any("channels_last" in a or "fused=True" in a for a in plain["advice"])
    convnet = bound_by(_accounting(parts_per_step_us=memory, conv_kernel_us=50.0))
    assert any("channels_last" in advice for advice in convnet["advice"])
    with_optimizer = bound_by(_accounting(parts_per_step_us={**memory, "optimizer": 100.0}))
    assert any("fused=True" in advice for advice in with_optimizer["advice"])
    cpu_conv = bound_by(_accounting(kind="cpu", parts_per_step_us=memory,
                                    ops=[{"cpu_op": "aten::mkldnn_convolution"}]))
    assert any("channels_last" in advice for advice in cpu_conv["advice"])
    assert plain["sentence"].endswith("matrix and attention work 22 %")


def test_launch_bound_sentence_names_the_short_kernels():
    result = bound_by(_accounting(idle_share=0.69, median_kernel_us=8.0, kernel_count=900))
    assert result["sentence"] == ("CPU/launch-bound: the GPU was idle 69 % of the step between "
                                  "900 kernels of median 8.0 µs (launch overhead)")
    assert any("CUDA graphs" in advice for advice in result["advice"])


def test_data_wait_passed_in_replaces_the_trace_spans():
    result = bound_by(_accounting(data_loader_us=900.0), data_wait_ms=0.0)
    assert result["verdict"] == "math"
    assert result["numbers"]["data_wait_source"] == "data_wait_ms passed in"


# ---------------------------------------------------------------------------------------
# CPU op parts and other vendors


@pytest.mark.parametrize(
    "name, part",
    [
        ("aten::addmm", "matrix"),
        ("aten::mkldnn_convolution", "matrix"),
        ("aten::_to_copy", "copies"),
        ("aten::copy_", "copies"),
        ("aten::native_layer_norm", "normalisation"),
        ("aten::gelu", "elementwise"),
        ("aten::_foreach_add_", "optimizer"),
        ("aten::scaled_dot_product_attention", "attention"),
        ("aten::t", None),
        ("autograd::engine::evaluate_function: AddmmBackward0", "other"),
    ],
)
def test_cpu_op_parts(name, part):
    assert cpu_op_part(name) == part


def test_cpu_trace_self_time_by_hand(tmp_path):
    def op(name, ts, dur):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = [op("aten::linear", 0, 30), op("aten::t", 1, 4), op("aten::addmm", 6, 20),
              op("aten::to", 40, 10), op("aten::_to_copy", 41, 8), op("aten::empty_strided", 42, 2),
              op("aten::copy_", 45, 3), _span("Optimizer.step#AdamW.step", 60, 20),
              op("aten::add_", 62, 10), _span("Optimizer.step#AdamW.step", 100, 10)]
    accounting = time_accounting(_write(tmp_path, events, properties=[]))
    assert accounting["kind"] == "cpu"
    assert accounting["window"]["step_count"] == 2 and accounting["window_us"] == 110
    # linear 30 us in all (t and addmm inside), the cast chain 10 us, add_ under the optimizer
    assert {p: us for p, us in accounting["parts_us"].items() if us} == {
        "matrix": 30, "copies": 10, "optimizer": 10, "idle": 60}
    assert accounting["cast_us"] == 10 and accounting["cast_share"] == pytest.approx(10 / 110,
                                                                                    abs=1e-4)
    assert accounting["step_time_us"] == 55


AMD_KERNELS = [  # names as hipBLASLt / rocBLAS (Tensile), Composable Kernel and PyTorch write them
    ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_AFC1_GRVWA8_"
     "ISA942_WG32_8_1_WGM8", 600),
    ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1_ISA90a", 100),
    ("void ck_tile::kentry<ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<"
     "ck_tile::bf16_t>>>(ck_tile::FmhaFwdKernel::Kargs)", 200),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>"
     ", at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>)", 50),
]


def test_amd_trace_gets_matrix_core_verdict_and_no_nvidia_capability(tmp_path):
    """A synthetic ROCm trace (no public AMD trace is in tests/data): deviceProperties as
    Kineto writes them on ROCm (HIP reports gfx942 as 9.4), real AMD library kernel names."""
    properties = [{"id": 0, "name": "AMD Instinct MI300X", "computeMajor": 9, "computeMinor": 4,
                   "gcnArchName": "gfx942:sramecc+:xnack-", "totalGlobalMem": 205822885888}]
    events = [
        _kernel(name, 100 * i, dur, correlation=i) for i, (name, dur) in enumerate(AMD_KERNELS)
    ]
    result = analyze(_write(tmp_path, events, properties=properties))
    assert (result["vendor"], result["arch"], result["compute_capability"]) == (
        "amd", "gfx942", None)
    assert result["verdict"]["tensor_cores"] == "yes"
    assert result["verdict"]["headline"] == (
        "Matrix Cores (AMD MFMA): yes, 100 % of matrix time in bf16/fp16 matrix-core kernels")
    top = {k["name"][:20]: k for k in result["top_kernels"]}
    assert "MI16x16x1" in top["Cijk_Ailk_Bljk_BBS_B"]["reason"]
    assert top["void ck_tile::kentry"]["category"] == "attention"


def test_amd_gpu_never_gets_a_compute_capability_from_its_name(tmp_path):
    properties = [{"id": 0, "name": "AMD Instinct MI250X", "computeMajor": 9, "computeMinor": 0}]
    events = [_kernel("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_AMAS3_ISA90a_K1_WG16_16_1", 0, 10)]
    table = load_trace(_write(tmp_path, events, properties=properties)).table
    assert (table.attrs["vendor"], table.attrs["compute_capability"]) == ("amd", None)
    result = analyze(_write(tmp_path, events, properties=properties))
    assert result["verdict"]["tensor_cores"] == "no"
    assert "vector ALUs" in result["verdict"]["headline"]


def test_no_dominant_kind_of_work_is_not_called_memory_bound():
    """One 'other' kernel filling the busy time: not "memory-bound: ... 0 % of the busy time"."""
    result = bound_by(_accounting(parts_per_step_us={"other": 900.0, "idle": 100.0}))
    assert result["verdict"] == "unknown"
    assert result["sentence"].startswith("Bound-by: unknown, no kind of work dominates")
    assert "matrix and attention 0 %" in result["sentence"]
