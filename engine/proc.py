"""Process helpers without torch: the project root, the environment of the processes a
run uses, liveness (pid plus create time, so a reused pid is never mistaken for ours),
process-group signals, and the address-space cap of memory-capped CPU runs.

The supervisor, the launcher, the standby, the torchrun bookkeeping and the Ray driver
all use these; none of them may import torch for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable

import psutil

from engine.schema import HOME_ENV, RUN_ID_ENV, RUNS_DIRNAME

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def reap_when_done(proc: subprocess.Popen, what: str) -> None:
    """Wait for a detached child in a daemon thread: a long-lived parent (the Streamlit
    server) that never waits keeps every ended worker, standby or driver as a zombie."""
    threading.Thread(target=proc.wait, name=f"reap-{what}-{proc.pid}", daemon=True).start()


def child_env(home: Path) -> dict[str, str]:
    """The environment of the processes a run uses (worker, standby trainer)."""
    env = dict(os.environ)
    env[HOME_ENV] = str(home)
    # A supervisor's own run id stays its own: a standby it starts serves the next run.
    env.pop(RUN_ID_ENV, None)
    # The worker imports `engine` from this checkout whatever the caller's cwd is.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


PRIVATE_DIR_MODE, PRIVATE_FILE_MODE = 0o700, 0o600


def make_private(path: Path, mode: int = PRIVATE_FILE_MODE) -> None:
    """Owner-only permissions on a file or folder of ours (runs, logs, traces, the store
    are one user's business); an existing one made by an older version is fixed too."""
    try:
        info = path.stat()
        if (info.st_mode & 0o777) != mode and info.st_uid == os.getuid():
            os.chmod(path, mode)
    except OSError:  # gone, or not ours to change: nothing to fix
        pass


def open_private_log(path: Path):
    """A log file opened for appending, created owner-only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE_MODE)
    make_private(path)
    return os.fdopen(fd, "ab")


def process_create_time(pid: int) -> float | None:
    """When `pid` started (psutil's clock), or None when it is gone or not visible."""
    try:
        return psutil.Process(pid).create_time()
    except Exception:
        return None


def is_alive(pid: int | None, create_time: float | None) -> bool:
    """True when `pid` runs and is the process we started (same create time)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False  # the pid was reused by another process
        return True
    except Exception:  # NoSuchProcess, AccessDenied on a foreign pid: not ours
        return False


def memory_cap(cap_mb: int):
    """A preexec_fn that caps the child's address space at `cap_mb` MiB; None for no cap."""
    if not cap_mb:
        return None

    def apply() -> None:  # runs in the child between fork and exec
        import resource  # only here: the parent never needs it

        cap_bytes = cap_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    return apply


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when its parent dies, and exit at once if
    the parent is already gone (it died between our fork and this call).

    Called in a child right after fork (a trainer's preexec_fn, the standby's forked
    trainer): a trainer must never outlive the process that answers for its run. The
    setting survives exec; it is cleared only by a setuid exec, which never happens here.
    """
    try:
        import ctypes  # only in the child, between fork and exec

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: reconcile still kills
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants: a workload's child that
    double-forks or whose parent exits is re-parented here, not to init, so the trainer
    can still find and end it (end_descendants). False where Linux does not offer it."""
    try:
        import ctypes  # Linux's prctl, as in die_with_parent

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return False


def end_descendants(grace_s: float = 2.0, spare: Callable[[psutil.Process], bool] | None = None
                    ) -> list[str]:
    """End every process this one started, directly or not (fork, multiprocessing, Popen,
    setsid'd ones included: setsid changes the session, not the parent): SIGTERM, SIGKILL
    after `grace_s`, then reap. `spare(proc)` keeps a process and everything under it (the
    supervisor spares the app's standby). Returns "pid name" of each, for the run's log."""
    me = psutil.Process()
    ended: list[str] = []
    for _ in range(3):  # a dying parent hands its own children to us (subreaper): look again
        procs = _descendants(me, spare)
        if not procs:
            break
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                ended.append(f"{proc.pid} {proc.name()}")
                proc.terminate()
        _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=grace_s)
    _reap_orphans()
    return list(dict.fromkeys(ended))


def _descendants(me: psutil.Process, spare) -> list[psutil.Process]:
    found, pending = [], list(me.children())
    while pending:
        proc = pending.pop()
        try:
            if spare is not None and spare(proc):
                continue
            found.append(proc)
            pending += proc.children()
        except psutil.Error:
            continue
    return found


PR_SET_NAME = 15  # linux/prctl.h


def trainer_name(run_id: str) -> str:
    """The process name (comm, at most 15 bytes) of a standby's trainer for this run."""
    return f"pl-{run_id[-10:]}"


def set_process_name(name: str) -> None:
    """Set this process's comm (`ps`, psutil's name()); fork children inherit it, exec
    replaces it. Linux only."""
    try:
        import ctypes  # Linux's prctl, as in die_with_parent

        comm = ctypes.c_char_p(name.encode()[:15])
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, comm, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def processes_of_run(home: Path, run_id: str) -> list[psutil.Process]:
    """Live processes left of a run whose trainer was killed: those whose environment names
    this run and data directory (a fresh trainer's, inherited by all its workload starts,
    setsid'd ones too), and those that still carry a standby trainer's name for the run
    with this data directory's command line (forked with no exec, a standby trainer's
    children keep its name; the run's environment is not in their /proc environ). Reads
    every process's environment: called only for a run that has ended."""
    found, name = [], trainer_name(run_id)
    for proc in psutil.process_iter(["pid", "status", "cmdline", "name"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        forked = proc.info["name"] == name and str(home) in (proc.info["cmdline"] or [])
        if forked or (env.get(RUN_ID_ENV) == run_id and env.get(HOME_ENV) == str(home)):
            found.append(proc)
    return found


def kill_processes_of_run(home: Path, run_id: str) -> int:
    """SIGKILL what is left of a run: its cgroup where it has one (whatever its processes
    did), then what carries its marks (processes_of_run); how many there were."""
    in_cgroup = end_cgroup(run_cgroup(Path(home) / RUNS_DIRNAME / run_id))
    leftovers = processes_of_run(home, run_id)
    for proc in leftovers:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return in_cgroup + len(leftovers)


def is_standby(proc: psutil.Process) -> bool:
    """The app's pre-started trainer (engine.run.standby): a supervisor never ends it."""
    try:
        return "engine.run.standby" in proc.cmdline()
    except psutil.Error:
        return False


def _reap_orphans() -> None:
    """Collect the exit status of re-parented descendants that ended (no zombies left)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def child_setup(parent_pid: int, cap_mb: int = 0, cgroup: Path | None = None):
    """A preexec_fn for a trainer: die with `parent_pid`, the memory cap if any, and into
    the run's cgroup if it has one (make_run_cgroup)."""
    cap = memory_cap(cap_mb)

    def apply() -> None:  # runs in the child between fork and exec
        join_cgroup(cgroup)
        die_with_parent(parent_pid)
        if cap is not None:
            cap()

    return apply


SYS_CGROUP = Path("/sys/fs/cgroup")
PROC = Path("/proc")


def cgroup_oom_kills(pid: int | str = "self", sys_cgroup: Path = SYS_CGROUP,
                     proc: Path = PROC) -> tuple[str, int] | None:
    """(where, count): the kernel's OOM-kill count for `pid`, read from its memory cgroup
    (v2 memory.events, else v1 memory.oom_control), else the machine's (/proc/vmstat);
    None where none can be read. A SIGKILLed trainer is said to be the OOM killer's victim
    only when this count rose while it ran: a kill by a user or another process is not
    an OOM."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        _hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        relative = path.strip().lstrip("/")
        if controllers == "":  # v2 (unified); the root cgroup has no memory.events
            found = _count_in("cgroup v2", "memory.events", sys_cgroup / relative,
                              sys_cgroup / "unified" / relative)
        elif "memory" in controllers.split(","):  # v1: its own hierarchy
            # inside a container without a cgroup namespace its own cgroup is the mount's root
            found = _count_in("cgroup v1", "memory.oom_control", sys_cgroup / "memory" / relative,
                              sys_cgroup / "memory")
        else:
            continue
        if found is not None:
            return found
    return _count_in("machine", "vmstat", proc)


def _count_in(where: str, filename: str, *folders: Path) -> tuple[str, int] | None:
    """The `oom_kill N` row of the first `folder/filename` that has one."""
    for folder in folders:
        try:
            text = (folder / filename).read_text(encoding="utf-8")
        except OSError:
            continue
        for row in text.splitlines():
            key, _, value = row.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return where, int(value)
    return None


def signal_name(sig: int) -> str:
    """SIGKILL for 9; the number itself for a signal Python does not name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def sigkill_cause(oom_kills_before: tuple[str, int] | None) -> str:
    """What a SIGKILL's reason may add, from evidence only: the OOM killer when the
    cgroup's count rose, nothing when it cannot be told."""
    now = cgroup_oom_kills()
    if oom_kills_before is None or now is None or now[0] != oom_kills_before[0]:
        return ""
    where, count = now
    if count <= oom_kills_before[1]:
        return " (not the kernel's OOM killer: a user or another process sent it)"
    if where == "machine":  # no cgroup count: the machine's says only that one happened
        return (" (the kernel's OOM killer ended a process on this machine meanwhile "
                "(/proc/vmstat oom_kill rose): most likely this one)")
    return f" (the kernel's OOM killer: the oom_kill count of this memory cgroup ({where}) rose)"


STORAGE_WORDS = ("database or disk is full", "No space left on device", "disk I/O error")


def storage_problem_in(log_tail: str) -> str | None:
    """A full or failing disk named in a process's last output, in plain words."""
    lowered = log_tail.lower()
    if any(words.lower() in lowered for words in STORAGE_WORDS):
        return "the data directory's disk is full or failing: free space there, then re-run"
    return None


def kill_if_ours(pid: int | None, create_time: float | None) -> bool:
    """SIGKILL `pid` when it is still the process we recorded (same create time)."""
    if not pid or create_time is None or not is_alive(pid, create_time):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` runs (zombies do not count)."""
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                return True
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return False


# ---------------------------------------------------------------------------------------
# a run's own cgroup: its processes in reach whatever they do
#
# The subreaper and the environment marks find a workload's processes only while their
# reaper lives and while they keep the marks: a daemon that double-forks and scrubs its
# environment escapes both once the supervisor and the trainer are SIGKILLed. A cgroup
# holds every descendant whatever it does (fork, setsid, exec, a new environment), and is
# ended as a whole. Where this machine lets the user make one: cgroup v2, else v1's
# freezer; the folder's path is kept in runs/<id>/cgroup, so whoever ends the run (the
# supervisor, or reconcile after it died) finds it.

RUN_CGROUP_FILE = "cgroup"  # in the run's folder: the path of the run's cgroup
CGROUP_PARENT = "precision-lab"  # beside this process's own cgroup, one folder per run
PROC_MOUNTS = Path("/proc/self/mounts")
PROC_CGROUP = Path("/proc/self/cgroup")


def _cgroup_mounts() -> tuple[Path | None, Path | None]:
    """(the cgroup v2 mount, the v1 freezer mount), each None when absent."""
    v2 = freezer = None
    try:
        lines = PROC_MOUNTS.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        where, kind, options = Path(fields[1]), fields[2], fields[3].split(",")
        if kind == "cgroup2" and v2 is None:
            v2 = where
        elif kind == "cgroup" and "freezer" in options and freezer is None:
            freezer = where
    return v2, freezer


def _own_cgroup(hierarchy: str) -> str:
    """This process's cgroup path in the v2 hierarchy ("") or a v1 controller's."""
    try:
        for line in PROC_CGROUP.read_text().splitlines():
            number, controllers, path = line.split(":", 2)
            if (hierarchy == "" and number == "0") or hierarchy in controllers.split(","):
                return path.lstrip("/")
    except (OSError, ValueError):
        pass
    return ""


def run_cgroup_parent() -> tuple[Path | None, str]:
    """Where runs' cgroups go on this machine: (folder, "cgroup v2" | "cgroup v1 freezer"),
    or (None, why not). Made if missing: the answer is whether it can be."""
    v2, freezer = _cgroup_mounts()
    problems = []
    for mount, kind, hierarchy in ((v2, "cgroup v2", ""), (freezer, "cgroup v1 freezer",
                                                           "freezer")):
        if mount is None:
            problems.append(f"no {kind} mount")
            continue
        parent = mount / _own_cgroup(hierarchy) / CGROUP_PARENT
        try:
            parent.mkdir(exist_ok=True)
        except OSError as exc:
            problems.append(f"{kind} at {mount}: {parent} cannot be made "
                            f"({exc.strerror or exc})")
            continue
        if os.access(parent / "cgroup.procs", os.W_OK):
            return parent, kind
        problems.append(f"{kind}: {parent}/cgroup.procs is not writable")
    return None, "; ".join(problems) or "no cgroup file system"


def make_run_cgroup(run_dir: Path, run_id: str) -> Path | None:
    """The run's cgroup (made, its path written to runs/<id>/cgroup), or None where the
    machine does not allow one (engine doctor says why)."""
    parent, _kind = run_cgroup_parent()
    if parent is None:
        return None
    group = parent / run_id
    try:
        group.mkdir(exist_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_CGROUP_FILE).write_text(str(group) + "\n")
    except OSError:
        return None
    return group


def run_cgroup(run_dir: Path) -> Path | None:
    """The run's cgroup recorded in its folder, when it still exists."""
    try:
        group = Path((run_dir / RUN_CGROUP_FILE).read_text().strip())
    except OSError:
        return None
    # Only a folder of ours: the file is in the data directory, not a place to trust blindly.
    if group.name and group.parent.name == CGROUP_PARENT and (group / "cgroup.procs").is_file():
        return group
    return None


def join_cgroup(group: Path | None) -> bool:
    """Move the calling process into `group`; its later children follow. Safe between
    fork and exec (one write)."""
    if group is None:
        return False
    try:
        fd = os.open(group / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def cgroup_pids(group: Path) -> list[int]:
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def end_cgroup(group: Path | None, timeout_s: float = 5.0) -> int:
    """SIGKILL every process in `group` and remove it; how many there were. The caller is
    never in it (a supervisor starts its trainer there, it does not join). v2 with
    cgroup.kill: one write; else the group is frozen first (v2's cgroup.freeze, v1's
    freezer.state), so nothing forks between the list and the kill, then thawed for the
    SIGKILLs to be delivered."""
    import time

    if group is None or not group.is_dir():
        return 0
    pids = [pid for pid in cgroup_pids(group) if pid != os.getpid()]
    if pids:
        if (group / "cgroup.kill").exists():
            _write(group / "cgroup.kill", "1")
        else:
            freeze, frozen, thawed = ((group / "cgroup.freeze", "1", "0")
                                      if (group / "cgroup.freeze").exists() else
                                      (group / "freezer.state", "FROZEN", "THAWED"))
            _write(freeze, frozen)
            for pid in cgroup_pids(group):
                if pid != os.getpid():
                    pids += [] if pid in pids else [pid]
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            _write(freeze, thawed)
    deadline = time.monotonic() + timeout_s
    # Nothing is reaped here: a waitpid would take the exit status of a child the caller
    # waits for itself (a subreaper collects its orphans in end_descendants).
    while True:
        try:
            group.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:  # EBUSY: a process still dying or not yet collected
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    return len(pids)


def _write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(text)
