"""A pre-started trainer: a process that has already imported PyTorch and waits for a run.

Most of the time from "Launch" to the first metric point is not training: a fresh
trainer spends ~2 s importing torch and ~1.6 s more in the first optimizer's lazy
`torch._dynamo` import (2-core CPU). A standby pays that before anyone asks, then:

  supervisor ──connect──> standby (listening; torch imported, no CUDA, no threads run)
             ──{"run_id"}─>          fork() ─> trainer child: run_trainer(run_id)
             <─{"pid"}─────          waits for the child, watches the connection
             <─{"returncode"}─       exits (one run per standby)

Why a fork and not the standby itself training: the standby is the trainer's parent,
so it can `waitpid` and report the real exit status (a SIGKILL by the OOM killer is
reported as such, as for a trainer the supervisor started itself). Forking is safe
because the standby never runs a torch operation (no OpenMP pool, no CUDA context):
the child initialises those itself.

Lifetime and safety:
  - One standby per data directory, found by an abstract UNIX socket named after the
    directory (no path-length limit, nothing left on disk). Only processes of the same
    user may hand it a run (SO_PEERCRED); the message is a run id, validated, never
    executed.
  - If the supervisor dies (a stop escalated to SIGKILL), the connection closes and the
    standby kills its trainer: a run never outlives its supervisor.
  - It exits after `IDLE_EXIT_S` unused, when its data directory disappears, or on
    SIGTERM; `PRECISION_LAB_STANDBY=0` turns the whole mechanism off.
  - Runs with a memory cap never use it: the cap (RLIMIT_AS) must be set before the
    process maps PyTorch, so those trainers start fresh.
  - The app asks for a standby to be kept ready (`want`, a small file naming the
    server's pid). While that server lives, every way a run can end leaves a successor
    (`keep`): the supervisor when its run is asked to stop and when it ends, the
    launcher after a stop (a supervisor killed mid-stop cannot), reconcile after a
    death. A successor importing torch is recorded (`standby.starting.json`), so two of
    them asking at once start one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine.proc import (
    PROJECT_ROOT,
    become_subreaper,
    child_env,
    die_with_parent,
    end_descendants,
    is_alive,
    join_cgroup,
    make_private,
    open_private_log,
    process_create_time,
    reap_when_done,
    run_cgroup,
    set_process_name,
    trainer_name,
)
from engine.schema import RUN_ID_ENV, STANDBY_LOG, STANDBY_STARTING, STANDBY_WANTED, WORKER_LOG
from engine.store import Store, validate_run_id

ENABLE_ENV = "PRECISION_LAB_STANDBY"
IDLE_EXIT_S = 1800.0  # an unused standby holds ~300 MB; it goes away after 30 minutes
HOME_CHECK_S = 5.0
CONNECT_TIMEOUT_S = 2.0


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


def socket_name(home: Path) -> bytes:
    """Abstract-namespace socket name (leading NUL) for one data directory."""
    digest = hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:24]
    return b"\0precision-lab-standby-" + digest.encode()


# ---------------------------------------------------------------------------------------
# client side: the supervisor and the launcher


class StandbyTrainer:
    """A trainer forked by a standby, driven like a `subprocess.Popen` of one.

    `wait(timeout)` returns the exit status as Popen does (negative: killed by that
    signal); the signals go straight to the trainer's pid.
    """

    def __init__(self, conn: socket.socket, pid: int):
        self.conn = conn
        self.pid = pid
        self.returncode: int | None = None
        self._buffer = b""

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            message = _read_message(self.conn, self._buffer, deadline)
            if message is None:  # timed out
                raise subprocess.TimeoutExpired("standby trainer", timeout)
            self._buffer = message.pop("_rest", b"")
            if "returncode" in message:
                self.returncode = int(message["returncode"])
                self.conn.close()
                return self.returncode
            if message.get("eof"):
                # The standby itself died: the trainer (its child) was killed with it
                # or is orphaned; either way nothing will report its status.
                self.returncode = -signal.SIGKILL
                self.conn.close()
                return self.returncode

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def hand_off(run_id: str, home: Path) -> StandbyTrainer | None:
    """Give `run_id` to this data directory's standby; None when there is none (or it
    does not answer), and the caller starts a trainer itself."""
    if not enabled():
        return None
    conn = _connect(home)
    if conn is None:
        return None
    try:
        _send(conn, {"run_id": run_id})
        reply = _read_message(conn, b"", time.monotonic() + 10.0)
    except OSError:
        conn.close()
        return None
    if not reply or "pid" not in reply:
        conn.close()
        return None
    trainer_pid = _trainer_pid(conn, reply["pid"])
    if trainer_pid is None:
        conn.close()  # a real standby sees the supervisor gone and ends its child
        return None
    trainer = StandbyTrainer(conn, trainer_pid)
    trainer._buffer = reply.get("_rest", b"")
    return trainer


def ping(home: Path) -> int | None:
    """The standby's pid when one listens for this data directory, else None."""
    conn = _connect(home)
    if conn is None:
        return None
    try:
        _send(conn, {"ping": True})
        reply = _read_message(conn, b"", time.monotonic() + CONNECT_TIMEOUT_S)
        if not reply or "pong" not in reply:
            return None
        # The pid the kernel says is at the other end, not the one the peer names.
        return _peer_credentials(conn)[0]
    except (OSError, ValueError):
        return None
    finally:
        conn.close()


def shutdown(home: Path) -> bool:
    """Ask this data directory's standby to exit; True when one was there."""
    conn = _connect(home)
    if conn is None:
        return False
    try:
        _send(conn, {"exit": True})
        return True
    except OSError:
        return False
    finally:
        conn.close()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    make_private(tmp)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _live_pid(record: dict[str, Any]) -> int | None:
    pid = record.get("pid")
    if isinstance(pid, int) and is_alive(pid, record.get("create_time")):
        return pid
    return None


def want(store: Store, owner_pid: int) -> None:
    """Keep a standby ready for this data directory while `owner_pid` (the app's
    server) lives: runs that end then always leave a successor."""
    try:
        _write_json(store.home / STANDBY_WANTED,
                    {"pid": owner_pid, "create_time": process_create_time(owner_pid)})
    except OSError:
        pass  # a read-only data dir: launches still work, the slower way


def wanted(home: Path) -> bool:
    """True while the process that asked for a standby (`want`) is alive."""
    return _live_pid(_read_json(Path(home) / STANDBY_WANTED)) is not None


def app_gone(home: Path) -> bool:
    """True when an app asked for standbys here (`want`) and its server has ended: a run
    it launched that ends later must not start a successor nobody will use (~300 MB for
    30 minutes)."""
    record = _read_json(Path(home) / STANDBY_WANTED)
    return bool(record.get("pid")) and _live_pid(record) is None


def keep(store: Store) -> int | None:
    """`ensure` when a standby is wanted for this data directory (the app runs), else
    nothing: a run from a terminal with no app leaves no daemon behind. Never raises."""
    if not wanted(store.home):
        return None
    try:
        return ensure(store)
    except OSError as exc:  # a standby is an optimisation; the caller's work goes on
        print(f"[standby] no successor started: {exc}", file=sys.stderr, flush=True)
        return None


def starting_pid(home: Path) -> int | None:
    """The pid of a standby started for `home` that is still importing torch, if any."""
    return _live_pid(_read_json(Path(home) / STANDBY_STARTING))


def ensure(store: Store) -> int | None:
    """Start a standby for `store`'s data directory unless one is listening; its pid.

    Called when the app starts and by a supervisor after its run ended, never while a
    run trains: the standby's imports take a core for ~3 s, which would slow that run's
    first steps (and a niced standby would hand its priority down to the next run).
    Never blocks on the import: the new process binds its socket once torch is loaded,
    so a launch in the next few seconds simply starts a trainer the usual way.
    """
    if not enabled():
        return None
    existing = ping(store.home) or starting_pid(store.home)
    if existing is not None:
        return existing

    # For the app while its server lives: then it ends with the server, even one that ends
    # while this one still imports torch.
    for_app = ["--for-app"] if wanted(store.home) else []
    log_path = store.home / STANDBY_LOG
    with open_private_log(log_path) as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine.run.standby", "--home", str(store.home), *for_app],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=str(PROJECT_ROOT), env=child_env(store.home),
            start_new_session=True, close_fds=True)
    with contextlib.suppress(OSError):  # lets a second caller see this one is on its way
        _write_json(store.home / STANDBY_STARTING,
                    {"pid": proc.pid, "create_time": process_create_time(proc.pid)})
    reap_when_done(proc, "standby")
    return proc.pid


def _connect(home: Path) -> socket.socket | None:
    """A connection to this data directory's standby, or None.

    The socket's name is public (an abstract name anyone on the machine can bind first),
    so the listener must prove it is ours: SO_PEERCRED gives the uid the kernel knows, and
    a listener of another user is refused (it could name any pid as "the trainer", and a
    stop would signal that process)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)
    try:
        conn.connect(socket_name(home))
        _pid, uid, _gid = _peer_credentials(conn)
    except OSError:  # nobody listening (ECONNREFUSED) or a stuck standby (timeout)
        conn.close()
        return None
    if uid != os.getuid():
        print(f"warning: the standby socket for {home} is held by uid {uid}, not this user "
              f"(uid {os.getuid()}); not used", file=sys.stderr, flush=True)
        conn.close()
        return None
    conn.settimeout(None)
    return conn


def _trainer_pid(conn: socket.socket, named) -> int | None:
    """The trainer pid a standby named, when it is that standby's own child (the pid at
    the other end of `conn`, from the kernel); None otherwise: an impostor could name any
    process, and the supervisor signals the pid it was given."""
    try:
        pid = int(named)
        standby_pid = _peer_credentials(conn)[0]
    except (TypeError, ValueError, OSError):
        return None
    if pid <= 1 or parent_pid(pid) != standby_pid:
        print(f"warning: the standby (pid {standby_pid}) named pid {pid} as its trainer, "
              "which is not its child; starting a trainer here instead", file=sys.stderr,
              flush=True)
        return None
    return pid


def parent_pid(pid: int) -> int | None:
    """`pid`'s parent from /proc (None when it is gone)."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; cut at the last ")".
    fields = stat_text[stat_text.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _read_message(conn: socket.socket, buffer: bytes,
                  deadline: float | None) -> dict[str, Any] | None:
    """One JSON line; None on timeout; {"eof": True} when the peer closed."""
    while b"\n" not in buffer:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([conn], [], [], remaining)
        if not ready:
            return None
        chunk = conn.recv(4096)
        if not chunk:
            return {"eof": True, "_rest": b""}
        buffer += chunk
    line, rest = buffer.split(b"\n", 1)
    message = json.loads(line)
    message["_rest"] = rest
    return message


# ---------------------------------------------------------------------------------------
# server side: the standby process


def _preload() -> None:
    """Everything a trainer imports before its first step, and nothing that starts a
    thread or touches a device (that would make the fork unsafe)."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  - what the first optimizer would import lazily
    import torch.optim  # noqa: F401
    import torch.profiler  # noqa: F401
    import torch.utils.flop_counter  # noqa: F401

    # The trainer's own modules (engine.run.session's imports when it trains):
    import engine.hardware.telemetry  # noqa: F401
    import engine.run.session  # noqa: F401
    import engine.run.window  # noqa: F401
    import engine.training.loop  # noqa: F401


def _peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel recorded them."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def _peer_uid(conn: socket.socket) -> int:
    return _peer_credentials(conn)[1]


def serve(home: Path, for_app: bool = False) -> int:
    """Listen until a run arrives, train it in a forked child, report, exit. `for_app`:
    started for the app's server, and ends with it."""
    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))
    become_subreaper()  # a trainer killed mid-run hands its workload's children to us
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(socket_name(home))
    except OSError:
        print(f"[standby {os.getpid()}] another standby serves {home}; exiting", flush=True)
        return 0
    listener.listen(4)
    if starting_pid(home) == os.getpid():
        with contextlib.suppress(OSError):
            (Path(home) / STANDBY_STARTING).unlink()
    print(f"[standby {os.getpid()}] ready for {home}", flush=True)
    idle_deadline = time.monotonic() + IDLE_EXIT_S
    # Kept for the app: it ends with the app's server (a stopped server must not leave
    # ~300 MB waiting for 30 minutes). A standby started from the terminal has no owner.
    for_the_app = for_app or wanted(home)
    while not stop["requested"] and time.monotonic() < idle_deadline:
        ready, _, _ = select.select([listener], [], [], HOME_CHECK_S)
        if not Path(home).is_dir():
            print(f"[standby {os.getpid()}] {home} is gone; exiting", flush=True)
            return 0
        if for_the_app and not wanted(home):
            print(f"[standby {os.getpid()}] the app's server has ended; exiting", flush=True)
            return 0
        if not ready:
            continue
        conn, _ = listener.accept()
        run_id = _accept_request(conn, listener)
        if run_id == "exit":
            return 0
        if run_id:
            listener.close()  # one run per standby: the next one binds the name
            return _run_forked(conn, run_id, home)
    print(f"[standby {os.getpid()}] idle or stopped; exiting", flush=True)
    return 0


def _accept_request(conn: socket.socket, listener: socket.socket) -> str | None:
    """Answer pings here; return a validated run id, "exit", or None."""
    try:
        if _peer_uid(conn) != os.getuid():
            conn.close()
            return None
        message = _read_message(conn, b"", time.monotonic() + CONNECT_TIMEOUT_S)
        if not message or message.get("eof"):
            conn.close()
            return None
        if message.get("ping"):
            _send(conn, {"pong": os.getpid()})
            conn.close()
            return None
        if message.get("exit"):
            conn.close()
            listener.close()
            return "exit"
        return validate_run_id(str(message.get("run_id", "")))
    except (OSError, ValueError) as exc:
        print(f"[standby {os.getpid()}] bad request: {exc}", flush=True)
        conn.close()
        return None


def _run_forked(conn: socket.socket, run_id: str, home: Path) -> int:
    standby_pid = os.getpid()
    if _peer_gone(conn):  # stalled past hand_off's wait: the supervisor started its own
        print(f"[standby {standby_pid}] run {run_id}: the supervisor stopped waiting for "
              "the hand-off; its own trainer has the run, exiting", flush=True)
        conn.close()
        return 0
    pid = os.fork()
    if pid == 0:  # the trainer: the supervisor's connection belongs to the standby alone
        # Dies with the standby: a SIGKILLed standby must not leave its trainer behind
        # (the standby itself kills the trainer when the supervisor goes away).
        die_with_parent(standby_pid)
        conn.close()
        os._exit(_child_main(run_id, home))
    print(f"[standby {os.getpid()}] run {run_id}: trainer pid {pid}", flush=True)
    try:
        _send(conn, {"pid": pid})
    except OSError:  # the supervisor gave up between the check above and now
        _end_child(pid)
        print(f"[standby {standby_pid}] run {run_id}: the supervisor stopped waiting for "
              f"the hand-off; ended trainer pid {pid}, exiting", flush=True)
        conn.close()
        return 0
    returncode = _watch_child(conn, pid)
    leftovers = end_descendants()  # what a trainer that died abruptly could not end
    if leftovers:
        print(f"[standby {os.getpid()}] run {run_id}: ended {len(leftovers)} leftover "
              f"process(es): {', '.join(leftovers[:10])}", flush=True)
    with contextlib.suppress(OSError):
        _send(conn, {"returncode": returncode})
    conn.close()
    return 0


def _child_main(run_id: str, home: Path) -> int:
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        store = Store(home)
        # Into the run's cgroup (its supervisor made it): what the workload starts stays in
        # reach when this trainer, the standby and the supervisor are all killed.
        join_cgroup(run_cgroup(store.run_dir(run_id)))
        # The trainer's output goes to the run's own log, as a fresh trainer's would.
        log = os.open(store.run_dir(run_id) / WORKER_LOG,
                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        # Marks inherited by what the workload starts, so reconcile and the supervisor find
        # it after a kill: the environment (for what it execs), the name (what it forks).
        os.environ[RUN_ID_ENV] = run_id
        set_process_name(trainer_name(run_id))
        print(f"[trainer] run {run_id}: started by standby {os.getppid()}", flush=True)
        from engine.run.session import run_trainer  # the forked child trains: torch is loaded

        return run_trainer(run_id, store)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the server
        import traceback

        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _watch_child(conn: socket.socket, pid: int) -> int:
    """Wait for the trainer; if the supervisor goes away first, kill the trainer."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if _peer_gone(conn, wait_s=0.1):
            return _end_child(pid)


def _peer_gone(conn: socket.socket, wait_s: float = 0.0) -> bool:
    """Whether the supervisor closed its end (EOF or a reset), waiting up to `wait_s`."""
    try:
        ready, _, _ = select.select([conn], [], [], wait_s)
        return bool(ready) and not conn.recv(1, socket.MSG_PEEK)
    except OSError:
        return True


def _end_child(pid: int) -> int:
    """SIGKILL the forked trainer and reap it; its exit status."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.run.standby")
    parser.add_argument("--home", required=True, help="the data directory to serve")
    parser.add_argument("--for-app", action="store_true",
                        help="started for the app's server: exit when it has ended")
    args = parser.parse_args(argv)
    return serve(Path(args.home), for_app=args.for_app)


if __name__ == "__main__":
    sys.exit(main())
