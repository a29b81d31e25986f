"""The one GPU catalogue: what a GPU's name or compute capability tells about it.

- compute capability -> architecture name (Volta, Ampere, Hopper, ...);
- marketing name -> compute capability, for traces that record only a name;
- exact device name -> dense datasheet peak TFLOP/s per dtype (the MFU denominator).

Pure data and string matching: no NVML, no torch. The facts and their sources are in
docs/precision-reference.md (#hardware-matrix, #peak-throughput).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ---------------------------------------------------------------------------------------
# architecture


def arch_name(compute_capability: tuple[int, int]) -> str:
    major, minor = compute_capability
    if major >= 10:
        return "Blackwell"
    if major == 9:
        return "Hopper"
    if (major, minor) == (8, 9):
        return "Ada"
    if major == 8:
        return "Ampere"
    if (major, minor) == (7, 5):
        return "Turing"
    if major == 7:
        return "Volta"
    if major == 6:
        return "Pascal"
    return "pre-Pascal"


# ---------------------------------------------------------------------------------------
# name -> compute capability

_DEVICE_CC = (  # name pattern -> compute capability, for traces without computeMajor
    (r"RTX 50\d\d|RTX PRO \d+ Blackwell", "12.0"),
    (r"\bB[23]00\b|GB[23]00|Blackwell", "10.0"),
    (r"\bH[12]00\b|GH200|Hopper", "9.0"),
    (r"\bL4\b|L40|RTX 40\d\d|Ada", "8.9"),
    (r"\bA10\b|A40|A16|A2\b|RTX 30\d\d|RTX A\d", "8.6"),
    (r"\bA100\b|A30\b|A800", "8.0"),
    (r"\bT4\b|RTX 20\d\d|TITAN RTX|Quadro RTX", "7.5"),
    (r"V100|TITAN V|Volta", "7.0"),
    (r"P100|GP100", "6.0"),
    (r"P40|P4\b|GTX 10\d\d|TITAN Xp|Pascal", "6.1"),
    (r"M40|M60|GTX 9\d\d|Maxwell", "5.2"),
    (r"K80|K40|Kepler", "3.7"),
)



def compute_capability_from_name(device_name: str | None) -> str | None:
    """Best guess "8.0" style compute capability from a marketing name; None if unknown."""
    if not device_name:
        return None
    for pattern, capability in _DEVICE_CC:
        if re.search(pattern, device_name, re.IGNORECASE):
            return capability
    return None


# ---------------------------------------------------------------------------------------
# name -> datasheet peaks

# Dense (no sparsity) TFLOP/s from vendor datasheets; None = the datasheet has no figure
# because the GPU has no such unit. Columns: fp32, tf32, fp16, bf16, fp8.
DATASHEET_TFLOPS: dict[str, dict[str, float | None]] = {
    "V100 SXM2": dict(fp32=15.7, tf32=None, fp16=125, bf16=None, fp8=None),
    "T4": dict(fp32=8.1, tf32=None, fp16=65, bf16=None, fp8=None),
    "A10": dict(fp32=31.2, tf32=62.5, fp16=125, bf16=125, fp8=None),
    "A100 SXM/PCIe": dict(fp32=19.5, tf32=156, fp16=312, bf16=312, fp8=None),
    "L4": dict(fp32=30.3, tf32=60, fp16=121, bf16=121, fp8=242),
    "L40S": dict(fp32=91.6, tf32=183, fp16=362, bf16=362, fp8=733),
    "H100 SXM": dict(fp32=67, tf32=495, fp16=989, bf16=989, fp8=1979),
    "H100 PCIe": dict(fp32=51, tf32=378, fp16=756, bf16=756, fp8=1513),
    "H200 SXM": dict(fp32=67, tf32=495, fp16=989, bf16=989, fp8=1979),
    "B200": dict(fp32=75, tf32=1100, fp16=2250, bf16=2250, fp8=4500),
    "RTX 3090": dict(fp32=35.6, tf32=35.6, fp16=71, bf16=71, fp8=None),
    "RTX 4090": dict(fp32=82.6, tf32=82.6, fp16=165, bf16=165, fp8=330),
}

# Full-match patterns over the normalised name (lower case, "nvidia "/"tesla " dropped).
# Deliberately strict: a near miss (H100 NVL, H200 NVL, A10G, L40, V100 PCIe, RTX 4090 D,
# laptop parts) has different clocks and power, so it is measured rather than guessed.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"v100-sxm2-(16|32)gb", "V100 SXM2"),
    (r"t4", "T4"),
    (r"a10", "A10"),
    (r"a100[- ](sxm4[- ]|pcie[- ])?(40|80)gb( pcie)?", "A100 SXM/PCIe"),
    (r"l4", "L4"),
    (r"l40s", "L40S"),
    (r"h100( (80|94)gb)? pcie", "H100 PCIe"),
    # The SXM5 board reports itself as "NVIDIA H100 80GB HBM3".
    (r"h100 ((64|80|94)gb hbm3|sxm5?( (64|80|94)gb)?( hbm3)?)", "H100 SXM"),
    (r"h200( 141gb( hbm3e)?)?", "H200 SXM"),
    (r"b200( \d+gb( hbm3e)?)?", "B200"),
    (r"geforce rtx 3090", "RTX 3090"),
    (r"geforce rtx 4090", "RTX 4090"),
)
_COMPILED = tuple((re.compile(pattern), row) for pattern, row in _NAME_PATTERNS)


def normalise_gpu_name(name: str) -> str:
    text = " ".join(name.strip().lower().split())
    for prefix in ("nvidia ", "tesla "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text


def datasheet_row(device_name: str) -> str | None:
    """The DATASHEET_TFLOPS row for an NVML/torch device name; None when unknown."""
    text = normalise_gpu_name(device_name)
    for pattern, row in _COMPILED:
        if pattern.fullmatch(text):
            return row
    return None


# ---------------------------------------------------------------------------------------
# name -> matrix and vector peaks per dtype, memory bandwidth (the per-op rates' yardsticks)

@dataclass(frozen=True)
class GpuSpec:
    """What one GPU can do, dense, per dtype: on its matrix units (Tensor Cores, AMD Matrix
    Cores), on its vector units (CUDA cores, AMD SIMDs), and its memory bandwidth.

    vector_tflops is a ceiling: the datasheet's non-matrix figure where it prints one, else
    a bound no vector unit of that GPU exceeds (marked "bound" in the source). An op that ran
    faster than it must have used the matrix units; the converse does not hold."""

    row: str
    matrix_tflops: dict[str, float]
    vector_tflops: dict[str, float]
    memory_tb_per_s: float
    source: str

    def matrix_peak(self, dtype: str) -> float | None:
        return self.matrix_tflops.get(_peak_dtype(dtype))

    def vector_ceiling(self, dtype: str) -> float | None:
        dtype = _peak_dtype(dtype)
        if dtype in self.vector_tflops:
            return self.vector_tflops[dtype]
        if dtype in ("tf32", "fp8", "fp4"):  # no vector path: judged against 16-bit math
            return self.vector_tflops.get("fp16") or self.vector_tflops.get("fp32")
        return None


def _peak_dtype(dtype: str) -> str:
    """A kernel's dtype label -> the peak column it runs at: block-scaled MXFP8 at the fp8
    rate, MXFP4/NVFP4 at the fp4 rate."""
    return {"mxfp8": "fp8", "mxfp4": "fp4", "nvfp4": "fp4"}.get(dtype, dtype)


def _nvidia(row: str, vector: dict, memory_tb_per_s: float, source: str) -> GpuSpec:
    matrix = {dtype: float(value) for dtype, value in DATASHEET_TFLOPS[row].items()
              if value is not None and dtype != "fp32"}
    return GpuSpec(row, matrix, {k: float(v) for k, v in vector.items()}, memory_tb_per_s,
                   source)


# Sources (docs/precision-reference.md#peaks-per-dtype): NVIDIA's V100, A100 and H100
# whitepapers (non-Tensor FP32/FP16/BF16 rows) and product datasheets; AMD's Instinct
# MI210, MI250X and MI300X datasheets (vector FP32, packed FP32, matrix rows). "2x fp32
# bound": no datasheet figure for 16-bit vector math; packed half2/bf16x2 FMA is 2x fp32.
GPU_SPECS: dict[str, GpuSpec] = {spec.row: spec for spec in (
    _nvidia("V100 SXM2", dict(fp32=15.7, fp16=31.4, bf16=31.4), 0.9,
            "NVIDIA V100 whitepaper; fp16/bf16 vector: 2x fp32 bound"),
    _nvidia("T4", dict(fp32=8.1, fp16=16.2, bf16=16.2), 0.32,
            "NVIDIA T4 datasheet; 16-bit vector: 2x fp32 bound"),
    _nvidia("A10", dict(fp32=31.2, fp16=31.2, bf16=31.2), 0.6,
            "NVIDIA A10 datasheet; GA102 whitepaper: non-Tensor FP16/BF16 = FP32 rate"),
    _nvidia("A100 SXM/PCIe", dict(fp32=19.5, fp16=78.0, bf16=39.0), 2.039,
            "NVIDIA A100 whitepaper (non-Tensor FP16 78, BF16 39); 80GB SXM bandwidth"),
    _nvidia("L4", dict(fp32=30.3, fp16=60.6, bf16=60.6), 0.3,
            "NVIDIA L4 datasheet; 16-bit vector: 2x fp32 bound"),
    _nvidia("L40S", dict(fp32=91.6, fp16=183.2, bf16=183.2), 0.864,
            "NVIDIA L40S datasheet; 16-bit vector: 2x fp32 bound"),
    _nvidia("H100 SXM", dict(fp32=67.0, fp16=133.8, bf16=133.8), 3.35,
            "NVIDIA H100 whitepaper (non-Tensor FP16/BF16 133.8) and datasheet"),
    _nvidia("H100 PCIe", dict(fp32=51.0, fp16=102.4, bf16=102.4), 2.0,
            "NVIDIA H100 whitepaper (PCIe non-Tensor FP16/BF16 102.4) and datasheet"),
    _nvidia("H200 SXM", dict(fp32=67.0, fp16=133.8, bf16=133.8), 4.8,
            "NVIDIA H200 datasheet (the H100 SXM's SMs and clocks)"),
    _nvidia("B200", dict(fp32=75.0, fp16=150.0, bf16=150.0), 8.0,
            "NVIDIA B200 datasheet; 16-bit vector: 2x fp32 bound"),
    _nvidia("RTX 3090", dict(fp32=35.6, fp16=35.6, bf16=35.6), 0.936,
            "NVIDIA GA102 whitepaper: non-Tensor FP16/BF16 = FP32 rate"),
    _nvidia("RTX 4090", dict(fp32=82.6, fp16=82.6, bf16=82.6), 1.008,
            "NVIDIA AD102 whitepaper: non-Tensor FP16/BF16 = FP32 rate"),
    GpuSpec("MI300X", dict(fp32=163.4, tf32=653.7, fp16=1307.4, bf16=1307.4, fp8=2614.9),
            dict(fp32=163.4, fp16=326.8, bf16=326.8), 5.3,
            "AMD Instinct MI300X datasheet; 16-bit vector: 2x fp32 bound"),
    GpuSpec("MI250X", dict(fp32=95.7, fp16=383.0, bf16=383.0),
            dict(fp32=95.7, fp16=191.4, bf16=191.4), 3.2768,
            "AMD Instinct MI250X datasheet (packed FP32 95.7); 16-bit vector: 2x bound"),
    GpuSpec("MI210", dict(fp32=45.3, fp16=181.0, bf16=181.0),
            dict(fp32=45.3, fp16=90.6, bf16=90.6), 1.6384,
            "AMD Instinct MI210 datasheet (packed FP32 45.3); 16-bit vector: 2x bound"),
)}
# fp32 on NVIDIA's matrix units is TF32 (or fp32 emulated with bf16 passes): an fp32 op
# rated against the fp32 vector peak; AMD's MFMA has a real fp32 matrix rate.

_AMD_NAME_PATTERNS = (
    (re.compile(r"amd instinct mi300x( vf)?"), "MI300X"),
    (re.compile(r"amd instinct mi250x( / mi250)?"), "MI250X"),
    (re.compile(r"amd instinct mi210"), "MI210"),
)


def gpu_spec(device_name: str | None) -> GpuSpec | None:
    """The GPU_SPECS row for a device name as NVML, torch or a trace's deviceProperties
    write it; None when the name is not one the catalogue knows exactly."""
    if not device_name:
        return None
    row = datasheet_row(device_name)
    if row is None:
        text = normalise_gpu_name(device_name)
        row = next((row for pattern, row in _AMD_NAME_PATTERNS if pattern.fullmatch(text)),
                   None)
    return GPU_SPECS.get(row) if row else None
