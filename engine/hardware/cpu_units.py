"""What runs a CPU's matrix work in each dtype: the one decision every surface words.

Doctor, the device card, the Launch page, the GPU check and a run's oneDNN evidence all
say the same thing for the same CPU and dtype, because they all call `cpu_matrix_unit`
(from the ISA flags) or `unit_for_isa` (from the ISA oneDNN names in its verbose log).

Facts behind it (docs/precision-reference.md#cpu-isa-flags):
- AMX (`amx_bf16`, `amx_fp16`) is a matrix engine for bf16/fp16 (and int8) tiles only:
  it has no fp32 math, so fp32 always runs on the vector units (AVX-512 or AVX2 FMA).
- `avx512_bf16` adds bf16 dot-product instructions (vdpbf16ps) to the vector units: two
  bf16 products per fp32 lane, so up to about 2x fp32 on large matmuls.
- `avx512_fp16` (oneDNN `avx512_core_fp16`, also reported as `avx10_1_512`) adds fp16
  arithmetic, but oneDNN's fp16 matmul/convolution kernels on it convert to fp32 and
  accumulate there: about fp32 speed (measured 1.07x fp32 on such a CPU, while its AMX ran
  bf16 at 18x). Only `amx_fp16` gives fp16 a matrix engine.
- Without these flags bf16/fp16 go through conversion or reference code: slower than
  fp32 (fp16 far slower).
"""

from __future__ import annotations

from dataclasses import dataclass

NATIVE = "native"
EMULATED = "emulated"
UNSUPPORTED = "unsupported"

FASTER = "faster than fp32"
ABOUT_FP32 = "about fp32 speed"
SLOWER = "slower than fp32"
BASELINE = "baseline"


@dataclass(frozen=True)
class CpuMatrixUnit:
    status: str  # native | emulated | unsupported
    unit: str    # what runs the matrix work, e.g. "AMX tiles (amx_bf16)"
    expect: str  # faster than fp32 | about fp32 speed | slower than fp32 | baseline
    words: str   # the sentence every surface shows

    @property
    def key(self) -> str:
        """A short identity for the unit: equal keys = the same verdict on two surfaces."""
        return self.unit


def vector_isa(flags: frozenset[str]) -> str:
    if "avx512f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2"
    if "asimd" in flags:
        return "NEON"
    return "scalar/SSE"


def _fp32_unit(vector: str, has_amx: bool) -> CpuMatrixUnit:
    amx_note = "; AMX has no fp32 math" if has_amx else ""
    return CpuMatrixUnit(NATIVE, f"{vector} vector units (fp32 FMA)", BASELINE,
                         f"fp32 matmuls on the CPU's {vector} vector units{amx_note}")


def _bf16_unit(flags: frozenset[str], vector: str) -> CpuMatrixUnit:
    if "amx_bf16" in flags:
        return CpuMatrixUnit(NATIVE, "AMX tiles (amx_bf16)", FASTER,
                             "bf16 matmuls on AMX tiles (amx_bf16), the CPU's matrix engine: "
                             "much faster than fp32 on large matmuls")
    if "avx512_bf16" in flags:
        return CpuMatrixUnit(NATIVE, "AVX-512 BF16 dot products", FASTER,
                             "bf16 matmuls on AVX-512 BF16 dot-product instructions "
                             "(vdpbf16ps), no matrix engine: up to about 2x fp32 on large "
                             "matmuls")
    return CpuMatrixUnit(EMULATED, f"{vector} conversion code", SLOWER,
                         f"no bf16 unit (no avx512_bf16/amx_bf16): bf16 is converted to fp32 "
                         f"on the {vector} vector units, expect it slower than fp32")


def _fp16_unit(flags: frozenset[str], vector: str) -> CpuMatrixUnit:
    if "amx_fp16" in flags:
        return CpuMatrixUnit(NATIVE, "AMX tiles (amx_fp16)", FASTER,
                             "fp16 matmuls on AMX tiles (amx_fp16), the CPU's matrix engine: "
                             "much faster than fp32 on large matmuls")
    if "avx512_fp16" in flags:
        amx = "; AMX here does bf16 only" if "amx_bf16" in flags else ""
        return CpuMatrixUnit(NATIVE, "AVX-512 FP16 vector units", ABOUT_FP32,
                             "fp16 matmuls on AVX-512 FP16 vector units (oneDNN accumulates in "
                             f"fp32), no matrix engine: about fp32 speed{amx}")
    return CpuMatrixUnit(EMULATED, f"{vector} reference code", SLOWER,
                         "no fp16 unit (no avx512_fp16/amx_fp16): fp16 is emulated, expect "
                         "it much slower than fp32")


def cpu_matrix_unit(flags: frozenset[str], dtype: str) -> CpuMatrixUnit:
    """What this CPU (by its ISA flags) runs `dtype` matmuls on: fp32 | bf16 | fp16 |
    tf32 | fp8."""
    vector = vector_isa(flags)
    has_amx = "amx_bf16" in flags or "amx_fp16" in flags
    if dtype == "fp32":
        return _fp32_unit(vector, has_amx)
    if dtype == "bf16":
        return _bf16_unit(flags, vector)
    if dtype == "fp16":
        return _fp16_unit(flags, vector)
    if dtype == "tf32":
        return CpuMatrixUnit(UNSUPPORTED, "none", SLOWER,
                             "TF32 is an NVIDIA Tensor Core format (sm80+); CPUs have no TF32 "
                             "matmul mode. Use fp32.")
    return CpuMatrixUnit(UNSUPPORTED, "none", SLOWER,
                         "fp8 training needs an NVIDIA GPU with sm89+ (Ada, Hopper, "
                         "Blackwell); CPUs cannot run it.")


def unit_for_isa(isa: str, dtype: str) -> CpuMatrixUnit | None:
    """The unit a oneDNN implementation ISA (e.g. `avx512_core_amx`, `avx512_core_bf16`,
    `avx10_1_512`) means for `dtype` work; None when the ISA has no native unit for it
    (conversion code)."""
    isa = isa.lower()
    flags: set[str] = set()
    if "avx512" in isa or "avx10" in isa:
        flags.add("avx512f")
    elif "avx2" in isa:
        flags.add("avx2")
    if "amx" in isa:
        flags.add("amx_bf16")
        if "fp16" in isa:
            flags.add("amx_fp16")
    if "avx512_core_bf16" in isa or "avx10" in isa or "amx" in isa:
        flags.add("avx512_bf16")
    if "avx512_core_fp16" in isa or "avx10" in isa or "amx" in isa:
        flags.add("avx512_fp16")  # AVX10.1 and the AMX generations include AVX512-FP16
    unit = cpu_matrix_unit(frozenset(flags), dtype)
    if unit.status != NATIVE:
        return None
    if dtype == "fp16" and "amx" in isa and "fp16" not in isa:
        # oneDNN picked its AMX kernel family, but without amx_fp16 the fp16 math runs on
        # the AVX-512 FP16 vector units: the tiles do bf16 only.
        return cpu_matrix_unit(frozenset({"avx512f", "avx512_fp16", "amx_bf16"}), "fp16")
    return unit


# ---------------------------------------------------------------------------------------
# what one oneDNN implementation ran on (a run's or a probe's verbose log)

REFERENCE_UNIT = "oneDNN reference code (not vectorised)"


def is_reference_implementation(implementation: str) -> bool:
    """oneDNN's reference C++ code (`ref:any`, `ref_fused_convolution:any`, `gemm:ref`...):
    plain loops, no vector or matrix unit; far slower than any jit or brgemm kernel."""
    tokens = implementation.lower().replace(":", "_").split("_")
    return "ref" in tokens


def implementation_isa(implementation: str) -> str:
    """The ISA part of a oneDNN implementation name: `brgconv_bwd_w:avx10_1_512_amx` ->
    `avx10_1_512_amx`, `jit:avx2` -> `avx2`; `x64:gemm:jit` (a jit sgemm, no ISA named) and
    `ref:any` keep their last field."""
    return implementation.rsplit(":", 1)[-1] if ":" in implementation else implementation


def implementation_unit(implementation: str, dtype: str) -> str:
    """What an implementation that ran `dtype` (fp32 | bf16 | fp16 | ...) work ran on,
    in the words of the device card: the native unit, conversion code, or reference code."""
    if is_reference_implementation(implementation):
        return REFERENCE_UNIT
    isa = implementation_isa(implementation)
    if dtype in ("bf16", "fp16"):
        unit = unit_for_isa(isa, dtype)
        return unit.unit if unit is not None else f"{isa} ({dtype} converted to fp32)"
    if dtype == "fp32":
        vector = ("AVX-512" if "avx512" in isa or "avx10" in isa else
                  "AVX2" if "avx2" in isa else None)
        return f"{vector} vector units (fp32 FMA)" if vector else f"vector units ({isa})"
    return isa
