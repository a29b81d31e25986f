"""Runs after launch: `delete`, `archive`, `tag`, `note`.

    python -m engine delete RUN_ID [RUN_ID ...] [--yes]
    python -m engine archive RUN_ID [RUN_ID ...] [--undo]
    python -m engine tag RUN_ID key=value [key=value ...] [--remove KEY ...]
    python -m engine note RUN_ID "text"        ("" clears the note)

A queued or running run is not deleted (stop it first). Delete asks on a terminal; from a
script it needs --yes. Bad input exits 2 with one line naming the field.
"""

from __future__ import annotations

import argparse
import json
import sys

from engine.analysis.runs import parse_tag_assignments
from engine.cli.errors import EXIT_OK, UsageError
from engine.config import ConfigError
from engine.store import RunActive, RunNotFound, Store, validate_run_id


def add_subparsers(sub) -> None:
    delete = sub.add_parser("delete", help="delete ended runs: their rows and files")
    delete.add_argument("run_ids", nargs="+", metavar="RUN_ID")
    delete.add_argument("--yes", action="store_true", help="do not ask (scripts)")
    delete.add_argument("--json", action="store_true")
    delete.set_defaults(func=cmd_delete)

    archive = sub.add_parser("archive", help="hide runs from the lists (kept; --undo shows them)")
    archive.add_argument("run_ids", nargs="+", metavar="RUN_ID")
    archive.add_argument("--undo", action="store_true", help="unarchive")
    archive.add_argument("--json", action="store_true")
    archive.set_defaults(func=cmd_archive)

    tag = sub.add_parser("tag", help="add, change or remove a run's key=value tags")
    tag.add_argument("run_id", metavar="RUN_ID")
    tag.add_argument("tags", nargs="*", metavar="KEY=VALUE")
    tag.add_argument("--remove", nargs="+", default=[], metavar="KEY", help="tags to drop")
    tag.add_argument("--json", action="store_true")
    tag.set_defaults(func=cmd_tag)

    note = sub.add_parser("note", help="set a run's note (\"\" clears it)")
    note.add_argument("run_id", metavar="RUN_ID")
    note.add_argument("text")
    note.add_argument("--json", action="store_true")
    note.set_defaults(func=cmd_note)


def _run_ids(ids: list[str], store: Store) -> list[str]:
    checked = []
    for run_id in ids:
        try:
            store.get_run(validate_run_id(run_id))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        checked.append(run_id)
    return checked


def _usage(exc: ConfigError) -> UsageError:
    return UsageError(f"{exc.field} {exc.value!r}: {exc.fix}")


def cmd_delete(args: argparse.Namespace) -> int:
    store = Store()
    run_ids = _run_ids(args.run_ids, store)
    active = [store.get_run(run_id) for run_id in run_ids if store.get_run(run_id).is_active]
    if active:  # refuse before deleting any: all or none
        raise UsageError(str(RunActive(active[0].id, active[0].status)))
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"delete {' '.join(run_ids)}: add --yes to delete without a prompt")
        answer = input(f"Delete {len(run_ids)} run(s) and their files ({', '.join(run_ids)})? "
                       "[y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted", file=sys.stderr)
            return EXIT_OK
    for run_id in run_ids:
        try:
            store.delete_run(run_id)
        except RunActive as exc:  # it started meanwhile
            raise UsageError(str(exc)) from None
    print(json.dumps({"deleted": run_ids}) if args.json else f"deleted {' '.join(run_ids)}")
    return EXIT_OK


def cmd_archive(args: argparse.Namespace) -> int:
    store = Store()
    run_ids = _run_ids(args.run_ids, store)
    for run_id in run_ids:
        store.set_archived(run_id, not args.undo)
    word = "unarchived" if args.undo else "archived"
    print(json.dumps({word: run_ids}) if args.json else f"{word} {' '.join(run_ids)}")
    return EXIT_OK


def cmd_tag(args: argparse.Namespace) -> int:
    store = Store()
    (run_id,) = _run_ids([args.run_id], store)
    if not args.tags and not args.remove:
        raise UsageError("tag: give KEY=VALUE tags to set or --remove KEY, e.g. "
                         f"`python -m engine tag {run_id} team=infra`")
    try:
        tags = store.update_tags(run_id, parse_tag_assignments(args.tags), args.remove)
    except ConfigError as exc:
        raise _usage(exc) from None
    print(json.dumps({"run_id": run_id, "tags": tags}) if args.json
          else ", ".join(f"{k}={v}" for k, v in sorted(tags.items())) or "(no tags)")
    return EXIT_OK


def cmd_note(args: argparse.Namespace) -> int:
    store = Store()
    (run_id,) = _run_ids([args.run_id], store)
    try:
        store.set_note(run_id, args.text)
    except ConfigError as exc:
        raise _usage(exc) from None
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps({"run_id": run_id, "note": args.text}) if args.json else "note saved")
    return EXIT_OK
