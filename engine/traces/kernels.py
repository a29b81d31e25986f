"""Kernel name -> category, Tensor Cores yes/no/unknown, dtype, and the token that decided.

Why names: the PyTorch profiler records kernel *names*, not tensor-pipe counters. NVIDIA's
libraries encode the math unit and the precision in those names, in a handful of naming
schemes (cuBLAS/cuDNN SASS kernels, XMMA, nvjet, CUTLASS, FlashAttention, ...). This module
reads them. Pure functions; no torch import. The rules and their evidence:
docs/precision-reference.md#recognising-tensor-core-kernels.

Policy, in order of how much a wrong answer would hurt a user:
- "yes" only on positive evidence: an MMA token (tensorop, 884/1688/16816, tensor16x8x8,
  gmma, ...) or a library family that only exists as tensor-core code (nvjet, FlashAttention).
  A false "yes" would tell someone their fp32 run is fine when it is not.
- "no" on negative evidence (simt, ffma, sgemm, gemv, winograd, split-K reduce, ...) or when
  the name carries no matrix-multiply token at all: Tensor Cores only multiply matrices, and
  kernels that use them say so in their names.
- "unknown" when the name looks like matrix math but says nothing about the unit (Triton
  templates, unfamiliar GEMM libraries, generic CUTLASS device kernels).

The arch tag in a name (sm80, volta_, cutlass_75) is the build target, not the GPU it ran on;
it matters only where a family has both kinds of builds (fmha_cutlassF ..._sm50 vs _sm80).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from engine.traces.kernel_dtypes import dtype_in as _dtype_in
from engine.traces.kernel_dtypes import first_dtype_in as _first_dtype_in

# "memcpy/memset" is the copy engine's own events (Memcpy HtoD ..., Memset (Device)),
# "copy kernel" a kernel that copies, fills or transposes on the SMs: the first is DMA
# the step may overlap, the second competes with compute kernels for the GPU.
KERNEL_CATEGORIES = (
    "gemm", "conv", "attention", "elementwise", "reduction/norm", "softmax",
    "copy kernel", "memcpy/memset", "communication", "optimizer", "other",
)
MATRIX_CATEGORIES = ("gemm", "conv", "attention")
# Kernel dtypes narrower than fp32/tf32: a run with any used autocast or low-precision
# tensors. The block-scaled formats (Blackwell) carry their own labels: fp4 data is not fp8.
LOW_PRECISION_DTYPES = ("fp16", "bf16", "fp8", "mxfp8", "fp4", "mxfp4", "nvfp4", "int8")


@dataclass(frozen=True)
class KernelVerdict:
    category: str          # one of KERNEL_CATEGORIES
    tensor_core: str       # "yes" | "no" | "unknown"
    dtype: str | None      # fp32 tf32 fp16 bf16 fp8 mxfp8 mxfp4 nvfp4 fp4 int8 fp64 complex64;
                           # None if unsaid
    reason: str            # names the token or family that decided


def _yes(category: str, dtype: str | None, reason: str) -> KernelVerdict:
    return KernelVerdict(category, "yes", dtype, reason)


def _no(category: str, dtype: str | None, reason: str) -> KernelVerdict:
    return KernelVerdict(category, "no", dtype, reason)


def _unknown(category: str, dtype: str | None, reason: str) -> KernelVerdict:
    return KernelVerdict(category, "unknown", dtype, reason)


# ---------------------------------------------------------------------------------------
# Itanium-mangled names (CUTLASS kernels often reach the trace undemangled)

_MANGLED_NUMBER = re.compile(r"\d+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def demangle_hint(name: str) -> str:
    """The source identifiers inside an Itanium-mangled name, space-separated.

    Not a demangler: it only pulls out the length-prefixed identifiers (`23ImplicitGemm...`)
    so the word-level rules below can see `MmaTensorOp`, `tfloat32_t`, `Conv2dWgrad...`.
    Integer literals (`Li128E`), substitutions (`S4_`) and template parameters (`T0_`) also
    carry digits; they are skipped so a literal is never read as an identifier length.
    Names that are not mangled come back unchanged.
    """
    if not name.startswith("_Z"):
        return name
    words: list[str] = []
    pos = 0
    while pos < len(name):
        match = _MANGLED_NUMBER.search(name, pos)
        if match is None:
            break
        start, end = match.span()
        before = name[max(0, start - 2):start]
        follows_literal = len(before) == 2 and before[0] == "L" and before[1].isalpha()
        is_reference = start > 0 and name[start - 1] in "ST" and name[end:end + 1] == "_"
        length = int(match.group())
        word = name[end:end + length]
        if (not follows_literal and not is_reference and length > 0 and len(word) == length
                and _IDENTIFIER.fullmatch(word)):
            words.append(word)
            pos = end + length
        else:
            pos = end
    return " ".join(words)


# ---------------------------------------------------------------------------------------
# Rules. Each takes (name, text) where text is the lower-cased name plus demangled words,
# and returns a verdict or None. classify_kernel tries them in order; first hit wins.
# Order matters: helpers before the families they accompany, specific families before
# generic tokens, and "no matrix token" last.

# Copy-engine event names as Kineto writes them ("Memcpy HtoD (Pageable -> Device)",
# "Memset (Device)"): engine.traces.verdict reads those events apart from kernels.
_MEMCPY_EVENT = re.compile(r"^(?:memcpy|memset)\b|cudamemcpy|cudamemset|hipmemcpy|hipmemset")
_COMMUNICATION = re.compile(
    r"nccl|nvshmem|multimem_all_?reduce|cross_device_reduce|custom_?all_?reduce"
    r"|(?<![a-z])(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv)|userbuffers")


def _rule_transfer_and_comm(name: str, text: str) -> KernelVerdict | None:
    if _MEMCPY_EVENT.search(text):
        return _no("memcpy/memset", None, "memcpy/memset: copy engine or fill, no math")
    match = _COMMUNICATION.search(text)
    if match:
        return _no("communication", _first_dtype_in(text),
                   f"'{match.group()}': collective communication kernel (CUDA cores)")
    return None


# --- AMD (ROCm) ---------------------------------------------------------------------------
# Families, each matched as its own tokens (docs/precision-reference.md, "AMD kernel
# families"):
# - hipBLASLt / rocBLAS GEMMs are Tensile kernels: Cijk_<layout>_<types>_..._MT<tile>_MI<m>x
#   <n>x<k>[x<b>]_... where the MI token is the MFMA (matrix-core) instruction; without it the
#   kernel runs on the vector ALUs. Types: S fp32, D fp64, H fp16, B bf16, I8 int8, F8 fp8 (the
#   first letters are A/B inputs). `PostGSU` kernels are the split-K ("global split-U")
#   reduction after such a GEMM: no matrix work.
# - Composable Kernel (ck::, ck_tile::, often mangled `_ZN2ck...`): `Xdl`/`xdlops`/`Wmma`/
#   `Mfma` class tokens use the matrix cores, `Fmha` is attention on them; `Dl` GEMMs are the
#   vector dot-product builds; the rest (elementwise, reduce, permute) multiply no matrices.
# - MIOpen: igemm "gtcx" convolutions are its xdlops builds; naive/asm direct convolutions run
#   on the vector ALUs; `SubTensorOp*` kernels are element-wise (scale, cast) whatever the
#   "TensorOp" in their name.
# - AOTriton (PyTorch's ROCm SDPA): attn_fwd, bwd_kernel_fuse, bwd_kernel_dk_dv, bwd_kernel_dq
#   (flash attention on matrix cores), bwd_preprocess (a helper). aiter / CK-tile attention:
#   fmha_fwd_* / fmha_bwd_* and FmhaFwd/FmhaBwd kernels.

_TENSILE = re.compile(r"^cijk_[a-z]+_[a-z]+_(?P<types>[a-z0-9]+?)_")
_TENSILE_MFMA = re.compile(r"_mi(?P<shape>\d+x\d+x\d+(?:x\d+)?)(?:_|$)")
_TENSILE_SPLIT_K = re.compile(r"_postgsu\d*(?:_|$)")
_TENSILE_TYPES = (("f8", "fp8"), ("i8", "int8"), ("b", "bf16"), ("h", "fp16"),
                  ("x", "tf32"), ("d", "fp64"), ("s", "fp32"))
_CK_FAMILY = re.compile(r"(?<![a-z0-9_])(?:ck|ck_tile)::|^_zn(?:2ck|7ck_tile)\d")
# Class-name tokens in CK's original spelling: a camel-case word start (GemmXdl, BlockGemm
# Xdlops, WarpGemmMfma) or a snake-case one (gridwise_gemm_xdl_cshuffle).
_CK_MATRIX_TOKEN = re.compile(r"(?<![A-Z])(?:Xdlops|Xdl|XDL|Wmma|WMMA|Mfma|MFMA)"
                              r"|(?<![A-Za-z])(?:xdlops|xdl|wmma|mfma)(?![a-z])")
_CK_ATTENTION_TOKEN = re.compile(r"(?<![A-Z])Fmha|(?<![A-Za-z])fmha(?![a-z])")
_CK_VECTOR_TOKEN = re.compile(r"(?:Gemm|Conv\w*?|Fwd|Bwd\w*?)Dl(?![a-z])|_dl(?:_|$)")
_ATTENTION_HELPER = re.compile(r"dot_?do_?o|ograd_?dot_?o|convert_?q_?grad|convert_?dq"
                               r"|bwd_preprocess")
_AOTRITON = re.compile(r"^(?:attn_fwd|bwd_kernel_fuse|bwd_kernel_dk_dv|bwd_kernel_dq)"
                       r"(?:_varlen)?$")
_AITER_FMHA = re.compile(r"(?<![a-z0-9])fmha_(?:fwd|bwd)(?=_|$)")
_MIOPEN_XDLOPS = re.compile(r"igemm_(?:fwd|bwd|wrw)_gtcx\w*")
_MIOPEN_ELEMENTWISE = re.compile(r"(?<![a-z])subtensorop\w*")
_MIOPEN_VALU = re.compile(r"miopensp\d+asmconv\w*|naive_conv\w*|miopenconv\w*"
                          r"|gridwise_convolution\w*")


def _tensile_dtype(types: str) -> str | None:
    for token, dtype in _TENSILE_TYPES:
        if types.startswith(token):
            return dtype
    return None


def _rule_tensile(name: str, text: str) -> KernelVerdict | None:
    match = _TENSILE.match(text)
    if not match:
        return None
    dtype = _tensile_dtype(match.group("types"))
    split_k = _TENSILE_SPLIT_K.search(text)
    if split_k:
        return _no("reduction/norm", dtype, f"Tensile '{split_k.group().strip('_')}': split-K "
                                            "reduction after a GEMM (vector ALUs)")
    mfma = _TENSILE_MFMA.search(text)
    if mfma:
        return _yes("gemm", dtype, f"Tensile (hipBLASLt/rocBLAS) GEMM with MFMA token "
                                   f"'MI{mfma.group('shape')}' (AMD matrix cores)")
    return _no("gemm", dtype, "Tensile (hipBLASLt/rocBLAS) GEMM without an MFMA 'MI' "
                              "token: vector-ALU FMA")


def _rule_composable_kernel(name: str, text: str) -> KernelVerdict | None:
    if not _CK_FAMILY.search(text):
        return None
    spelled = demangle_hint(name) if name.startswith("_Z") else name
    dtype = _dtype_in(text)
    helper = _ATTENTION_HELPER.search(text)
    attention = _CK_ATTENTION_TOKEN.search(spelled)
    if attention and helper:
        return _no("attention", dtype, f"Composable Kernel attention helper "
                                       f"'{helper.group()}' (no MFMA)")
    if attention:
        return _yes("attention", dtype, "Composable Kernel 'Fmha' attention (MFMA on AMD "
                                        "matrix cores)")
    token = _CK_MATRIX_TOKEN.search(spelled)
    category = "conv" if _CONV_HINT.search(text) else "gemm"
    if token:
        return _yes(category, dtype, f"Composable Kernel '{token.group()}' (MFMA/WMMA on AMD "
                                     "matrix cores)")
    vector = _CK_VECTOR_TOKEN.search(spelled)
    if vector and _matrix_category(text):
        return _no(category, dtype, f"Composable Kernel '{vector.group().strip('_')}' build "
                                    "(vector-ALU dot products)")
    if _matrix_category(text) in ("gemm", "conv") and not _content_words_only(text):
        return _unknown(category, dtype, "Composable Kernel GEMM/conv without an Xdl/Wmma "
                                         "class token")
    return _no(_content_category(text), _first_dtype_in(text),
               "Composable Kernel kernel without a matrix class (elementwise, reduce, copy)")


def _content_words_only(text: str) -> bool:
    """A CK kernel whose own name is an elementwise/reduce/permute device op: the GEMM words
    in it are its template arguments, not what it computes."""
    return bool(re.search(r"elementwise|reduce|permute|normalization|softmax|pool", text))


def _rule_amd(name: str, text: str) -> KernelVerdict | None:
    verdict = _rule_tensile(name, text) or _rule_composable_kernel(name, text)
    if verdict:
        return verdict
    if text.startswith("bwd_preprocess"):
        return _no("attention", None, "AOTriton 'bwd_preprocess': attention backward helper "
                                      "(no MFMA)")
    if _AOTRITON.match(text):
        return _yes("attention", None, f"AOTriton '{text}': flash attention (MFMA on AMD "
                                       "matrix cores)")
    match = _AITER_FMHA.search(text)
    if match:
        helper = _ATTENTION_HELPER.search(text)
        if helper:
            return _no("attention", _dtype_in(text), f"'{helper.group()}': attention helper "
                                                     "(no MFMA)")
        return _yes("attention", _dtype_in(text), f"aiter/CK '{match.group()}' attention "
                                                  "(MFMA on AMD matrix cores)")
    match = _MIOPEN_ELEMENTWISE.search(text)
    if match:
        return _no("elementwise", _first_dtype_in(text), f"MIOpen '{match.group()}': "
                                                         "element-wise tensor op (vector ALUs)")
    match = _MIOPEN_XDLOPS.search(text)
    if match:
        return _yes("conv", _dtype_in(text), f"MIOpen '{match.group()}': xdlops implicit GEMM "
                                             "(AMD matrix cores)")
    match = _MIOPEN_VALU.search(text)
    if match:
        return _no("conv", _dtype_in(text), f"MIOpen '{match.group()}': vector-ALU convolution")
    return None


# Kernels that run beside a tensor-core GEMM/conv/attention but do not multiply matrices
# themselves. Classed outside the matrix categories so a tensor-core op is not reported as
# "ran without Tensor Cores" because of its split-K reduction.
_HELPERS = (
    (re.compile(r"splitkv_combine|fwdcombine|fwd_combine|flash_bwd_dot_do_o|flash_bwd_convert_d"
                r"|flash_bwd_clear|flashattnbwdpreprocess|flashattnbwdpostprocess"
                r"|prepare_varlen|paged_attention_\w*?_reduce|mergestates|merge_attn_states"),
     "attention", "attention helper (combine / preprocess / convert), no MMA"),
    (re.compile(r"reshape_and_cache|concat_and_cache|copy_blocks|swap_blocks|copy_page"),
     "copy kernel", "KV-cache / page copy"),
    (re.compile(r"splitkreduce|reducesplitk|split_k_reduce|splitk_reduce|reduce_wgrad"),
     "reduction/norm", "split-K reduction after a GEMM/conv (CUDA cores)"),
    (re.compile(r"cudnn\w*::compute\w*kernel"),
     "other", "cuDNN offset computation helper (CUDA cores)"),
    (re.compile(r"nchwtonhwc|nhwctonchw|transpose_readwrite|transpose_kernel"),
     "copy kernel", "layout transform (CUDA cores)"),
    (re.compile(r"epilogue::impl|scalepackedtensor|(?<![a-z])scal_kernel|axpy_kernel"),
     "elementwise", "BLAS/cuDNN elementwise helper (CUDA cores)"),
)


def _rule_helpers(name: str, text: str) -> KernelVerdict | None:
    for pattern, category, why in _HELPERS:
        match = pattern.search(text)
        if match:
            return _no(category, _dtype_in(text), f"'{match.group()}': {why}")
    return None


# Inductor names its kernels triton_<kind>_fused_<ops>_<n>. Pointwise and reduction kinds
# never call tl.dot, so they are "no"; templates (mm/conv) may or may not get Tensor Cores
# depending on dtype and shape, and the name does not say.
_TRITON = re.compile(r"^triton_(?P<kind>[a-z]+)_")
_TRITON_NON_MATRIX_KINDS = {"poi": "elementwise", "pointwise": "elementwise",
                            "red": "reduction/norm", "per": "reduction/norm"}


def _rule_triton(name: str, text: str) -> KernelVerdict | None:
    match = _TRITON.match(text)
    if not match and not text.startswith("triton"):
        return None
    kind = match.group("kind") if match else ""
    if kind in _TRITON_NON_MATRIX_KINDS:
        category = "softmax" if "softmax" in text else _TRITON_NON_MATRIX_KINDS[kind]
        return _no(category, _first_dtype_in(text),
                   f"'triton_{kind}_': Inductor pointwise/reduction kernel, no tl.dot")
    if kind == "tem":  # Inductor templates are matmuls or convolutions
        category = "conv" if _CONV_HINT.search(text) else "gemm"
    else:
        category = _matrix_category(text) or _content_category(text)
    return _unknown(category, _dtype_in(text),
                    "Triton kernel: the name carries no evidence of the math unit")


# --- attention -------------------------------------------------------------------------

_FLASH = re.compile(r"flash_fwd|flash_bwd|flashattn(?:fwd|bwd)|pytorch_flash::|(?<![a-z])flash::"
                    r"|fmha_v2_flash")
_FMHA_CUTLASS = re.compile(r"fmha_cutlass[fb]_(?P<dtype>bf16|f16|f32)_\w*?_sm(?P<sm>\d+)")
_ATTENTION_TEMPLATE = re.compile(
    r"attention(?:backward)?kernel<\s*(?:cutlass::arch::sm(?P<sm1>\d+),\s*)?"
    r"(?P<dtype>cutlass::half_t|cutlass::bfloat16_t|float)(?:,\s*cutlass::arch::sm(?P<sm2>\d+))?")
_FMHA_SM = re.compile(r"^fmhasm(?P<sm>\d+)[a-z]?kernel")
_SDPA = re.compile(r"sdpa")
_SDPA_MMA = re.compile(r"flash|wgmma|hmma|(?<![a-z0-9])sm(?:8|9|1\d)\d(?![0-9])")
_FLASHINFER_PREFILL = re.compile(r"(?:batch|single)prefillwith\w*kernel")
_FLASHINFER_DECODE = re.compile(r"(?:batch|single)decodewith\w*kernel")
_PAGED_ATTENTION = re.compile(r"paged_attention_v\d")

_MEM_EFF_DTYPES = {"f16": "fp16", "bf16": "bf16", "f32": "fp32", "cutlass::half_t": "fp16",
                   "cutlass::bfloat16_t": "bf16", "float": "fp32"}


def _mem_efficient_attention(dtype_token: str, sm: int, token: str) -> KernelVerdict:
    """PyTorch/xFormers memory-efficient attention: Tensor Cores depend on build and dtype.

    fp16/bf16 builds for sm70+ use OpClassTensorOp; fp32 builds use it only from sm80
    (3xTF32, accurate to fp32); sm50 builds and fp32 builds for sm70/75 use OpClassSimt.
    """
    dtype = _MEM_EFF_DTYPES[dtype_token]
    if sm < 70:
        return _no("attention", dtype, f"'{token}': sm{sm} build of mem-efficient attention "
                                       "(OpClassSimt, CUDA cores)")
    if dtype == "fp32" and sm < 80:
        return _no("attention", dtype, f"'{token}': fp32 mem-efficient attention for sm{sm} "
                                       "(OpClassSimt, CUDA cores)")
    if dtype == "fp32":
        return _yes("attention", dtype, f"'{token}': fp32 mem-efficient attention for sm{sm} "
                                        "(3xTF32 on Tensor Cores)")
    return _yes("attention", dtype, f"'{token}': {dtype} mem-efficient attention "
                                    f"(OpClassTensorOp, sm{sm} build)")


def _rule_attention(name: str, text: str) -> KernelVerdict | None:
    match = _FMHA_CUTLASS.search(text)
    if match:
        return _mem_efficient_attention(match.group("dtype"), int(match.group("sm")),
                                        match.group())
    match = _ATTENTION_TEMPLATE.search(text)
    if match and (match.group("sm1") or match.group("sm2")):
        sm = int(match.group("sm1") or match.group("sm2"))
        return _mem_efficient_attention(match.group("dtype"), sm, match.group())
    match = _FLASH.search(text)
    if match:
        return _yes("attention", _dtype_in(text),
                    f"'{match.group()}': FlashAttention (mma.sync / wgmma on Tensor Cores)")
    match = _FMHA_SM.search(text)
    if match:
        sm = int(match.group("sm"))
        if sm >= 90:
            return _yes("attention", _dtype_in(text),
                        f"'{match.group()}': trtllm-gen FMHA for sm{sm} (wgmma / tcgen05)")
        return _unknown("attention", _dtype_in(text), f"'{match.group()}': FMHA build for sm{sm}")
    if _SDPA.search(text):
        mma = _SDPA_MMA.search(text)
        if mma:
            return _yes("attention", _dtype_in(text),
                        f"cuDNN SDPA kernel with '{mma.group()}' (flash attention on Tensor Cores)")
        return _unknown("attention", _dtype_in(text), "'sdpa' kernel without an MMA token")
    match = _FLASHINFER_PREFILL.search(text)
    if match:
        return _yes("attention", _dtype_in(text),
                    f"'{match.group()}': FlashInfer prefill (mma.sync on Tensor Cores)")
    match = _FLASHINFER_DECODE.search(text) or _PAGED_ATTENTION.search(text)
    if match:
        return _no("attention", _dtype_in(text),
                   f"'{match.group()}': decode attention with CUDA-core dot products")
    return None


# --- cuBLASLt nvjet (Hopper/Blackwell generated GEMMs) ---------------------------------
# nvjet_<types>_<tile>...: types are one letter per A/B, compute, C/D; h = fp16, t = bf16,
# s = fp32 (with a _tf32 or _bf16x9 suffix for the tensor-core fp32 paths), q/e = fp8,
# o = fp4 (block-scaled only: with Avec16UE4M3 NVFP4, with Avec32UE8M0 MXFP4).

# nvjet's block-scale tokens -> the dtype by the A/B type letter (docs: block-scaled formats)
_NVJET_BLOCK_SCALES = {"avec16ue4m3": {"o": "nvfp4"},
                       "avec32ue8m0": {"o": "mxfp4", "q": "mxfp8", "e": "mxfp8"}}
_NVJET = re.compile(r"^nvjet_(?:sm\d+[a-z]?_)?(?P<types>[a-z]+)(?P<rest>_\w*)?")
_NVJET_LETTER_DTYPES = {"h": "fp16", "t": "bf16", "q": "fp8", "o": "fp4", "e": "fp8",
                        "i": "int8"}


def _rule_nvjet(name: str, text: str) -> KernelVerdict | None:
    match = _NVJET.match(text)
    if not match:
        return None
    types, rest = match.group("types"), match.group("rest") or ""
    for scale_token, by_letter in _NVJET_BLOCK_SCALES.items():
        if scale_token in rest:
            dtype = next((by_letter[letter] for letter in types if letter in by_letter), None)
            if dtype:
                return _yes("gemm", dtype, f"'nvjet_{types}' with '{scale_token}': cuBLASLt "
                                           f"block-scaled {dtype} GEMM (tcgen05)")
    for letter in types:
        if letter in _NVJET_LETTER_DTYPES:
            dtype = _NVJET_LETTER_DTYPES[letter]
            return _yes("gemm", dtype, f"'nvjet_{types}': cuBLASLt generated {dtype} GEMM "
                                       "(wgmma / tcgen05)")
    if "tf32" in rest:
        return _yes("gemm", "tf32", f"'nvjet_{types}_tf32': cuBLASLt TF32 GEMM (wgmma / tcgen05)")
    if "bf16x9" in rest:
        return _yes("gemm", "fp32", f"'nvjet_{types}_bf16x9': fp32 GEMM emulated with bf16 "
                                    "Tensor Core passes")
    return _unknown("gemm", "fp32", f"'nvjet_{types}': fp32 nvjet GEMM without a tf32 token")


# --- XMMA (cuBLAS/cuDNN sm70+ generated kernels) ---------------------------------------

_XMMA = re.compile(r"(?:^|_)sm(?P<sm>\d+)_xmma_(?P<op>[a-z]+)")
_XMMA_SIMT = re.compile(r"_(?:ffma|hfma2|dfma|simt)(?:_|$)")
_XMMA_MMA = re.compile(r"tensor\d+x\d+x\d+|warpgroupsize|gmma|hmma|imma|dmma")
_XMMA_TRAITS = re.compile(
    r"xmma\w*::.*?(?P<token>(?:volta|turing|ampere|hopper)_[hid]mma\w*?_traits)")
_XMMA_TC_MATH_TYPES = re.compile(r"_(?:tf32|bf16|f16|e4m3|e5m2|s8|i8)")


def _rule_xmma(name: str, text: str) -> KernelVerdict | None:
    match = _XMMA.search(text)
    if match:
        category = "conv" if match.group("op") in ("fprop", "dgrad", "wgrad", "conv") else (
            _matrix_category(text) or "gemm")
        dtype = _dtype_in(text)
        simt = _XMMA_SIMT.search(text)
        if simt:
            return _no(category, dtype, f"XMMA math token '{simt.group().strip('_')}': "
                                        "FMA on CUDA cores")
        mma = _XMMA_MMA.search(text) or _XMMA_TC_MATH_TYPES.search(text)
        if mma:
            return _yes(category, dtype, f"XMMA kernel with '{mma.group().strip('_')}' "
                                         "(Tensor Core MMA)")
        return _unknown(category, dtype, "XMMA kernel without a math token")
    match = _XMMA_TRAITS.search(text)
    if match:
        return _yes(_matrix_category(text) or "gemm", _dtype_in(match.group("token")) or
                    _dtype_in(text), f"XMMA traits '{match.group('token')}' (Tensor Core MMA)")
    return None


# --- trtllm-gen batched GEMMs (Blackwell): bmm_<out>_<a><b>_<acc>_t<tile>..._sm100f -------

_TRTLLM_GEMM = re.compile(r"^(?:bmm|mm|gemm)_(?P<out>[a-z0-9]+)_(?P<ab>[a-z0-9]+)"
                          r"_(?:fp32|fp16|int32)_t\d+x\d+x\d+\w*_sm(?P<sm>\d+)[a-z]?$")


def _trtllm_dtype(ab: str) -> str | None:
    """trtllm-gen's A/B types: `Mx` marks an MX format (e8m0 scales per 32), a bare E2m1 is
    NVFP4 (e4m3 scales per 16). A mixed MXFP4 x MXFP8 GEMM runs at the fp8 rate."""
    if "mxe4m3" in ab or "mxe5m2" in ab:
        return "mxfp8"
    if "mxe2m1" in ab:
        return "mxfp4"
    if "e2m1" in ab:
        return "nvfp4"
    return _dtype_in(ab)


def _rule_trtllm_gemm(name: str, text: str) -> KernelVerdict | None:
    match = _TRTLLM_GEMM.match(text)
    if not match:
        return None
    sm = int(match.group("sm"))
    dtype = _trtllm_dtype(match.group("ab")) or _dtype_in(text)
    if sm >= 90:
        return _yes("gemm", dtype, f"trtllm-gen GEMM built for sm{sm} (tcgen05 / wgmma)")
    return _unknown("gemm", dtype, f"trtllm-gen GEMM built for sm{sm}")


# --- cuBLAS/cuDNN SASS kernels: <arch>_[<type>_]<x><mma shape><gemm|cudnn>_... ----------
# The MMA shape token names the Tensor Core instruction: 884 (Volta HMMA.884), 1688
# (Turing/Ampere), 16816 / 16832 (Ampere+), 8816 (int8 IMMA). Without it, sgemm / scudnn /
# hgemm / winograd / gemv are CUDA-core kernels.

_LEGACY = re.compile(r"^(?:cudnn_)?(?:infer_|train_)?(?P<arch>maxwell|pascal|kepler|volta|turing"
                     r"|ampere|hopper|ada|blackwell|sm\d+)_(?P<rest>\w+)$")
_MMA_SHAPE = re.compile(r"(?<![0-9x])(?P<acc>[hsid])?(?P<shape>884|1688|16816|16832|8816|161616)"
                        r"(?P<kind>gemm|cudnn|fprop|dgrad|wgrad|conv)")
_NON_TC_LEGACY = re.compile(r"(?<![a-z])(?:fp16_|bf16_)?(?P<token>[sdhcz]gemm|gcgemm|[sh]cudnn"
                            r"|winograd|gemv|gemmsn|[sdhcz]gemv|gemmk1)")
_CONV_TOKENS = re.compile(r"cudnn|fprop|dgrad|wgrad|conv(?!ert)|winograd|implicit_?gemm")
_NEW_TC_ARCHES = ("ampere", "hopper", "ada", "blackwell")


def _mma_shape_dtype(text: str, shape: str, arch: str) -> str | None:
    """dtype of a legacy MMA-shape kernel; the type prefix is optional in these names.

    The letter before the shape is the accumulate/compute type (h884: fp16, i8816: int8,
    d884: fp64); "s" (fp32 accumulate) says nothing about the inputs.
    """
    dtype = _dtype_in(text.replace(shape, ""))
    if dtype not in (None, "fp32"):
        return dtype
    accumulate = re.search(rf"(?<![0-9a-z])([hid]){shape}", text)
    if accumulate:
        return {"h": "fp16", "i": "int8", "d": "fp64"}[accumulate.group(1)]
    if shape == "884":
        return "fp16"          # Volta HMMA only takes fp16
    if shape == "8816":
        return "int8"
    if shape == "1688" and arch not in ("turing", "75", "sm75"):
        return "tf32"          # cutlass_80_tensorop_s1688gemm: fp32 tensors, TF32 MMA
    if shape == "1688":
        return "fp16"          # Turing has no TF32: s1688 there is fp16 x fp16 -> fp32
    return dtype


def _rule_legacy_sass(name: str, text: str) -> KernelVerdict | None:
    match = _LEGACY.match(text)
    if not match:
        return None
    arch, rest = match.group("arch"), match.group("rest")
    category = "conv" if _CONV_TOKENS.search(rest) else "gemm"
    mma = _MMA_SHAPE.search(rest)
    if mma:
        return _yes(category, _mma_shape_dtype(rest, mma.group("shape"), arch),
                    f"MMA shape token '{mma.group()}' ({arch} Tensor Core kernel)")
    simt = _NON_TC_LEGACY.search(rest)
    if simt:
        token = simt.group("token")
        if token == "dgemm" and arch in _NEW_TC_ARCHES:
            return _unknown(category, "fp64", f"'{arch}_dgemm': fp64 GEMM; A100/H100 have fp64 "
                                              "Tensor Cores and the name does not say")
        return _no(category, _dtype_in(rest), f"'{token}': {arch} CUDA-core kernel "
                                              "(no MMA shape token)")
    return _unknown(category, _dtype_in(rest), f"'{arch}_' library kernel without an MMA token")


# --- CUTLASS ----------------------------------------------------------------------------
# Named instances: cutlass_80_tensorop_bf16_s16816gemm_..., cutlass_80_simt_sgemm_...,
# cutlass_tensorop_s1688fprop_..., cutlass3x_sm90_tensorop_gemm_...; templated instances
# (demangled or not) carry MmaTensorOp / OpClassTensorOp / Gmma / Umma or Simt classes.

_CUTLASS_NAMED = re.compile(r"cutlass(?:3x)?(?:_sm(?P<sm>\d+)|_(?P<arch>\d+))?"
                            r"_(?P<cls>wmma_tensorop|tensorop|simt)_(?P<rest>\w+)")
_CUTLASS_ANY = re.compile(r"cutlass")


def _rule_cutlass_named(name: str, text: str) -> KernelVerdict | None:
    match = _CUTLASS_NAMED.search(text)
    if not match:
        return None
    cls, rest = match.group("cls"), match.group("rest")
    category = "conv" if _CONV_TOKENS.search(rest) else "gemm"
    if cls == "simt":
        return _no(category, _dtype_in(rest), "CUTLASS 'simt' kernel (CUDA-core FMA)")
    mma = _MMA_SHAPE.search(rest)
    arch = match.group("sm") or match.group("arch") or ""
    dtype = _mma_shape_dtype(rest, mma.group("shape"), arch) if mma else _dtype_in(rest)
    return _yes(category, dtype, f"CUTLASS '{cls}' kernel (Tensor Core MMA)")


# --- CUDA-core GEMM/conv families ------------------------------------------------------

_NON_TC_GEMM = re.compile(
    r"(?P<token>(?<![a-z])gemv\w*?_kernel|gemvx::|gemvnsp|gemmsn_\w*?kernel|gemmk1_kernel"
    r"|(?<![a-z])dot_kernel|reduce_1block_kernel|magma_sgemm\w*|(?<![a-z])[sdcz]gemm_\w*?kernel)")
_NON_TC_CONV = re.compile(
    r"(?P<token>implicit_convolve_sgemm|explicit_convolve_sgemm|convolve_common_engine|"
    r"wgrad_alg\d\w*?_engine|dgrad\w*?_engine|dgrad2d_alg\w*|dgrad_alg\w*|winograd\w*|"
    r"fft\d?d?_[rc]2[rc]\w*|flip_filter|pointwise_mult_and_sum_complex|im2col\w*|col2im\w*|"
    r"conv_depthwise\w*|depthwise\w*conv\w*|slow_conv\w*|conv2d_grouped_direct\w*|"
    r"cudnn::cnn::\w+)")


def _rule_cuda_core_matrix(name: str, text: str) -> KernelVerdict | None:
    match = _NON_TC_GEMM.search(text)
    if match:
        reduction = match.group("token").startswith("reduce")
        return _no("reduction/norm" if reduction else "gemm", _dtype_in(text),
                   f"'{match.group('token')}': cuBLAS CUDA-core kernel (gemv / small-shape / "
                   "dot path)")
    match = _NON_TC_CONV.search(text)
    if match:
        return _no("conv", _dtype_in(text),
                   f"'{match.group('token')}': CUDA-core convolution path")
    return None


# --- generic evidence anywhere in the name (templated CUTLASS/CuTe, custom kernels) ------

_TC_TOKENS = re.compile(
    r"mmatensorop|opclasstensorop|majortensorop|(?<![a-z])(?:bs)?tensorop|wmma|gmma|hmma"
    r"|(?<![a-z])imma(?![a-z])|tcgen05|(?<![a-z])mfma|(?<![a-z])xdlops"
    r"|(?<![a-z])umma|sm1\d\d_mma|sm(?:75|8\d|9\d|1\d\d)_\d+x\d+x\d+_[a-z0-9]+"
    r"|m16n8k(?:8|16|32)|marlin|tinygemm")
# CuTe/CUTLASS 3 spell Blackwell MMA classes "Umma" inside camel-case words; lower-cased,
# "umma" would also hit "summary", so this one is matched on the original spelling.
_TC_TOKENS_CASED = re.compile(r"Umma|UMMA")
_SIMT_TOKENS = re.compile(r"opclasssimt|mmasimt|(?<![a-z])simt|(?<![a-z])ffma(?![a-z])|sgemm"
                          r"|universalfma")


def _rule_generic_evidence(name: str, text: str) -> KernelVerdict | None:
    simt = _SIMT_TOKENS.search(text)
    tensor = _TC_TOKENS.search(text) or _TC_TOKENS_CASED.search(name)
    category = _matrix_category(text) or "gemm"
    if tensor and not simt:
        return _yes(category, _dtype_in(text), f"'{tensor.group()}' in name (Tensor Core MMA)")
    if simt and not tensor:
        return _no(category, _dtype_in(text), f"'{simt.group()}' in name (CUDA-core FMA)")
    if simt and tensor:
        return _unknown(category, _dtype_in(text),
                        f"both '{tensor.group()}' and '{simt.group()}' in name")
    if _CUTLASS_ANY.search(_without_parameters(text)) and _matrix_category(text):
        return _unknown(category, _dtype_in(text), "CUTLASS kernel without an MMA class token")
    return None


# --- everything else: content words -> category; no matrix token -> "no" ---------------

_ATTENTION_HINT = re.compile(r"attention|attn|fmha|(?<![a-z])mha|sdpa|flash_|flash::|^_fwd_kernel"
                             r"|^_bwd_kernel")
_CONV_HINT = re.compile(r"conv(?!ert)|fprop|dgrad|wgrad|implicit_?gemm")
_GEMM_HINT = re.compile(r"gemm|matmul|(?<![a-z])(?:add|badd)?b?mm(?![a-z])|(?<![a-z])mma|cublas"
                        r"|nvjet|xmma|fused_moe|grouped_gemm|machete|cutlass")


def _without_parameters(text: str) -> str:
    """`void ns::k<T>(cutlass::bfloat16_t*, flashinfer::Layout)` -> `void ns::k<T>`.

    Hints are read from the kernel's own name; argument types (a cutlass dtype, a
    flashinfer enum) say nothing about what the kernel computes."""
    if not text.endswith(")"):
        return text
    depth = 0
    for pos in range(len(text) - 1, -1, -1):
        if text[pos] == ")":
            depth += 1
        elif text[pos] == "(":
            depth -= 1
            if depth == 0:
                return text[:pos]
    return text


def _matrix_category(text: str) -> str | None:
    text = _without_parameters(text)
    if _ATTENTION_HINT.search(text):
        return "attention"
    if _CONV_HINT.search(text):
        return "conv"
    if _GEMM_HINT.search(text):
        return "gemm"
    return None


# PyTorch / CUB / FBGEMM / cuDNN-norm families that never multiply matrices, whatever words
# their template arguments contain.
_NON_MATRIX_FAMILIES = re.compile(
    r"at::native::|at_cuda_detail|(?<![a-z])cub::|thrust::|cunn_|cudnn::bn_|cudnn::ops::"
    r"|fbgemm_gpu::|split_embedding|moe::dev::|vllm::(?:rms|fused_add|rotary|scaled|silu|gelu)")

# First match wins: specific words before generic ones ("reduce_kernel<...sum_functor>"
# is a reduction although "functor" also names elementwise kernels).
_CONTENT_CATEGORIES = tuple((category, re.compile(pattern)) for category, pattern in (
    ("reduction/norm", r"lpnorm|l2norm"),
    ("optimizer", r"adam|(?<![a-z])sgd|adagrad|lamb(?![a-z])|lion|rmsprop|optimizer|momentum"
                  r"|multi_tensor_apply|_amp_foreach|amp_update_scale|non_finite_check"),
    ("softmax", r"softmax"),
    ("reduction/norm", r"norm(?!al)|moments|welford|bn_fw|bn_bw|batchnorm|gammabeta"
                       r"|reduce_kernel|reduceop|argmax|argmin|max_pool|avg_pool|adaptive_\w*pool"
                       r"|pooling|nll|criterion|loss|cross_entropy"),
    ("copy kernel", r"copy|fill|catarray|cat_array|concat|transpose|permute|memcpy|memset"),
    ("elementwise", r"elementwise|functor|vectorized|unrolled|dropout|distribution|rotary|rope"),
    ("other", r"routing|(?<![a-z])moe|sort|topk|embedding|index|gather|scatter|histogram"
              r"|bucketize|bounds_check|offsets_range"),
    ("elementwise", r"gelu|relu|silu|swiglu|sigmoid|tanh|exp|log|rotary|rope|quant|scale|bias"
                    r"|activation|pointwise|add|mul|div|sub|where|clamp|cast|convert|threshold"
                    r"|masked|arange|to_float"),
    ("reduction/norm", r"reduce|scan|sum|mean"),
))


def _content_category(text: str) -> str:
    for category, pattern in _CONTENT_CATEGORIES:
        if pattern.search(text):
            return category
    return "other"


def _rule_non_matrix_family(name: str, text: str) -> KernelVerdict | None:
    match = _NON_MATRIX_FAMILIES.search(text)
    if match and not _TC_TOKENS.search(text):  # at::native::tinygemm_m16n8k16 does use MMA
        return _no(_content_category(text), _first_dtype_in(text),
                   f"'{match.group()}' kernel family: no matrix multiply (CUDA cores)")
    return None


def _rule_matrix_hint(name: str, text: str) -> KernelVerdict | None:
    category = _matrix_category(text)
    if category:
        return _unknown(category, _dtype_in(text),
                        f"looks like {category} but the name names no math unit")
    return None


_RULES = (
    _rule_transfer_and_comm,
    _rule_amd,
    _rule_helpers,
    _rule_triton,
    _rule_attention,
    _rule_nvjet,
    _rule_xmma,
    _rule_trtllm_gemm,
    _rule_legacy_sass,
    _rule_cutlass_named,
    _rule_cuda_core_matrix,
    _rule_non_matrix_family,
    _rule_generic_evidence,
    _rule_matrix_hint,
)


@lru_cache(maxsize=8192)
def classify_kernel(name: str) -> KernelVerdict:
    """What one GPU kernel was, judged from its name alone. Cached: traces repeat names."""
    name = (name or "").strip()
    text = name.lower()
    if name.startswith("_Z"):
        text = f"{text} {demangle_hint(name).lower()}"
    for rule in _RULES:
        verdict = rule(name, text)
        if verdict is not None:
            return verdict
    category = _content_category(text)
    return _no(category, _first_dtype_in(text),
               "no matrix-multiply token in the name (only GEMM/conv/attention use Tensor Cores)")
