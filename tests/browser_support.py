"""Helpers for tests/test_browser.py: a real `streamlit run` server, and driving its widgets
from Playwright (system Chromium; Playwright never downloads a browser here).

Kept apart from the tests so the tests read as user stories.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
REQUIRE_ENV = "PRECISION_LAB_REQUIRE_BROWSER"
SCREENSHOTS_ENV = "PRECISION_LAB_SCREENSHOTS"
README_SCREENSHOTS = REPO_ROOT / "docs" / "screenshots"
SCREENSHOT_WIDTH_PX = 1280  # docs/screenshots/ show the pages at a laptop's width
HOME_ENV = "PRECISION_LAB_HOME"


# ---------------------------------------------------------------------------------------
# skip (locally) or fail (CI) when the browser is missing


def unavailable(reason: str) -> None:
    """Skip with `reason`, or fail when CI demands the browser tests (REQUIRE_ENV=1)."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: browser tests must run here)", pytrace=False)
    pytest.skip(reason)


def require_browser() -> None:
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        unavailable(f"{CHROMIUM} not found: install Debian's `chromium` package")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("Python package `playwright` not installed (pip install playwright; "
                    "do not run `playwright install`, the system Chromium is used)")


@contextmanager
def chromium_browser() -> Iterator[Any]:
    """The system Chromium under Playwright, closed after; skipped (or failed in CI) when
    it is missing or does not start."""
    require_browser()
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except PlaywrightError as exc:
            unavailable(f"{CHROMIUM} did not start under Playwright: {exc}")
        try:
            yield chromium
        finally:
            chromium.close()


# ---------------------------------------------------------------------------------------
# polling


def wait_for(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.2,
             message: str | Callable[[], str] = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {text}; "
                                 f"last value: {value!r}")
        time.sleep(interval_s)


# ---------------------------------------------------------------------------------------
# the server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _health(url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
            return response.read().decode("utf-8", "replace").strip()
    except (urllib.error.URLError, OSError, ValueError):
        return None


class StreamlitServer:
    """`streamlit run app.py` in its own session, on a fixed port and data directory.

    stop() ends the server's process group only: run workers live in sessions of their
    own and must survive it. start() after stop() reuses the same port and home.
    """

    def __init__(self, home: Path, log_dir: Path, port: int | None = None):
        self.home = Path(home)
        self.log_dir = Path(log_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"streamlit-{self.port}-{self.starts}.log"

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return "(no server log)"

    def start(self, timeout_s: float = 60.0) -> "StreamlitServer":
        assert self.proc is None or self.proc.poll() is not None, "server already running"
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env[HOME_ENV] = str(self.home)
        env["PYTHONUNBUFFERED"] = "1"
        env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", "app.py",
                 "--server.port", str(self.port), "--server.headless", "true"],
                cwd=str(REPO_ROOT), env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while _health(self.url) != "ok":
            if self.proc.poll() is not None:
                raise AssertionError(f"streamlit exited with {self.proc.returncode}:\n"
                                     f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"streamlit not healthy after {timeout_s:.0f}s:\n"
                                     f"{self.log_tail()}")
            time.sleep(0.2)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `grace_s`."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the server leads its own group
        if pgid == os.getpgid(0):  # never signal the test runner's own group
            raise AssertionError("server shares the test runner's process group")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(pgid):
                break
        proc.wait(timeout=5)

    def restart(self, timeout_s: float = 60.0) -> "StreamlitServer":
        self.stop()
        return self.start(timeout_s)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


# ---------------------------------------------------------------------------------------
# run workers


def worker_processes(run_id: str) -> list:
    """Live (non-zombie) `engine.run.worker` processes of `run_id`: supervisor and trainer."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if (proc.info["status"] != psutil.STATUS_ZOMBIE and "engine.run.worker" in cmdline
                    and run_id in cmdline):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def worker_groups(run_id: str) -> set[int]:
    groups = set()
    for proc in worker_processes(run_id):
        try:
            groups.add(os.getpgid(proc.pid))
        except ProcessLookupError:
            continue
    return groups


def stop_all_runs(home: Path) -> None:
    """Stop every run still active in `home` (the launcher's own stop), then SIGKILL any
    worker group that is left: no trainer outlives its test."""
    from engine.run.launcher import stop
    from engine.schema import ACTIVE_STATUSES
    from engine.store import DB_FILENAME, Store

    if not (Path(home) / DB_FILENAME).exists():
        return
    store = Store(home)
    runs = store.list_runs(limit=10_000)
    for run in runs:
        if run.status in ACTIVE_STATUSES:
            try:
                stop(run.id, store)
            except Exception:  # best effort: the kill below still runs
                pass
    own_group = os.getpgid(0)
    for run in runs:
        for pgid in worker_groups(run.id):
            if pgid != own_group:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# ---------------------------------------------------------------------------------------
# the page


APP = '[data-testid="stApp"]'
EXCEPTION = '[data-testid="stException"]'


def wait_app_idle(page, timeout_s: float = 60.0, settle_s: float = 0.25,
                  required: bool = True) -> bool:
    """Connected and not running a script, seen twice `settle_s` apart (a widget change
    takes a moment to start its rerun). With required=False, give up quietly (a page whose
    fragment reruns every second may rarely be idle on a loaded machine)."""
    idle = (f'{APP}[data-test-connection-state="CONNECTED"]'
            f'[data-test-script-state="notRunning"]')
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if page.locator(idle).count():
            page.wait_for_timeout(settle_s * 1000)
            if page.locator(idle).count():
                return True
        else:
            page.wait_for_timeout(100)
    if required:
        raise AssertionError(
            f"the app did not go idle within {timeout_s:.0f}s (script state "
            f"{page.locator(APP).get_attribute('data-test-script-state')!r}, "
            f"connection {page.locator(APP).get_attribute('data-test-connection-state')!r})"
        )
    return False


def goto(page, url: str, title: str | None = None, timeout_s: float = 60.0,
         idle: bool = True) -> None:
    """Open `url` and wait until the script has run: its title shown and, with `idle`,
    the app idle (not on a page whose fragment refreshes every second)."""
    page.goto(url)
    if title:
        page.get_by_role("heading", name=title, exact=True).first.wait_for(
            timeout=timeout_s * 1000)
    else:
        page.locator("h1").first.wait_for(timeout=timeout_s * 1000)
    if idle:
        wait_app_idle(page, timeout_s)


def exceptions(page) -> list[str]:
    return [text.strip()[:2000] for text in page.locator(EXCEPTION).all_inner_texts()]


def error_alerts(page) -> list[str]:
    return [text.strip()[:500] for text in
            page.locator('[data-testid="stAlertContentError"]').all_inner_texts()]


def main_text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def widget(page, key: str):
    """The element container Streamlit tags with the widget's key (class st-key-<key>)."""
    return page.locator(f".st-key-{key}")


def choose(page, key: str, option: str | Callable[[str], bool], exact: bool = True) -> str:
    """Open the selectbox with `key` and click an option: its exact text, or the first one
    for which `option(text)` is true. Returns the chosen text."""
    box = widget(page, key).get_by_role("combobox")
    box.click()
    options = page.get_by_role("option")
    options.first.wait_for()
    texts = options.all_inner_texts()
    if callable(option):
        matches = [t for t in texts if option(t.strip())]
    else:
        matches = [t for t in texts if (t.strip() == option if exact else option in t)]
    assert matches, f"{key}: no option matching {option!r} in {texts}"
    chosen = matches[0].strip()
    options.nth(texts.index(matches[0])).click()
    wait_for(lambda: box.input_value() == chosen, 10, message=f"{key} to show {chosen!r}")
    wait_app_idle(page)
    return chosen


def set_number(page, key: str, value: int | float) -> None:
    field = widget(page, key).locator("input")
    field.fill(str(value))
    field.press("Enter")
    wait_app_idle(page)
    wait_for(lambda: float(field.input_value()) == float(value), 10,
             message=f"{key} to keep {value}")


# Streamlit's theme wraps plotly titles in <b> (on a rerender, twice): compare the text only.
_TITLE_JS = """
  const titleOf = (el) => {
    const t = el.layout && el.layout.title;
    const text = t && (typeof t === 'string' ? t : t.text);
    return typeof text === 'string' ? text.replace(/<[^>]*>/g, '').trim() : null;
  };
"""
_POINTS_JS = """
(title) => {""" + _TITLE_JS + """
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    if (titleOf(el) === title && el.data && el.data.length) {
      const y = el.data[0].y;
      if (y && typeof y.length === 'number') return y.length;
      const full = el._fullData && el._fullData[0] && el._fullData[0].y;
      return full ? full.length : 0;
    }
  }
  return -1;
}
"""


def chart_points(page, title: str = "Loss") -> int:
    """Points plotted in the first trace of the plotly chart titled `title` (-1: no chart)."""
    return page.evaluate(_POINTS_JS, title)


def chart_titles(page) -> list[str]:
    return page.evaluate("() => {" + _TITLE_JS + "return Array.from("
                         "document.querySelectorAll('.js-plotly-plot')).map(titleOf); }")


def screenshot(page, name: str, tmp_dir: Path) -> Path:
    """Full-page PNG: into docs/screenshots/ when SCREENSHOTS_ENV=1 (the README embeds
    them), else into the test's tmp dir."""
    target_dir = README_SCREENSHOTS if os.environ.get(SCREENSHOTS_ENV) == "1" else tmp_dir
    target_dir.mkdir(parents=True, exist_ok=True)
    path = target_dir / name
    # Streamlit scrolls inside stMain, not the document, so full_page alone stops at the
    # viewport: grow the viewport to the content's height for the shot, then restore it.
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    size = page.viewport_size  # shots at a laptop's width, whatever the test's viewport
    height = page.evaluate("""() => Math.max(...Array.from(document.querySelectorAll(
        '[data-testid="stMain"], [data-testid="stSidebarContent"]')).map(e => e.scrollHeight))""")
    page.set_viewport_size({"width": SCREENSHOT_WIDTH_PX,
                            "height": min(max(height, size["height"]), 6000)})
    try:
        page.wait_for_timeout(500)  # let plotly and the grid relayout
        page.screenshot(path=str(path), full_page=True)
    finally:
        page.set_viewport_size(size)
    return path


def grid_cells(page, testid: str = "stDataFrame") -> list[list[str]]:
    """Rows of the accessible <table role="grid"> that glide-data-grid keeps next to its
    canvas (visible rows/columns only: the grid is virtualised). Hidden, so textContent."""
    return page.evaluate("""(testid) => Array.from(document.querySelectorAll(
        `[data-testid="${testid}"] table[role="grid"] tbody tr`)).map(tr =>
        Array.from(tr.querySelectorAll('td')).map(td => td.textContent))""", testid)


def grid_columns(page, testid: str = "stDataFrame") -> list[str]:
    return page.evaluate("""(testid) => Array.from(document.querySelectorAll(
        `[data-testid="${testid}"] table[role="grid"] thead th`)).map(th => th.textContent)""",
                         testid)
