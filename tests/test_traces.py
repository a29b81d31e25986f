"""engine.traces.verdict on real profiler traces (tests/data/traces, see SOURCES.md) and on small
synthetic traces that pin the attribution and cause logic down exactly.

Each real trace is parsed once per module (fixture `tables`); the whole file runs in a few
seconds.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from engine.traces.kernels import KERNEL_CATEGORIES
from engine.traces.parser import TABLE_COLUMNS, load_kernel_table, trace_device, trace_metadata
from engine.traces.verdict import (
    CAUSE_FP32_IN_AMP,
    CAUSE_FP32_NO_TF32,
    CAUSE_FP32_PRE_AMPERE,
    CAUSE_NO_HARDWARE,
    CAUSE_SMALL_SHAPES,
    UNATTRIBUTED_OP,
    analyze_trace,
    breakdown,
    kernel_groups,
    kernel_summary_rows,
)

TRACES = Path(__file__).parent / "data" / "traces"
TRACE_FILES = sorted(p.name for p in TRACES.glob("*.json.gz"))

# Expected numbers per trace. total/tensor-core time are sums of kernel `dur` (us).
# V100 and H100-bert were verified independently of engine code with jq:
#   zcat F | jq '[.traceEvents[] | select(.cat=="kernel" or .cat=="Kernel")]
#     | {count: length, total_us: (map(.dur)|add),
#        tc_us: (map(select(.name|test("tensorop|xmma_gemm|flash_fwd|s884|s1688|16816|nvjet"))
#                    | select(.name|test("ffma|simt")|not) | .dur) | add),
#        top: (group_by(.name) | map({name: .[0].name, us: (map(.dur)|add)}) | max_by(.us))}'
#   v100: count 8772, total_us 591532, tc_us null (none), top dgrad_engine 80756 us
#   h100 bert: count 60, total_us 307.197, tc_us 235.006, top cutlass wmma bf16 98.718 us
#   (h100 qwen, same filter: 1465 kernels, 45432.698 us, tc 16645.386 us)
# The V100 per-op number was checked the same way by joining kernel args["external id"] to
# Operator args["External id"]: aten::cudnn_convolution_backward_weight 141933 us.
EXPECTED = {
    "a100_alexnet_hta.json.gz": dict(
        kernel_count=79, total_kernel_us=10692.0, tensor_core_us=1814.0,
        device="NVIDIA A100-PG509-200", verdict="partly",
        top_kernel="ampere_sgemm_32x32_sliced1x4_tn"),
    "a100_conv_nccl_hta.json.gz": dict(
        kernel_count=2700, total_kernel_us=162532.34, tensor_core_us=38611.252,
        device="NVIDIA A100-PG509-200", verdict="yes",
        top_kernel="ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, "
                   "ncclWork*)"),
    "b200_eager_tracelens.json.gz": dict(
        kernel_count=768, total_kernel_us=10862.916, tensor_core_us=6485.42,
        device="NVIDIA B200", verdict="yes",
        top_kernel="bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_"
                   "16dp256b_rM_TN_transOut_schedP2x1x2x3_biasM_bN_tma_tmaOpt_clmp_swiGlu_"
                   "dynBatch_sm100f"),
    "gp100_pascal_hta.json.gz": dict(
        kernel_count=130, total_kernel_us=290.0, tensor_core_us=0.0,
        device="Quadro GP100", verdict="no",
        top_kernel="void at::native::vectorized_elementwise_kernel<4, at::native::"
                   "CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::"
                   "CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"),
    "h100_bert_small_tracelens.json.gz": dict(
        kernel_count=60, total_kernel_us=307.197, tensor_core_us=235.006,
        device="NVIDIA H100 80GB HBM3", verdict="yes",
        top_kernel="void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_"
                   "128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_"
                   "tn_align8::Params)"),
    "h100_qwen_tracelens.json.gz": dict(
        kernel_count=1465, total_kernel_us=45432.698, tensor_core_us=16645.386,
        device="NVIDIA H100 80GB HBM3", verdict="yes",
        top_kernel="sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize"
                   "1x1x1_execute_segment_k_off_kernel__5x_cublas"),
    # MI300X (jq as above, matrix cores: names with an MFMA 'MI' token or AOTriton attn_fwd)
    "mi300_bert_small_tracelens.json.gz": dict(
        kernel_count=60, total_kernel_us=388.344, tensor_core_us=287.786,
        device="AMD Instinct MI300X VF", verdict="yes", top_kernel="attn_fwd"),
    "mi300_qwen_tracelens.json.gz": dict(
        kernel_count=1516, total_kernel_us=43062.042, tensor_core_us=22583.105,
        device="AMD Instinct MI300X VF", verdict="yes",
        top_kernel='Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA1024_LBSPPB512_LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV0_MIWT8_4_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS16_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW8_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_VSn1_VWA8_VWB4_WSGRA0_WSGRB0_WS64_WG32_8_1'),
    "v100_resnet50_kineto_v1.json.gz": dict(
        kernel_count=8772, total_kernel_us=591532.0, tensor_core_us=0.0,
        device="Tesla V100-DGXS-32GB", verdict="no",
        top_kernel="void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, "
                   "int, float const*, int, float const*, int, float*, kernel_grad_params, "
                   "unsigned long long, int, unsigned long long, int, float, int, int, int)"),
}


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    return {name: load_kernel_table(TRACES / name) for name in TRACE_FILES}


@pytest.fixture(scope="module")
def summaries(tables) -> dict[str, dict]:
    return {name: breakdown(table) for name, table in tables.items()}


def test_every_fixture_trace_has_expectations():
    assert TRACE_FILES == sorted(EXPECTED)


# --- real traces -----------------------------------------------------------------------

@pytest.mark.parametrize("name", TRACE_FILES)
def test_trace_headline_numbers(name, tables, summaries):
    expected, summary = EXPECTED[name], summaries[name]
    assert len(tables[name]) == expected["kernel_count"] == summary["kernel_count"]
    assert summary["total_kernel_us"] == pytest.approx(expected["total_kernel_us"], abs=1e-3)
    assert summary["tensor_core_us"] == pytest.approx(expected["tensor_core_us"], abs=1e-3)
    assert summary["top_kernels"][0]["name"] == expected["top_kernel"]
    assert summary["device"] == expected["device"]
    assert summary["verdict"]["tensor_cores"] == expected["verdict"]


@pytest.mark.parametrize("name", TRACE_FILES)
def test_table_shape_and_classification(name, tables):
    table = tables[name]
    assert tuple(table.columns) == TABLE_COLUMNS
    assert table["dur_us"].dtype == "float64" and (table["dur_us"] >= 0).all()
    assert table["ts_us"].is_monotonic_increasing
    assert set(table["category"]) <= set(KERNEL_CATEGORIES)
    assert set(table["tensor_core"]) <= {"yes", "no", "unknown"}
    assert table["stream"].notna().all()  # both schemas: args.stream or tid "stream 7"


@pytest.mark.parametrize("name", TRACE_FILES)
def test_breakdown_is_consistent_and_json_serialisable(name, summaries):
    summary = summaries[name]
    assert json.loads(json.dumps(summary)) == summary
    total = summary["total_kernel_us"]
    assert sum(summary["categories"].values()) == pytest.approx(total, rel=1e-9, abs=0.01)
    assert sum(op["kernel_us"] for op in summary["per_op"]) == pytest.approx(total, abs=0.01)
    for share in (summary["tensor_core_share"], summary["matrix_tensor_core_share"]):
        assert share is None or 0.0 <= share <= 1.0
    tops = summary["top_kernels"]
    assert 0 < len(tops) <= 20
    assert [k["total_us"] for k in tops] == sorted((k["total_us"] for k in tops), reverse=True)
    assert set(tops[0]) >= {"name", "total_us", "count", "tensor_core", "dtype", "reason",
                            "category"}
    verdict = summary["verdict"]
    assert verdict["tensor_cores"] in ("yes", "partly", "no", "unknown")
    assert verdict["headline"].startswith(("Tensor Cores: ", "Matrix Cores (AMD MFMA): "))
    assert verdict["evidence"]


def test_old_schema_v100_kernels_and_attribution(tables, summaries):
    table = tables["v100_resnet50_kineto_v1.json.gz"]
    assert table["cpu_op"].notna().all()  # kernels carry "external id" (lower case) here
    top_op = summaries["v100_resnet50_kineto_v1.json.gz"]["per_op"][0]
    assert (top_op["cpu_op"], top_op["kernel_us"]) == (
        "aten::cudnn_convolution_backward_weight", 141933.0)


def test_v100_fp32_run_explains_itself(summaries):
    summary = summaries["v100_resnet50_kineto_v1.json.gz"]
    assert summary["compute_capability"] == "7.0"
    assert summary["matrix_tensor_core_share"] == 0.0
    causes = {c for entry in summary["could_have_didnt"] for c in entry["likely_causes"]}
    assert CAUSE_FP32_PRE_AMPERE in causes


def test_independent_totals_match(tables):
    """Plain json + sum, no engine code: the same totals for one trace of each schema."""
    for name in ("v100_resnet50_kineto_v1.json.gz", "h100_bert_small_tracelens.json.gz"):
        with gzip.open(TRACES / name, "rt") as handle:
            events = json.load(handle)["traceEvents"]
        durations = [e["dur"] for e in events if e.get("cat") in ("kernel", "Kernel")]
        assert len(tables[name]) == len(durations)
        assert tables[name]["dur_us"].sum() == pytest.approx(sum(durations))


def test_pascal_reports_no_tensor_core_hardware(tables, summaries):
    summary = summaries["gp100_pascal_hta.json.gz"]
    assert summary["tensor_core_us"] == 0.0 and summary["tensor_core_share"] == 0.0
    assert summary["compute_capability"] == "6.0"
    assert "has no Tensor Cores" in summary["verdict"]["headline"]
    [entry] = summary["could_have_didnt"]
    assert entry["cpu_op"] == "aten::mm"  # found by launch time: HTA rewrote External ids
    assert entry["likely_causes"][0].startswith(CAUSE_NO_HARDWARE)
    assert len(entry["likely_causes"]) == 1


def test_a100_fp32_matmul_without_tf32(summaries):
    summary = summaries["a100_alexnet_hta.json.gz"]
    entries = {e["cpu_op"]: e for e in summary["could_have_didnt"]}
    assert entries["aten::addmm"]["likely_causes"] == [CAUSE_FP32_NO_TF32]
    assert entries["aten::addmm"]["kernels"] == ["ampere_sgemm_32x32_sliced1x4_tn"]


def test_h100_amp_run_flags_the_fp32_bmm(summaries):
    summary = summaries["h100_qwen_tracelens.json.gz"]
    entries = {e["cpu_op"]: e for e in summary["could_have_didnt"]}
    assert CAUSE_FP32_IN_AMP in entries["aten::bmm"]["likely_causes"]
    # Never "100 %" while an op is listed as running without Tensor Cores.
    assert summary["verdict"]["headline"] == (
        "Tensor Cores: yes, 99.98 % of matrix time in bf16 tensor-core kernels")


def test_kernels_launched_before_the_window_are_unattributed(tables, summaries):
    table = tables["h100_qwen_tracelens.json.gz"]
    assert int(table["cpu_op"].isna().sum()) == 436
    assert summaries["h100_qwen_tracelens.json.gz"]["per_op"][0]["cpu_op"] == UNATTRIBUTED_OP


def test_kernel_summary_rows_sum_to_the_table(tables):
    table = tables["h100_bert_small_tracelens.json.gz"]
    rows = kernel_summary_rows(table)
    assert sum(r["total_us"] for r in rows) == pytest.approx(table["dur_us"].sum(), abs=0.01)
    assert sum(r["count"] for r in rows) == len(table)
    assert set(rows[0]) == {"name", "cpu_op", "total_us", "count", "category", "tensor_core",
                            "dtype", "reason"}


@pytest.mark.parametrize("name", ["v100_resnet50_kineto_v1.json.gz",
                                  "a100_conv_nccl_hta.json.gz"])
def test_kernel_groups_match_a_plain_sum_per_kernel_name(name, tables):
    """Every breakdown figure comes from kernel_groups: its per-name sums and counts must be
    those of the raw events (plain json, no engine code)."""
    with gzip.open(TRACES / name, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    expected: dict[str, list[float]] = {}
    for event in events:
        if event.get("cat") in ("kernel", "Kernel"):
            expected.setdefault(event["name"], []).append(event["dur"])
    got: dict[str, list] = {}
    for group in kernel_groups(tables[name]):
        entry = got.setdefault(group.name, [0.0, 0])
        entry[0] += group.us
        entry[1] += group.count
    assert set(got) == set(expected)
    for kernel, durations in expected.items():
        assert got[kernel][1] == len(durations)
        assert got[kernel][0] == pytest.approx(sum(durations), rel=1e-12, abs=1e-9)


def test_ties_are_ordered_the_same_way_every_time(tmp_path):
    """Equal times: top kernels in the order they first ran, ops alphabetically."""
    events = [
        _op("aten::mm", 0, 20, ext=1), _launch(5, correlation=1, ext=1),
        _kernel("ampere_sgemm_64x64_nn", 10, 5, 1),
        _op("aten::addmm", 30, 20, ext=2), _launch(35, correlation=2, ext=2),
        _kernel("ampere_sgemm_32x32_nn", 40, 5, 2),
    ]
    summary = breakdown(load_kernel_table(_write(tmp_path, events)))
    assert [k["name"] for k in summary["top_kernels"]] == ["ampere_sgemm_64x64_nn",
                                                           "ampere_sgemm_32x32_nn"]
    assert [op["cpu_op"] for op in summary["per_op"]] == ["aten::addmm", "aten::mm"]
    assert [e["cpu_op"] for e in summary["could_have_didnt"]] == ["aten::addmm", "aten::mm"]


# --- file handling ---------------------------------------------------------------------

def test_plain_json_round_trip(tmp_path, tables):
    name = "h100_bert_small_tracelens.json.gz"
    plain = tmp_path / "bert.json"
    plain.write_bytes(gzip.decompress((TRACES / name).read_bytes()))
    table = load_kernel_table(plain)
    pd.testing.assert_frame_equal(table, tables[name])
    assert table.attrs["source"] == str(plain)


def test_file_object_input(tables):
    name = "gp100_pascal_hta.json.gz"
    table = load_kernel_table(io.BytesIO((TRACES / name).read_bytes()))
    pd.testing.assert_frame_equal(table, tables[name])


def test_metadata_and_device():
    path = TRACES / "gp100_pascal_hta.json.gz"
    assert trace_device(path) == "Quadro GP100"
    meta = trace_metadata(path)
    assert (meta["compute_capability"], meta["kernel_count"]) == ("6.0", 130)
    assert analyze_trace(path)["source"] == str(path)


def test_no_trace_events_names_the_file(tmp_path):
    path = tmp_path / "memory_snapshot.json"
    path.write_text(json.dumps({"segments": [], "device_traces": []}))
    with pytest.raises(ValueError, match="memory_snapshot.json.*traceEvents"):
        load_kernel_table(path)


def test_not_json_names_the_file(tmp_path):
    path = tmp_path / "notes.json.gz"
    path.write_bytes(gzip.compress(b"this is not json"))
    with pytest.raises(ValueError, match="notes.json.gz"):
        load_kernel_table(path)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="nowhere.json"):
        load_kernel_table(tmp_path / "nowhere.json")


def test_trace_without_kernels(tmp_path):
    path = tmp_path / "cpu_only.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}))
    table = load_kernel_table(path)
    assert table.empty and tuple(table.columns) == TABLE_COLUMNS
    summary = breakdown(table)
    assert json.loads(json.dumps(summary)) == summary
    assert summary["total_kernel_us"] == 0.0 and summary["tensor_core_share"] is None
    assert summary["verdict"]["tensor_cores"] == "unknown"
    assert "No GPU kernels" in summary["verdict"]["headline"]


# --- synthetic traces: attribution and causes, exactly ---------------------------------

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0}]


def _op(name, ts, dur, ext, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext}}


def _launch(ts, correlation, ext=None, tid=1):
    args = {"correlation": correlation, "cbid": 211}
    if ext is not None:
        args["External id"] = ext
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
            "ts": ts, "dur": 2, "args": args}


def _kernel(name, ts, dur, correlation, ext=None):
    args = {"correlation": correlation, "stream": 7, "device": 0}
    if ext is not None:
        args["External id"] = ext
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": args}


def _write(tmp_path, events, properties=A100, name="trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"deviceProperties": properties, "traceEvents": events}))
    return path


def test_attribution_by_id_by_launch_time_and_unattributed(tmp_path):
    events = [
        _op("aten::linear", 0, 100, ext=10), _op("aten::addmm", 10, 40, ext=11),
        _launch(20, correlation=500, ext=11), _kernel("ampere_sgemm_64x64_nn", 30, 5, 500),
        # a tool rewrote this launch's External id: found by time instead (innermost op at 70)
        _launch(70, correlation=501, ext=99999), _kernel("ampere_sgemm_64x64_nn", 80, 7, 501),
        # launched before the profiling window: no launch event, no id
        _kernel("volta_sgemm_128x32_nt", 1, 3, 502),
        # kernel carries its own External id and its launch is missing
        _kernel("ampere_sgemm_64x64_nn", 90, 11, 503, ext=11),
    ]
    table = load_kernel_table(_write(tmp_path, events))
    by_corr = dict(zip(table["correlation"], table["cpu_op"]))
    assert by_corr == {500: "aten::addmm", 501: "aten::linear", 502: None, 503: "aten::addmm"}
    external_ids = table.set_index("correlation")["external_id"]
    assert pd.isna(external_ids[502])
    assert (external_ids[500], external_ids[501], external_ids[503]) == (11, 99999, 11)


def test_chrome_array_format_and_old_schema(tmp_path):
    events = [
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 5, "tid": "5", "ts": 0,
         "dur": 50, "args": {"External id": 3}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 5, "tid": "5", "ts": 5,
         "dur": 3, "args": {"correlation": 40, "external id": 3}},
        {"ph": "X", "cat": "Kernel", "name": "volta_h884gemm_64x128_ldg8_nn", "pid": 0,
         "tid": "stream 7", "ts": 10, "dur": 20, "args": {"correlation": 40, "external id": 3}},
    ]
    path = tmp_path / "array.json"
    path.write_text(json.dumps(events))
    table = load_kernel_table(path)
    row = table.iloc[0]
    assert (row["cpu_op"], row["stream"], row["tensor_core"], row["dtype"]) == (
        "aten::mm", 7, "yes", "fp16")
    assert table.attrs["device"] is None


def test_causes_in_a_mixed_precision_run(tmp_path):
    events = [
        _op("aten::mm", 0, 10, ext=1), _launch(1, 100, ext=1),
        _kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 20, 900, 100),
        _op("aten::bmm", 30, 10, ext=2), _launch(31, 101, ext=2),
        _kernel("ampere_sgemm_128x64_nn", 40, 60, 101),
        _op("aten::addmm", 50, 10, ext=3), _launch(51, 102, ext=3),
        _kernel("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, "
                "float, 128, 16, 4, 4, false, false>(cublasGemvParamsEx)", 60, 40, 102),
    ]
    summary = breakdown(load_kernel_table(_write(tmp_path, events)))
    assert summary["matrix_tensor_core_share"] == 0.9
    assert summary["verdict"]["tensor_cores"] == "yes"
    assert summary["verdict"]["headline"] == (
        "Tensor Cores: yes, 90 % of matrix time in bf16 tensor-core kernels")
    causes = {e["cpu_op"]: e["likely_causes"] for e in summary["could_have_didnt"]}
    assert causes["aten::bmm"] == [CAUSE_FP32_IN_AMP]
    assert causes["aten::addmm"] == [CAUSE_SMALL_SHAPES]
    assert [e["cpu_op"] for e in summary["could_have_didnt"]] == ["aten::bmm", "aten::addmm"]


def test_partly_and_no_verdicts(tmp_path):
    fp32_only = [_op("aten::mm", 0, 10, ext=1), _launch(1, 100, ext=1),
                 _kernel("ampere_sgemm_128x64_nn", 20, 100, 100)]
    summary = breakdown(load_kernel_table(_write(tmp_path, fp32_only, name="a.json")))
    assert summary["verdict"]["tensor_cores"] == "no"
    assert summary["could_have_didnt"][0]["likely_causes"] == [CAUSE_FP32_NO_TF32]
    mixed = fp32_only + [_op("aten::addmm", 30, 10, ext=2), _launch(31, 101, ext=2),
                         _kernel("nvjet_sss_tf32_64x64_64x8_1x1_v_bz_NNT", 40, 100, 101)]
    summary = breakdown(load_kernel_table(_write(tmp_path, mixed, name="b.json")))
    assert summary["verdict"]["tensor_cores"] == "partly"
    assert summary["verdict"]["headline"].startswith(
        "Tensor Cores: partly, 50 % of matrix time in tf32 tensor-core kernels; 50 % on CUDA")


def test_unknown_verdict_when_triton_templates_dominate(tmp_path):
    events = [_op("aten::mm", 0, 10, ext=1), _launch(1, 100, ext=1),
              _kernel("triton_tem_fused_mm_0", 20, 100, 100),
              _kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 200, 10, 101, ext=1)]
    summary = breakdown(load_kernel_table(_write(tmp_path, events)))
    assert summary["verdict"]["tensor_cores"] == "unknown"
    assert summary["verdict"]["evidence"] == ["triton_tem_fused_mm_0"]
    assert summary["unknown_us"] == 100.0


def test_device_override_changes_the_causes(tmp_path):
    events = [_op("aten::mm", 0, 10, ext=1), _launch(1, 100, ext=1),
              _kernel("volta_sgemm_128x32_nt", 20, 100, 100)]
    table = load_kernel_table(_write(tmp_path, events, properties=[]))
    assert table.attrs["device"] is None
    summary = breakdown(table, device="Tesla P100-PCIE-16GB")
    assert summary["compute_capability"] == "6.0"
    assert summary["could_have_didnt"][0]["likely_causes"][0].startswith(CAUSE_NO_HARDWARE)


def test_hardware_judged_from_kernel_builds_when_the_trace_names_no_gpu(tmp_path):
    def causes_for(names, file_name):
        events = [_kernel(name, 10 * i, 5, 900 + i) for i, name in enumerate(names)]
        summary = breakdown(load_kernel_table(_write(tmp_path, events, [], file_name)))
        return summary["could_have_didnt"][0]["likely_causes"]

    # only Maxwell builds ran: most likely a pre-Volta GPU
    assert causes_for(["maxwell_sgemm_128x64_nn"], "m.json")[0].startswith(CAUSE_NO_HARDWARE)
    # a volta_ build ran too, so the GPU is sm70+; cuDNN also runs maxwell_ builds there
    assert causes_for(["maxwell_scudnn_winograd_128x128_ldg1_ldg4_tile148n_nt",
                       "volta_sgemm_128x32_nt"], "v.json") == [CAUSE_FP32_NO_TF32]


# ---------------------------------------------------------------------------------------
# crafted traces: malformed events are counted and left out, non-traces refused in one line


def _kernel_event(**changes):
    event = {"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm_f16f16_tensorop", "ts": 1.0,
             "dur": 2.0, "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7, "correlation": 1}}
    event.update(changes)
    return event


@pytest.mark.parametrize("bad", [
    {"name": 12345},
    {"args": {"device": [0], "stream": 7, "correlation": 1}},
    {"args": {"device": 0, "stream": 7, "correlation": [1, 2]}},
    {"pid": {"x": 1}},
    {"cat": ["kernel"]},
])
def test_a_malformed_event_is_counted_and_left_out(tmp_path, bad):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [_kernel_event(**bad), _kernel_event()],
                                "deviceProperties": [{"id": 0, "name": 5, "computeMajor": [8]}]}))
    result = analyze_trace(path)
    assert result["kernel_count"] == 1 and result["total_kernel_us"] == pytest.approx(2.0)
    assert result["malformed_events"] == (0 if "cat" in bad else 1)


@pytest.mark.parametrize("content, words", [
    ("[1, 2, 3]", "a JSON list that is not a list of trace events"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_a_json_document_that_is_no_trace_is_refused_with_one_line(tmp_path, content, words):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(ValueError) as info:
        analyze_trace(path)
    assert words in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------
# bounded memory on any input: a gzip bomb stops at the decompressed-size limit


def _bomb(path: Path, decompressed_mib: int) -> Path:
    """A gzip file of `decompressed_mib` MiB of spaces (a few hundred kB on disk)."""
    chunk = b" " * 2**20
    with gzip.open(path, "wb", compresslevel=9) as handle:
        handle.write(b'{"traceEvents": [')
        for _ in range(decompressed_mib):
            handle.write(chunk)
        handle.write(b"]}")
    return path


@pytest.mark.slow
def test_a_gzip_bomb_is_refused_at_the_limit_with_bounded_memory(tmp_path):
    import subprocess
    import sys

    from conftest import REPO_ROOT, cli_env

    bomb = _bomb(tmp_path / "bomb.json.gz", 400)
    assert bomb.stat().st_size < 5 * 2**20
    # The CLI's own peak RSS, read by a fresh parent whose only child it is (this test
    # process's RUSAGE_CHILDREN also holds every earlier test's subprocesses).
    probe = ("import json, resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
             "print(json.dumps({'rc': r.returncode, 'stderr': r.stderr, 'peak_kib': "
             "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")
    result = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "engine",
                             "kernels", str(bomb)], cwd=str(REPO_ROOT), env=cli_env(tmp_path),
                            capture_output=True, text=True, timeout=150)
    measured = json.loads(result.stdout)
    assert measured["rc"] == 2
    # the reader holds one event's text at most: 400 MiB of spaces is no event
    assert measured["stderr"].strip().splitlines() == [
        f"error: {bomb}: an event (or text between events) longer than 64 MiB, so not a "
        "profiler trace event"]
    peak_kib = measured["peak_kib"]
    assert peak_kib < 0.75 * 2**20, f"peak RSS {peak_kib / 2**20:.2f} GiB"


@pytest.mark.parametrize("content, words", [
    (b'{"traceEvents": "abc"}', "'traceEvents' is a str, not a list of events"),
    (b'{"traceEvents": []}', "the trace has no events"),
    (b"[]", "the trace has no events"),
    (bytes(range(256)) * 4, "content that is neither gzip nor JSON"),
    (b"[1, 2, \xff\xfe]", "content that is neither gzip nor JSON text"),
    (b'[{"a": 1}]', "1 event(s), none of them a profiler event"),
    (b'{"traceEvents": [{"ph": "M", "name": "process_name"}]}', "none of them a profiler event"),
])
def test_malformed_trace_documents_are_refused_in_words(tmp_path, content, words):
    path = tmp_path / "upload.json.gz"
    path.write_bytes(content)
    with pytest.raises(ValueError) as error:
        analyze_trace(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and words in message
    assert message.count(str(path)) == 1


def test_the_trace_limit_is_configurable(tmp_path, monkeypatch):
    from engine.traces.parser import TraceTooLarge

    bomb = _bomb(tmp_path / "small.json.gz", 3)
    monkeypatch.setenv("PRECISION_LAB_MAX_TRACE_MIB", "2")
    with pytest.raises(TraceTooLarge, match="larger than 2 MiB"):
        analyze_trace(bomb)
    monkeypatch.setenv("PRECISION_LAB_MAX_TRACE_MIB", "8")
    with pytest.raises(ValueError, match="the trace has no events"):  # read: within the limit
        analyze_trace(bomb)
