"""A small sampling profiler for code running on other threads (py-spy is not installed,
and cProfile sees only the thread that enables it, while Streamlit's AppTest runs a page
on a script-runner thread).

Every `interval_s` it takes `sys._current_frames()`, and for each thread whose name
starts with `thread_prefix` (default: Streamlit's script-runner thread), counts every
function on the stack once (cumulative) and the innermost one (self); samples of other
threads are only counted (`other_samples`: e.g. AppTest's component-manifest scan runs
on a pool thread of its own). The GIL switch interval is lowered while sampling, or the
sampler would rarely get a turn; renders run a little slower under it, so time them
separately.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path

from bench._common import REPO_ROOT


class StackSampler:
    def __init__(self, interval_s: float = 0.002, thread_prefix: str = "ScriptRunner"):
        self.interval_s = interval_s
        self.thread_prefix = thread_prefix
        self.samples = 0
        self.other_samples = 0
        self._switch_interval = sys.getswitchinterval()
        self.cumulative: Counter[str] = Counter()
        self.self_time: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._skip = {threading.get_ident()}

    def __enter__(self) -> "StackSampler":
        sys.setswitchinterval(0.0005)
        self._thread = threading.Thread(target=self._loop, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        sys.setswitchinterval(self._switch_interval)

    def _loop(self) -> None:
        self._skip.add(threading.get_ident())
        while not self._stop.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident in self._skip:
                    continue
                if names.get(ident, "").startswith(self.thread_prefix):
                    self._record(frame)
                else:
                    self.other_samples += 1
            time.sleep(self.interval_s)

    def _record(self, frame) -> None:
        self.samples += 1
        self.self_time[_label(frame)] += 1
        seen = set()
        while frame is not None:
            label = _label(frame)
            if label not in seen:
                seen.add(label)
                self.cumulative[label] += 1
            frame = frame.f_back

    def top(self, count: int = 15, only_project: bool = False) -> list[tuple[str, float, float]]:
        """(function, cumulative share, self share), largest cumulative first.

        Streamlit's and threading's own frames that sit under every sample are left out
        (they would all read ~100 %)."""
        rows = []
        for label, hits in self.cumulative.most_common():
            if _is_plumbing(label) or (only_project and not _is_project(label)):
                continue
            rows.append((label, hits / max(1, self.samples),
                         self.self_time[label] / max(1, self.samples)))
            if len(rows) >= count:
                break
        return rows


def _label(frame) -> str:
    code = frame.f_code
    path = Path(code.co_filename)
    try:
        shown = str(path.relative_to(REPO_ROOT))
    except ValueError:
        parts = path.parts
        for marker in ("site-packages", "lib"):
            if marker in parts:
                parts = parts[len(parts) - parts[::-1].index(marker):]
                break
        shown = "/".join(parts[-3:])
    return f"{shown}:{code.co_name}"


def _is_project(label: str) -> bool:
    return label.startswith(("engine/", "pages/", "app.py"))


_PLUMBING = ("threading.py:", "streamlit/runtime/scriptrunner", "scriptrunner/exec_code",
             "scriptrunner/script_runner", "testing/v1/local_script_runner",
             "runtime/scriptrunner_utils", "streamlit/navigation/page", "navigation/page.py",
             "exec_code.py", "script_runner.py", "bench/")


def _is_plumbing(label: str) -> bool:
    return any(marker in label for marker in _PLUMBING)
