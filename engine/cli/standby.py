"""`python -m engine standby [status|start|stop]`: the pre-started trainer of this data
directory (engine/run/standby.py). The app starts one; a terminal user never gets one
unless asked here. It holds ~300 MB while idle and exits after 30 idle minutes.
"""

from __future__ import annotations

import argparse
import json
import time

from engine.cli.errors import EXIT_OK, UsageError
from engine.run import standby
from engine.store import Store

READY_TIMEOUT_S = 90.0  # importing torch on a loaded 2-core machine


def add_subparsers(sub) -> None:
    parser = sub.add_parser("standby", help="the pre-started trainer of this data directory: "
                                            "status, start or stop it")
    parser.add_argument("action", nargs="?", default="status", choices=("status", "start", "stop"))
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=cmd_standby)


def running_note(store: Store) -> str | None:
    """One line for `list`: a standby is running for this data directory, and how to end it."""
    pid = standby.ping(store.home)
    if pid is None:
        return None
    return (f"note: a standby trainer (pid {pid}, ~300 MB, exits after 30 idle minutes) is "
            "running for this data directory; end it with `python -m engine standby stop`")


def cmd_standby(args: argparse.Namespace) -> int:
    store = Store()
    pid = standby.ping(store.home)
    if args.action == "start":
        if pid is None:
            if not standby.enabled():
                raise UsageError(f"standby start: {standby.ENABLE_ENV}=0 turns the standby off; "
                                 "unset it to start one")
            standby.ensure(store)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while pid is None and time.monotonic() < deadline:
                time.sleep(0.2)
                pid = standby.ping(store.home)
        state = "running" if pid else "starting"
    elif args.action == "stop":
        state = "stopped" if standby.shutdown(store.home) else "not running"
    else:
        state = "running" if pid else "not running"
    info = {"state": state, "pid": pid if state == "running" else None, "home": str(store.home)}
    print(json.dumps(info) if args.json else
          f"standby {state}" + (f" (pid {pid})" if info["pid"] else ""))
    return EXIT_OK
