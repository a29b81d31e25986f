"""What a person sees at a laptop's width (1280 x 800) in Chromium: the main tables of Runs,
Compare and Kernels show every column without scrolling sideways, the HTML report printed to
PDF carries every summary column, and a screenshot of every page (docs/screenshots/ with
PRECISION_LAB_SCREENSHOTS=1, as the README embeds them; else the test's tmp dir).

Real server, real store (tiny CPU runs trained in this process, a real V100 profiler trace),
system Chromium through Playwright.
"""

from __future__ import annotations

import shutil
import unicodedata
from pathlib import Path

import pytest
from _real_runs import record_run, tiny_config
from browser_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO_ROOT,
    StreamlitServer,
    exceptions,
    goto,
    grid_cells,
    require_browser,
    screenshot,
    stop_all_runs,
    wait_for,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAPTOP = {"width": 1280, "height": 800}
V100_TRACE = REPO_ROOT / "tests" / "data" / "traces" / "v100_resnet50_kineto_v1.json.gz"

# Every grid of the page: how wide its content is against the box it is drawn in. A grid
# whose columns do not fit scrolls sideways, and a person at 1280 px never sees the last ones.
_GRID_FIT_JS = """() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
  .filter(grid => grid.offsetParent !== null && grid.querySelector('.dvn-scroller'))
  .map(grid => { const s = grid.querySelector('.dvn-scroller');
                 return {scroll: s.scrollWidth, client: s.clientWidth,
                         columns: Array.from(grid.querySelectorAll('table[role="grid"] thead th'))
                                       .map(th => th.textContent)}; })"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A server over a store with three finished runs and a run carrying a V100 trace."""
    require_browser()
    from playwright.sync_api import sync_playwright

    from engine.config import RunConfig
    from engine.schema import FINISHED, TRACE_FILENAME
    from engine.store import Store

    tmp = tmp_path_factory.mktemp("layout")
    server = StreamlitServer(home=tmp / "lab_home", log_dir=tmp / "logs")
    store = Store(server.home)
    ids = [
        record_run(store, tiny_config(mode, steps=30)) for mode in ("fp32", "bf16-amp", "fp16-amp")
    ]
    trace_cfg = RunConfig(model="gpt", size="tiny", precision="bf16-amp", batch_size=16,
                          steps=10, profile=True, name="V100 ResNet-50 trace")
    kernel_run = store.create_run(trace_cfg, "cuda:0", "Tesla V100-SXM2-16GB")
    shutil.copyfile(V100_TRACE, store.run_dir(kernel_run) / TRACE_FILENAME)
    store.set_status(kernel_run, FINISHED)
    try:
        server.start()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport=LAPTOP)
                context.set_default_timeout(60_000)
                yield {"server": server, "store": store, "ids": ids, "kernel_run": kernel_run,
                       "page": context.new_page(), "tmp": tmp}
                context.close()
            finally:
                browser.close()
    finally:
        server.stop()
        stop_all_runs(server.home)


def _grids_fit(page, main_columns: list[str]) -> list[dict]:
    """The drawn grids whose columns do not fit their box, read once the grids have sized
    their columns (two readings 0.5 s apart agree) and the page's main table is among them
    with `main_columns` first (a grid in a closed expander is not drawn: not on screen)."""
    def settled():
        first = page.evaluate(_GRID_FIT_JS)
        page.wait_for_timeout(500)
        second = page.evaluate(_GRID_FIT_JS)
        drawn = any(g["client"] > 0 and g["columns"][:len(main_columns)] == main_columns
                    for g in first)
        return second if drawn and first == second else None

    grids = wait_for(settled, timeout_s=60,
                     message=lambda: f"the tables drawn and sized: {page.evaluate(_GRID_FIT_JS)}")
    return [g for g in grids if g["scroll"] > g["client"] + 1]


def _open(lab, path: str, title: str) -> None:
    goto(lab["page"], f"{lab['server'].url}{path}", title=title)
    assert not exceptions(lab["page"]), exceptions(lab["page"])


@pytest.mark.timeout(300)
def test_main_tables_fit_a_laptop_screen(lab):
    ids, page = lab["ids"], lab["page"]
    _open(lab, "/runs", "Runs")
    screenshot(page, "runs.png", lab["tmp"])
    assert _grids_fit(page, ["label", "status", "steps"]) == []
    rows = wait_for(lambda: grid_cells(page), timeout_s=30, message="the runs table's rows")
    assert len(rows) == 4  # the grid draws "n/a" on its canvas: tests/test_one_figure.py

    _open(lab, f"/compare?runs={','.join(ids)}&baseline={ids[0]}", "Compare runs")
    # the summary (and every other open grid) without sideways scrolling; the columns that
    # did not fit are in the "Every summary column" expander, closed
    screenshot(page, "compare.png", lab["tmp"])
    assert _grids_fit(page, ["run", "throughput x", "95 % interval"]) == []

    _open(lab, f"/kernels?run={lab['kernel_run']}", "Kernels")
    screenshot(page, "kernels.png", lab["tmp"])
    assert _grids_fit(page, ["kernel", "time (ms)", "count", "Tensor Cores"]) == []


@pytest.mark.timeout(180)
def test_a_closed_detail_is_drawn_when_opened(lab):
    """pages/ui.details: a closed expander's table is not sent; a click opens it and the
    page, rerun, draws it."""
    page = lab["page"]
    _open(lab, f"/kernels?run={lab['kernel_run']}", "Kernels")
    tables = page.locator('[data-testid="stDataFrame"]')
    idle = page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]')

    def drawn_tables() -> int | None:
        """The number of tables once the script is idle and two readings agree."""
        first = tables.count()
        page.wait_for_timeout(500)
        return first if first and idle.count() and tables.count() == first else None

    closed = wait_for(drawn_tables, timeout_s=30, message="the page's tables, drawn")
    def cpu_ops():
        """aten:: ops in a table inside an expander (the per-op rates table above it names
        ops too, and is always drawn)."""
        return page.evaluate("""() => Array.from(document.querySelectorAll(
            '[data-testid="stExpander"] [data-testid="stDataFrame"] table[role="grid"] tbody td'
            )).map(td => td.textContent).filter(text => text.startsWith('aten::'))""")

    assert not cpu_ops()  # the per-op table is not on the page while closed
    page.get_by_text("Per CPU op", exact=True).click()
    wait_for(lambda: drawn_tables() == closed + 1, timeout_s=30,
             message=lambda: f"one more table once opened ({closed} -> {tables.count()})")
    details = page.locator('[data-testid="stExpander"]', has_text="Per CPU op")
    assert details.locator('[data-testid="stDataFrame"]').count() == 1
    assert wait_for(cpu_ops, timeout_s=30, message="the CPU ops in the opened table")
    assert not exceptions(page), exceptions(page)


@pytest.mark.timeout(300)
def test_every_page_at_1280_px_has_a_screenshot(lab):
    page, ids = lab["page"], lab["ids"]
    # (launch.png and live.png of a run training: tests/test_browser.py's launch story)
    for path, title, name in ((f"/live?run={ids[1]}", None, "live-finished.png"),
                              ("/sweep", "Sweeps", "sweep.png"),
                              ("/check", "GPU check", "check.png")):
        _open(lab, path, title)
        shot = screenshot(page, name, lab["tmp"])
        assert shot.stat().st_size > 10_000  # a drawn page, not a blank one


@pytest.mark.timeout(180)
def test_the_report_printed_to_pdf_carries_every_summary_column(lab):
    import io

    from pypdf import PdfReader

    from engine.analysis.compare import summary_table
    from engine.analysis.summary_text import summary_strings
    from engine.report.html import export_html

    store, ids, page = lab["store"], lab["ids"], lab["page"]
    report = Path(lab["tmp"]) / "report.html"
    export_html(store, ids, report)
    page.goto(report.as_uri())
    page.emulate_media(media="print")
    pdf = page.pdf(format="A4")
    page.emulate_media(media="screen")
    pages = PdfReader(io.BytesIO(pdf)).pages
    # the configs and raw summaries stay in the file, out of print
    assert len(ids) >= 3 and len(pages) <= 6, f"{len(pages)} A4 pages for {len(ids)} runs"
    text = " ".join(p.extract_text() for p in pages)
    # A narrow cell wraps a word anywhere ("measu red") and the PDF's text keeps ligatures
    # ("ﬁ"): compare without whitespace, ligatures unfolded; and only the summary's own
    # text (from its first header to the note under it), not the rest of the report.
    printed = "".join(unicodedata.normalize("NFKC", text).split())
    start = printed.index("runrunidstatus")
    printed = printed[start:printed.index("Baselineinbold", start)]
    every = summary_strings(summary_table(store, ids, ids[0]))
    for header in every.columns:
        assert header.replace(" ", "") in printed, (header, printed[:3000])
    for run_id in ids:
        assert run_id in printed, run_id
    for cell in every.iloc[1]:  # the second run's figures, every column (a blank is no test)
        if cell:
            assert "".join(cell.split()) in printed, (cell, printed[:3000])
