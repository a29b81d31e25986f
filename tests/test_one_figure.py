"""One run, every surface, the same strings: Live's tiles, Runs' grid, Compare's summary, the
HTML report and `engine show` print a figure of a kind through engine.display, so a person
who reads "1.1995" on one page never reads "1.2" for the same loss on the next."""

from __future__ import annotations

import ast
import html
import re
from pathlib import Path

import pytest
from _real_runs import record_run, tiny_config
from streamlit.testing.v1 import AppTest

from engine.analysis.compare import display_names, summary_table
from engine.analysis.summary_text import MAIN_COLUMNS, summary_strings
from engine.cli.main import main as cli_main
from engine.display import (
    LOSS_PRINTF,
    NA,
    THROUGHPUT_PRINTF,
    loss_text,
    memory_printf,
    memory_text,
    memory_unit,
    mfu_text,
    step_time_text,
    throughput_text,
)
from engine.report.html import build_html
from engine.store import Store

APP = str(Path(__file__).resolve().parents[1] / "app.py")
# process peaks (a CPU run's peak resident set) and tensor peaks: two figures, two names
PEAK_BYTES = {"fp32": 734_003_200, "bf16-amp": 1_288_490_189}  # 700.0 MiB, 1.20 GiB
TENSOR_BYTES = {"fp32": 209_715_200, "bf16-amp": 157_286_400}  # 200.0 MiB, 150.0 MiB
SPLIT = {"parameters_bytes": 50 * 2**20, "gradients_bytes": 50 * 2**20,
         "optimizer_state_bytes": 0, "master_copies_bytes": 0, "rest_bytes": 50 * 2**20,
         "peak_bytes": TENSOR_BYTES["bf16-amp"], "counted_exceeds_peak": False}


@pytest.fixture
def two_runs(home):
    store = Store(home)
    ids = [record_run(store, tiny_config(mode), {
        "peak_mem_bytes": PEAK_BYTES[mode], "process_peak_bytes": PEAK_BYTES[mode],
        "tensor_peak_bytes": TENSOR_BYTES[mode], "memory_by_kind": SPLIT})
        for mode in ("fp32", "bf16-amp")]
    return store, ids


def _expected(store: Store, run_id: str) -> dict[str, str]:
    s = store.get_run(run_id).summary
    return {
        "loss": loss_text(s["final_loss"]),
        "throughput": throughput_text(s["samples_per_s"]),
        "step_time": step_time_text(s["step_time_ms"]),
        "memory": memory_text(s["process_peak_bytes"]),
        "tensor": memory_text(s["tensor_peak_bytes"]),
        "mfu": mfu_text(s.get("mfu")),
    }


def _report_row(report: str, run_id: str) -> list[str]:
    """The report summary's cells of the row that names `run_id` (header cells first)."""
    table = report[report.index("<th>run</th>"):]
    table = table[:table.index("</table>")]
    header = [html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, flags=re.S):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        if run_id in cells:
            return dict(zip(header, cells))
    raise AssertionError(f"{run_id} not in the report's summary")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_run_reads_the_same_on_every_surface(two_runs, capsys):
    store, (base_id, run_id) = two_runs
    want = _expected(store, run_id)
    assert want["memory"] == "1.20 GiB" and "None" not in want.values()

    # Live: the tiles.
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["run"] = run_id
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception, at.exception
    tiles = {m.label: m.value for m in at.metric}
    assert all(grid.proto.placeholder == NA for grid in at.dataframe)
    assert tiles["Loss"] == want["loss"]
    assert tiles["Samples/s"] == want["throughput"]
    assert tiles["Step time"] == want["step_time"]
    assert tiles["Process peak"] == want["memory"]  # the CPU's tile: the chart's figure
    # the other peak, by its name, with its split, under the tiles
    captions = [c.value.replace("\\", "") for c in at.caption]  # Markdown escapes off
    assert any(f"Tensor peak {want['tensor']} (parameters 50.0 MiB; gradients 50.0 MiB"
               in c for c in captions), captions

    # Compare: the summary's strings are the same formatters' (memory in the column's unit).
    at.query_params["runs"] = f"{base_id},{run_id}"
    at.query_params["baseline"] = base_id
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert all(grid.proto.placeholder == NA for grid in at.dataframe)
    main = at.dataframe[0].value
    name = display_names([store.get_run(i) for i in (base_id, run_id)])[run_id]
    row = main[main["run"] == name].iloc[0]
    # each peak's column in its own unit: 150 MiB of tensors never reads "0.15 GiB"
    unit, tensor_unit = memory_unit(PEAK_BYTES.values()), memory_unit(TENSOR_BYTES.values())
    assert (unit, tensor_unit) == ("GiB", "MiB")
    assert row[f"tensor peak ({tensor_unit})"] == memory_text(
        TENSOR_BYTES["bf16-amp"], tensor_unit, with_unit=False
    )
    assert row["final loss"] == want["loss"]
    assert row["MFU"] == want["mfu"]
    assert list(main.columns) == list(summary_strings(summary_table(store, [base_id, run_id],
                                                                    base_id), MAIN_COLUMNS).columns)

    # Runs: a sortable grid keeps numbers; printed with the printf twins they read the same.
    at.switch_page("pages/runs.py").run()
    assert not at.exception, at.exception
    assert all(grid.proto.placeholder == NA for grid in at.dataframe)
    grid = at.dataframe[0].value.set_index("run_id")  # the data: shown columns or not
    assert LOSS_PRINTF % grid.loc[run_id, "final_loss"] == want["loss"]
    assert THROUGHPUT_PRINTF % grid.loc[run_id, "throughput"] == want["throughput"].replace(",", "")
    assert f"{memory_printf(unit) % grid.loc[run_id, 'process_peak']} {unit}" == want["memory"]
    assert (f"{memory_printf(tensor_unit) % grid.loc[run_id, 'tensor_peak']} {tensor_unit}"
            == memory_text(TENSOR_BYTES["bf16-amp"], tensor_unit))

    # The HTML report: the same cells as Compare's full table.
    cells = _report_row(build_html(store, [base_id, run_id], base_id), run_id)
    full = summary_strings(summary_table(store, [base_id, run_id], base_id))
    assert cells == full[full["run id"] == run_id].iloc[0].to_dict()
    assert cells["final loss"] == want["loss"] and cells["MFU"] == want["mfu"]
    # the process peak: beside the tensor peak in every summary column, in its own unit
    assert cells[f"process peak ({unit})"] == memory_text(PEAK_BYTES["bf16-amp"], unit,
                                                         with_unit=False)
    assert cells["step time (ms)"] == want["step_time"].removesuffix(" ms")

    # The CLI.
    assert cli_main(["show", run_id]) == 0
    shown = capsys.readouterr().out
    assert f"final loss         {want['loss']}" in shown
    assert f"process peak       {want['memory']}" in shown
    assert f"tensor peak        {want['tensor']}" in shown
    assert f"step time          {want['step_time']}" in shown
    assert f"throughput         {want['throughput']} samples/s" in shown
    assert "None" not in shown


def test_every_grid_on_every_page_writes_a_missing_figure_as_n_a():
    """Streamlit draws a missing cell as "None" unless told otherwise (`placeholder`)."""
    pages = Path(__file__).resolve().parents[1] / "pages"
    silent = []
    for path in sorted(pages.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "dataframe"
                    and not any(k.arg == "placeholder" for k in node.keywords)):
                silent.append(f"{path.name}:{node.lineno}")
    assert silent == [], "pass placeholder=NA (engine.display) to these st.dataframe calls"
