"""Shared fixtures: a private data directory per test, the store on it, the CLI as a
subprocess, and a poller for things that happen in other processes.

Every test gets its own PRECISION_LAB_HOME (set in os.environ, so the CLI and the
worker processes it starts use it too). At teardown, any worker still active in that
home is killed by its own process-group id: a failing test must not leave trainers
eating the two CI cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # `pytest` run from elsewhere still imports this checkout
    sys.path.insert(0, str(REPO_ROOT))

HOME_ENV = "PRECISION_LAB_HOME"
# No pre-started trainers unless a test asks for one (tests/test_standby.py): each
# holds PyTorch in memory for up to 30 minutes after the test that made it.
os.environ["PRECISION_LAB_STANDBY"] = "0"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: starts real worker processes or trains; still part of CI")
    config.addinivalue_line(
        "markers", "fast: the tier to run while working (python -m pytest -m fast): every "
        "test not marked slow or browser; it starts no process")


# ---------------------------------------------------------------------------------------
# AppTest: Streamlit's component scan once per session, not once per AppTest


@pytest.fixture(autouse=True, scope="session")
def _component_manifests_scanned_once():
    """Each new AppTest scans every installed distribution's metadata for Streamlit
    components (about 1 s per AppTest here, with Ray and MLflow's ~170 packages, hundreds
    of AppTests in the suite). The installed set does not change during a session, so
    the real scan runs once and its answer is reused; pages still run in a real AppTest."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # an older or newer Streamlit without the scan: nothing to keep
        yield
        return
    real_scan = manifest_scanner.scan_component_manifests
    found: list = []

    def scan_once(max_workers=None):
        if not found:
            found.append(real_scan(max_workers))
        return list(found[0])

    patch = pytest.MonkeyPatch()
    patch.setattr(manifest_scanner, "scan_component_manifests", scan_once)
    yield
    patch.undo()


# ---------------------------------------------------------------------------------------
# the fast tier: every test not marked slow or browser, and such a test starts no process


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(name) for name in ("slow", "browser")):
            item.add_marker(pytest.mark.fast)


# nodeid of the fast test now running, and what it started (a process is a reason to be slow)
_FAST_TEST: dict[str, Any] = {"nodeid": None, "started": []}


def _note_fork() -> None:
    if _FAST_TEST["nodeid"] is not None:
        _FAST_TEST["started"].append(f"os.fork() (pid {os.getpid()})")


os.register_at_fork(before=_note_fork)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test in the fast tier that starts a process (subprocess, multiprocessing, a fork)
    or a torch.distributed process group fails, naming what it started: such a test belongs
    in the slow tier. A process start is what makes a test take seconds here (interpreter
    start-up, torch import); a process group brings threads of its own, and ending one
    (a gloo group's destructor joining them) has hung the whole session."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    execute_child = subprocess.Popen._execute_child

    def noted_execute_child(popen, args, *rest, **kwargs):
        _FAST_TEST["started"].append(" ".join(map(str, args if isinstance(args, (list, tuple))
                                                  else [args]))[:160])
        return execute_child(popen, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", noted_execute_child)
    group_before = _note_process_groups(monkeypatch)
    _FAST_TEST.update(nodeid=request.node.nodeid, started=[])
    try:
        yield
    finally:
        if not group_before and _process_group_initialized():
            _FAST_TEST["started"].append("a torch.distributed process group (still open)")
        started, _FAST_TEST["nodeid"] = list(_FAST_TEST["started"]), None
    assert not started, (f"this test started {len(started)} process(es) or process group(s) "
                         f"({started[0]}): mark it @pytest.mark.slow (the fast tier starts "
                         "none)")


def _note_process_groups(monkeypatch: pytest.MonkeyPatch) -> bool:
    """Note every torch.distributed process group made during the test (init_process_group
    and new_group both make theirs in c10d's `_new_process_group_helper`). torch is not
    imported for this: a test that loads it itself is caught at its end by a group still
    initialized. Returns whether a group was initialized before the test."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return False
    name = ("_new_process_group_helper" if hasattr(c10d, "_new_process_group_helper")
            else "init_process_group")
    make_group = getattr(c10d, name)

    def noted_make_group(*args, **kwargs):
        _FAST_TEST["started"].append(f"a torch.distributed process group ({name})")
        return make_group(*args, **kwargs)

    monkeypatch.setattr(c10d, name, noted_make_group)
    if name == "init_process_group":  # `dist.init_process_group` is the package's name for it
        monkeypatch.setattr(sys.modules["torch.distributed"], name, noted_make_group)
    return _process_group_initialized()


def _process_group_initialized() -> bool:
    distributed = sys.modules.get("torch.distributed")
    return bool(distributed is not None and distributed.is_available()
                and distributed.is_initialized())


# ---------------------------------------------------------------------------------------
# polling


def wait_for(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.05,
             message: str | Callable[[], str] | None = None) -> Any:
    """Call `predicate` until it returns something truthy; return that value.

    Raises AssertionError after `timeout_s` (with `message`, which may be a callable so
    it can describe the state at the moment of failure, e.g. the worker log).
    """
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout_s:.1f}s waiting for "
                                 f"{text or getattr(predicate, '__name__', 'condition')}; "
                                 f"last value: {last!r}")
        time.sleep(interval_s)


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    return wait_for


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in process group `pgid`."""
    import psutil

    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                return True
        except (OSError, psutil.Error):
            continue
    return False


@pytest.fixture(name="group_alive")
def group_alive_fixture() -> Callable[[int], bool]:
    return group_alive


# ---------------------------------------------------------------------------------------
# data directory and store


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh data directory, exported as PRECISION_LAB_HOME for this process and children."""
    path = tmp_path / "lab_home"
    monkeypatch.setenv(HOME_ENV, str(path))
    yield path
    _kill_active_workers(path)
    _shutdown_standby(path)


def _shutdown_standby(path: Path) -> None:
    from engine.run import standby

    standby.shutdown(path)


@pytest.fixture
def store(home: Path):
    from engine.store import Store

    return Store(home)


def _kill_active_workers(path: Path) -> None:
    """SIGKILL the process group of every run still active in this test's store.

    Only groups this test's workers lead: the supervisor pid with its recorded create
    time, or a trainer whose group is still that supervisor's (start_new_session).
    """
    from engine.schema import ACTIVE_STATUSES
    from engine.store import DB_FILENAME, Store

    if not (path / DB_FILENAME).exists():
        return
    try:
        runs = Store(path).list_runs(statuses=ACTIVE_STATUSES)
    except Exception:  # a test that corrupted its own store on purpose
        return
    for run in runs:
        if not run.pid:
            continue
        if _is_process(run.pid, run.pid_create_time) or _in_group(run.train_pid, run.pid):
            if run.pid != os.getpgid(0):  # never our own group
                try:
                    os.killpg(run.pid, signal.SIGKILL)
                except OSError:
                    pass


def _is_process(pid: int, create_time: float | None) -> bool:
    try:
        import psutil

        return (
            create_time is not None and abs(psutil.Process(pid).create_time() - create_time) <= 1.0
        )
    except Exception:
        return False


def _in_group(pid: int | None, pgid: int) -> bool:
    try:
        return bool(pid) and os.getpgid(pid) == pgid
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# one OpenMP thread per worker


def _set_one_thread_for_children(patch: pytest.MonkeyPatch) -> None:
    """Workers started from this process (launcher.start_worker copies os.environ) get one
    intra-op thread: on a shared 2-core box two OpenMP threads spinning against other
    load made an mlp-tiny step 20x slower (99 ms vs 4.5 ms measured), and these tests are
    about processes and records, not throughput.

    torch is imported first: its OpenMP runtime reads the variable when it loads, so this
    process keeps its own thread count whatever the tests set for their children.
    """
    import torch  # noqa: F401

    patch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def one_thread_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_one_thread_for_children(monkeypatch)


# ---------------------------------------------------------------------------------------
# several runs at once (module scope)


@pytest.fixture(scope="module")
def module_homes(tmp_path_factory: pytest.TempPathFactory):
    """`make(name)` -> a fresh data directory for a module-scoped fixture that starts
    several independent runs at once (one home each, so each has its own device queue).
    Nothing is exported: pass the path to Store()/the CLI helpers explicitly."""
    made: list[Path] = []

    def make(name: str) -> Path:
        path = tmp_path_factory.mktemp(name) / "lab_home"
        made.append(path)
        return path

    with pytest.MonkeyPatch.context() as patch:
        _set_one_thread_for_children(patch)
        yield make
    for path in made:
        _kill_active_workers(path)


# ---------------------------------------------------------------------------------------
# CLI


def cli_command(*args: Any) -> list[str]:
    return [sys.executable, "-m", "engine", *map(str, args)]


def cli_env(home: Path) -> dict[str, str]:
    """The environment for a `python -m engine ...` subprocess using data directory `home`."""
    env = dict(os.environ)
    env[HOME_ENV] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _one_thread_env(home: Path) -> dict[str, str]:
    env = cli_env(home)
    env["OMP_NUM_THREADS"] = "1"  # see _set_one_thread_for_children
    return env


@pytest.fixture
def cli(home: Path) -> Callable[..., subprocess.CompletedProcess]:
    """`cli("run", "--json", ...)` -> CompletedProcess of `python -m engine ...`."""

    def run_cli(*args: Any, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run(cli_command(*args), cwd=str(REPO_ROOT), env=_one_thread_env(home),
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    return run_cli


@pytest.fixture(scope="session")
def start_cli() -> Callable[..., subprocess.Popen]:
    """`start_cli(home, "run", ...)` -> Popen; several can run at once (2 cores)."""

    def start(home: Path, *args: Any) -> subprocess.Popen:
        return subprocess.Popen(cli_command(*args), cwd=str(REPO_ROOT), env=_one_thread_env(home),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)

    return start


@pytest.fixture(scope="session")
def finish_cli() -> Callable[..., subprocess.CompletedProcess]:
    """`finish_cli(popen, timeout)` -> CompletedProcess; kills the process on timeout."""

    def finish(proc: subprocess.Popen, timeout: float = 180.0) -> subprocess.CompletedProcess:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n[test] killed after {timeout:.0f} s"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    return finish


# ---------------------------------------------------------------------------------------
# a ready standby trainer


@pytest.fixture
def ready_standby(store, monkeypatch, wait_for):
    """A listening standby for this test's store; at teardown it and any successor end."""
    import psutil

    from engine.run import standby

    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    standby.ensure(store)
    pid = wait_for(lambda: standby.ping(store.home), 60, interval_s=0.2,
                   message="the standby to listen")
    yield pid
    standby.shutdown(store.home)
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "engine.run.standby" in cmdline and str(store.home) in cmdline:
            proc.kill()


@contextlib.contextmanager
def mounted_tmpfs(mount_point: Path, size: str):
    """A tmpfs of `size` ("2m") mounted at `mount_point` (made here) for the block, a disk
    that fills or is remounted read-only; the test skips, with the reason, where mounting
    is not allowed."""
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                           str(mount_point)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


# A 2 MiB tmpfs: a disk that fills (tests/test_full_disk.py, test_reliability_disk.py).
@pytest.fixture
def small_disk(tmp_path):
    with mounted_tmpfs(tmp_path / "small", "2m") as mount_point:
        yield mount_point
