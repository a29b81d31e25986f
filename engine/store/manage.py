"""What a person does to a run after launch: archive it, tag it, write a note, delete it.

Delete removes the run's rows from every table (runs, metrics and their overview,
telemetry, kernels, its sweep link) in one transaction, then its directory runs/<id>/
(logs, trace, numerics), and nothing else. A queued or running run is refused with the
reason: stop it first, so no worker writes into rows that are gone.
"""

from __future__ import annotations

import json
import re
import shutil

from engine.config import ConfigError
from engine.schema import ACTIVE_STATUSES
from engine.store.db import RunNotFound, stored_tags, validate_run_id

TAG_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,39}$")
MAX_TAG_VALUE_CHARS = 200
MAX_TAGS = 50
MAX_NOTE_CHARS = 4000
# Tables holding a run's rows, besides `runs` itself.
_RUN_TABLES = ("metrics", "metrics_overview", "telemetry", "kernels", "sweep_runs")


class RunActive(ValueError):
    """A queued or running run cannot be deleted."""

    def __init__(self, run_id: str, status: str):
        self.run_id, self.status = run_id, status
        super().__init__(f"run {run_id} is {status}: stop it first "
                         f"(`python -m engine stop {run_id}`), then delete it")


def check_tags(tags: dict[str, str]) -> dict[str, str]:
    """Tags as stored: keys of letters, digits, _ . - (up to 40), values up to 200
    printable characters; ConfigError naming the tag otherwise."""
    if len(tags) > MAX_TAGS:
        raise ConfigError("tags", f"{len(tags)} tags", f"at most {MAX_TAGS} tags per run")
    checked = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not TAG_KEY_RE.fullmatch(key):
            raise ConfigError("tag", key, "a key of letters, digits, _ . - (up to 40), "
                              "starting with a letter or digit, e.g. team=infra")
        value = "" if value is None else str(value)
        if len(value) > MAX_TAG_VALUE_CHARS or not value.isprintable():
            raise ConfigError(f"tag {key}", value[:60], f"a value of up to {MAX_TAG_VALUE_CHARS} "
                              "printable characters")
        checked[key] = value
    return checked


def check_note(note: str) -> str:
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise ConfigError("note", str(note)[:60] + "...",
                          f"text of up to {MAX_NOTE_CHARS} characters")
    if any(not (ch.isprintable() or ch in "\n\t") for ch in note):
        raise ConfigError("note", note[:60], "printable text (line breaks and tabs allowed)")
    return note


class ManageMixin:
    """Store methods for archive, tags, notes and delete (mixed into engine.store.Store)."""

    def _update_annotation(self, run_id: str, column: str, value) -> None:
        validate_run_id(run_id)
        with self.connect() as conn:
            cursor = conn.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", (value, run_id))
            if cursor.rowcount != 1:
                raise RunNotFound(run_id)

    def set_archived(self, run_id: str, archived: bool = True) -> None:
        self._update_annotation(run_id, "archived", 1 if archived else 0)

    def set_note(self, run_id: str, note: str) -> None:
        self._update_annotation(run_id, "note", check_note(note))

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        """Replace the run's tags."""
        self._update_annotation(run_id, "tags_json", json.dumps(check_tags(tags), sort_keys=True))

    def update_tags(self, run_id: str, add: dict[str, str] | None = None,
                    remove: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
        """Add or overwrite `add`, drop the keys in `remove`; the tags afterwards.

        Read and write in one immediate transaction: two `engine tag` commands at once each
        read the old tags and the later write dropped the earlier one's tag."""
        validate_run_id(run_id)
        with self.transaction(immediate=True) as conn:
            row = conn.execute("SELECT tags_json FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            tags = stored_tags(row[0])
            tags.update(add or {})
            for key in remove:
                tags.pop(key, None)
            conn.execute("UPDATE runs SET tags_json = ? WHERE id = ?",
                         (json.dumps(check_tags(tags), sort_keys=True), run_id))
        return tags

    def delete_run(self, run_id: str) -> None:
        """The run's rows and files; RunActive for a queued or running run."""
        validate_run_id(run_id)
        with self.transaction(immediate=True) as conn:
            row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            if row[0] in ACTIVE_STATUSES:
                raise RunActive(run_id, row[0])
            for table in _RUN_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        # After the commit: a crash in between leaves files without rows, never rows
        # whose files are gone. run_dir() validated the id: no path outside runs/.
        shutil.rmtree(self.run_dir(run_id), ignore_errors=True)
