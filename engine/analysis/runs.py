"""The run list as people search it: filters (text, tags, model, precision, status, date,
archived) and the rows of the Runs table and `python -m engine list`. Pure functions of
RunRecords: the page and the CLI filter and show the same runs the same way."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from engine.analysis.memory_peaks import memory_peaks
from engine.config import ConfigError
from engine.display import mfu_text
from engine.schema import throughput_column, throughput_unit
from engine.store import RunRecord
from engine.store.manage import TAG_KEY_RE


@dataclass(frozen=True)
class RunFilter:
    text: str = ""                                  # in id, label, note, tags (case-insensitive)
    tags: dict[str, str | None] = field(default_factory=dict)  # value None: the key is set
    models: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: dt.date | None = None                    # created on or after (local date)
    until: dt.date | None = None                    # created on or before
    archived: bool = False                          # True: archived runs too


def parse_tag_filter(text: str) -> dict[str, str | None]:
    """"team=infra, baseline" -> {"team": "infra", "baseline": None}; a key no tag could
    have is refused (ConfigError) rather than silently matching nothing."""
    wanted: dict[str, str | None] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not key.strip() or not TAG_KEY_RE.fullmatch(key.strip()):
            raise ConfigError("tag filter", part, "key=value or key, e.g. team=infra (keys: "
                              "letters, digits, _ . -)")
        wanted[key.strip()] = value.strip() if sep else None
    return wanted


def parse_tag_assignments(items: Iterable[str]) -> dict[str, str]:
    """["team=infra", "goal=bf16"] -> {"team": "infra", "goal": "bf16"} (CLI `tag`)."""
    tags = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError("tag", item, "key=value, e.g. team=infra")
        tags[key] = value
    return tags


def parse_tags_text(text: str) -> dict[str, str]:
    """"team=infra, goal=bf16" -> {"team": "infra", "goal": "bf16"}; a bare key gets "".
    The inverse of tags_text (the Runs page's tags input)."""
    tags = {}
    for part in (p.strip() for p in (text or "").split(",")):
        if part:
            key, _, value = part.partition("=")
            tags[key.strip()] = value.strip()
    return tags


def _matches(run: RunRecord, flt: RunFilter) -> bool:
    cfg = run.config
    if run.archived and not flt.archived:
        return False
    if flt.models and cfg.model not in flt.models:
        return False
    if flt.precisions and cfg.precision not in flt.precisions:
        return False
    if flt.statuses and run.status not in flt.statuses:
        return False
    created = dt.datetime.fromtimestamp(run.created_at).date()
    if (flt.since and created < flt.since) or (flt.until and created > flt.until):
        return False
    for key, value in flt.tags.items():
        if key not in run.tags or (value is not None and run.tags[key] != value):
            return False
    if flt.text:
        haystack = " ".join([run.id, cfg.label, cfg.name, run.note,
                             *(f"{k}={v}" for k, v in run.tags.items())]).lower()
        if flt.text.lower() not in haystack:
            return False
    return True


def filter_runs(runs: Iterable[RunRecord], flt: RunFilter) -> list[RunRecord]:
    return [run for run in runs if _matches(run, flt)]


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def tags_text(tags: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" if v else k for k, v in sorted(tags.items()))


def progress_text(run: RunRecord) -> str:
    """How far a run got: "412/1000" steps; a speedup check trains no run steps, its
    progress is its rounds ("23 rounds, 4 modes")."""
    cfg = run.config
    if not cfg.is_speedup_check:
        return f"{run.steps_completed}/{run.total_steps}"
    rounds = (run.summary.get("speedup") or {}).get("rounds")
    modes = len(cfg.speedup_mode_list)
    return f"{rounds if rounds is not None else 0} rounds, {modes} modes"


def run_row(run: RunRecord) -> dict[str, Any]:
    """One run as the Runs table and `list --json` show it."""
    s, cfg = run.summary, run.config
    peak = s.get("peak_mem_bytes")
    return {
        "run_id": run.id,
        "status": run.status,
        "model": cfg.model_label,
        "precision": (
            f"speedup check: {', '.join(cfg.speedup_mode_list)}"
            if cfg.is_speedup_check
            else str(cfg.precision)
        ),
        "steps": progress_text(run),
        "tags": tags_text(run.tags),
        "note": run.note,
        "created": dt.datetime.fromtimestamp(run.created_at).replace(microsecond=0),
        "duration_s": _finite(run.duration_s),
        "batch_size": cfg.batch_size,
        "label": cfg.label,
        "throughput": _finite(s.get(throughput_column(cfg.model))),
        "unit": throughput_unit(cfg.model),
        "peak_mem_bytes": peak if isinstance(peak, (int, float)) and peak else None,
        # the two peaks by name (engine.analysis.memory_peaks), as Live and Compare show
        **{key: value for key, value in memory_peaks(s, run.device_key).items()
           if key in ("tensor_peak_bytes", "process_peak_bytes")},
        "final_loss": _finite(s.get("final_loss")),
        "mfu_pct": 100 * s["mfu"] if _finite(s.get("mfu")) else None,
        # the same digits as Live, Compare, the report and the CLI (printf cannot switch them)
        "mfu": mfu_text(s.get("mfu")),
        "device": run.device_key,
        "archived": run.archived,
        "reason": run.reason or "",
    }


# A cell a spreadsheet would run as a formula when the table is saved as CSV (the grid's
# own "Download as CSV"): text a user typed (a note "=1+2", a tag, a run name) starts with
# one of these. OWASP's CSV-injection advice: prefix a single quote, which spreadsheets
# show as text and never evaluate.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
USER_TEXT_COLUMNS = ("label", "tags", "note", "reason")


def spreadsheet_safe(value: Any) -> Any:
    """`value` with a leading quote when it is text a spreadsheet would run as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def grid_row(run: RunRecord) -> dict[str, Any]:
    """`run_row` for a table that can be downloaded as CSV: user text made formula-safe."""
    row = run_row(run)
    for column in USER_TEXT_COLUMNS:
        row[column] = spreadsheet_safe(row[column])
    return row
