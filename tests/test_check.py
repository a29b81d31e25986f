"""The device check: a real bounded CPU run, pure verdict rules with realistic GPU numbers,
kernel evidence from real traces and the child-process runner."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
import torch

from engine.config import Precision
from engine.diagnostics.check import (
    NOT_SUPPORTED,
    OK,
    SLOW,
    VERDICTS,
    CheckFailed,
    dtype_support,
    kernel_events,
    matmul_verdict,
    run_check,
    run_check_subprocess,
    speed_words,
    summarize_kernels,
    tensor_core_of,
)
from engine.hardware.devices import (
    EMULATED,
    NATIVE,
    DeviceInfo,
    ModeSupport,
    cpu_device,
    mode_support,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
TRACES = REPO_ROOT / "tests" / "data" / "traces"
LINE_KEYS = {"test", "dtype", "value", "unit", "peak", "ratio_to_peak", "speedup_vs_fp32",
             "verdict", "reason", "kernels"}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs an NVIDIA GPU and a CUDA build of torch")


def load_trace(name: str) -> dict:
    with gzip.open(TRACES / name, "rt", encoding="utf-8") as handle:
        return json.load(handle)


# ---------------------------------------------------------------------------------------
# a real CPU check


@pytest.fixture(scope="module")
def cpu_result():
    updates: list[tuple[float, str]] = []
    start_s = time.perf_counter()
    result = run_check("cpu", progress=lambda f, m: updates.append((f, m)), time_budget_s=8)
    return result, updates, time.perf_counter() - start_s


@pytest.mark.slow
def test_cpu_check_structure(cpu_result):
    result, _updates, wall_s = cpu_result
    json.dumps(result)  # JSON-serialisable as is
    assert {"device", "lines", "nvml", "elapsed_s"} <= set(result)
    assert result["device"]["key"] == "cpu" and result["device"]["kind"] == "cpu"
    assert set(result["device"]["modes"]) == set(m.value for m in Precision)
    assert wall_s < 8 + 6  # the budget, plus one-time thread-pool start-up
    matmuls = {line["dtype"]: line for line in result["lines"] if line["test"] == "matmul"}
    assert set(matmuls) == {"fp32", "tf32", "fp16", "bf16", "fp8"}
    assert any(line["test"] == "memory copy" for line in result["lines"])
    for line in result["lines"]:
        assert LINE_KEYS <= set(line), line
        assert line["verdict"] in VERDICTS and line["reason"], line


def test_cpu_check_verdicts_follow_the_real_isa(cpu_result):
    result, _updates, _wall_s = cpu_result
    cpu = cpu_device()
    matmuls = {line["dtype"]: line for line in result["lines"] if line["test"] == "matmul"}
    assert matmuls["fp32"]["verdict"] == OK and matmuls["fp32"]["value"] > 0
    assert matmuls["fp32"]["unit"] == "GFLOP/s" and matmuls["fp32"]["speedup_vs_fp32"] == 1.0
    assert matmuls["tf32"]["verdict"] == NOT_SUPPORTED and matmuls["tf32"]["value"] is None
    assert matmuls["fp8"]["verdict"] == NOT_SUPPORTED
    for dtype, mode in (("bf16", Precision.BF16_AMP), ("fp16", Precision.FP16_AMP)):
        line = matmuls[dtype]
        assert line["value"] > 0 and line["speedup_vs_fp32"] > 0
        if mode_support(cpu, mode).status == EMULATED:
            assert line["verdict"] == SLOW and "emulated" in line["reason"]
    assert result["nvml"] is None and result["nvml_reason"]
    # the CPU's ISA peak (the one Live's MFU uses), and oneDNN's evidence per dtype
    assert matmuls["fp32"]["peak"] > 0 and matmuls["fp32"]["peak_source"].startswith("ISA peak")
    assert result["onednn_probe_error"] is None
    fp32_rows = matmuls["fp32"]["kernels"]
    assert any(row["kind"] == "convolution backward weights" and row["implementation"]
               for row in fp32_rows), fp32_rows
    assert all(row["name"] for line in matmuls.values() for row in line["kernels"])
    assert "flags: " in matmuls["bf16"]["reason"] and "measured: " in matmuls["bf16"]["reason"]
    if not torch.cuda.is_available():
        assert "CPU-only build" in result["no_gpu_reason"] or "no GPU" in result["no_gpu_reason"]


def test_cpu_check_progress(cpu_result):
    _result, updates, _wall_s = cpu_result
    fractions = [fraction for fraction, _message in updates]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert any("bf16" in message for _f, message in updates)


@pytest.mark.slow
def test_tiny_budget_still_bounded_and_every_line_has_a_verdict():
    start_s = time.perf_counter()
    result = run_check("cpu", time_budget_s=1.5)
    assert time.perf_counter() - start_s < 1.5 + 5
    assert all(line["verdict"] in VERDICTS for line in result["lines"])


def test_unknown_device_names_the_field():
    from engine.config import ConfigError

    with pytest.raises(ConfigError, match="device"):
        run_check("cuda:7")


# ---------------------------------------------------------------------------------------
# verdict rules with realistic GPU numbers


def test_h200_bf16_near_peak_is_ok():
    support = ModeSupport(NATIVE, "NVIDIA H200 (sm90, Hopper) has bf16 Tensor Cores")
    verdict, reason = matmul_verdict("cuda", "bf16", support, ratio_to_peak=780 / 989,
                                     speedup_vs_fp32=780 / 51.5, tensor_core="yes")
    assert verdict == OK and "79% of datasheet peak" in reason and "15.15x fp32" in reason


def test_under_half_of_peak_is_slow():
    support = ModeSupport(NATIVE, "has fp16 Tensor Cores")
    verdict, reason = matmul_verdict("cuda", "fp16", support, 0.31, 4.2, "yes")
    assert verdict == SLOW and "31%" in reason and "throttle" in reason


def test_tensor_core_dtype_on_cuda_cores_is_slow():
    support = ModeSupport(NATIVE, "has fp16 Tensor Cores")
    verdict, reason = matmul_verdict("cuda", "fp16", support, 0.8, 2.0, "no",
                                     "ampere_sgemm_128x64_nn ('sgemm')")
    assert verdict == SLOW and "CUDA cores" in reason and "sgemm" in reason


def test_emulated_bf16_on_v100_is_slow():
    support = ModeSupport(EMULATED, "Tesla V100 has fp16 Tensor Cores but no bf16")
    verdict, reason = matmul_verdict("cuda", "bf16", support, None, 0.9, "no")
    assert verdict == SLOW and reason.startswith("emulated")


def test_unknown_gpu_without_peak_is_ok_with_reason():
    support = ModeSupport(NATIVE, "has bf16 Tensor Cores")
    verdict, reason = matmul_verdict("cuda", "bf16", support, None, 12.0, "yes",
                                     peak_note="NVIDIA H100 NVL is not in the table")
    assert verdict == OK and "no datasheet peak" in reason


def test_native_cpu_bf16_slower_than_fp32_is_slow():
    support = ModeSupport(NATIVE, "native bf16 dot products (avx512_core_bf16)")
    assert matmul_verdict("cpu", "bf16", support, None, 1.8)[0] == OK
    assert matmul_verdict("cpu", "bf16", support, None, 0.7)[0] == SLOW


def test_speed_words():
    assert speed_words(2.614) == "2.61x fp32"
    assert speed_words(0.0149) == "67x slower than fp32"
    assert speed_words(None) == ""


def test_fp8_matmul_support_needs_sm89_not_torchao():
    def gpu(cc):
        return DeviceInfo(key="cuda:0", kind="cuda", name="GPU", capability=f"sm{cc[0]}{cc[1]}",
                          memory_bytes=None, compute_capability=cc)

    assert dtype_support(gpu((9, 0)), "fp8").status == NATIVE
    assert dtype_support(gpu((8, 9)), "fp8").status == NATIVE
    assert dtype_support(gpu((8, 0)), "fp8").status == "unsupported"


# ---------------------------------------------------------------------------------------
# kernel evidence from real traces


def test_kernel_events_both_schema_variants():
    assert len(kernel_events(load_trace("h100_qwen_tracelens.json.gz"))) == 1465  # cat "kernel"
    assert len(kernel_events(load_trace("v100_resnet50_kineto_v1.json.gz"))) == 8772  # "Kernel"
    assert kernel_events({"traceEvents": []}) == []


def test_summarize_and_tensor_core_verdict_on_an_h100_trace():
    events = kernel_events(load_trace("h100_qwen_tracelens.json.gz"))
    kernels = summarize_kernels(events, top=10)
    assert len(kernels) == 10
    totals = [k["total_us"] for k in kernels]
    assert totals == sorted(totals, reverse=True)
    assert sum(k["count"] for k in summarize_kernels(events, top=10_000)) == len(events)
    verdict, evidence = tensor_core_of(kernels)
    assert verdict in ("yes", "no", "unknown") and evidence


def test_tensor_core_of_no_kernels_says_why():
    verdict, evidence = tensor_core_of([])
    assert verdict == "unknown" and "CUPTI" in evidence


# ---------------------------------------------------------------------------------------
# child process (what the page uses)


@pytest.mark.slow
def test_run_check_subprocess_relays_progress(home):
    updates = []
    result = run_check_subprocess("cpu", progress=lambda f, m: updates.append(f), time_budget_s=3)
    assert result["device"]["key"] == "cpu" and result["lines"]
    assert updates and updates[-1] == 1.0


@pytest.mark.slow
def test_run_check_subprocess_bad_device_fails_with_the_cli_message(home):
    with pytest.raises(CheckFailed, match="--device 'cuda:9'"):
        run_check_subprocess("cuda:9", time_budget_s=3)


# ---------------------------------------------------------------------------------------
# GPU only


@needs_cuda
def test_gpu_check_finds_tensor_cores():
    result = run_check("cuda:0", time_budget_s=40)
    json.dumps(result)
    lines = {line["dtype"]: line for line in result["lines"] if line["test"] == "matmul"}
    assert lines["fp32"]["value"] > 0 and lines["fp32"]["unit"] == "TFLOP/s"
    cc = torch.cuda.get_device_capability(0)
    if cc >= (8, 0):
        assert lines["bf16"]["kernels"] and lines["bf16"]["tensor_core"] == "yes"
        assert lines["bf16"]["speedup_vs_fp32"] > 2
    assert result["nvml"] is not None or result["nvml_reason"]


def test_a_gpu_matmul_above_its_datasheet_peak_is_never_ok():
    # 1.4x the H200's dense bf16 peak: a timing error (an unsynchronised clock), not a fast GPU.
    support = ModeSupport(NATIVE, "NVIDIA H200 (sm90, Hopper) has bf16 Tensor Cores")
    verdict, reason = matmul_verdict("cuda", "bf16", support, ratio_to_peak=1.4,
                                     speedup_vs_fp32=27.0, tensor_core="yes")
    assert verdict == SLOW and "more than the GPU can do" in reason
    ok, _ = matmul_verdict("cuda", "bf16", support, ratio_to_peak=1.05,
                           speedup_vs_fp32=20.0, tensor_core="yes")
    assert ok == OK  # boost clocks: a few % over the datasheet is real
