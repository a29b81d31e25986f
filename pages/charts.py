"""Plotly figure builders shared by the pages (drawing only; the data comes from the engine).

Each figure is built from plain dicts by engine.report.figures.unvalidated_figure: Live
rebuilds its five or six charts every second while a trainer shares the machine, and
plotly's property-by-property validation cost 370-500 ms of a 2-core machine's CPU per
refresh (tests/test_figures.py checks each one against plotly's validating build)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.analysis.live import steady_median
from engine.analysis.steady import ema
from engine.display import MEMORY_UNITS, memory_unit, throughput_text
from engine.report.figures import (
    PLOT_TEMPLATE,
    RAW_OPACITY,
    line_layout,
    line_mode,
    unvalidated_figure,
)
from engine.schema import PROFILE

_LAYOUT = dict(template=PLOT_TEMPLATE, margin=dict(l=10, r=10, t=40, b=10), height=320,
               # The legend under the x-axis title, at the bottom of the chart: on top it
               # ran into the title as soon as the chart was narrow or the names long.
               legend=dict(orientation="h", yref="container", y=0, yanchor="bottom",
                           x=0, xanchor="left"),
               hovermode="x unified")


def _layout(title: str, x_title: str, y_title: str, log_y: bool = False) -> dict[str, Any]:
    return line_layout(_LAYOUT, title, x_title, y_title, log_y)


def _values(column: pd.Series) -> np.ndarray:
    """A column as floats, missing values as NaN (a gap in the line)."""
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _line(xs, ys, name: str, mode: str = "lines", **props: Any) -> dict[str, Any]:
    return {"type": "scatter", "x": xs, "y": ys, "mode": mode, "name": name, **props}


def _profile_window(frame: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Grey band over the profiler window (those steps are slower on purpose), as layout
    shapes and annotations: what plotly's add_vrect builds, without its validation."""
    if "phase" not in frame or frame.empty:
        return {}
    window = frame.loc[frame["phase"] == PROFILE, "step"]
    if window.empty:
        return {}
    x0, x1 = float(window.min()) - 0.5, float(window.max()) + 0.5
    return {"shapes": [{"type": "rect", "xref": "x", "yref": "y domain", "x0": x0, "x1": x1,
                        "y0": 0, "y1": 1, "fillcolor": "grey", "opacity": 0.15,
                        "line": {"width": 0}}],
            "annotations": [{"text": "profiler", "showarrow": False, "xref": "x", "x": x0,
                             "xanchor": "left", "yref": "y domain", "y": 1, "yanchor": "top"}]}


def _series(frame: pd.DataFrame, column: str, name: str, smoothing: float
            ) -> list[dict[str, Any]]:
    """The raw series, and its EMA (engine.analysis.steady.ema) over it when smoothing > 0."""
    mode = line_mode(len(frame))
    steps, values = _values(frame["step"]), _values(frame[column])
    if smoothing <= 0:
        return [_line(steps, values, name, mode)]
    return [_line(steps, values, f"{name} (raw)", mode, opacity=RAW_OPACITY),
            _line(steps, ema(values, smoothing).to_numpy(dtype=float), mode=mode,
                  name=f"{name} (EMA {smoothing:g})")]


def _with_window(layout: dict[str, Any], window: dict[str, list]) -> dict[str, Any]:
    for key, items in window.items():
        layout[key] = [*layout.get(key, []), *items]
    return layout


def loss_figure(frame: pd.DataFrame, name: str = "loss", smoothing: float = 0.0,
                log_y: bool = False) -> go.Figure:
    layout = _with_window(_layout("Loss", "step", "loss", log_y), _profile_window(frame))
    return unvalidated_figure(_series(frame, "loss", name, smoothing), layout)


def throughput_figure(frame: pd.DataFrame, column: str, unit: str, smoothing: float = 0.0,
                      log_y: bool = False) -> go.Figure:
    traces = _series(frame, column, f"{unit}/s", smoothing)
    layout = _layout(f"Throughput ({unit}/s)", "step", f"{unit}/s", log_y)
    median = steady_median(frame, column)
    if median is not None:
        label = f"steady median {throughput_text(median)}"
        if log_y:
            # An annotation sits at y in axis units, which on a log axis are log10: name the
            # line in the legend instead, where it cannot land off the chart.
            ends = [float(frame["step"].min()), float(frame["step"].max())]
            traces.append(_line(ends, [median, median], label,
                                line={"dash": "dot", "color": "grey"}))
        else:  # what plotly's add_hline builds
            layout["shapes"] = [{"type": "line", "xref": "x domain", "x0": 0, "x1": 1,
                                 "yref": "y", "y0": median, "y1": median,
                                 "line": {"dash": "dot"}}]
            layout["annotations"] = [{"text": label, "showarrow": False, "xref": "x domain",
                                      "x": 0, "xanchor": "left", "yref": "y", "y": median,
                                      "yanchor": "top", "bgcolor": "rgba(255,255,255,0.8)"}]
    return unvalidated_figure(traces, _with_window(layout, _profile_window(frame)))


def memory_figure(frame: pd.DataFrame, is_cuda: bool) -> go.Figure:
    series = ([("mem_allocated_bytes", "allocated"), ("mem_reserved_bytes", "reserved"),
               ("mem_peak_bytes", "peak allocated")] if is_cuda
              else [("rss_bytes", "process RSS"), ("mem_peak_bytes", "peak RSS")])
    # The unit of the peak, the figure the Peak memory tile beside it shows (engine.display);
    # on CUDA the reserved pool can pass 1 GiB while the peak allocated is still below it.
    peak_column = "mem_peak_bytes" if "mem_peak_bytes" in frame else None
    unit = memory_unit([frame[peak_column].max()] if peak_column else
                       [frame[column].max() for column, _label in series if column in frame])
    steps, mode = _values(frame["step"]), line_mode(len(frame))
    traces = [_line(steps, _values(frame[column]) / MEMORY_UNITS[unit], label, mode)
              for column, label in series if column in frame and frame[column].notna().any()]
    return unvalidated_figure(traces, _layout(f"Memory ({unit})", "step", unit))


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
    mode, steps = line_mode(len(frame)), _values(frame["step"])
    traces = [_line(steps, _values(frame["loss_scale"]), "loss scale", mode,
                    line={"shape": "hv"}),
              _line(steps, _values(frame["skipped_steps"]), "skipped steps (cumulative)", mode,
                    yaxis="y2", line={"dash": "dot", "shape": "hv"})]
    layout = _layout("Loss scale and skipped steps", "step", "loss scale (powers of two)",
                     log_y=True)
    layout["yaxis"].update(power_of_two_ticks(frame["loss_scale"]))
    layout["yaxis2"] = {"title": {"text": "skipped steps"}, "overlaying": "y", "side": "right",
                        **count_axis_ticks(frame["skipped_steps"])}
    return unvalidated_figure(traces, layout)


def telemetry_figure(frame: pd.DataFrame, columns: list[tuple[str, str]], title: str,
                     y_title: str) -> go.Figure:
    """One line per column; per rank and column when the frame holds several ranks
    (a multi-process run: each process samples itself)."""
    layout = _layout(title, "time (s since start)", y_title)
    if frame.empty:
        return unvalidated_figure([], layout)
    t0 = frame["t_s"].min()
    ranks = sorted(frame["rank"].unique()) if "rank" in frame else []
    parts = ([(f"rank {rank} ", frame[frame["rank"] == rank]) for rank in ranks]
             if len(ranks) > 1 else [("", frame)])
    traces = [_line(_values(part["t_s"] - t0), _values(part[column]), prefix + label)
              for prefix, part in parts for column, label in columns
              if column in part and part[column].notna().any()]
    return unvalidated_figure(traces, layout)
