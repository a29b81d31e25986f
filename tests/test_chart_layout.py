"""Chart and report layout: what a person sees, not what the figure object says.

The loss-scale axis reads in powers of two and the skipped-steps axis in whole numbers;
a short series shows its points; and, measured in Chromium (tests/browser_support.py),
no legend covers a chart's title, axis titles or tick labels, every tick label lies
inside its chart, and the HTML report fits a 1280 px screen and a printed page.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import psutil
import pytest
from browser_support import chromium_browser

from engine.report import figures
from pages import charts

PRINT_WIDTH_PX = 703  # A4's 210 mm less the report's 12 mm @page margins, at 96 px/in


def metrics_frame(steps: int = 200, rate: float = 4000.0) -> pd.DataFrame:
    """A run as the store returns it: the loss scale backs off from 2^16 to 2^10."""
    step = np.arange(1, steps + 1)
    return pd.DataFrame({
        "step": step, "loss": 5 * 0.99 ** step + 0.05 * (step % 2),
        "tokens_per_s": rate + 300 * (step % 2), "samples_per_s": rate / 128,
        "loss_scale": np.where(step < steps // 2, 65536.0, 1024.0),
        "skipped_steps": np.where(step < steps // 2, 0, 3),
        "phase": ["warmup"] * 3 + ["steady"] * (steps - 3),
        "mem_peak_bytes": 2**30 + step * 2**20, "rss_bytes": 2**30, "wall_time_s": 0.1 * step})


# ---------------------------------------------------------------------------------------
# the figure objects


def test_loss_scale_axis_is_labelled_in_powers_of_two():
    axis = charts.loss_scale_figure(metrics_frame()).layout.yaxis
    assert axis.type == "log"
    assert list(axis.tickvals) == [2.0 ** k for k in range(10, 17)]
    assert list(axis.ticktext) == [f"2^{k}" for k in range(10, 17)]


def test_a_wide_loss_scale_range_keeps_the_ticks_few_and_powers_of_two():
    frame = metrics_frame().assign(loss_scale=lambda f: 2.0 ** (f["step"] % 24))
    axis = charts.loss_scale_figure(frame).layout.yaxis
    assert 2 <= len(axis.tickvals) <= 8
    assert all(math.log2(v).is_integer() for v in axis.tickvals)


def test_skipped_steps_axis_has_whole_number_ticks_only():
    for skipped in (0, 3, 17, 1000):
        frame = metrics_frame().assign(skipped_steps=np.linspace(0, skipped, 200).round())
        axis = charts.loss_scale_figure(frame).layout.yaxis2
        assert axis.tickmode == "linear" and axis.tick0 == 0, skipped
        assert float(axis.dtick).is_integer() and axis.dtick >= 1, (skipped, axis.dtick)
        assert axis.tickformat == "d"
        assert axis.range[0] == 0 and axis.range[1] >= max(1, skipped)


def test_forest_plot_keeps_the_top_label_and_the_no_difference_line_inside():
    """A speedup's label is drawn above its point: the y range leaves half a row above the
    top mode (plotly's own ends at it and cuts "0.98x n.s."), and the line at 1.0 is
    inside the x range, not on its edge."""
    result = {"baseline": "fp32", "contention": {"busy": False}, "modes": [
        {"mode": "fp32", "speedup": 1.0},
        {"mode": "bf16-amp", "speedup": 1.8, "ci_low": 1.7, "ci_high": 1.9},
        {"mode": "fp16-amp", "speedup": 0.98, "ci_low": 0.9, "ci_high": 1.05}]}
    layout = figures.speedup_forest_figure(result).layout
    assert list(layout.yaxis.range) == [-0.5, 1.5]  # two modes against the baseline
    low, high = layout.xaxis.range
    assert low < 0.9 and high > 1.9 and low < 1.0 < high


def test_a_single_logged_point_is_drawn_as_a_marker():
    one = metrics_frame().head(1)
    drawn = [charts.loss_figure(one), charts.throughput_figure(one, "tokens_per_s", "tokens"),
             charts.memory_figure(one, is_cuda=False), charts.loss_scale_figure(one),
             *figures.comparison_figures({"a": one}, {"a": "run a"},
                                         {"a": "tokens/s"}).values()]
    for fig in drawn:
        assert "markers" in fig.data[0].mode, (fig.layout.title.text, fig.data[0].mode)
    # A long curve is a line only: markers on thousands of points hide the shape.
    assert charts.loss_figure(metrics_frame(500)).data[0].mode == "lines"


# ---------------------------------------------------------------------------------------
# measured in the browser

# Boxes (left, top, right, bottom) in CSS px of every chart's parts.
_GEOMETRY_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => {
  const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect();
    return r.width || r.height ? [r.left, r.top, r.right, r.bottom] : null; };
  const texts = (sel) => Array.from(el.querySelectorAll(sel))
    .map(e => ({text: e.textContent, box: box(e)})).filter(t => t.box && t.text);
  return {name: el.querySelector('.gtitle') ? el.querySelector('.gtitle').textContent : '?',
          svg: box(el.querySelector('.main-svg')), title: box(el.querySelector('.gtitle')),
          legend: box(el.querySelector('.legend')), xtitle: box(el.querySelector('.xtitle')),
          ytitle: box(el.querySelector('.ytitle')), y2title: box(el.querySelector('.y2title')),
          xticks: texts('.xtick text'), yticks: texts('.ytick text'),
          y2ticks: texts('.y2tick text')};
})"""


def _overlap(a, b, pad: float = 0.5) -> bool:
    return bool(a and b and a[0] < b[2] - pad and b[0] < a[2] - pad
                and a[1] < b[3] - pad and b[1] < a[3] - pad)


def _inside(a, outer, pad: float = 0.5) -> bool:
    return (a[0] >= outer[0] - pad and a[1] >= outer[1] - pad and a[2] <= outer[2] + pad
            and a[3] <= outer[3] + pad)


def layout_problems(chart: dict) -> list[str]:
    """What a reader would see wrong in one chart: a legend over a title or a tick label,
    an axis title over its tick labels, text cut off at the chart's edge."""
    found = []
    ticks = chart["xticks"] + chart["yticks"] + chart["y2ticks"]
    for part in ("title", "xtitle", "ytitle", "y2title"):
        if _overlap(chart["legend"], chart[part]):
            found.append(f"legend over the {part}")
    for tick in ticks:
        if _overlap(chart["legend"], tick["box"]):
            found.append(f"legend over tick label {tick['text']!r}")
        if not _inside(tick["box"], chart["svg"]):
            found.append(f"tick label {tick['text']!r} cut off at the chart's edge")
    for title, axis_ticks in (("xtitle", chart["xticks"]), ("ytitle", chart["yticks"]),
                              ("y2title", chart["y2ticks"])):
        found += [f"{title} over tick label {t['text']!r}" for t in axis_ticks
                  if _overlap(chart[title], t["box"])]
    found += [f"{part} cut off at the chart's edge"
              for part in ("title", "legend", "xtitle", "ytitle", "y2title")
              if chart[part] and not _inside(chart[part], chart["svg"])]
    return [f"{chart['name']}: {problem}" for problem in found]


@pytest.fixture(scope="module")
def browser():
    with chromium_browser() as chromium:
        yield chromium
    # The browser's processes end with it: none may outlive the tests.
    left = [p for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE and "chrom" in p.name().lower()]
    assert not left, f"browser processes left behind: {left}"


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    try:
        yield tab
    finally:
        context.close()


def _charts_page(path, figs_and_widths) -> None:
    from plotly.offline import get_plotlyjs

    divs = "".join(f"<div style='width:{width}px'>"
                   + fig.to_html(full_html=False, include_plotlyjs=False) + "</div>"
                   for fig, width in figs_and_widths)
    path.write_text(f"<html><head><script>{get_plotlyjs()}</script></head><body>{divs}"
                    "</body></html>", encoding="utf-8")


def _wait_for_charts(page, count: int, settle_s: float = 10.0) -> list[dict]:
    """The geometry once every chart is drawn and its layout has settled: plotly's
    automargin redraws a chart after the first paint (asynchronously, later on a busy
    machine), so two reads 0.3 s apart must agree."""
    page.wait_for_function("(n) => document.querySelectorAll('.js-plotly-plot .gtitle')"
                           ".length >= n", arg=count)
    # Plotly's automargin pass (and font loading) can land a few frames after the first
    # paint on a busy machine: wait for fonts, then for three equal reads 0.3 s apart.
    page.evaluate("() => document.fonts.ready.then(() => true)")
    page.wait_for_timeout(500)
    deadline = time.monotonic() + settle_s
    previous, equal_reads = page.evaluate(_GEOMETRY_JS), 0
    while time.monotonic() < deadline and equal_reads < 2:
        page.wait_for_timeout(300)
        current = page.evaluate(_GEOMETRY_JS)
        equal_reads = equal_reads + 1 if current == previous else 0
        previous = current
    return previous


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_live_and_compare_charts_keep_legends_off_titles_and_labels(page, tmp_path):
    frame = metrics_frame()
    frames = {"a": frame, "b": frame.assign(tokens_per_s=frame["tokens_per_s"] * 1.8)}
    names = {"a": "fp32 baseline with a long label", "b": "bf16-amp with a long label too"}
    units = {"a": "tokens/s", "b": "tokens/s"}
    live = [charts.loss_scale_figure(frame), charts.loss_figure(frame, smoothing=0.6),
            charts.throughput_figure(frame, "tokens_per_s", "tokens", smoothing=0.6),
            charts.memory_figure(frame, is_cuda=True)]
    compare = [*figures.comparison_figures(frames, names, units, smoothing=0.6).values(),
               *figures.comparison_figures(frames, names, units, x=figures.X_WALL,
                                           log_y=True).values()]
    # A Live column is ~420 px wide next to the sidebar at 1280 px; Compare spans the page.
    path = tmp_path / "charts.html"
    _charts_page(path, [(fig, 420) for fig in live] + [(fig, 1100) for fig in compare])
    page.goto(path.as_uri())
    drawn = _wait_for_charts(page, len(live) + len(compare))
    assert [t["text"] for t in drawn[0]["yticks"]] == [f"2^{k}" for k in range(10, 17)]
    assert [t["text"] for t in drawn[0]["y2ticks"]] == ["0", "1", "2", "3"]
    problems = [problem for chart in drawn for problem in layout_problems(chart)]
    assert not problems, problems


@pytest.fixture
def report_path(tmp_path):
    """An HTML report of three finished runs with thousands of tokens/s and long names."""
    from engine.config import RunConfig
    from engine.report.html import export_html
    from engine.run.finalize import finalize_run_data
    from engine.store import Store

    store = Store(tmp_path / "home")
    run_ids = []
    for precision, speed in (("fp32", 1.0), ("bf16-amp", 1.8), ("fp16-amp", 1.3)):
        run_id = store.create_run(RunConfig(model="gpt", size="tiny", precision=precision,
                                            name=f"a rather long run name at {precision}"),
                                  "cpu", "test cpu with a long model name")
        store.set_status(run_id, "running")
        frame = metrics_frame(120, rate=2400.0 * speed).drop(columns=["loss_scale"])
        store.write_metrics(run_id, frame.to_dict("records"))
        finalize_run_data(store, run_id)
        store.set_status(run_id, "finished")
        run_ids.append(run_id)
    return export_html(store, run_ids, tmp_path / "report.html")


_WIDTHS_JS = """() => ({
  page: document.documentElement.scrollWidth,
  tables: Array.from(document.querySelectorAll('.table-wrap')).map(
    e => e.getBoundingClientRect().right),
  printedTables: Array.from(document.querySelectorAll('table')).map(
    e => e.getBoundingClientRect().right),
  charts: Array.from(document.querySelectorAll('.js-plotly-plot .main-svg')).map(
    e => e.getBoundingClientRect().right)})"""


@pytest.mark.browser
@pytest.mark.timeout(120)
def test_html_report_fits_a_1280_px_screen_and_a_printed_page(page, report_path):
    page.goto(report_path.as_uri())
    drawn = _wait_for_charts(page, 3)
    problems = [problem for chart in drawn for problem in layout_problems(chart)]
    assert not problems, problems
    widths = page.evaluate(_WIDTHS_JS)
    # On screen: no sideways scrolling of the page; a wide table scrolls in its own box.
    assert widths["page"] <= 1280, widths
    assert max(widths["tables"] + widths["charts"]) <= 1280, widths

    # Printing resizes every chart to the paper before the page is laid out.
    page.emulate_media(media="print")
    page.evaluate("() => window.dispatchEvent(new Event('beforeprint'))")
    page.wait_for_timeout(300)
    assert max(page.evaluate(_WIDTHS_JS)["charts"]) <= PRINT_WIDTH_PX

    # The printed page's layout: tables wrap (paper cannot scroll), charts fit.
    page.set_viewport_size({"width": PRINT_WIDTH_PX, "height": 1000})
    page.wait_for_timeout(300)
    printed = page.evaluate(_WIDTHS_JS)
    assert printed["page"] <= PRINT_WIDTH_PX, printed
    assert max(printed["printedTables"] + printed["charts"]) <= PRINT_WIDTH_PX, printed
    problems = [problem for chart in page.evaluate(_GEOMETRY_JS)
                for problem in layout_problems(chart)]
    assert not problems, problems
    page.evaluate("() => window.dispatchEvent(new Event('afterprint'))")

    pdf = page.pdf(format="A4")
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000
