"""Small helpers shared by the pages: the store handle, formatting, status badges.

Not a page itself (app.py lists the pages explicitly with st.navigation). Pages only
read from the engine, draw, and call the engine: no training logic here.
"""

from __future__ import annotations

import math
import re
import time
from typing import Callable

import streamlit as st

from engine.config import (
    INT_BOUNDS,
    OPEN_LOW_BOUNDS,
    ConfigError,
    bounds,
    parse_whole,
    plain_number,
)
from engine.store import Store, StoreError
from engine.store.db import RUN_ID_RE

# Status as a word with a colour (Streamlit's Markdown colours), never a glyph: an emoji is
# an empty box on a machine without an emoji font. Tables and select boxes show the word.
STATUS_COLOURS = {
    "queued": "gray", "running": "blue", "finished": "green", "failed": "red",
    "stopped": "orange", "diverged": "red", "oom": "red",
}
MODE_COLOURS = {"native": "green", "emulated": "orange", "unsupported": "red"}
# Tensor-Core verdicts ("yes" / "partly" / "no") and CPU verdict tones
VERDICT_COLOURS = {"yes": "green", "partly": "orange", "no": "red", "native": "green",
                   "neutral": "gray"}
LIVE_RUN_KEY = "live_run_id"
SHELL_KEY = "_app_shell_drawn"


def ensure_app_shell() -> None:
    """Make sure the page runs inside app.py's navigation, even on a server's first request.

    Streamlit keeps a legacy mode for apps with a `pages/` folder: until some session has
    run app.py (which calls st.navigation and switches the mode off), a first request for
    /live runs pages/live.py alone, without the app's navigation, layout and sidebar.
    Switching the legacy flag off and rerunning, before the page draws anything, routes
    the same URL through app.py.
    """
    from streamlit.runtime.pages_manager import PagesManager

    # Only for a session that has never had the shell: Streamlit's test harness re-enters
    # the legacy mode on every rerun of a session that app.py already set up, and a
    # rerun there would swallow the widget interaction being tested.
    if PagesManager.uses_pages_directory and not st.session_state.get(SHELL_KEY):
        PagesManager.uses_pages_directory = False
        st.rerun()


@st.cache_resource(show_spinner=False)
def _cached_store(home: str | None) -> Store:
    import os

    from engine.run import standby

    store = Store(home)
    # A trainer with PyTorch already loaded, ready for the first launch from this server;
    # while this server lives, every run that ends (stopped, killed, failed too) leaves a
    # successor (engine.run.standby.keep). Off with PRECISION_LAB_STANDBY=0.
    try:
        standby.want(store, os.getpid())
        standby.ensure(store)
    except OSError:
        pass  # launches still work; they start a trainer the slower way
    return store


def get_store() -> Store:
    """The store for this server, or a clear error and a stopped page (no crash loop)."""
    import os

    try:
        return PageStore(_cached_store(os.environ.get("PRECISION_LAB_HOME")))
    except StoreError as exc:
        store_error(exc)
        raise  # unreachable: store_error stops the page


class PageStore:
    """The server's cached Store as the pages (and the engine calls they make) use it: a
    StoreError from any method, also one raised long after the store was opened (the
    database damaged or deleted under the running server, a full disk), shows the
    store's own message and fix and stops the page, instead of a redacted traceback."""

    def __init__(self, store: Store):
        self._store = store

    def __getattr__(self, name: str):
        value = getattr(self._store, name)
        if not callable(value):
            return value

        def guarded(*args, **kwargs):
            try:
                return value(*args, **kwargs)
            except StoreError as exc:
                store_error(exc)

        return guarded


def store_error(exc: StoreError) -> None:
    """The store's own message and fix (a path the operator set: ours, as written), then
    stop the page. Also for a store that breaks after this server cached it."""
    st.error(f"The data store cannot be used: {exc}")
    st.stop()


@st.cache_resource(show_spinner=False)
def cached_devices():
    from engine.hardware.devices import list_devices

    return list_devices()


_MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]<>()#+!|~$-])")


def plain(text) -> str:
    """Any text that is not ours (kernel and device names from a trace, a run's reason, a
    label, an exception message) made literal inside st.markdown/st.error/...: every
    Markdown and HTML special character escaped, so `![x](http://...)` shows as text and
    the viewer's browser fetches nothing."""
    return _MARKDOWN_SPECIALS.sub(r"\\\1", str(text))


def show_caveat(caveat: dict) -> None:
    """An engine caveat ({"text", "severity"}): a warning changes what the figures beside it
    mean, a note frames them. The text may hold run names: shown literally."""
    (st.warning if caveat["severity"] == "warning" else st.caption)(plain(caveat["text"]))


def details(label: str, key: str, draw: Callable[[], None]) -> None:
    """An expander whose content (a table, code, JSON: nothing with a widget) is built, sent
    and drawn only while it is open.

    Streamlit draws a closed expander's content all the same: on a 2-core machine each
    closed table or code block cost the browser 50-200 ms before the page was ready (a
    Chromium CPU profile of Live and Kernels). Opening or closing one reruns the page, so
    this is for pages with heavy details and a quick script (Live, Kernels, the GPU check).
    Widgets stay in plain expanders: a widget that is not drawn loses its value.
    """
    with st.expander(label, key=key, on_change="rerun") as box:
        if box.open:
            draw()


def status_badge(status: str) -> str:
    """The status as plain words, for tables and select boxes (which draw no colour)."""
    return str(status)


def coloured(word: str, colour: str | None) -> str:
    """`word` in a Markdown colour (`word` is ours: a status, a mode's support)."""
    return f":{colour}[**{word}**]" if colour else f"**{word}**"


def status_words(status: str) -> str:
    """The status in its colour, for Markdown."""
    return coloured(status, STATUS_COLOURS.get(status))


def fmt_num(value, digits: int = 4, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if abs(value) >= 10 ** digits:  # "111,487", not "1.1149e+05"
        return f"{value:,.0f}{suffix}"
    return f"{value:,.{digits}g}{suffix}"


def fmt_duration(seconds) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "n/a"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_age(timestamp) -> str:
    if not timestamp:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def open_in_live(run_id: str) -> None:
    """Live of this run, its id in the address (a link that can be shared)."""
    st.session_state[LIVE_RUN_KEY] = run_id
    st.switch_page("pages/live.py", query_params={"run": run_id})


PREFILL_KEY = "launch_prefill"  # {"run_id": ..., "config": RunConfig.to_dict()} for Launch
RELAUNCHED_KEY = "launch_relaunched_from"  # the ?relaunch= id already filled in


def relaunch(run) -> None:
    """Open the Launch page with this run's config filled in (nothing starts yet); the
    address says which run (/?relaunch=ID), so the filled form can be shared."""
    st.session_state[PREFILL_KEY] = {"run_id": run.id, "config": run.config.to_dict()}
    st.session_state[RELAUNCHED_KEY] = run.id  # filled from the state, not again from the URL
    st.switch_page("pages/launch.py", query_params={"relaunch": run.id})


class NumberInputs:
    """Number inputs whose range is checked here, not by the browser.

    Streamlit's number_input with min_value/max_value shows an out-of-range entry in red
    but never sends it: the script keeps the last valid value, and a Launch click would
    start a run with a number the user did not ask for. These inputs send what was typed;
    an entry outside the field's bounds (engine.config.bounds) is named under the input
    with the allowed range, and `problems` (non-empty) disables the buttons that use it.
    """

    def __init__(self) -> None:
        self.problems: list[str] = []

    @staticmethod
    def state_value(field: str, value):
        """What a prefill writes into this field's session state: whole-number fields are
        text inputs (see number), so their state is text."""
        return str(int(value)) if field in INT_BOUNDS else value

    def number(self, label: str, field: str, *, key: str, value, step,
               high=None, low=None, help: str | None = None, format: str | None = None):
        lowest, highest = bounds(field)
        lowest = lowest if low is None else low
        highest = highest if high is None else high
        if field in INT_BOUNDS:
            return self._whole(label, field, key, value, lowest, highest, help)
        open_low = field in OPEN_LOW_BOUNDS and low is None
        allowed = (f"above {plain_number(lowest)} up to {plain_number(highest)}" if open_low
                   else f"{plain_number(lowest)} to {plain_number(highest)}")
        entered = st.number_input(label, value=value, step=step, key=key, format=format,
                                  help=f"{help + ' ' if help else ''}Allowed: {allowed}.")
        below = entered <= lowest if open_low else entered < lowest
        if below or entered > highest:
            problem = f"{label}: {plain_number(entered)} is outside the allowed range {allowed}"
            self.problems.append(problem)
            st.error(problem)
        return entered

    def _whole(self, label: str, field: str, key: str, value: int, lowest: int, highest: int,
               help: str | None) -> int:
        """A whole number typed as text and parsed strictly: a browser's number input turns
        "1e9" into 1 and "3.7" into 3 without a word; here either is named with the range
        and disables the buttons. The value returned then is the default, never launched."""
        allowed = f"{plain_number(lowest)} to {plain_number(highest)}"
        entered = st.text_input(label, value=str(value), key=key,
                                help=f"{help + ' ' if help else ''}Allowed: a whole number "
                                     f"from {allowed}.")
        try:
            number = parse_whole(field, entered, label)
            if not lowest <= number <= highest:  # a page's own narrower range (processes)
                raise ConfigError(label, entered, f"a whole number from {allowed}")
            return number
        except ConfigError as exc:
            shown = str(entered).strip()[:40] or "(empty)"
            problem = f"{label}: {shown} is not {exc.fix}"
            self.problems.append(problem)
            st.error(plain(problem))  # what was typed: shown as text, never Markdown
            return value


# -- ids in the page's address ----------------------------------------------------------
# A shared link's ?run=, ?runs=, ?baseline=, ?relaunch=, ?sweep= can hold anything a person
# (or a hostile page linking here) typed: each is checked against the id pattern before any
# engine call sees it, and a bad one is named as text while the page draws as usual.
ADDRESS_SHOWN_CHARS = 80
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def address_text(value: str) -> str:
    """A value from the address as it is shown back: control characters as "?", cut to
    ADDRESS_SHOWN_CHARS with its length (a 5,000-character value is not repeated)."""
    text = _CONTROL_CHARS.sub("?", str(value))
    if len(text) <= ADDRESS_SHOWN_CHARS:
        return text
    return f"{text[:ADDRESS_SHOWN_CHARS]}... ({len(text)} characters)"


def is_id(value) -> bool:
    """A run or sweep id's shape: letters, digits, - and _, up to 64 characters."""
    return isinstance(value, str) and RUN_ID_RE.fullmatch(value) is not None


def id_in_address(param: str, what: str = "run", *, warn: bool = True) -> str | None:
    """The id in the address's `param`, or None when there is none or it is malformed;
    a malformed one is named (as text, `warn`) and ignored, so the page draws as usual."""
    value = st.query_params.get(param)
    if not value:
        return None
    if is_id(value):
        return value
    if warn:
        malformed_id_warning(param, what, [value])
    return None


def ids_in_address(param: str, what: str = "run", *, warn: bool = True) -> list[str]:
    """The comma-separated ids in the address's `param`; malformed ones named and left out."""
    value = st.query_params.get(param)
    if not value:
        return []
    parts = [part.strip() for part in str(value).split(",") if part.strip()]
    malformed = [part for part in parts if not is_id(part)]
    if malformed and warn:
        malformed_id_warning(param, what, malformed)
    return [part for part in parts if is_id(part)]


def malformed_id_warning(param: str, what: str, values: list[str]) -> None:
    st.warning(f"The page's address has ?{param}= values that are not {what} ids ({what} ids "
               "are letters, digits, - and _, up to 64 characters): no such "
               f"{what}; they are ignored.")
    st.code("\n".join(address_text(v) for v in values[:20]), language=None)
