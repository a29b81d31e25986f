"""The one GPU catalogue: what a GPU's name or compute capability tells about it.

- compute capability -> architecture name (Volta, Ampere, Hopper, ...);
- marketing name -> compute capability, for traces that record only a name;
- exact device name -> dense datasheet peak TFLOP/s per dtype (the MFU denominator).

Pure data and string matching: no NVML, no torch. The facts and their sources are in
docs/precision-reference.md (#hardware-matrix, #peak-throughput).
"""

from __future__ import annotations

import re

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
