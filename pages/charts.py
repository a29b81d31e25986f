"""Plotly figure builders shared by the pages (drawing only; the data comes from the engine)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.analysis.steady import ema
from engine.analysis.live import steady_median
from engine.display import MEMORY_UNITS, memory_unit, throughput_text
from engine.report.figures import PLOT_TEMPLATE, line_mode
from engine.schema import PROFILE

_LAYOUT = dict(template=PLOT_TEMPLATE, margin=dict(l=10, r=10, t=40, b=10), height=320,
               # The legend under the x-axis title, at the bottom of the chart: on top it
               # ran into the title as soon as the chart was narrow or the names long.
               legend=dict(orientation="h", yref="container", y=0, yanchor="bottom",
                           x=0, xanchor="left"),
               hovermode="x unified")


def _figure(title: str, x_title: str, y_title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, **_LAYOUT)
    return fig


def _shade_profile_window(fig: go.Figure, frame: pd.DataFrame) -> None:
    """Grey band over the profiler window: those steps are slower on purpose."""
    if "phase" not in frame or frame.empty:
        return
    window = frame.loc[frame["phase"] == PROFILE, "step"]
    if not window.empty:
        fig.add_vrect(x0=window.min() - 0.5, x1=window.max() + 0.5, fillcolor="grey",
                      opacity=0.15, line_width=0, annotation_text="profiler",
                      annotation_position="top left")


RAW_OPACITY = 0.3  # with smoothing on, the raw points stay visible, faint, under the EMA


def _series(fig: go.Figure, frame: pd.DataFrame, column: str, name: str,
            smoothing: float) -> None:
    """The raw series, and its EMA (engine.analysis.compare.ema) over it when smoothing > 0."""
    mode = line_mode(len(frame))
    if smoothing <= 0:
        fig.add_trace(go.Scatter(x=frame["step"], y=frame[column], mode=mode, name=name))
        return
    fig.add_trace(go.Scatter(x=frame["step"], y=frame[column], mode=mode, name=f"{name} (raw)",
                             opacity=RAW_OPACITY))
    fig.add_trace(go.Scatter(x=frame["step"], y=ema(frame[column], smoothing), mode=mode,
                             name=f"{name} (EMA {smoothing:g})"))


def loss_figure(frame: pd.DataFrame, name: str = "loss", smoothing: float = 0.0,
                log_y: bool = False) -> go.Figure:
    fig = _figure("Loss", "step", "loss")
    _series(fig, frame, "loss", name, smoothing)
    if log_y:
        fig.update_yaxes(type="log")
    _shade_profile_window(fig, frame)
    return fig


def throughput_figure(frame: pd.DataFrame, column: str, unit: str, smoothing: float = 0.0,
                      log_y: bool = False) -> go.Figure:
    fig = _figure(f"Throughput ({unit}/s)", "step", f"{unit}/s")
    _series(fig, frame, column, f"{unit}/s", smoothing)
    if log_y:
        fig.update_yaxes(type="log")
    median = steady_median(frame, column)
    if median is not None:
        if log_y:
            # An annotation sits at y in axis units, which on a log axis are log10: name the
            # line in the legend instead, where it cannot land off the chart.
            fig.add_trace(go.Scatter(x=[frame["step"].min(), frame["step"].max()],
                                     y=[median, median], mode="lines",
                                     line=dict(dash="dot", color="grey"),
                                     name=f"steady median {throughput_text(median)}"))
        else:
            fig.add_hline(y=median, line_dash="dot",
                          annotation_text=f"steady median {throughput_text(median)}",
                          annotation_position="bottom left",
                          annotation_bgcolor="rgba(255,255,255,0.8)")
    _shade_profile_window(fig, frame)
    return fig


def memory_figure(frame: pd.DataFrame, is_cuda: bool) -> go.Figure:
    series = ([("mem_allocated_bytes", "allocated"), ("mem_reserved_bytes", "reserved"),
               ("mem_peak_bytes", "peak allocated")] if is_cuda
              else [("rss_bytes", "process RSS"), ("mem_peak_bytes", "peak RSS")])
    # The unit of the peak, the figure the Peak memory tile beside it shows (engine.display);
    # on CUDA the reserved pool can pass 1 GiB while the peak allocated is still below it.
    peak_column = "mem_peak_bytes" if "mem_peak_bytes" in frame else None
    unit = memory_unit([frame[peak_column].max()] if peak_column else
                       [frame[column].max() for column, _label in series if column in frame])
    fig = _figure(f"Memory ({unit})", "step", unit)
    for column, label in series:
        if column in frame and frame[column].notna().any():
            fig.add_trace(go.Scatter(x=frame["step"], y=frame[column] / MEMORY_UNITS[unit],
                                     mode=line_mode(len(frame)), name=label))
    return fig


def power_of_two_ticks(values: pd.Series, max_ticks: int = 8) -> dict:
    """Log-axis ticks at powers of two, labelled 2^k: GradScaler halves and doubles the
    scale, so 2^16 -> 2^15 reads as one backoff where plotly's own "5, 2, 100k" does not.
    Every other power (or fewer) when the range holds more than `max_ticks` of them."""
    numbers = pd.to_numeric(values, errors="coerce")
    finite = numbers[np.isfinite(numbers) & (numbers > 0)]
    if finite.empty:
        return {}
    low = math.floor(math.log2(finite.min()))
    high = math.ceil(math.log2(finite.max()))
    if low == high:  # a flat scale: one tick on each side of it
        low, high = low - 1, high + 1
    stride = math.ceil((high - low + 1) / max_ticks)
    exponents = range(low, high + 1, stride)
    return {"tickmode": "array", "tickvals": [2.0 ** k for k in exponents],
            "ticktext": [f"2^{k}" for k in exponents]}


def count_axis_ticks(counts: pd.Series, max_ticks: int = 6) -> dict:
    """Whole-number ticks from 0 for an axis that counts things (plotly would label 0.5)."""
    numbers = pd.to_numeric(counts, errors="coerce")
    finite = numbers[np.isfinite(numbers)]
    highest = float(finite.max()) if len(finite) else 0.0
    step = max(1, math.ceil(highest / max_ticks))
    return {"tickmode": "linear", "tick0": 0, "dtick": step, "tickformat": "d",
            "range": [0, max(1.0, highest) * 1.05]}


def loss_scale_figure(frame: pd.DataFrame) -> go.Figure:
    fig = _figure("Loss scale and skipped steps", "step", "loss scale (powers of two)")
    mode = line_mode(len(frame))
    fig.add_trace(go.Scatter(x=frame["step"], y=frame["loss_scale"], mode=mode,
                             name="loss scale", line=dict(shape="hv")))
    fig.add_trace(go.Scatter(x=frame["step"], y=frame["skipped_steps"], mode=mode,
                             name="skipped steps (cumulative)", yaxis="y2",
                             line=dict(dash="dot", shape="hv")))
    fig.update_layout(yaxis=dict(type="log", **power_of_two_ticks(frame["loss_scale"])),
                      yaxis2=dict(title="skipped steps", overlaying="y", side="right",
                                  **count_axis_ticks(frame["skipped_steps"])))
    return fig


def telemetry_figure(frame: pd.DataFrame, columns: list[tuple[str, str]], title: str,
                     y_title: str) -> go.Figure:
    """One line per column; per rank and column when the frame holds several ranks
    (a multi-process run: each process samples itself)."""
    fig = _figure(title, "time (s since start)", y_title)
    if frame.empty:
        return fig
    t0 = frame["t_s"].min()
    ranks = sorted(frame["rank"].unique()) if "rank" in frame else []
    parts = ([(f"rank {rank} ", frame[frame["rank"] == rank]) for rank in ranks]
             if len(ranks) > 1 else [("", frame)])
    for prefix, part in parts:
        for column, label in columns:
            if column in part and part[column].notna().any():
                fig.add_trace(go.Scatter(x=part["t_s"] - t0, y=part[column], mode="lines",
                                         name=prefix + label))
    return fig
