"""Exports against slow or broken destinations: an MLflow server that answers one byte at
a time is given a bound for the whole request, not for each read."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from engine.config import RunConfig
from engine.schema import FINISHED
from engine.store import Store


class TrickleServer:
    """HTTP on loopback: /health answers at once; every other path answers one byte every
    `byte_every_s` (a socket timeout per read never trips)."""

    def __init__(self, byte_every_s: float = 0.5, health_at_once: bool = True):
        self.health_at_once = health_at_once
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.byte_every_s = byte_every_s
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            request = conn.recv(65536)
            body = b'{"status": "OK"}'
            reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
            if self.health_at_once and request.startswith(b"GET /health"):
                conn.sendall(reply)
                return
            for byte in reply:
                if self.stop.wait(self.byte_every_s):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        self.listener.close()


@pytest.fixture
def trickle():
    server = TrickleServer()
    yield server
    server.close()


def test_a_health_check_that_trickles_ends_within_its_bound():
    from engine.report.mlflow_export import TrackingServerUnreachable, check_tracking_server

    slow = TrickleServer(health_at_once=False)
    try:
        started = time.monotonic()
        with pytest.raises(TrackingServerUnreachable, match="did not answer within 1 s"):
            check_tracking_server(slow.uri, 1.0)
        assert time.monotonic() - started < 4.0
    finally:
        slow.close()


@pytest.mark.slow  # importing mlflow runs `uname -p`
def test_an_mlflow_export_to_a_server_answering_one_byte_at_a_time_ends_within_its_bound(
        home, trickle):
    pytest.importorskip("mlflow")
    from engine.report.mlflow_export import TrackingServerUnreachable, export_to_mlflow

    store = Store(home)
    run_id = store.create_run(RunConfig(model="mlp"), "cpu")
    store.set_status(run_id, FINISHED)
    started = time.monotonic()
    with pytest.raises(TrackingServerUnreachable) as raised:
        export_to_mlflow(store, run_id, trickle.uri, timeout_s=1.0)
    took_s = time.monotonic() - started
    assert trickle.uri in str(raised.value) and "within 4 s" in str(raised.value)
    assert took_s < 12.0, took_s  # the request's bound (and mlflow's import), not minutes
