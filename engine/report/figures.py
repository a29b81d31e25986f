"""The comparison charts (plotly only, no streamlit): the Compare page and the HTML
report draw the same figures from here. Raw points stay visible, faint, under the
EMA-smoothed line; a dotted line marks each run's steady-state median."""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative

from engine.analysis.speedup import CLAIMS, INCONCLUSIVE, NO_DIFFERENCE, stored_verdict
from engine.analysis.steady import ema
from engine.display import MEMORY_KINDS, MEMORY_UNITS, memory_unit

X_STEP, X_WALL = "step", "wall_time_s"
X_TITLES = {X_STEP: "step", X_WALL: "wall time since run start (s)"}
PALETTE = qualitative.Plotly
RAW_OPACITY = 0.3  # raw points stay visible, faint, under the smoothed line
# Pinned: importing Streamlit makes its own template plotly's default, so without this a
# figure built in the app server (the report downloaded from Compare) would differ from
# the same figure built by the CLI, and its tested layout would not hold.
PLOT_TEMPLATE = "plotly"
_LAYOUT = dict(template=PLOT_TEMPLATE, margin=dict(l=10, r=10, t=50, b=10), height=360,
               # The legend under the x-axis title, at the bottom of the chart: on top it
               # covered the title (long run names, EMA on: two entries per run).
               legend=dict(orientation="h", yref="container", y=0, yanchor="bottom",
                           x=0, xanchor="left"),
               hovermode="closest")
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
FEW_POINTS = 50  # below this many points a line also draws its markers


def line_mode(points: int) -> str:
    """Markers too while a series is short: a line through one point draws nothing, so a
    run's first logged step would stay invisible until the second arrives."""
    return "lines+markers" if points < FEW_POINTS else "lines"


# ---------------------------------------------------------------------------------------
# figures


def _color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def unvalidated_figure(traces: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A Figure from plain trace and layout dicts (plotly's property names, traces with
    their "type"), built without plotly's property-by-property validation.

    Why: validating is most of a chart's server-side cost. Compare with 20 runs built its
    three figures (61 traces, their data read and smoothed included) in 200-280 ms
    validated, 46-65 ms this way, out of a ~400 ms script run, on every visit and every
    widget change. The JSON drawn is the same
    (tests/test_figures.py builds each figure again with validation and compares). The
    template is resolved here, as validation would have done: plotly.js does not know
    templates by name."""
    template = layout.get("template", PLOT_TEMPLATE)
    if isinstance(template, str):
        template = pio.templates[template]
    return go.Figure(data=traces, layout={**layout, "template": template}, _validate=False)


def line_layout(base: Mapping[str, Any], title: str, x_title: str, y_title: str,
                log_y: bool = False) -> dict[str, Any]:
    """A line chart's layout dict: `base` (size, margins, legend) with its titles and y axis
    (the comparison charts and Live's, pages/charts.py, each with their own base)."""
    return {**base, "title": {"text": title}, "xaxis": {"title": {"text": x_title}},
            "yaxis": {"title": {"text": y_title}, **({"type": "log"} if log_y else {})}}


def _layout(title: str, x: str, y_title: str, log_y: bool) -> dict[str, Any]:
    return line_layout(_LAYOUT, title, X_TITLES[x], y_title, log_y)


def _series_traces(frame: pd.DataFrame, column: str, name: str, color: str, x: str,
                   smoothing: float, scale: float = 1.0) -> list[dict[str, Any]]:
    """Raw values as a line, or faint raw points under an EMA line when smoothing > 0."""
    if column not in frame or x not in frame:
        return []
    # numpy arrays, not lists or pandas selections: pandas indexing costs more than the
    # drawing at 20 runs, and plotly sends arrays as compact typed arrays.
    xs = frame[x].to_numpy(dtype=float, na_value=np.nan)
    ys = frame[column].to_numpy(dtype=float, na_value=np.nan) / scale
    keep = ~np.isnan(xs)
    xs, ys = xs[keep], ys[keep]
    if not len(ys) or np.isnan(ys).all():
        return []
    label = html.escape(name)  # plotly renders trace names as (limited) HTML
    if smoothing <= 0:
        return [{"type": "scatter", "x": xs, "y": ys, "mode": line_mode(len(ys)), "name": label,
                 "legendgroup": label, "line": {"color": color}, "marker": {"size": 5}}]
    return [{"type": "scatter", "x": xs, "y": ys, "mode": "markers", "name": f"{label} (raw)",
             "legendgroup": label, "showlegend": False, "opacity": RAW_OPACITY,
             "marker": {"color": color, "size": 4}},
            {"type": "scatter", "x": xs, "y": ema(ys, smoothing).to_numpy(dtype=float),
             "mode": "lines", "name": f"{label} (EMA {smoothing:g})", "legendgroup": label,
             "line": {"color": color, "width": 2}}]


def loss_overlay_figure(frames: Mapping[str, pd.DataFrame], names: Mapping[str, str],
                        x: str = X_STEP, smoothing: float = 0.0, log_y: bool = False) -> go.Figure:
    traces = []
    for index, (run_id, frame) in enumerate(frames.items()):
        traces += _series_traces(frame, "loss", names[run_id], _color(index), x, smoothing)
    return unvalidated_figure(traces, _layout("Loss", x, "loss", log_y))


def throughput_overlay_figure(frames: Mapping[str, pd.DataFrame], names: Mapping[str, str],
                              units: Mapping[str, str], x: str = X_STEP,
                              smoothing: float = 0.0, log_y: bool = False,
                              steady_medians: Mapping[str, Mapping[str, Any]] | None = None
                              ) -> go.Figure:
    """tokens/s when every run has them (gpt), else samples/s; a dotted line per run
    at its steady-state median: the summary table's number when `steady_medians` (run id
    -> {"samples_per_s", "tokens_per_s"}) gives it, else the median of the plotted rows."""
    column = ("tokens_per_s" if all(u == "tokens/s" for u in units.values())
              else "samples_per_s")
    unit = column.replace("_per_s", "/s")
    traces = []
    for index, (run_id, frame) in enumerate(frames.items()):
        series = _series_traces(frame, column, names[run_id], _color(index), x, smoothing)
        traces += series
        median = (steady_medians or {}).get(run_id, {}).get(column)
        if median is None and len(frame):
            steady = frame.loc[frame["phase"] == "steady", column].dropna()
            median = float(steady.median()) if len(steady) else None
        if median is not None and series:
            # A two-point line over the run's own x range: a layout shape per run
            # (add_hline) costs ~5 ms each in plotly, a trace almost nothing.
            xs = series[0]["x"]
            traces.append({"type": "scatter", "x": [float(xs.min()), float(xs.max())],
                           "y": [median, median], "mode": "lines", "showlegend": False,
                           "hoverinfo": "skip",
                           "line": {"color": _color(index), "dash": "dot", "width": 1}})
    return unvalidated_figure(
        traces, _layout(f"Throughput ({unit}; dotted: steady median)", x, unit, log_y))


def memory_overlay_figure(frames: Mapping[str, pd.DataFrame], names: Mapping[str, str],
                          x: str = X_STEP, smoothing: float = 0.0,
                          log_y: bool = False) -> go.Figure:
    """Peak memory so far: CUDA peak allocated, or the process's peak RSS on a CPU."""
    unit = memory_unit(value for frame in frames.values() if "mem_peak_bytes" in frame
                       for value in (frame["mem_peak_bytes"].max(),))
    traces = []
    for index, (run_id, frame) in enumerate(frames.items()):
        traces += _series_traces(frame, "mem_peak_bytes", names[run_id], _color(index), x,
                                 smoothing, scale=MEMORY_UNITS[unit])
    return unvalidated_figure(
        traces, _layout(f"Peak memory ({unit}; GPU runs: tensor peak, CPU runs: process peak)",
                        x, unit, log_y))


def comparison_figures(frames: Mapping[str, pd.DataFrame], names: Mapping[str, str],
                       units: Mapping[str, str], x: str = X_STEP, smoothing: float = 0.0,
                       log_y: bool = False,
                       steady_medians: Mapping[str, Mapping[str, Any]] | None = None
                       ) -> dict[str, go.Figure]:
    return {
        "loss": loss_overlay_figure(frames, names, x, smoothing, log_y),
        "throughput": throughput_overlay_figure(frames, names, units, x, smoothing, log_y,
                                                steady_medians),
        "memory": memory_overlay_figure(frames, names, x, smoothing, log_y),
    }


# ---------------------------------------------------------------------------------------
# the HTML document


_UNCLAIMED_LABEL = {NO_DIFFERENCE: " n.s.", INCONCLUSIVE: " inconclusive"}


def speedup_forest_figure(result: Mapping[str, Any], title: str | None = None) -> go.Figure:
    """A paired speedup check as a forest plot: one row per mode, the speedup as a point,
    its 95 % interval as a bar, a line at 1.0 (no difference). Modes whose interval
    includes 1.0 are grey and labelled "n.s."; on a busy machine every mode is grey and
    labelled "inconclusive" (the verdict of engine.analysis.speedup.mode_verdict, the one
    rule the table and text beside it follow too)."""
    rows = [row for row in result.get("modes", []) if row.get("mode") != result.get("baseline")]
    busy = bool((result.get("contention") or {}).get("busy"))
    head = title or f"Speedup vs {result.get('baseline')} (95 % interval)"
    if busy:
        head += " - machine busy: inconclusive"
    fig = go.Figure()
    fig.add_vline(x=1.0, line_dash="dash", line_color="#555")
    for index, row in enumerate(rows):
        if row.get("speedup") is None:
            continue
        low, high = row.get("ci_low"), row.get("ci_high")
        verdict, _words = stored_verdict(row, result)
        claimed = verdict in CLAIMS
        color = _color(index) if claimed else "#999999"
        label = f"{row['speedup']:.2f}x" + (
            "" if claimed else _UNCLAIMED_LABEL.get(verdict, " n.s.")
        )
        error = ({"type": "data", "symmetric": False, "array": [high - row["speedup"]],
                  "arrayminus": [row["speedup"] - low], "thickness": 3, "width": 8,
                  "color": color} if low is not None and high is not None else None)
        fig.add_trace(go.Scatter(
            x=[row["speedup"]], y=[html.escape(str(row["mode"]))], mode="markers+text",
            marker={"size": 12, "color": color}, error_x=error, text=[label],
            textposition="top center", name=html.escape(str(row["mode"])),
            hovertemplate=(f"{html.escape(str(row['mode']))}: %{{x:.3f}}x"
                           + (f" (95 % CI {low:.3f}-{high:.3f})" if low is not None else "")
                           + "<extra></extra>")))
    fig.update_layout(title={"text": html.escape(head), "x": 0, "xanchor": "left"},
                      xaxis_title=f"speedup vs {html.escape(str(result.get('baseline')))} "
                                  "(> 1: faster)",
                      showlegend=False, height=140 + 60 * max(1, len(rows)),
                      margin={"l": 110, "r": 30, "t": 60, "b": 50}, template=PLOT_TEMPLATE)
    # Half a row above the top mode and below the bottom one: plotly's own range ends at
    # the outer points, and cuts the label drawn above the top one ("0.98x n.s.").
    drawn = sum(1 for row in rows if row.get("speedup") is not None)
    fig.update_yaxes(automargin=True, range=[-0.5, max(drawn, 1) - 0.5])
    # ... and the no-difference line at 1.0 inside the plot, not on its edge
    ends = [v for row in rows for v in (row.get("ci_low"), row.get("ci_high"), row.get("speedup"))
            if v is not None] + [1.0]
    pad = 0.08 * (max(ends) - min(ends) or 0.1)
    fig.update_xaxes(automargin=True, range=[min(ends) - pad, max(ends) + pad])
    return fig


def memory_by_kind_figure(result: Mapping[str, Any]) -> go.Figure | None:
    """A paired speedup check's tensor peak per mode, stacked by what holds it
    (engine.training.memory.memory_by_kind); None when no mode has the split."""
    return memory_split_figure([(str(row["mode"]), row["memory_by_kind"])
                                for row in result.get("modes", [])
                                if row.get("memory_by_kind")])


def memory_split_figure(splits: Sequence[tuple[str, Mapping[str, Any]]]
                        ) -> go.Figure | None:
    """Each (label, memory_by_kind) as a bar of its tensor peak, stacked by kind: a
    speedup check's modes, or the runs Compare shows; None when there is none."""
    if not splits:
        return None
    labels = [html.escape(label) for label, _ in splits]
    # one unit for every bar, the unit of the tables beside it
    unit = memory_unit(split.get("peak_bytes") for _, split in splits)
    fig = go.Figure()
    for index, (key, label) in enumerate(MEMORY_KINDS):
        sizes = [split.get(key, 0) / MEMORY_UNITS[unit] for _, split in splits]
        fig.add_trace(go.Bar(y=labels, x=sizes, name=label, orientation="h",
                             marker_color=_color(index),
                             hovertemplate=f"{label}: %{{x:,.2f}} {unit}<extra></extra>"))
    fig.update_layout(barmode="stack",
                      title={"text": f"Tensor peak by kind ({unit})", "x": 0,
                             "xanchor": "left"},
                      xaxis_title=unit, height=140 + 50 * len(splits),
                      legend={"orientation": "h", "y": -0.35},
                      margin={"l": 110, "r": 30, "t": 60, "b": 90}, template=PLOT_TEMPLATE)
    fig.update_yaxes(automargin=True)
    return fig


def roofline_figure(op_rates: list[Mapping[str, Any]],
                    device_spec: Mapping[str, Any] | None) -> go.Figure | None:
    """Each rated op as a point (FLOP per byte, achieved TFLOP/s; log-log), sized by its
    time, under the device's roofs: memory bandwidth x intensity up to each dtype's matrix
    peak, and the fp32 vector peak. None when no op has a rate."""
    rows = [row for row in op_rates if row.get("flop_per_byte") and row.get("tflops_per_s")]
    if not rows:
        return None
    fig = go.Figure()
    by_dtype: dict[str, list] = {}
    for row in rows:
        by_dtype.setdefault(row["compute_dtype"], []).append(row)
    largest_us = max(row["kernel_us"] for row in rows)
    for index, (dtype, members) in enumerate(sorted(by_dtype.items())):
        fig.add_trace(go.Scatter(
            x=[row["flop_per_byte"] for row in members],
            y=[row["tflops_per_s"] for row in members], mode="markers", name=dtype,
            marker=dict(color=_color(index), opacity=0.8,
                        size=[8 + 22 * (row["kernel_us"] / largest_us) ** 0.5 for row in members]),
            text=[f"{row['op']} {row['shape']}<br>{row['calls']} calls, "
                  f"{row['kernel_us'] / 1000:.3f} ms" for row in members],
            hovertemplate="%{text}<br>%{x:.1f} FLOP/B, %{y:.2f} TFLOP/s<extra></extra>"))
    if device_spec:
        low = min(row["flop_per_byte"] for row in rows) / 4
        high = max(row["flop_per_byte"] for row in rows) * 4
        bandwidth = device_spec["memory_tb_per_s"]
        roofs = {f"{dtype} matrix peak": peak
                 for dtype, peak in device_spec["matrix_tflops"].items() if dtype in by_dtype}
        roofs["fp32 vector peak"] = device_spec["vector_tflops"].get("fp32")
        dashes = ("dash", "dot", "dashdot", "longdash")
        for index, (name, peak) in enumerate(roofs.items()):
            if not peak:
                continue
            ridge = peak / bandwidth
            xs = [low, max(low, min(ridge, high)), high]
            fig.add_trace(go.Scatter(x=xs, y=[min(peak, bandwidth * x) for x in xs],
                                     mode="lines", name=f"{name} ({peak:g} TFLOP/s)",
                                     hoverinfo="name",
                                     line=dict(width=1.5, dash=dashes[index % len(dashes)],
                                               color="#666")))
    title = "Per-op rates against the roofline" + (
        f" ({device_spec['row']}, {device_spec['memory_tb_per_s']:g} TB/s)"
        if device_spec else " (no datasheet for this device: points only)")
    fig.update_layout(title=title, height=420, margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte)"),
                      yaxis=dict(type="log", title="achieved TFLOP/s"))
    return fig
