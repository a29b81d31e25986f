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


# -- TensorBoard: a note is text, a full disk is one line ------------------------------------
def _run_with_hostile_note(store: Store) -> str:
    run_id = store.create_run(RunConfig(model="mlp"), "cpu")
    store.write_metrics(run_id, [{"step": i, "loss": 1.0 / i} for i in range(1, 50)])
    store.set_status(run_id, FINISHED)
    store.set_note(run_id, "see ![chart](http://example.invalid/x.png) and <img src=x>")
    store.set_tags(run_id, {"link": "[click](javascript:alert(1))"})
    return run_id


@pytest.mark.slow  # TensorBoard's import starts processes
def test_tensorboard_text_shows_the_note_and_tags_as_text_not_markdown(home, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard import plugin_util
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from engine.report.tensorboard_export import export_to_tensorboard

    store = Store(home)
    run_id = _run_with_hostile_note(store)
    folder = export_to_tensorboard(store, run_id, tmp_path / "tb")
    accumulator = EventAccumulator(str(folder), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    assert len(accumulator.Scalars("loss")) == 49
    text = accumulator.Tensors("precision_lab/run")[0].tensor_proto.string_val[0].decode()
    html = plugin_util.markdown_to_safe_html(text)
    assert "<img" not in html and "<a " not in html and "<pre><code>" in html
    assert "example.invalid/x.png" in html  # shown, as text


@pytest.mark.slow
def test_tensorboard_export_on_a_full_disk_is_one_line_and_leaves_no_event_file(
        home, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from conftest import mounted_tmpfs

    from engine.cli.main import main

    store = Store(home)
    run_id = _run_with_hostile_note(store)
    with mounted_tmpfs(tmp_path / "small", "1m") as small:
        try:  # the disk fills to the last block
            with open(small / "filler", "wb") as handle:
                while True:
                    handle.write(b"\0" * 4096)
                    handle.flush()
        except OSError:
            pass
        assert main(["export", run_id, "--tensorboard", str(small / "tb")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "No space left on device" in err and "free space there" in err
        assert not list((small / "tb").rglob("events.out.tfevents.*"))
