"""FLOPs and bytes of one matrix op call from the shapes the trace recorded.

A profiler trace taken with record_shapes=True gives each CPU op its `Input Dims`, `Input
type` and (PyTorch 2.1+) `Concrete Inputs` (scalars and int lists as text). From those,
torch.utils.flop_counter's formulas give the op's FLOPs; the bytes are its tensors read
and written once (inputs, output, bias), the floor any implementation moves. Pure
functions; no torch. The formulas and where ours differ from the counter:
docs/precision-reference.md#per-op-flops-and-rates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Input type -> (dtype label, bytes per element)
_TYPE_BYTES = {
    "float": ("fp32", 4), "c10::Half": ("fp16", 2), "c10::BFloat16": ("bf16", 2),
    "double": ("fp64", 8), "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1),
    "c10::Float8_e4m3fnuz": ("fp8", 1), "c10::Float8_e5m2fnuz": ("fp8", 1),
    "c10::Float4_e2m1fn_x2": ("fp4", 1), "signed char": ("int8", 1), "int": ("int32", 4),
    "long int": ("int64", 8), "c10::complex<float>": ("complex64", 8),
}

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                      "aten::matmul", "aten::linear", "aten::_scaled_mm"})
CONV_OPS = frozenset({"aten::convolution", "aten::convolution_backward"})
# The SDPA ops at the level TraceLens and the PyTorch profiler's users read them: the
# backend-specific op (flash, efficient, cuDNN) under the public one. The kernels' own
# wrappers below them (aten::_flash_attention_forward, ...) are not in the set: an op is
# rated at the innermost level of this set, and they would split one attention call.
SDPA_FORWARD_OPS = {
    # op -> index of is_causal among its inputs
    "aten::scaled_dot_product_attention": 5,
    "aten::_scaled_dot_product_flash_attention": 4,
    "aten::_scaled_dot_product_efficient_attention": 6,
    "aten::_scaled_dot_product_cudnn_attention": 6,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
}
SDPA_BACKWARD_OPS = {
    "aten::_scaled_dot_product_flash_attention_backward": 11,
    "aten::_scaled_dot_product_efficient_attention_backward": 11,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 7,
}
SHAPED_OPS = frozenset(GEMM_OPS | CONV_OPS | set(SDPA_FORWARD_OPS) | set(SDPA_BACKWARD_OPS))
# FlashAttention's backward is 2.5x its forward (the forward's two matmuls recomputed in
# part, five in all), as torch.utils.flop_counter counts it for the flash and efficient ops.
SDPA_BACKWARD_FACTOR = 2.5


@dataclass(frozen=True)
class OpCost:
    """One call's arithmetic: FLOPs, bytes moved at least, the tensors' dtype, and the
    shape as people write it ("141x30522x512", "B16 H16 S559/559 d64 causal")."""

    flops: float
    bytes: float
    dtype: str
    shape: str
    kind: str            # "gemm" | "conv" | "attention"


def dtype_of(type_name: str) -> str | None:
    entry = _TYPE_BYTES.get(type_name)
    return entry[0] if entry else None


def _bytes_per_element(type_name: str) -> int:
    return _TYPE_BYTES.get(type_name, (None, 4))[1]


def _nbytes(dims: tuple, type_name: str) -> float:
    return math.prod(dims) * _bytes_per_element(type_name) if dims else 0.0


def _tensor_types(types: tuple) -> list[str]:
    return [name for name in types if name in _TYPE_BYTES]


def op_cost(name: str, dims: tuple, types: tuple, concrete: tuple) -> OpCost | None:
    """The cost of one call, or None when the shapes do not give it (a broadcast matmul
    the formulas do not cover, a conv without its stride and padding recorded)."""
    try:
        if name in GEMM_OPS:
            return _gemm_cost(name, dims, types)
        if name == "aten::convolution":
            return _conv_forward_cost(dims, types, concrete)
        if name == "aten::convolution_backward":
            return _conv_backward_cost(dims, types, concrete)
        if name in SDPA_FORWARD_OPS:
            return _sdpa_cost(dims, types, concrete, SDPA_FORWARD_OPS[name], 1.0)
        if name in SDPA_BACKWARD_OPS:
            # backward inputs: grad_out first, then query, key, value
            return _sdpa_cost(dims[1:], types[1:], concrete[1:], SDPA_BACKWARD_OPS[name] - 1,
                              SDPA_BACKWARD_FACTOR)
    except (IndexError, ValueError, ZeroDivisionError):
        return None
    return None


# --- GEMM -----------------------------------------------------------------------------

def _gemm_operands(name: str, dims: tuple) -> tuple[tuple, tuple, tuple | None]:
    """(a, b, bias) dims for the op's argument order."""
    if name in ("aten::addmm", "aten::baddbmm"):
        return dims[1], dims[2], dims[0]
    if name == "aten::linear":  # weight is (out, in): the product is a @ weight.T
        weight = dims[1]
        bias = dims[2] if len(dims) > 2 and dims[2] else None
        return dims[0], (weight[1], weight[0]), bias
    return dims[0], dims[1], None


def _gemm_cost(name: str, dims: tuple, types: tuple) -> OpCost | None:
    a, b, bias = _gemm_operands(name, dims)
    if len(a) < 2 or len(b) < 2:
        return None
    if len(b) == 2:      # (..., M, K) @ (K, N): leading dims of a are rows
        batch, m, k, n = 1, math.prod(a[:-1]), a[-1], b[1]
        if b[0] != k:
            return None
    elif len(a) == len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        batch, m, k, n = a[0], a[1], a[2], b[2]
    else:
        return None
    type_name = _tensor_types(types)[0] if _tensor_types(types) else "float"
    if name == "aten::_scaled_mm":  # fp8 inputs, output in out_dtype (not recorded): bf16
        moved = (batch * m * k + batch * k * n) * _bytes_per_element(type_name) + \
            batch * m * n * 2
    else:
        moved = (batch * (m * k + k * n + m * n)) * _bytes_per_element(type_name)
    if bias:
        moved += _nbytes(bias, type_name)
    shape = f"{m}x{n}x{k}" if batch == 1 else f"{batch}x{m}x{n}x{k}"
    return OpCost(2.0 * batch * m * n * k, float(moved), dtype_of(type_name) or "fp32",
                  shape, "gemm")


# --- convolution ------------------------------------------------------------------------

_INT_LIST = re.compile(r"-?\d+")


def _ints(text: str) -> list[int]:
    return [int(value) for value in _INT_LIST.findall(text or "")]


def _conv_flops(batch: int, weight: tuple, spatial_out: list[int]) -> float:
    """torch.utils.flop_counter.conv_flop_count: 2 * N * Cout * Cin/groups * prod(kernel)
    * prod(output spatial) (the weight's dim 1 is already Cin/groups)."""
    c_out, c_in_per_group, *kernel = weight
    return 2.0 * batch * c_out * c_in_per_group * math.prod(kernel) * math.prod(spatial_out)


def _conv_forward_cost(dims: tuple, types: tuple, concrete: tuple) -> OpCost | None:
    """aten::convolution(input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups): the output's size needs stride, padding and dilation, which
    only Concrete Inputs carry."""
    x, weight = dims[0], dims[1]
    if len(x) < 3 or len(weight) != len(x) or len(concrete) < 9:
        return None
    stride, padding, dilation = _ints(concrete[3]), _ints(concrete[4]), _ints(concrete[5])
    transposed = concrete[6].strip().lower() == "true"
    spatial = len(x) - 2
    if transposed or not (len(stride) == len(padding) == len(dilation) == spatial):
        return None
    out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (weight[2 + i] - 1) - 1) // stride[i] + 1
           for i in range(spatial)]
    if min(out) <= 0:
        return None
    type_name = _tensor_types(types)[0] if _tensor_types(types) else "float"
    out_dims = (x[0], weight[0], *out)
    moved = _nbytes(x, type_name) + _nbytes(weight, type_name) + _nbytes(out_dims, type_name)
    if len(dims) > 2 and dims[2]:
        moved += _nbytes(dims[2], type_name)
    shape = f"{'x'.join(map(str, x))} * {'x'.join(map(str, weight))}"
    return OpCost(_conv_flops(x[0], weight, out), float(moved),
                  dtype_of(type_name) or "fp32", shape, "conv")


def _conv_backward_cost(dims: tuple, types: tuple, concrete: tuple) -> OpCost | None:
    """aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask): the grad_output's shape is
    the forward's output, so no stride is needed. Each gradient asked for (input, weight)
    costs one forward, as in flop_counter's conv_backward_flop."""
    grad_out, x, weight = dims[0], dims[1], dims[2]
    if len(x) < 3 or len(weight) != len(x) or len(grad_out) != len(x):
        return None
    if len(concrete) > 7 and concrete[7].strip().lower() == "true":
        return None  # a transposed conv's backward: not covered
    mask = [word.strip().lower() == "true"
            for word in re.findall(r"true|false", concrete[10], re.IGNORECASE)] \
        if len(concrete) > 10 else []
    passes = (int(mask[0]) + int(mask[1])) if len(mask) >= 2 else 2
    if passes == 0:
        return None
    type_name = _tensor_types(types)[0] if _tensor_types(types) else "float"
    forward = _conv_flops(x[0], weight, list(grad_out[2:]))
    moved = 2 * (_nbytes(grad_out, type_name) + _nbytes(x, type_name) +
                 _nbytes(weight, type_name))
    shape = f"{'x'.join(map(str, x))} * {'x'.join(map(str, weight))} backward"
    return OpCost(forward * passes, float(moved), dtype_of(type_name) or "fp32", shape, "conv")


# --- attention ------------------------------------------------------------------------

def _sdpa_cost(dims: tuple, types: tuple, concrete: tuple, causal_index: int,
               factor: float) -> OpCost | None:
    """4 * B * H * Sq * Sk * d (QK^T and PV, 2 FLOPs a multiply-add) for query (B, H, Sq, d)
    and key (B, H_kv, Sk, d). A causal mask halves the work FlashAttention does (it skips
    the masked blocks): counted as half, as FlashAttention's benchmarks and TraceLens
    count it; flop_counter counts it in full."""
    query, key, value = dims[0], dims[1], dims[2]
    if len(query) != 4 or len(key) != 4:
        return None
    batch, heads, seq_q, head_dim = query
    seq_k = key[2]
    value_dim = value[3] if len(value) == 4 else head_dim
    causal = len(concrete) > causal_index and concrete[causal_index].strip().lower() == "true"
    flops = 2.0 * batch * heads * seq_q * seq_k * (head_dim + value_dim)
    if causal:
        flops /= 2
    type_name = _tensor_types(types)[0] if _tensor_types(types) else "float"
    output = (batch, heads, seq_q, value_dim)
    moved = sum(_nbytes(t, type_name) for t in (query, key, value, output))
    if factor != 1.0:
        moved *= 2  # backward reads them and writes their gradients
    shape = (f"B{batch} H{heads} S{seq_q}/{seq_k} d{head_dim}" + (" causal" if causal else "")
             + (" backward" if factor != 1.0 else ""))
    return OpCost(flops * factor, float(moved), dtype_of(type_name) or "fp32", shape,
                  "attention")
