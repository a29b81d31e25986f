"""The standby's socket has a public name: whoever listens there must be this user's own
standby, and the trainer it names must be its own child, or nothing is handed to it."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest

from engine.run import standby


class FakeStandby:
    """A listener on the data directory's standby socket that answers every request the
    way an impostor would: it names `victim_pid` as the trainer."""

    def __init__(self, home, victim_pid: int):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(standby.socket_name(home))
        self.listener.listen(4)
        self.victim_pid = victim_pid
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(json.dumps({"pid": self.victim_pid,
                                         "pong": self.victim_pid}).encode() + b"\n")

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=5)


def test_a_listener_naming_a_process_not_its_child_gets_no_run(home, monkeypatch, capsys):
    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    victim = os.getppid()  # pytest's parent: alive, and no child of the listener
    fake = FakeStandby(home, victim)
    try:
        assert standby.hand_off("20260101-000000-abcdef", home) is None
        assert "not its child" in capsys.readouterr().err
        # The pid `standby status` reports is the one at the other end of the socket.
        assert standby.ping(home) == os.getpid()
    finally:
        fake.close()


def test_a_listener_naming_pid_one_gets_no_run(home, monkeypatch):
    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    fake = FakeStandby(home, 1)
    try:
        assert standby.hand_off("20260101-000000-abcdef", home) is None
    finally:
        fake.close()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to listen as another user")
def test_a_listener_of_another_user_is_refused(home, monkeypatch, capsys):
    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    ready_read, ready_write = os.pipe()
    child = os.fork()
    if child == 0:  # another local user squatting on the socket's name
        try:
            os.setgid(65534)
            os.setuid(65534)
            fake = FakeStandby(home, os.getppid())
            os.write(ready_write, b"1")
            fake.thread.join(timeout=60)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_read, 1) == b"1"
        assert standby.hand_off("20260101-000000-abcdef", home) is None
        assert "held by uid 65534" in capsys.readouterr().err
        assert standby.ping(home) is None
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready_read)
        os.close(ready_write)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_app_stopped_mid_run_leaves_no_standby_behind(store, monkeypatch, wait_for):
    import subprocess
    import sys

    import psutil

    from engine.config import RunConfig
    from engine.run.launcher import launch
    from engine.schema import FINISHED

    monkeypatch.setenv(standby.ENABLE_ENV, "1")
    app = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        standby.want(store, app.pid)  # what the app's server does when it starts
        standby.ensure(store)
        wait_for(lambda: standby.ping(store.home), 90, interval_s=0.2,
                 message="the app's standby to listen")
        run_id = launch(RunConfig(model="mlp", batch_size=8, steps=40, profile=False,
                                  device="cpu"), store=store)
        wait_for(lambda: store.metrics_count(run_id) >= 1, 90, message="a first step")
        assert "from the standby" in (store.run_dir(run_id) / "worker.log").read_text()
    finally:
        app.kill()  # the app's server stops while the run trains
        app.wait()
    run = wait_for(lambda: (r := store.get_run(run_id)).status == FINISHED and r, 120,
                   message="the run to finish")
    wait_for(lambda: not psutil.pid_exists(run.pid), 30, message="the supervisor to exit")

    def standbys() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"])
                if "engine.run.standby" in (p.info["cmdline"] or [])
                and str(store.home) in (p.info["cmdline"] or [])
                and p.status() != psutil.STATUS_ZOMBIE]

    time.sleep(2.0)
    assert standby.ping(store.home) is None
    wait_for(lambda: not standbys(), 15, message=lambda: f"no standby left: {standbys()}")
    assert "no successor standby" in (store.run_dir(run_id) / "worker.log").read_text()
