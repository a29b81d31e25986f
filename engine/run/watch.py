"""What the supervisor watches while its trainer runs: the size of worker.log and whether
the run still makes progress. Neither needs torch; both are polled from the supervisor's
wait loop (engine.run.worker, engine.run.torchrun).

- The log is capped: a workload that prints without end (a build() printing 100 MB) must
  not fill the disk. Past the cap the first part (how the run started) and the newest
  part (how it is going) are kept, with one line between them saying how much was cut.
  Every writer has the file open with O_APPEND, so after the cut they write at its new end.
- A stall is said: no progress for PRECISION_LAB_STALL_WARN_S seconds (before the first
  step too: a build() that never returns) puts one line in the log and `stall` in the
  run's summary, which Live and `engine show` say while the run is active; the next step
  clears it (engine.analysis.stall: the rule and its words).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from engine.analysis.stall import speedup_in_setup, stall_bound_s, stall_warn_s, stall_words
from engine.config import env_number
from engine.schema import WORKER_LOG
from engine.store import Store

MAX_LOG_ENV = "PRECISION_LAB_MAX_LOG_MIB"
DEFAULT_MAX_LOG_MIB = 20.0
LOG_HEAD_BYTES = 256 * 1024  # the run's start: config, device, the first steps
LOG_CHECK_S = 1.0

STALL_CHECK_S = 2.0


def max_log_mib() -> tuple[float, str | None]:
    """The cap in MiB ($PRECISION_LAB_MAX_LOG_MIB, default 20), and why a value given was
    not used (said in the run's log)."""
    return env_number(MAX_LOG_ENV, DEFAULT_MAX_LOG_MIB, 1, 100_000, "MiB")


# ---------------------------------------------------------------------------------------
# the log cap


class LogCap:
    """Keeps `path` at most `max_bytes` (plus what is written between two checks)."""

    def __init__(self, path: Path, max_bytes: int, head_bytes: int = LOG_HEAD_BYTES):
        self.path = path
        self.max_bytes = max_bytes
        self.head_bytes = min(head_bytes, max_bytes // 4)
        self.head_len: int | None = None  # fixed at the first cut: later cuts keep the same
        self.cut_bytes = 0  # in all, over every cut so far

    def check(self) -> int:
        """Cut the log when it is over the cap; the bytes cut now (0: under the cap)."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return 0
        if size <= self.max_bytes:
            return 0
        return self._cut(size)

    def _cut(self, size: int) -> int:
        # After a cut the log is about half the cap: not cut again at every check.
        tail_bytes = self.max_bytes // 2 - self.head_bytes
        with open(self.path, "rb") as handle:
            if self.head_len is None:
                head = handle.read(self.head_bytes)
                self.head_len = head.rfind(b"\n") + 1 or len(head)  # whole lines if it can
            handle.seek(max(self.head_len, size - tail_bytes))
            tail = handle.read()
        newline = tail.find(b"\n")
        if 0 <= newline < len(tail) - 1:
            tail = tail[newline + 1:]
        cut = size - self.head_len - len(tail)
        self.cut_bytes += cut
        marker = (f"[log] {self.cut_bytes / 2**20:.1f} MiB of output cut here in all: "
                  f"{WORKER_LOG} is capped at {self.max_bytes / 2**20:g} MiB "
                  f"({MAX_LOG_ENV}); its start and its newest output are kept\n").encode()
        # Written through O_APPEND, as every writer of the log writes: what a writer appends
        # between the read above and the truncate is lost (one narrow window per cut), what
        # it appends after the truncate lands before the marker, never overwritten.
        os.truncate(self.path, self.head_len)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, marker + tail)
        finally:
            os.close(fd)
        return cut


# ---------------------------------------------------------------------------------------
# the stall warning (the rule and its words: engine.analysis.stall)


def progress_of(store: Store, run_id: str) -> tuple[tuple[int, int, int], dict[str, Any]]:
    """((steps logged, speedup rounds done, speedup set-up stages done), the summary):
    what moves while a run makes progress, and what the stall bound reads."""
    run = store.get_run(run_id)
    speedup = run.summary.get("speedup") or {}
    stages = int((speedup.get("setup") or {}).get("stages_done") or 0)
    return (run.steps_completed, int(speedup.get("rounds") or 0), stages), run.summary


class StallWatch:
    """Records `stall` in the run's summary when the run has made no progress for
    `warn_after_s` (None: watched, making progress), and clears it when it resumes."""

    def __init__(self, store: Store, run_id: str, warn_after_s: float):
        self.store = store
        self.run_id = run_id
        self.warn_after_s = warn_after_s
        self.progress: tuple[int, int, int] | None = None
        self.since_mono_s = time.monotonic()
        self.since_unix_s = time.time()
        self.warned = False
        try:
            store.merge_summary(run_id, {"stall": None})  # watched: the surfaces ask us
        except Exception:  # noqa: BLE001 - unwatched, the surfaces judge from the rows
            pass

    def check(self) -> str | None:
        """A line for the log when the run has just stalled or resumed, else None."""
        progress, summary = progress_of(self.store, self.run_id)
        if progress != self.progress:
            first = self.progress is None
            self.progress = progress
            if not first:
                self.since_mono_s, self.since_unix_s = time.monotonic(), time.time()
            if self.warned:
                self.warned = False
                self.store.merge_summary(self.run_id, {"stall": None})
                steps, rounds, _stages = progress
                return (f"[supervisor] run {self.run_id}: progress again ("
                        + (f"round {rounds})" if rounds else f"step {steps})"))
            return None
        bound_s = stall_bound_s(summary, self.warn_after_s)  # a check's set-up: its budget
        if self.warned or time.monotonic() - self.since_mono_s < bound_s:
            return None
        setup = speedup_in_setup(summary)
        stall = {"since_unix_s": self.since_unix_s, "at_step": progress[0],
                 "at_round": progress[1], "warn_after_s": bound_s,
                 "setup": {key: (setup.get("setup") or {}).get(key) for key in ("stage", "mode")}
                 if setup else None}
        self.store.merge_summary(self.run_id, {"stall": stall})
        self.warned = True
        return f"[supervisor] run {self.run_id}: {stall_words(stall)}"


# ---------------------------------------------------------------------------------------
# both, for the supervisor's wait loop


class RunWatch:
    """`tick()` from the wait loop (cheap: each check runs at its own interval), `close()`
    once the trainer has ended (a last cut of the log)."""

    def __init__(self, store: Store, run_id: str):
        max_mib, log_problem = max_log_mib()
        warn_s, stall_problem = stall_warn_s()
        for problem in (log_problem, stall_problem):
            if problem:
                print(f"[supervisor] run {run_id}: {problem}", flush=True)
        self.log = LogCap(store.run_dir(run_id) / WORKER_LOG, int(max_mib * 2**20))
        self.stall = StallWatch(store, run_id, warn_s)
        self.next_log_s = self.next_stall_s = time.monotonic()
        self.last_problem: str | None = None

    def tick(self) -> None:
        """Never raises: a full disk or a locked store must not end the run it watches."""
        now = time.monotonic()
        try:
            if now >= self.next_log_s:
                self.next_log_s = now + LOG_CHECK_S
                self.log.check()
            if now >= self.next_stall_s:
                self.next_stall_s = now + STALL_CHECK_S
                line = self.stall.check()
                if line:
                    print(line, flush=True)
        except Exception as exc:  # noqa: BLE001 - a diagnostic; looked at again next tick
            self._said(exc)

    def close(self) -> None:
        try:
            # A last look: steps made since the last check (a long build, then a few quick
            # steps and the end, all between two checks) are said in the log as progress.
            line = self.stall.check() if self.stall.warned else None
            if line:
                print(line, flush=True)
            if self.stall.warned:  # the run has ended: nothing is stalled any more
                self.stall.store.merge_summary(self.stall.run_id, {"stall": None})
            self.log.check()
        except Exception as exc:  # noqa: BLE001 - the run's outcome is recorded after this
            self._said(exc)

    def _said(self, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text != self.last_problem:  # once per kind of trouble, not every 0.1 s
            self.last_problem = text
            print(f"[supervisor] run {self.stall.run_id}: watch: {text[:300]}", flush=True)
