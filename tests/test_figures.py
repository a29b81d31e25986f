"""The comparison and Live figures are built without plotly's validation
(engine.report.figures.unvalidated_figure: 10x cheaper); these tests build each one again
through plotly's validating constructor, which raises on any property plotly does not
know, and check the JSON drawn is the same."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from engine.report import figures
from engine.schema import PROFILE
from pages import charts


def run_frame(steps: int, rate: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    step = np.arange(1, steps + 1, dtype=float)
    loss = 5 * 0.99 ** step + rng.normal(0, 0.01, steps)
    loss[7:8] = np.nan  # a skipped fp16 step logs no loss
    return pd.DataFrame({
        "step": step, "loss": loss, "wall_time_s": 0.1 * step,
        "samples_per_s": rate + rng.normal(0, 5, steps), "tokens_per_s": 128 * rate,
        "phase": ["warmup" if s <= 3 else "steady" for s in step],
        "mem_peak_bytes": 2**30 + step * 2**20})


FRAMES = {"a": run_frame(300, 40.0, 0), "b": run_frame(40, 75.0, 1), "c": run_frame(1, 9.0, 2)}
NAMES = {"a": "fp32 <baseline>", "b": "bf16-amp", "c": "fp16-amp & one step"}
UNITS = {"a": "samples/s", "b": "samples/s", "c": "samples/s"}


def drawn(fig: go.Figure) -> dict:
    return json.loads(pio.to_json(fig, validate=False))


@pytest.mark.parametrize("x", [figures.X_STEP, figures.X_WALL])
@pytest.mark.parametrize("smoothing, log_y", [(0.0, False), (0.6, True)])
def test_each_comparison_figure_is_what_plotlys_validation_would_build(x, smoothing, log_y):
    built = figures.comparison_figures(FRAMES, NAMES, UNITS, x, smoothing, log_y,
                                       steady_medians={"a": {"samples_per_s": 40.0}})
    assert set(built) == {"loss", "throughput", "memory"}
    for name, fig in built.items():
        validated = go.Figure(fig.to_dict())  # raises ValueError on an unknown property
        assert drawn(fig) == drawn(validated), name
        assert drawn(fig)["layout"]["template"]["layout"], "the template is resolved, not a name"
        assert (drawn(fig)["layout"]["yaxis"].get("type") == "log") == log_y, name
    # a raw line and an EMA line per run when smoothing; the names are escaped for plotly
    traces = built["loss"].data
    assert len(traces) == (6 if smoothing else 3)
    assert traces[0].name.startswith("fp32 &lt;baseline&gt;")
    assert built["throughput"].data[-2 if not smoothing else -3].line.dash == "dot"


def test_an_invalid_property_still_fails_when_validated():
    """The check above can fail: plotly's constructor rejects what unvalidated accepts."""
    fig = figures.unvalidated_figure([{"type": "scatter", "x": [1], "colour": "red"}], {})
    with pytest.raises(ValueError, match="colour"):
        go.Figure(fig.to_dict())


def live_frame(steps: int = 120) -> pd.DataFrame:
    """A fp16-amp run on a CUDA device as the store returns it: a profiler window, the loss
    scale backing off, a skipped step's missing loss."""
    frame = run_frame(steps, 40.0, 3).assign(
        step=lambda f: f["step"].astype("int64"),
        phase=lambda f: np.where(f["step"].between(60, 65), PROFILE, f["phase"]),
        loss_scale=lambda f: np.where(f["step"] < 80, 65536.0, 32768.0),
        skipped_steps=lambda f: (f["step"] >= 80).astype("int64"),
        mem_allocated_bytes=2.0**31, mem_reserved_bytes=2.5 * 2**31, rss_bytes=2.0**30)
    return frame


def telemetry_frame(ranks: int) -> pd.DataFrame:
    t_s = np.arange(40, dtype=float) / 2
    return pd.DataFrame({"t_s": np.tile(t_s + 1000.0, ranks),
                         "rank": np.repeat(np.arange(ranks), len(t_s)),
                         "gpu_util_pct": np.tile(50 + t_s, ranks),
                         "power_w": [None] * (len(t_s) * ranks)})


def live_figures(smoothing: float, log_y: bool) -> list[go.Figure]:
    frame = live_frame()
    return [charts.loss_figure(frame, smoothing=smoothing, log_y=log_y),
            charts.throughput_figure(frame, "tokens_per_s", "tokens", smoothing, log_y),
            charts.memory_figure(frame, is_cuda=True), charts.memory_figure(frame, is_cuda=False),
            charts.loss_scale_figure(frame), charts.loss_figure(frame.head(1)),
            *(charts.telemetry_figure(telemetry_frame(ranks), [("gpu_util_pct", "GPU util %"),
                                                               ("power_w", "power W")],
                                      "GPU utilisation", "%") for ranks in (1, 2)),
            charts.telemetry_figure(telemetry_frame(1).head(0), [("gpu_util_pct", "util")],
                                    "GPU utilisation", "%")]


@pytest.mark.parametrize("smoothing, log_y", [(0.0, False), (0.6, True)])
def test_each_live_figure_is_what_plotlys_validation_would_build(smoothing, log_y):
    for fig in live_figures(smoothing, log_y):
        name = fig.layout.title.text
        assert drawn(fig) == drawn(go.Figure(fig.to_dict())), name
    loss, throughput, cuda_memory, cpu_memory, scale, one, tele_one, tele_two, empty = \
        live_figures(smoothing, log_y)
    # the profiler window is shaded and named; the steady median is a line, and on a log
    # axis a legend entry (an annotation's y would be read as log10 there)
    assert [s.type for s in loss.layout.shapes] == ["rect"]
    assert loss.layout.shapes[0].x0 == 59.5 and loss.layout.annotations[0].text == "profiler"
    assert any("steady median" in (t.name or "") for t in throughput.data) == log_y
    assert any("steady median" in a.text for a in throughput.layout.annotations) != log_y
    assert [t.name for t in cuda_memory.data] == ["allocated", "reserved", "peak allocated"]
    assert cuda_memory.layout.title.text == "Memory (GiB)" and max(cuda_memory.data[1].y) == 5
    assert [t.name for t in cpu_memory.data] == ["process RSS", "peak RSS"]
    assert scale.layout.yaxis.type == "log" and scale.data[1].yaxis == "y2"
    assert "markers" in one.data[0].mode
    # a rank's line per column that has values; power_w is all missing: no line
    assert [t.name for t in tele_one.data] == ["GPU util %"]
    assert [t.name for t in tele_two.data] == ["rank 0 GPU util %", "rank 1 GPU util %"]
    assert tele_two.data[0].x[0] == 0.0 and not empty.data
