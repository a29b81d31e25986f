"""Plotly figure builders shared by the pages (drawing only; the data comes from the engine)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from engine.analysis.compare import ema
from engine.analysis.live import steady_median
from engine.schema import PROFILE

_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=300,
               # Legend top right, clear of the title on the left.
               legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
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
    if smoothing <= 0:
        fig.add_trace(go.Scatter(x=frame["step"], y=frame[column], mode="lines", name=name))
        return
    fig.add_trace(go.Scatter(x=frame["step"], y=frame[column], mode="lines", name=f"{name} (raw)",
                             opacity=RAW_OPACITY))
    fig.add_trace(go.Scatter(x=frame["step"], y=ema(frame[column], smoothing), mode="lines",
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
                                     name=f"steady median {median:,.0f}"))
        else:
            fig.add_hline(y=median, line_dash="dot", annotation_text=f"steady median {median:,.0f}",
                          annotation_position="bottom left",
                          annotation_bgcolor="rgba(255,255,255,0.8)")
    _shade_profile_window(fig, frame)
    return fig


def memory_figure(frame: pd.DataFrame, is_cuda: bool) -> go.Figure:
    fig = _figure("Memory (GiB)", "step", "GiB")
    series = ([("mem_allocated_bytes", "allocated"), ("mem_reserved_bytes", "reserved"),
               ("mem_peak_bytes", "peak allocated")] if is_cuda
              else [("rss_bytes", "process RSS"), ("mem_peak_bytes", "peak RSS")])
    for column, label in series:
        if column in frame and frame[column].notna().any():
            fig.add_trace(go.Scatter(x=frame["step"], y=frame[column] / 2**30, mode="lines",
                                     name=label))
    return fig


def loss_scale_figure(frame: pd.DataFrame) -> go.Figure:
    fig = _figure("Loss scale and skipped steps", "step", "loss scale")
    fig.add_trace(go.Scatter(x=frame["step"], y=frame["loss_scale"], mode="lines",
                             name="loss scale"))
    fig.add_trace(go.Scatter(x=frame["step"], y=frame["skipped_steps"], mode="lines",
                             name="skipped steps (cumulative)", yaxis="y2",
                             line=dict(dash="dot")))
    fig.update_layout(yaxis_type="log",
                      yaxis2=dict(title="skipped steps", overlaying="y", side="right",
                                  rangemode="tozero"))
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
