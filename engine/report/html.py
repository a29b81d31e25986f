"""A self-contained HTML report of one or more runs, plus the comparison charts.

"Self-contained" means the file opens offline: plotly.js is inlined once in the head
and every figure is a div with its data inline; nothing is loaded from a URL. Every
string a user or the system produced (labels, reasons, device names, findings) is
passed through html.escape.

The charts are engine.report.figures', the same the Compare page draws.
"""

from __future__ import annotations

import html
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd
import plotly.graph_objects as go

from engine.analysis.compare import config_diff, display_names, summary_table
from engine.analysis.findings import both_mfu_words, findings, peak_words
from engine.analysis.speedup import method_words
from engine.analysis.steady import chart_points_per_run, metrics_frames, steady_medians
from engine.analysis.summary_text import COLUMNS, NOTE, TEXT_KEYS, speedup_rows, summary_strings
from engine.display import NA, measured
from engine.report.export import write_file_atomically
from engine.report.figures import (
    PLOTLY_CONFIG,
    comparison_figures,
    memory_by_kind_figure,
    speedup_forest_figure,
)
from engine.store import RunRecord, Store
from engine.traces.explain import differs_words, explain_runs, only_in_rows, parts_rows


def export_html(store: Store, run_ids: Iterable[str], path: str | os.PathLike,
                baseline_id: str | None = None) -> Path:
    """Write the report to `path` (engine.report.export.write_file_atomically: regular
    files only) and return the path."""
    text = build_html(store, run_ids, baseline_id)
    write_file_atomically(path, text.encode("utf-8"))
    return Path(path)


def build_html(store: Store, run_ids: Iterable[str], baseline_id: str | None = None) -> str:
    """The whole report as one string. Raises RunNotFound for an unknown run id."""
    run_ids = list(dict.fromkeys(run_ids))
    if not run_ids:
        raise ValueError("run_ids=[]: name at least one run")
    every = {run_id: store.get_run(run_id) for run_id in run_ids}
    checks = {i: r for i, r in every.items() if r.config.is_speedup_check}
    runs = {i: r for i, r in every.items() if not r.config.is_speedup_check}
    parts = ["<h1>Precision Lab report</h1>", f"<p class=meta>{_e(_generated_line())}</p>"]
    if checks:
        parts.append(_section("Speedup checks (paired: the figures to quote)",
                              "\n".join(_speedup_html(check) for check in checks.values())))
    if runs:
        parts += _runs_sections(store, runs, baseline_id)
    title = "Precision Lab report: " + ", ".join(run_ids)
    return (f"<!DOCTYPE html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n"
            f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n"
            # plotly.js inlined once, so the file opens without a network.
            f"<script id=plotly-js>{_plotly_js()}</script>\n"
            f"<script id=print-charts>{_PRINT_SCRIPT}</script>\n</head>\n"
            f"<body>\n{chr(10).join(parts)}\n</body>\n</html>\n")


def _speedup_html(check: RunRecord) -> str:
    """One paired speedup check: verdict of the machine, forest plot, per-mode table."""
    result = check.summary.get("speedup") or {}
    head = (f"<h3>{_e(check.config.label)} "
            f"<span class=meta>({_e(check.id)}, {_e(check.status)})</span></h3>")
    if not result:
        return head + "<p>No round measured yet.</p>"
    contention = result.get("contention") or {}
    busy = bool(contention.get("busy"))
    machine = (f"<p class=warn>{_e(contention['words'])}</p>" if busy
               else f"<p class=meta>{_e(contention.get('words', ''))}</p>")
    modes = speedup_rows(result)
    table = _html_table(list(modes.columns), modes.values.tolist(), {1, 2, 3, 5, 6})
    method = f"<p class=meta>{_e(method_words(result))}</p>"
    findings_html = _findings_list(result.get("findings") or []) if result.get("findings") else ""
    memory = memory_by_kind_figure(result)
    return (head + machine + _figure_div(speedup_forest_figure(result))
            + (_figure_div(memory) if memory is not None else "") + table + method
            + findings_html)


def _runs_sections(
    store: Store, runs: Mapping[str, RunRecord], baseline_id: str | None
) -> list[str]:
    run_ids = list(runs)
    if baseline_id not in run_ids:
        baseline_id = None
    table = summary_table(store, run_ids, baseline_id)
    names = display_names(runs.values())
    frames = metrics_frames(store, run_ids, max_points=chart_points_per_run(len(run_ids)))
    units = dict(zip(table["run_id"], table["throughput_unit"]))
    figures = comparison_figures(frames, names, units, steady_medians=steady_medians(table))
    return [
        _section("Runs", _runs_table(runs, names)),
        _section("Devices", _devices_table(runs)),
        _section("Findings", _findings_list(findings(table, runs, run_dir=store.run_dir))),
        _section("Summary (steady-state steps; ratios against the baseline)",
                 _summary_html(table) + _mfu_peaks_html(runs, names)),
        _section("Charts", "\n".join(_figure_div(fig) for fig in figures.values())),
        _section("Why one run is faster than another (profiler windows)",
                 _diff_html(store, runs, table)),
        _section("Config differences", _config_diff_html(runs)),
        _raw_section("Full configs and run summaries", _configs_html(runs)),
    ]


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; padding: 0 1.5rem;
       max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.baseline td { font-weight: 600; }
.meta { color: #666; }
.warn { color: #8a4b00; background: #fff4e0; border-left: 4px solid #e69500;
        padding: 0.4rem 0.6rem; }
pre { background: #f7f7f7; padding: 0.5rem; overflow-x: auto; font-size: 0.8rem; }
.chart { margin-bottom: 1rem; }
/* A table wider than the page (the summary has 17 columns) scrolls inside its own box
   on screen instead of widening the page. */
.table-wrap { max-width: 100%; overflow-x: auto; }
@page { margin: 12mm; }
@media print {
  /* Paper cannot scroll: everything wraps to the page width (A4 and Letter). */
  body { margin: 0; padding: 0; max-width: none; }
  .table-wrap { overflow: visible; }
  table { font-size: 6.5pt; width: 100%; table-layout: auto; }
  th, td { padding: 1px 2px; overflow-wrap: anywhere; }
  pre { white-space: pre-wrap; overflow-wrap: anywhere; overflow: visible; }
  .chart { break-inside: avoid; }
  .screen-only { display: none; }
}
@media screen { .print-only { display: none; } }
"""

PRINT_CHART_WIDTH_PX = 680  # inside A4 and Letter at 12 mm margins (703 / 725 px)
# Plotly sizes a chart's SVG in pixels for the screen, so a printed page would cut it
# off: print each chart at a width that fits the paper, then give it its screen size back.
_PRINT_SCRIPT = """
window.addEventListener('beforeprint', () => {
  for (const el of document.querySelectorAll('.js-plotly-plot'))
    Plotly.relayout(el, {width: %d});
});
window.addEventListener('afterprint', () => {
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    Plotly.relayout(el, {width: null, autosize: true});
    Plotly.Plots.resize(el);
  }
});
""" % PRINT_CHART_WIDTH_PX


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _section(title: str, inner: str) -> str:
    return f"<section>\n<h2>{_e(title)}</h2>\n{inner}\n</section>"


def _raw_section(title: str, inner: str) -> str:
    """Raw JSON for the screen and the file, left out of print (it was 24 of 29 A4 pages
    for 3 runs); a printed line says where it is."""
    return (f'<section class="screen-only">\n<h2>{_e(title)}</h2>\n{inner}\n</section>\n'
            f'<p class="print-only meta">{_e(title)}: in the HTML file, not printed.</p>')


def _system() -> str:
    """"Linux 6.1.0 x86_64": not platform.platform(), which starts `uname -p` on Linux."""
    return " ".join(filter(None, (platform.system(), platform.release(), platform.machine())))


def _generated_line() -> str:
    versions = ", ".join(f"{pkg} {_version(pkg)}" for pkg in ("torch", "plotly", "pandas"))
    return (
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {platform.node() or 'this host'} "
        f"({_system()}; Python {platform.python_version()}; {versions})."
    )


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _html_table(header: list[str], rows: list[list[Any]], numeric: set[int] = frozenset(),
                row_classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    lines = []
    for index, row in enumerate(rows):
        cells = "".join(f"<td class=num>{_e(v)}</td>" if i in numeric else f"<td>{_e(v)}</td>"
                        for i, v in enumerate(row))
        css = f" class={row_classes[index]}" if row_classes and row_classes[index] else ""
        lines.append(f"<tr{css}>{cells}</tr>")
    return (f"<div class=table-wrap><table>\n<tr>{head}</tr>\n" + "\n".join(lines)
            + "\n</table></div>")


def _runs_table(runs: Mapping[str, RunRecord], names: Mapping[str, str]) -> str:
    rows = [[run.id, names[run.id], run.config.label, run.status, run.reason or "",
             f"{run.config.model}-{run.config.size}", run.config.precision,
             run.config.batch_size, f"{run.steps_completed}/{run.total_steps}",
             _fmt_time(run.created_at)] for run in runs.values()]
    return _html_table(["run id", "name", "label", "status", "reason", "model", "precision",
                        "batch", "steps", "created"], rows)


def _devices_table(runs: Mapping[str, RunRecord]) -> str:
    rows = [[run.id, run.device_key, run.device_name or "unknown",
             (run.summary.get("cpu_evidence") or {}).get("headline")
             or ((run.summary.get("kernels") or {}).get("verdict") or {}).get("headline") or ""]
            for run in runs.values()]
    return _html_table(["run id", "device", "device name", "matrix-unit evidence"], rows)


def _findings_list(statements: list[str]) -> str:
    if not statements:
        return "<p>No findings: no numbers to compare yet.</p>"
    return "<ul>\n" + "\n".join(f"<li>{_e(s)}</li>" for s in statements) + "\n</ul>"


def _mfu_peaks_html(runs: Mapping[str, RunRecord], names: Mapping[str, str]) -> str:
    """What each run's MFU is relative to (a datasheet row, or a measured peak and when)."""
    items = [f"<li>{_e(names.get(run_id, run_id))}: {_e(peak_words(run.summary))}"
             + (f"<br>{_e(both)}" if (both := both_mfu_words(run.summary)) else "") + "</li>"
             for run_id, run in runs.items()
             if run.summary.get("mfu") is not None or run.summary.get("mfu_peaks")]
    return (
        f"<p class=meta>MFU is relative to:</p><ul class=meta>{''.join(items)}</ul>"
        if items
        else ""
    )


def _summary_html(table: pd.DataFrame) -> str:
    """Every column of the summary (engine.analysis.summary_text), the baseline in bold."""
    cells = summary_strings(table)
    # summary_strings keeps COLUMNS' order: a column's index is its place there
    numeric = {i for i, (key, _header, _fmt) in enumerate(COLUMNS) if key not in TEXT_KEYS}
    classes = ["baseline" if base else "" for base in table["is_baseline"]]
    note = f"<p class=meta>Baseline in bold. {_e(NOTE)}</p>"
    return _html_table(list(cells.columns), cells.values.tolist(), numeric, classes) + note


def _diff_html(store: Store, runs: Mapping[str, RunRecord], table: pd.DataFrame) -> str:
    """Each run against the baseline, part by part (engine.traces.explain)."""
    base_id = next(r["run_id"] for r in table.to_dict("records") if r["is_baseline"])
    bounds = [f"<li>{_e(run.config.label)}: {_e(verdict['sentence'])}</li>"
              for run in runs.values()
              if (verdict := (run.summary.get("explain") or {}).get("bound_by"))]
    blocks = [f"<p>What limits each run's step:</p><ul>{''.join(bounds)}</ul>"] if bounds else []
    for run_id, run in runs.items():
        if run_id == base_id:
            continue
        diff = explain_runs(store, runs[base_id], run)
        if diff is None:
            continue
        if diff.get("error"):
            blocks.append(f"<p class=meta>{_e(run.config.label)}: {_e(diff['error'])}</p>")
            continue
        caveats = "".join(f"<p class={'warn' if c['severity'] == 'warning' else 'meta'}>"
                          f"{_e(c['text'])}</p>" for c in diff.get("caveats") or [])
        blocks.append(f"<h3>{_e(run.config.label)} vs {_e(runs[base_id].config.label)}</h3>"
                      f"<p><b>They differ in:</b> {_e(differs_words(diff))}</p>"
                      f"<p>{_e(diff['sentence'])}</p>" + caveats
                      + _records_table(parts_rows(diff)) + _only_in_html(diff))
    return "\n".join(blocks) or "<p>No two runs have a profiler window to compare.</p>"


def _only_in_html(diff: dict) -> str:
    """Kernels or ops that ran in one run only (casts, fp32 fallbacks), as on Compare."""
    blocks = []
    for key, label in (("only_in_a", diff["label_a"]), ("only_in_b", diff["label_b"])):
        rows = only_in_rows(diff[key])
        if rows:
            blocks.append(f"<p class=meta>Only in {_e(label)}:</p>" + _records_table(rows))
    return "".join(blocks)


def _records_table(rows: list[dict]) -> str:
    """Rows of one shape (explain.parts_rows, only_in_rows) as a table: floats as ms to
    3 decimals, columns 1 and 2 right-aligned (their numbers)."""
    header = list(rows[0])
    return _html_table(header, [[_record_cell(row[h]) for h in header] for row in rows], {1, 2})


def _record_cell(value: Any) -> Any:
    """ms to 3 decimals; "n/a" for a figure not measured (None, NaN), as on Compare."""
    if isinstance(value, float):
        return f"{value:,.3f}" if measured(value) else NA
    return NA if value is None else value


def _config_diff_html(runs: Mapping[str, RunRecord]) -> str:
    diff = config_diff({run_id: run.config for run_id, run in runs.items()})
    if diff.empty:
        return "<p>The runs' configs are identical.</p>" if len(runs) > 1 else \
            "<p>One run: nothing to compare.</p>"
    return _html_table(list(diff.columns), diff.values.tolist())


def _configs_html(runs: Mapping[str, RunRecord]) -> str:
    blocks = []
    for run in runs.values():
        payload = {"config": run.config.to_dict(), "summary": _summary_for_report(run.summary)}
        blocks.append(f"<details><summary>{_e(run.id)}</summary>\n"
                      f"<pre>{_e(json.dumps(payload, indent=2, default=str))}</pre></details>")
    return "\n".join(blocks)


def _summary_for_report(summary: dict[str, Any]) -> dict[str, Any]:
    """The run summary without bulky lists (primitive dumps) that bury the numbers."""
    trimmed = dict(summary)
    if isinstance(trimmed.get("cpu_evidence"), dict):
        trimmed["cpu_evidence"] = {k: v for k, v in trimmed["cpu_evidence"].items()
                                   if k != "primitives"}
    return trimmed


def _figure_div(fig: go.Figure) -> str:
    # Margins that grow to fit the tick labels and axis titles (no clipped "4k").
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return ("<div class=chart>" + fig.to_html(full_html=False, include_plotlyjs=False,
                                              config=PLOTLY_CONFIG) + "</div>")


def _fmt_time(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp)) if timestamp else ""
