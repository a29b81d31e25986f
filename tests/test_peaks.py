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
    SOURCE_MEASURED,
    SOURCE_NA,
    cache_path,
    measure_matmul,
    next_matrix_side,
    peak_for,
    plausible_range,
    read_cache,
)
from engine.training.fp8_advice import FP8_MIN_GEMM_DIM, fp8_advice, linear_gemm_shapes

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
    assert peak_for(gpu("NVIDIA A100-SXM4-80GB", (8, 0)), "tf32").flops_per_s == pytest.approx(
        156e12
    )
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


@pytest.mark.slow
def test_cpu_peak_is_measured_then_cached(home):
    cpu = cpu_device()
    assert peak_for(cpu, "fp32", measure=False).flops_per_s is None  # nothing cached yet
    start_s = time.perf_counter()
    first = _quiet_peak(cpu, "fp32")
    measure_s = time.perf_counter() - start_s
    assert first.source == SOURCE_MEASURED and first.flops_per_s > 1e8
    assert measure_s < 6.0 or first.record["elapsed_s"] < 3.0  # 1.5 s budget, thread start-up
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


@pytest.mark.slow
def test_cpu_bf16_note_is_honest_about_emulation(home):
    cpu = cpu_device()
    peak = _quiet_peak(cpu, "bf16")
    assert peak.source == SOURCE_MEASURED and peak.flops_per_s > 0
    if mode_support(cpu, Precision.BF16_AMP).status == EMULATED:  # from the real ISA flags
        assert "emulated" in peak.note and "honest" in peak.note
    else:
        assert "emulated" not in peak.note


@pytest.mark.slow
def test_corrupt_cache_is_remeasured(home):
    home.mkdir(parents=True, exist_ok=True)
    (home / "peaks_cache.json").write_text("{not json")
    assert read_cache() == {}
    assert _quiet_peak(cpu_device(), "fp32").flops_per_s > 0
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


# ---------------------------------------------------------------------------------------
# peaks that a busy machine cannot poison


def _quiet_peak(device, dtype, attempts: int = 8):
    """peak_for, retried while the machine is busy (a test machine has other work too; up
    to about 30 s): the point under test is what happens once a quiet measurement is
    possible."""
    from engine.hardware.peaks import peak_for as measured

    for _ in range(attempts):
        peak = measured(device, dtype)
        if peak.flops_per_s is not None:
            return peak
        assert "busy" in peak.note, peak.note  # the only reason a CPU peak is withheld
        time.sleep(3.0)
    # Refusing a busy figure is the behaviour under test elsewhere; what follows needs a
    # quiet one, which a machine loaded for half a minute (or a VM's steal) does not give.
    pytest.skip(f"the machine stayed busy for {attempts} measurements: {peak.note}")


def _poison(device, flops_per_s: float, busy: bool | None, version: int = 2) -> None:
    """A cache holding a tiny (0.22 GFLOP/s) or busy record for every thread count a run
    may use, as the loaded machine of the bug report left it."""
    from engine.hardware.peaks import cache_key

    entry = {"flops_per_s": flops_per_s, "n": 128, "measured_at": time.time() - 3600,
             "device_name": device.name, "source": "a run"}
    if version == 2:
        entry.update(version=2, busy=busy, load_words="other processes used 1.9 of 2 cores")
    records = {cache_key(device, dtype, threads): entry
               for dtype in ("fp32", "bf16", "fp16")
               for threads in {1, torch.get_num_threads()}}
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text(json.dumps(records))


def test_plausible_range_follows_the_isa_flags():
    from engine.hardware.peaks import plausible_range

    avx2 = cpu_device(flags=frozenset({"avx2", "fma"}), name="AVX2 CPU")
    low, high, basis = plausible_range(avx2, "fp32", threads=2, clock_ghz=2.5)
    assert basis.startswith("2 thread(s) x 2.50 GHz x 32 FLOP/cycle = 160 GFLOP/s")
    assert low == pytest.approx(8e9) and high == pytest.approx(320e9)
    # bf16 emulated on AVX2: at most the fp32 rate, with a far lower floor
    low16, high16, basis16 = plausible_range(avx2, "bf16", threads=2, clock_ghz=2.5)
    assert high16 == high and low16 < low / 50 and "bf16 emulated" in basis16
    amx = cpu_device(flags=frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
                     name="AMX CPU")
    assert plausible_range(amx, "bf16", threads=2, clock_ghz=2.5)[1] == pytest.approx(
        2 * 2.5e9 * 1024 * 2)
    avx512bf16 = cpu_device(flags=frozenset({"avx512f", "avx512_bf16"}), name="Zen 4")
    assert plausible_range(avx512bf16, "bf16", threads=1, clock_ghz=2.0)[1] == pytest.approx(
        2e9 * 128 * 2)
    # The 0.22 GFLOP/s record of the bug report is far below any real fp32 matmul here.
    assert plausible_range(cpu_device(), "fp32")[0] > 0.22e9


def test_a_peak_refused_for_steal_says_steal_not_only_the_idle_cores():
    """A shared VM's hypervisor can take the CPUs while no other process here runs: the
    reason must say so (it read 'other processes used 0.0 of 2 cores')."""
    from engine.hardware.peaks import MatmulTiming, _record, unusable_reason

    cpu = cpu_device()
    timing = MatmulTiming(flops_per_s=140e9, n=1024, reps=12, elapsed_s=1.4)
    record = _record(timing, {"others_cpu_cores": 0.0, "steal_pct": 16.1}, 2, cpu, "a run")
    assert record["busy"] is True and record["causes"] == ["steal"]
    assert unusable_reason(record, cpu, "fp32") == (
        "measured while the machine was busy (other processes used 0.0 of 2 cores; the "
        "hypervisor took 16 % of the CPU time (steal))")
    quiet = _record(timing, {"others_cpu_cores": 0.1, "steal_pct": 1.0}, 2, cpu, "a run")
    assert quiet["busy"] is False
    assert _record(timing, {}, 2, cpu, "a run")["load_words"] == "load not measured"


@pytest.mark.slow
@pytest.mark.parametrize("flops, busy, version, why", [
    (0.22e9, False, 2, "below"),           # a tiny figure, even one recorded as quiet
    (90e9, True, 2, "busy"),               # a busy record
    (90e9, None, 1, "without the machine's load"),  # older code's record: no load evidence
])
def test_a_poisoned_peak_record_is_not_used_and_is_measured_again(home, flops, busy, version,
                                                                  why):
    from engine.hardware.peaks import cache_key, unusable_reason

    cpu = cpu_device()
    _poison(cpu, flops, busy, version)
    stored = read_cache()[cache_key(cpu, "fp32")]
    assert why in unusable_reason(stored, cpu, "fp32")
    assert peak_for(cpu, "fp32", measure=False).flops_per_s is None  # never used as is
    peak = _quiet_peak(cpu, "fp32")
    low, high, _ = plausible_range(cpu, "fp32")
    assert low <= peak.flops_per_s <= high
    fresh = read_cache()[cache_key(cpu, "fp32")]
    assert fresh["busy"] is False and fresh["version"] == 2 and fresh["trials"] >= 3
    assert fresh["flops_per_s"] == peak.flops_per_s
    assert peak.label.startswith("measured fp32 matmul peak, ") and "machine quiet" in peak.label


@pytest.mark.slow
def test_a_peak_measured_under_load_is_never_kept(home):
    from bench._hog import bursty_hog, cpu_hog

    cpu = cpu_device()
    # Detached spinners: the probe counts this process's own children as its work.
    with cpu_hog(processes=2, detached=True):
        time.sleep(0.3)
        peak = peak_for(cpu, "fp32")
    assert peak.flops_per_s is None, "a steady hog must never pass as quiet"
    assert "busy" in peak.note and "MFU is omitted" in peak.note, peak.note
    assert read_cache() == {}  # nothing kept
    with bursty_hog(processes=2, seed=3, detached=True):
        time.sleep(0.3)
        peak = peak_for(cpu, "fp32")
    if peak.flops_per_s is None:
        assert "busy" in peak.note and read_cache() == {}
    else:  # the bursts paused for the whole 1.5 s: then it was quiet, with the evidence
        (record,) = read_cache().values()
        assert record["busy"] is False and record["others_cpu_cores"] < 0.5


@pytest.mark.slow
def test_a_run_that_beats_its_peak_marks_it_for_measuring_again(home):
    from engine.hardware.peaks import cache_key, note_achieved, unusable_reason

    cpu = cpu_device()
    peak = _quiet_peak(cpu, "fp32")
    assert not note_achieved(cpu, "fp32", peak.flops_per_s * 0.5)  # below: nothing to do
    assert note_achieved(cpu, "fp32", peak.flops_per_s * 1.3)
    assert "a run achieved" in unusable_reason(read_cache()[cache_key(cpu, "fp32")], cpu, "fp32")
    again = _quiet_peak(cpu, "fp32")  # measured again, not the beaten record
    assert "beaten_by_flops_per_s" not in read_cache()[cache_key(cpu, "fp32")]
    assert again.flops_per_s > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_device_check_replaces_a_poisoned_peak(home):
    from engine.diagnostics.check import run_check
    from engine.hardware.peaks import cache_key

    cpu = cpu_device()
    _poison(cpu, 0.22e9, False)
    for _attempt in range(3):
        result = run_check("cpu", time_budget_s=8)
        fp32 = next(line for line in result["lines"] if line["dtype"] == "fp32")
        if fp32["peak_record"]["kept"]:
            break
        assert "busy" in fp32["peak_record"]["not_kept_because"], fp32["peak_record"]
        time.sleep(2.0)
    if not fp32["peak_record"]["kept"]:
        pytest.skip(f"every check's measurement was refused as busy: {fp32['peak_record']}")
    record = read_cache()[cache_key(cpu, "fp32")]
    assert record["source"] == "device check" and record["busy"] is False
    assert record["flops_per_s"] == pytest.approx(fp32["value"] * 1e9, rel=1e-3)
    assert peak_for(cpu, "fp32", measure=False).flops_per_s == record["flops_per_s"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_next_run_after_a_poisoned_cache_reports_a_plausible_mfu(home, cli):
    """The bug report's state: a tiny fp32 record (taken under load, before records kept
    their load). A real run (worker, trainer) measures the peak again and its MFU is
    plausible, named against the new peak; the cache holds the new, quiet record."""
    from engine.hardware.peaks import cache_key

    cpu = cpu_device()
    _poison(cpu, 0.22e9, None, version=1)
    refusals = []
    for _attempt in range(4):
        proc = cli("run", "--model", "mlp", "--precision", "fp32", "--steps", "30",
                   "--batch-size", "64", "--no-profile", "--json", timeout=240)
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        # the headline MFU is against the ISA peak whatever the cache holds (one basis)
        assert result["mfu"] == pytest.approx(result["mfu_peaks"]["datasheet"]["mfu"])
        if result["mfu_peaks"]["measured"]["mfu"] is not None:
            break
        # Refused as busy (other processes, or the hypervisor's steal on a shared VM): the
        # poisoned record is not used either, the ISA-peak MFU still is, and the next run
        # measures again.
        assert result["mfu_peaks"]["datasheet"]["mfu"] > 0
        refusals.append(result["mfu_peaks"]["measured"]["label"])
        time.sleep(2.0)
    measured = result["mfu_peaks"]["measured"]
    if measured["mfu"] is None:
        pytest.skip(f"every peak measurement was refused as busy: {refusals}")
    assert 0.0 < measured["mfu"] <= 1.0
    assert result["mfu_peak"].startswith("ISA peak of this CPU for fp32")
    assert measured["label"].startswith("measured fp32 matmul peak, ")
    assert "(a run, " in measured["label"] and "machine quiet" in measured["label"]
    records = [r for k, r in read_cache().items() if "|fp32|" in k and r.get("version") == 2
               and not r.get("busy")]
    assert records and all(r["flops_per_s"] > 1e9 for r in records)
    assert read_cache()[cache_key(cpu, "fp32", 1)]["flops_per_s"] > 1e9  # the run's key
