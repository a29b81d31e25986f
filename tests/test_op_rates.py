"""Per-op FLOPs and rates from a trace's recorded shapes (engine.traces.op_flops, op_rates).

Two outside oracles: torch.utils.flop_counter (the formulas, on the same shapes run for
real on this CPU) and TraceLens's per-op reports for four real traces
(tests/data/tracelens_reference: FLOPs per call and TFLOP/s of every GEMM and SDPA row).
"""

from __future__ import annotations

import ast
import csv
from pathlib import Path

import pytest

from engine.hardware.gpus import GPU_SPECS, gpu_spec
from engine.traces.explain import analyze
from engine.traces.op_flops import SHAPED_OPS, op_cost
from engine.traces.op_rates import RECORD_SHAPES_HINT, op_rates, rate_witness
from engine.traces.parser import load_trace

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
REFERENCE = DATA / "tracelens_reference"
REFERENCED = ("h100_bert_small_tracelens", "h100_qwen_tracelens",
              "mi300_bert_small_tracelens", "mi300_qwen_tracelens")


def _reference_rows(name: str) -> list[dict]:
    rows = []
    for report in ("GEMM.csv", "SDPA_fwd.csv"):
        with (REFERENCE / name / report).open(newline="", encoding="utf-8") as handle:
            rows += list(csv.DictReader(handle))
    return rows


@pytest.fixture(scope="module", params=REFERENCED)
def traced(request):
    name = request.param
    return name, op_rates(load_trace(TRACES / f"{name}.json.gz"))


def test_every_gemm_and_sdpa_row_matches_the_reference_report(traced):
    name, rows = traced
    ours = {(row["op"], str(row["input_dims"])): row for row in rows}
    reference = _reference_rows(name)
    assert reference
    for ref in reference:
        dims = str([list(dim) for dim in ast.literal_eval(ref["Input Dims_first"])])
        row = ours.get((ref["name"], dims))
        assert row is not None, f"{name}: no row for {ref['name']} {dims}"
        flops = float(ref["GFLOPS_first"]) * 1e9
        assert row["flops_per_call"] == pytest.approx(flops, rel=0.005), (name, ref["name"], dims)
        assert row["calls"] == int(ref["name_count"])
        assert row["kernel_us"] == pytest.approx(float(ref["Kernel Time (µs)_sum"]), rel=0.02)
        assert row["tflops_per_s"] == pytest.approx(float(ref["TFLOPS/s_mean"]), rel=0.02), (
            name, ref["name"], dims)
        assert row["tb_per_s"] == pytest.approx(float(ref["TB/s_mean"]), rel=0.02)


def test_mi300x_verdicts_are_yes_with_all_matrix_time_on_matrix_cores():
    for name in ("mi300_bert_small_tracelens", "mi300_qwen_tracelens"):
        result = analyze(TRACES / f"{name}.json.gz")
        assert result["verdict"]["tensor_cores"] == "yes", name
        assert result["matrix_tensor_core_share"] >= 0.99, name


def test_the_rates_confirm_the_names_where_an_op_outran_the_vector_units():
    result = analyze(TRACES / "mi300_qwen_tracelens.json.gz")
    witness = result["rate_witness"]
    assert witness["witness"] == "confirms"
    assert witness["op"].startswith("aten::mm 8944x1024x2816 bf16")
    assert "326.8 TFLOP/s" in witness["why"]  # MI300X's bf16 vector ceiling


def test_small_ops_cannot_decide_and_say_so():
    result = analyze(TRACES / "h100_bert_small_tracelens.json.gz")
    assert result["rate_witness"]["witness"] == "cannot decide"
    assert "aten::addmm 141x30522x512" in result["rate_witness"]["why"]


def test_names_that_deny_the_matrix_units_are_contradicted_by_a_rate_above_the_ceiling():
    rows = op_rates(load_trace(TRACES / "mi300_qwen_tracelens.json.gz"))
    denied = [{**row, "name_verdict": "no"} if row["above_vector_ceiling"] else row
              for row in rows]
    witness = rate_witness(denied, "no", "AMD Instinct MI300X")
    assert witness["witness"] == "contradicts"
    assert "names say they did not use the matrix units" in witness["why"]


def test_a_trace_without_shapes_says_how_to_record_them():
    result = analyze(TRACES / "gp100_pascal_hta.json.gz")
    assert result["op_rates"] == []
    assert result["op_rates_note"] == RECORD_SHAPES_HINT
    assert "record_shapes=True" in result["op_rates_note"]


def test_rows_carry_the_documented_fields_and_a_roofline_side():
    rows = op_rates(load_trace(TRACES / "mi300_qwen_tracelens.json.gz"))
    for field in ("op", "dtype", "calls", "flops_per_call", "bytes_per_call", "kernel_us",
                  "tflops_per_s", "tb_per_s", "share_of_peak", "bound"):
        assert all(field in row for row in rows), field
    big = next(row for row in rows if row["shape"] == "8944x2816x1024")
    assert big["bound"] == "compute" and big["share_of_peak"] == pytest.approx(
        big["tflops_per_s"] / 1307.4)
    tiny = next(row for row in rows if row["op"] == "aten::bmm")
    assert tiny["bound"] == "memory"


def test_every_catalogued_gpu_has_matrix_and_vector_peaks_and_a_source():
    for row, spec in GPU_SPECS.items():
        assert spec.vector_tflops.get("fp32"), row
        assert spec.matrix_peak("bf16") or spec.matrix_peak("fp16"), row
        assert spec.memory_tb_per_s > 0 and spec.source, row
        # a matrix unit that is no faster than the vector ceiling proves nothing
        assert (spec.matrix_peak("fp16") or 0) > (spec.vector_ceiling("fp16") or 0), row
    assert gpu_spec("AMD Instinct MI300X VF").row == "MI300X"
    assert gpu_spec("NVIDIA H100 80GB HBM3").row == "H100 SXM"
    assert gpu_spec("AMD Radeon Graphics") is None


# --- the formulas against torch.utils.flop_counter ---------------------------------------

def _counted(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_gemm_formulas_match_the_flop_counter():
    import torch
    a, b, bias = torch.randn(7, 5), torch.randn(5, 3), torch.randn(3)
    x, y = torch.randn(4, 7, 5), torch.randn(4, 5, 3)
    cases = [
        ("aten::mm", lambda: torch.mm(a, b), ((7, 5), (5, 3)), ("float", "float"), ()),
        ("aten::addmm", lambda: torch.addmm(bias, a, b), ((3,), (7, 5), (5, 3), (), ()),
         ("float",) * 3 + ("Scalar", "Scalar"), ()),
        ("aten::bmm", lambda: torch.bmm(x, y), ((4, 7, 5), (4, 5, 3)), ("float", "float"), ()),
        ("aten::baddbmm", lambda: torch.baddbmm(torch.randn(4, 7, 3), x, y),
         ((4, 7, 3), (4, 7, 5), (4, 5, 3), (), ()), ("float",) * 3 + ("Scalar",) * 2, ()),
    ]
    for name, fn, dims, types, concrete in cases:
        assert op_cost(name, dims, types, concrete).flops == _counted(fn), name


def test_conv_formulas_match_the_flop_counter_forward_and_backward():
    import torch
    x = torch.randn(2, 6, 17, 15)
    w = torch.randn(8, 3, 3, 5)  # groups=2
    kwargs = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    forward = _counted(lambda: torch.nn.functional.conv2d(x, w, **kwargs))
    concrete = ("", "", "", "[2, 1]", "[1, 2]", "[1, 2]", "False", "[0, 0]", "2")
    cost = op_cost("aten::convolution", ((2, 6, 17, 15), (8, 3, 3, 5), ()),
                   ("float", "float", ""), concrete)
    assert cost.flops == forward
    # backward with groups=1: the counter's weight-gradient term counts all input channels
    # per group (groups x too many for a grouped conv; docs/precision-reference.md)
    x = torch.randn(2, 6, 17, 15, requires_grad=True)
    w = torch.randn(8, 6, 3, 5, requires_grad=True)
    kwargs = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))
    forward = _counted(lambda: torch.nn.functional.conv2d(x, w, **kwargs))
    out = torch.nn.functional.conv2d(x, w, **kwargs)
    both = _counted(lambda: out.sum().backward())
    grad_out = tuple(out.shape)
    backward = op_cost("aten::convolution_backward",
                       (grad_out, (2, 6, 17, 15), (8, 6, 3, 5), (), (), (), (), (), (), (), ()),
                       ("float",) * 3, ("", "", "", "[0]", "[2, 1]", "[1, 2]", "[1, 2]",
                                        "False", "[0, 0]", "1", "[True, True, False]"))
    assert backward.flops == both == 2 * forward


def test_sdpa_formulas_match_the_flop_counter_and_halve_causal():
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count
    query, key = (2, 4, 9, 16), (2, 4, 11, 16)
    dims = (query, key, key)
    cost = op_cost("aten::_scaled_dot_product_flash_attention", dims,
                   ("float",) * 3, ("", "", "", "0.", "False", "False", ""))
    assert cost.flops == sdpa_flop_count(query, key, key)
    causal = op_cost("aten::_scaled_dot_product_flash_attention", dims,
                     ("float",) * 3, ("", "", "", "0.", "True", "False", ""))
    assert causal.flops == cost.flops / 2 and "causal" in causal.shape
    backward = op_cost("aten::_scaled_dot_product_flash_attention_backward",
                       (query, query, key, key, query), ("float",) * 5, ("",) * 15)
    assert backward.flops == sdpa_backward_flop_count(query, query, key, key)


def test_shapes_that_no_formula_covers_give_no_cost_not_an_error():
    assert op_cost("aten::mm", ((3, 4), (5, 6)), ("float", "float"), ()) is None
    assert op_cost("aten::convolution", ((1, 3, 8, 8), (4, 3, 3, 3), ()), ("float",) * 2,
                   ()) is None  # no stride/padding recorded
    assert op_cost("aten::bmm", ((2,),), ("float",), ()) is None
    assert "aten::mm" in SHAPED_OPS and "aten::_flash_attention_forward" not in SHAPED_OPS
