"""Peaks: the device-name matcher, datasheet values, measured CPU peaks and their cache,
and the fp8 advice."""

from __future__ import annotations

import json
import time

import pytest
import torch

from engine.config import Precision, RunConfig, choices, compute_dtype_for
from engine.hardware.devices import EMULATED, DeviceInfo, cpu_device, mode_support
from engine.hardware.gpus import DATASHEET_TFLOPS, datasheet_row
from engine.hardware.peaks import (
    FP8_MIN_GEMM_DIM,
    SOURCE_MEASURED,
    SOURCE_NA,
    cache_path,
    fp8_advice,
    linear_gemm_shapes,
    measure_matmul,
    next_matrix_side,
    peak_for,
    read_cache,
)

# Names exactly as NVML / torch.cuda.get_device_name report them.
KNOWN_NAMES = {
    "Tesla V100-SXM2-16GB": "V100 SXM2",
    "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla T4": "T4",
    "NVIDIA A10": "A10",
    "NVIDIA A100-SXM4-40GB": "A100 SXM/PCIe",
    "NVIDIA A100-SXM4-80GB": "A100 SXM/PCIe",
    "NVIDIA A100-PCIE-40GB": "A100 SXM/PCIe",
    "NVIDIA A100 80GB PCIe": "A100 SXM/PCIe",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA B200": "B200",
    "NVIDIA GeForce RTX 3090": "RTX 3090",
    "NVIDIA GeForce RTX 4090": "RTX 4090",
    "  nvidia h100 80gb hbm3 ": "H100 SXM",  # case and whitespace do not matter
}
# Near misses with different clocks/power: must be measured, not given a neighbour's peak.
UNKNOWN_NAMES = [
    "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA H100", "NVIDIA GH200 480GB", "NVIDIA A10G",
    "NVIDIA L40", "Tesla V100-PCIE-16GB", "Tesla V100S-PCIE-32GB", "NVIDIA GeForce RTX 4090 D",
    "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA RTX A6000",
    "NVIDIA GeForce GTX 1080 Ti", "Tesla P100-PCIE-16GB", "NVIDIA B300", "AMD EPYC", "",
]


@pytest.mark.parametrize("name, row", KNOWN_NAMES.items())
def test_known_device_names(name, row):
    assert datasheet_row(name) == row


@pytest.mark.parametrize("name", UNKNOWN_NAMES)
def test_unknown_device_names(name):
    assert datasheet_row(name) is None


def gpu(name: str, cc: tuple[int, int], usable: bool = True) -> DeviceInfo:
    return DeviceInfo(key="cuda:0", kind="cuda", name=name, capability=f"sm{cc[0]}{cc[1]}",
                      memory_bytes=80 * 2**30, driver_version="570.86.15", cuda_version="12.8",
                      compute_capability=cc, torch_usable=usable)


def test_datasheet_peaks_match_reference():
    h200 = peak_for(gpu("NVIDIA H200", (9, 0)), "bf16")
    assert h200.flops_per_s == pytest.approx(989e12) and h200.source == "datasheet (H200 SXM)"
    assert peak_for(gpu("NVIDIA H100 PCIe", (9, 0)), "fp8").flops_per_s == pytest.approx(1513e12)
    assert peak_for(gpu("NVIDIA A100-SXM4-80GB", (8, 0)), "tf32").flops_per_s == pytest.approx(156e12)
    assert peak_for(gpu("Tesla T4", (7, 5)), "fp16").flops_per_s == pytest.approx(65e12)
    assert DATASHEET_TFLOPS["B200"]["fp8"] == 4500 and DATASHEET_TFLOPS["RTX 3090"]["tf32"] == 35.6


@pytest.mark.parametrize("name, cc, dtype", [
    ("Tesla V100-SXM2-16GB", (7, 0), "tf32"),
    ("Tesla V100-SXM2-32GB", (7, 0), "bf16"),
    ("Tesla T4", (7, 5), "bf16"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "fp8"),
])
def test_no_datasheet_peak_is_na_with_reason(name, cc, dtype):
    peak = peak_for(gpu(name, cc), dtype)
    assert peak.flops_per_s is None and peak.source == SOURCE_NA
    assert dtype in peak.note and "no" in peak.note


def test_unknown_gpu_this_torch_cannot_use_is_na():
    peak = peak_for(gpu("NVIDIA H100 NVL", (9, 0), usable=False), "bf16")
    assert peak.flops_per_s is None and "CUDA build" in peak.note


def test_unknown_dtype_names_the_field():
    with pytest.raises(ValueError, match="compute_dtype='int4'"):
        peak_for(cpu_device(), "int4")


@pytest.mark.parametrize("dtype", ["tf32", "fp8"])
def test_cpu_has_no_tf32_or_fp8_peak(dtype):
    peak = peak_for(cpu_device(), dtype)
    assert peak.flops_per_s is None and peak.source == SOURCE_NA and "CPU" in peak.note


def test_cpu_peak_is_measured_then_cached(home):
    cpu = cpu_device()
    assert peak_for(cpu, "fp32", measure=False).flops_per_s is None  # nothing cached yet
    start_s = time.perf_counter()
    first = peak_for(cpu, "fp32")
    measure_s = time.perf_counter() - start_s
    assert first.source == SOURCE_MEASURED and first.flops_per_s > 1e8
    assert measure_s < 6.0  # 1.5 s budget plus one-time thread-pool start-up
    assert cache_path() == home / "peaks_cache.json"
    entries = json.loads(cache_path().read_text())
    (key, entry), = entries.items()
    assert "fp32" in key and f"threads {torch.get_num_threads()}" in key
    assert entry["flops_per_s"] == first.flops_per_s
    start_s = time.perf_counter()
    again = peak_for(cpu, "fp32")
    assert again.flops_per_s == first.flops_per_s
    assert time.perf_counter() - start_s < 0.5  # read from the cache, not re-measured
    assert peak_for(cpu, "fp32", measure=False).flops_per_s == first.flops_per_s


def test_cpu_bf16_note_is_honest_about_emulation(home):
    cpu = cpu_device()
    peak = peak_for(cpu, "bf16")
    assert peak.source == SOURCE_MEASURED and peak.flops_per_s > 0
    if mode_support(cpu, Precision.BF16_AMP).status == EMULATED:  # from the real ISA flags
        assert "emulated" in peak.note and "honest" in peak.note
    else:
        assert "emulated" not in peak.note


def test_corrupt_cache_is_remeasured(home):
    home.mkdir(parents=True, exist_ok=True)
    (home / "peaks_cache.json").write_text("{not json")
    assert read_cache() == {}
    assert peak_for(cpu_device(), "fp32").flops_per_s > 0
    assert len(read_cache()) == 1


def test_measure_matmul_is_bounded():
    timing = measure_matmul("cpu", "bf16", budget_s=0.5)
    assert timing.elapsed_s < 2.0 and timing.flops_per_s > 0 and timing.reps >= 1
    assert timing.n <= 1024


def test_fp8_matmul_operands_run_through_scaled_mm():
    # torch._scaled_mm has a CPU reference path: the same code the GPU check uses runs here.
    timing = measure_matmul("cpu", "fp8", budget_s=0.3, max_n=256)
    assert timing.flops_per_s > 0


def test_next_matrix_side():
    assert next_matrix_side(128, call_s=0.001, target_call_s=0.15, max_n=1024) == 256
    assert next_matrix_side(256, call_s=0.02, target_call_s=0.15, max_n=1024) is None  # 8x = 0.16 s
    assert next_matrix_side(1024, call_s=1e-5, target_call_s=0.15, max_n=1024) is None


@pytest.mark.parametrize("mode", choices(Precision))
def test_compute_dtype_matches_the_precision_plan(mode):
    from engine.training.precision import make_plan

    plan = make_plan(RunConfig(precision=mode, device="cpu"), torch.device("cpu"))
    assert compute_dtype_for(mode) == plan.compute_dtype_name


# ---------------------------------------------------------------------------------------
# fp8 advice


def test_fp8_advice_only_for_fp8():
    assert fp8_advice(RunConfig(precision="bf16-amp")) is None


def test_fp8_advice_small_gpt():
    advice = fp8_advice(RunConfig(model="gpt", size="medium", precision="fp8", batch_size=16,
                                  seq_len=1024, compile=True))
    # GPT-2 small: tokens are plenty, but d_model 768 < 2048 in K or N of every GEMM.
    assert advice and "slower than bf16" in advice and "K=768" in advice
    assert "bf16-amp" in advice and "compile" not in advice


def test_fp8_advice_resnet_convs_stay_bf16():
    advice = fp8_advice(RunConfig(model="resnet", precision="fp8"))
    assert "convolutions" in advice


def test_fp8_advice_none_for_big_gemms():
    cfg = RunConfig(model="mlp", size="medium", precision="fp8", batch_size=8192, compile=True)
    assert all(min(m, k, n) >= FP8_MIN_GEMM_DIM for _, m, k, n in linear_gemm_shapes(cfg)[1:-1])
    assert fp8_advice(cfg) is None
    assert "compile" in fp8_advice(cfg.replace(compile=False))


@pytest.mark.parametrize("model", ["gpt", "mlp", "resnet"])
@pytest.mark.parametrize("size", ["tiny", "small", "medium"])
def test_gemm_shapes_match_the_real_linear_layers(model, size):
    from engine.training.models import build_model

    cfg = RunConfig(model=model, size=size)
    layers = {(m.in_features, m.out_features) for m in build_model(cfg).modules()
              if isinstance(m, torch.nn.Linear)}
    assert {(k, n) for _, _, k, n in linear_gemm_shapes(cfg)} == layers
