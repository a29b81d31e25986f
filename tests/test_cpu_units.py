"""One verdict per mode on a CPU: the flags decision, the oneDNN-evidence decision and
every surface that shows them say the same thing (engine.hardware.cpu_units)."""

from __future__ import annotations

from engine.analysis.cpu_evidence import NATIVE_AMX, NATIVE_FP16, cpu_verdict, parse_onednn_verbose
from engine.config import Precision
from engine.hardware.cpu_units import ABOUT_FP32, FASTER, cpu_matrix_unit, unit_for_isa
from engine.hardware.devices import cpu_device, mode_support

# A Sapphire Rapids-class CPU: AVX512-FP16 and AMX-BF16, no AMX-FP16.
SPR = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"})
GNR = SPR | {"amx_fp16"}
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})

FP16_ON_AVX10 = (
    "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512,undef,"
    "src:f16::blocked:ab::f0 wei:f16:a:blocked:ba::f0 dst:f16::blocked:ab::f0,,,"
    "1024x64:64x256,0.05\n")
BF16_ON_AMX = FP16_ON_AVX10.replace("avx10_1_512", "avx512_core_amx").replace("f16:", "bf16:")


def test_fp16_on_avx512_fp16_without_amx_fp16_is_about_fp32_speed_everywhere():
    unit = cpu_matrix_unit(SPR, "fp16")
    assert unit.expect == ABOUT_FP32
    assert unit.words == ("fp16 matmuls on AVX-512 FP16 vector units (oneDNN accumulates in "
                          "fp32), no matrix engine: about fp32 speed; AMX here does bf16 only")
    # The device card / doctor / Launch page read mode_support; the run's evidence reads
    # oneDNN's ISA: both give the same words.
    support = mode_support(cpu_device(SPR, "test CPU"), Precision.FP16_AMP)
    assert support.reason == unit.words
    verdict = cpu_verdict(parse_onednn_verbose(FP16_ON_AVX10), "fp16", SPR)
    assert verdict["verdict"] == NATIVE_FP16
    assert verdict["headline"] == f"{unit.words} (brg_matmul:avx10_1_512)"
    assert "emulated" not in verdict["headline"] and "software" not in verdict["headline"]


def test_amx_does_bf16_and_fp16_only_with_amx_fp16_and_never_fp32():
    assert cpu_matrix_unit(SPR, "bf16").unit == "AMX tiles (amx_bf16)"
    assert cpu_matrix_unit(GNR, "fp16").unit == "AMX tiles (amx_fp16)"
    assert cpu_matrix_unit(GNR, "fp16").expect == FASTER
    fp32 = cpu_matrix_unit(SPR, "fp32")
    assert fp32.words == "fp32 matmuls on the CPU's AVX-512 vector units; AMX has no fp32 math"
    assert "AMX" not in fp32.unit
    bf16 = cpu_verdict(parse_onednn_verbose(BF16_ON_AMX), "bf16", SPR)
    assert bf16["verdict"] == NATIVE_AMX and bf16["headline"].startswith("bf16 matmuls on AMX")
    # fp16 primitives that oneDNN ran on its AMX family without amx_fp16: vector speed.
    fp16_amx_family = unit_for_isa("avx512_core_amx", "fp16")
    assert fp16_amx_family is not None and fp16_amx_family.expect == ABOUT_FP32


def test_each_cpu_family_gets_one_status_per_mode():
    assert cpu_matrix_unit(ZEN4, "bf16").unit == "AVX-512 BF16 dot products"
    assert cpu_matrix_unit(ZEN4, "fp16").status == "emulated"
    assert cpu_matrix_unit(frozenset({"avx2"}), "bf16").status == "emulated"
    assert cpu_matrix_unit(frozenset({"avx2"}), "tf32").status == "unsupported"
    assert unit_for_isa("avx2", "bf16") is None  # conversion code: no native unit
    for flags in (SPR, GNR, ZEN4, frozenset({"avx2"})):
        dev = cpu_device(flags, "test CPU")
        for mode in Precision:
            assert mode_support(dev, mode).reason == cpu_matrix_unit(
                flags, {"fp32": "fp32", "tf32": "tf32", "fp16-amp": "fp16", "bf16-amp": "bf16",
                        "bf16-pure": "bf16", "fp8": "fp8"}[mode.value]).words
