"""Figure builders for the Numerics view (drawing only; the records come from
engine.training.numerics, stored per run in runs/<id>/numerics.json)."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

from engine.analysis.numerics import BF16_MIN_NORMAL, FP16_MAX, FP16_MIN_NORMAL

# In log2 |x|: fp16 rounds |x| <= 2**-25 to zero; [2**-25, 2**-14) lands in fp16's
# subnormal range (fewer significant bits); 2**-14 is the smallest normal fp16.
FP16_ZERO_BELOW_LOG2 = -25.0
FP16_MIN_NORMAL_LOG2 = math.log2(FP16_MIN_NORMAL)  # -14
FP16_MAX_LOG2 = math.log2(FP16_MAX)  # ~15.9998
BF16_MIN_NORMAL_LOG2 = math.log2(BF16_MIN_NORMAL)  # -126

KIND_LABELS = {
    "activation": "activations (layer outputs, forward)",
    "output_grad": "activation gradients (d loss / d layer output)",
    "grad": "weight gradients",
}


def histogram_figure(records: list[dict[str, Any]], step: int, kind: str,
                     times_loss_scale: bool = False) -> go.Figure:
    """Per-layer share of values per power-of-two bucket, against the fp16/bf16 ranges.

    `times_loss_scale`: shift gradients by log2(loss scale), i.e. show what a GradScaler
    stores in fp16 instead of the true values.
    """
    rows = [r for r in records if r["step"] == step and r["kind"] == kind]
    suffix = " × loss scale" if times_loss_scale else ""
    fig = go.Figure()
    fig.update_layout(
        title=f"{KIND_LABELS.get(kind, kind)}{suffix}, step {step}: share of values per "
              "power of two", height=420, margin=dict(l=10, r=10, t=60, b=10),
        xaxis_title="log2 |x|  (bucket e holds 2^e <= |x| < 2^(e+1))",
        yaxis_title="% of the layer's values", hovermode="closest",
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    low, high = FP16_ZERO_BELOW_LOG2 - 6, FP16_MAX_LOG2 + 3
    for index, record in enumerate(rows):
        hist = record["hist"]
        shift = _shift(record, times_loss_scale)
        xs = [e + shift for e in hist["exponents"]]
        total = hist["total"] or 1
        ys = [100.0 * c / total for c in hist["counts"]]
        if xs:
            low, high = min(low, min(xs) - 2), max(high, max(xs) + 2)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", line_shape="hvh",
                                 name=record["layer"], marker=dict(size=4),
                                 line=dict(color=qualitative.Plotly[index % 10])))
    _draw_ranges(fig, low, high)
    fig.update_xaxes(range=[low, high], tickvals=_ticks(low, high),
                     ticktext=[f"2^{e}<br>{2.0 ** e:.0e}" for e in _ticks(low, high)])
    return fig


def _shift(record: dict[str, Any], times_loss_scale: bool) -> float:
    scale = record.get("loss_scale")
    if not times_loss_scale or not scale or record["kind"] == "activation":
        return 0.0
    return math.log2(scale)


def _ticks(low: float, high: float) -> list[int]:
    step = 8 if high - low > 60 else 4
    first = int(math.ceil(low / step) * step)
    return list(range(first, int(high) + 1, step))


def _draw_ranges(fig: go.Figure, low: float, high: float) -> None:
    fig.add_vrect(x0=low, x1=FP16_ZERO_BELOW_LOG2, fillcolor="red", opacity=0.10, line_width=0,
                  annotation_text="fp16: rounds to 0", annotation_position="top left")
    fig.add_vrect(x0=FP16_ZERO_BELOW_LOG2, x1=FP16_MIN_NORMAL_LOG2, fillcolor="orange",
                  opacity=0.10, line_width=0, annotation_text="fp16 subnormal",
                  annotation_position="top left")
    fig.add_vline(x=FP16_MIN_NORMAL_LOG2, line_dash="dash", line_color="orange",
                  annotation_text="fp16 min normal 6.1e-5", annotation_position="bottom right")
    fig.add_vrect(x0=FP16_MAX_LOG2, x1=high, fillcolor="red", opacity=0.10, line_width=0)
    fig.add_vline(x=FP16_MAX_LOG2, line_dash="dash", line_color="red",
                  annotation_text="fp16 max 65504", annotation_position="top left")
    if low <= BF16_MIN_NORMAL_LOG2:
        fig.add_vline(x=BF16_MIN_NORMAL_LOG2, line_dash="dot", line_color="green",
                      annotation_text="bf16 min normal 1.2e-38")
    else:
        fig.add_annotation(x=low, y=1.0, yref="paper", xanchor="left", yanchor="bottom",
                           showarrow=False, text="bf16 (fp32 exponent range): normal down to "
                           "2^-126 = 1.2e-38, far left of this axis")
