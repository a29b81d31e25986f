"""The CPU verdict: parsing oneDNN verbose output and deciding native vs emulated."""

from __future__ import annotations

import pytest
import torch

from engine.analysis.cpu_evidence import (
    EMULATED,
    NATIVE_AMX,
    NATIVE_BF16_DOT,
    cpu_verdict,
    parse_onednn_verbose,
)
from engine.config import RunConfig
from engine.hardware.devices import read_cpu_flags
from engine.training.loop import train
from engine.training.onednn import capture_onednn_verbose

# Captured on this project's AVX2 dev machine (oneDNN 3.12, torch 2.13), fp32 ResNet step.
AVX2_FP32_CONV = """\
onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)
onednn_verbose,v1,info,cpu,isa:Intel AVX2
onednn_verbose,v1,primitive,info,template:operation,engine,primitive,implementation,prop_kind,memory_descriptors,attributes,auxiliary,problem_desc,exec_time
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 dst:f32::blocked:Acdb8a::f0,attr-scratchpad:user,,8x3x3x3,0.00317383
onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,forward_training,src:f32:a:blocked:abcd::f0 wei:f32:a:blocked:Acdb8a::f0 bia:f32:a:blocked:a::f0 dst:f32:a:blocked:aBcd8b::f0,attr-scratchpad:user,alg:convolution_direct,mb2_ic3oc8_ih16oh14kh3sh1dh0ph0_iw16ow14kw3sw1dw0pw0,0.0109863
"""
# The formats oneDNN prints on AVX512-BF16 and AMX machines (same v1 schema).
AVX512_BF16_MATMUL = (
    "onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core_bf16,undef,"
    "src:bf16::blocked:ab::f0 wei:bf16:a:blocked:ba::f0 dst:bf16::blocked:ab::f0,"
    "attr-scratchpad:user,,64x256:256x256,0.0451\n")
AMX_CONV = (
    "onednn_verbose,v1,primitive,exec,cpu,convolution,brgconv:avx512_core_amx,forward_training,"
    "src:bf16::blocked:acdb::f0 wei:bf16:a:blocked:AcdB16b16a2b::f0 dst:bf16::blocked:acdb::f0,"
    "attr-scratchpad:user,alg:convolution_direct,mb8_ic64oc64_ih32oh32kh3sh1dh0ph1_iw32ow32kw3sw1dw0pw1,0.21\n")


def test_parses_primitive_exec_lines_and_skips_info_lines():
    prims = parse_onednn_verbose(AVX2_FP32_CONV)
    assert [p.kind for p in prims] == ["reorder", "convolution"]
    conv = prims[1]
    assert conv.is_matrix and conv.isa == "avx2" and conv.src_dtype == "fp32"
    assert conv.implementation == "jit:avx2"
    assert conv.exec_ms == pytest.approx(0.0109863)
    assert conv.problem.startswith("mb2_ic3oc8")


def test_verdicts_for_each_cpu_family():
    bf16_dot = cpu_verdict(parse_onednn_verbose(AVX512_BF16_MATMUL), "bf16")
    assert bf16_dot["verdict"] == NATIVE_BF16_DOT
    assert "brg_matmul:avx512_core_bf16" in bf16_dot["headline"]
    amx = cpu_verdict(parse_onednn_verbose(AMX_CONV), "bf16")
    assert amx["verdict"] == NATIVE_AMX and "avx512_core_amx" in amx["headline"]
    none_ran = cpu_verdict([], "bf16", frozenset({"avx2"}))
    assert none_ran["verdict"] == EMULATED
    assert "lacks avx512_bf16 and amx_bf16" in none_ran["headline"]
    # bf16 primitives that ran on a plain AVX2 implementation convert in software.
    avx2_bf16 = AVX512_BF16_MATMUL.replace("brg_matmul:avx512_core_bf16", "gemm:jit:avx2")
    assert cpu_verdict(parse_onednn_verbose(avx2_bf16), "bf16")["verdict"] == EMULATED
    fp32 = cpu_verdict(parse_onednn_verbose(AVX2_FP32_CONV), "fp32")
    assert fp32["verdict"] == "not applicable" and "avx2" in fp32["headline"]


def test_capture_records_real_onednn_output(tmp_path):
    log = tmp_path / "verbose.log"
    conv = torch.nn.Conv2d(3, 8, 3)
    with capture_onednn_verbose(log):
        conv(torch.randn(2, 3, 16, 16))
    prims = parse_onednn_verbose(log.read_text())
    assert any(p.kind == "convolution" and p.src_dtype == "fp32" for p in prims)


@pytest.mark.timeout(180)
def test_bf16_run_on_this_cpu_gets_the_verdict_its_flags_predict(tmp_path):
    """Real run, real evidence: native only where the CPU has a bf16 matrix unit."""
    windows = []
    cfg = RunConfig(model="mlp", precision="bf16-amp", steps=8, batch_size=8,
                    warmup_steps=1, profile_steps=2)
    train(cfg, "cpu", emit=lambda rows: None, run_dir=tmp_path,
          on_window=lambda window, dtype: windows.append((window.onednn_log_path, dtype)))
    (log_path, dtype), = windows
    assert dtype == "bf16" and log_path.exists()
    verdict = cpu_verdict(parse_onednn_verbose(log_path.read_text()), dtype, read_cpu_flags())
    flags = read_cpu_flags()
    # With a native unit, oneDNN names it, or (work in MKL) the verdict says "unknown";
    # it must never claim emulation there.
    if "amx_bf16" in flags:
        assert verdict["verdict"] in (NATIVE_AMX, "unknown")
    elif "avx512_bf16" in flags:
        assert verdict["verdict"] in (NATIVE_BF16_DOT, NATIVE_AMX, "unknown")
    else:
        assert verdict["verdict"] == EMULATED
