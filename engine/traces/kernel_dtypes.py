"""The dtype a kernel name spells: the narrowest input type for a matrix kernel, the first
type named for the rest. Pure string rules (engine.traces.kernels calls them); the
spellings and their priority: docs/precision-reference.md#recognising-tensor-core-kernels."""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------------------
# dtype: the narrowest input type the name mentions. GEMM names list inputs, math type,
# accumulator and output (bf16bf16_bf16f32_f32 is a bf16 GEMM accumulating in fp32), and the
# inputs are the narrowest, so priority order picks them. fp8 before fp4: an fp4 x fp8
# block-scaled MMA runs at the fp8 rate.
#
# Block-scaled formats (Blackwell) come first and get their own labels: their names also
# spell the *scale's* type (ue4m3, ue8m0), which is not the data type. MXFP8: fp8 data,
# one e8m0 scale per 32 elements; MXFP4: e2m1 data, e8m0 per 32; NVFP4: e2m1 data, e4m3
# per 16. cuBLASLt spells them Avec32UE8M0 / Avec16UE4M3 beside its type letters (q fp8,
# o fp4); CUTLASS spells `<scale>x<data>` (ue8m0xe4m3, ue4m3xf4).

_BLOCK_SCALED = tuple((dtype, re.compile(pattern)) for dtype, pattern in (
    ("nvfp4", r"ue4m3x(?:f4|e2m1)|nvf4|nvfp4"),
    ("mxfp4", r"ue8m0x(?:f4|e2m1)|mxf4|mxfp4"),
    ("mxfp8", r"ue8m0x(?:e4m3|e5m2|f8)|mxf8|mxfp8"),
))

_DTYPE_PATTERNS = tuple((dtype, re.compile(pattern)) for dtype, pattern in (
    ("fp8", r"e4m3|e5m2|fp8|float8|f8f8|qgmma"),
    ("fp4", r"e2m1|fp4|nvf4|mxf4"),
    ("int8", r"int8|(?<![a-z0-9])[ius]8(?![0-9])|s8s8|imma|i8816|i16832"),
    ("tf32", r"tf32|tfloat32"),
    ("bf16", r"bf16|bfloat16|bhalf"),
    ("fp16", r"(?<!b)f16|fp16|half|(?<![a-z0-9])h(?:884|1688|16816|16832|gemm|cudnn)"),
    ("fp64", r"(?<![a-z0-9])f64|fp64|double|dgemm|dmma"),
    ("complex64", r"(?<![a-z])g?cgemm|complex"),
    ("fp32", r"f32|fp32|(?<![a-z0-9])float(?![0-9a-z])|sgemm|scudnn|ffma"),
))


# Template arguments that spell a dtype word without meaning that dtype: vLLM's
# Fp8KVCacheDataType 0 is "auto": the cache is not fp8. A mangled blob (`_zn2ck...`) is
# left out too: its substitutions (`s8_`) and literals read as types; the demangled words
# beside it carry the real ones (`half_t`, `bhalf_t`).
_NOT_A_DTYPE = re.compile(r"\(vllm::fp8kvcachedatatype\)0|(?<![a-z0-9_])_z[a-z0-9_.$]+")


def block_scaled_dtype(text: str) -> str | None:
    for dtype, pattern in _BLOCK_SCALED:
        if pattern.search(text):
            return dtype
    return None


# Itanium spellings of the builtin 16-bit floats inside a mangled blob: DF16b is
# std::bfloat16_t / __bf16 (newer Composable Kernel), DF16_ is _Float16.
_MANGLED_BUILTIN_DTYPES = (("bf16", re.compile(r"df16b")), ("fp16", re.compile(r"df16_")))


def mangled_dtype(text: str) -> str | None:
    for dtype, pattern in _MANGLED_BUILTIN_DTYPES:
        if text.startswith("_z") and pattern.search(text):
            return dtype
    return None


def dtype_in(text: str) -> str | None:
    """Matrix kernels: the narrowest type named anywhere (their inputs)."""
    mangled = mangled_dtype(text)
    if mangled:
        return mangled
    text = _NOT_A_DTYPE.sub(" ", text)
    scaled = block_scaled_dtype(text)
    if scaled:
        return scaled
    for dtype, pattern in _DTYPE_PATTERNS:
        if pattern.search(text):
            return dtype
    return None


def first_dtype_in(text: str) -> str | None:
    """Elementwise/reduction kernels: the first type named, i.e. the kernel's own template
    argument (`softmax_warp_forward<c10::BFloat16, ...>`), not a type buried in the
    argument list (`uniform_kernel(..., double, double)`)."""
    text = _NOT_A_DTYPE.sub(" ", text)
    best_pos, best_dtype = len(text) + 1, None
    for dtype, pattern in _DTYPE_PATTERNS:
        match = pattern.search(text)
        if match and match.start() < best_pos:
            best_pos, best_dtype = match.start(), dtype
    return best_dtype
