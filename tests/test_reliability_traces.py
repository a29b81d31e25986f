"""Traces that are not what they seem: the plain-JSON fallback under the event cap, files
that are not traces named by their kind (never their bytes)."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pytest

from engine.traces import parser
from engine.traces.parser import TraceTooLarge, load_trace
from engine.traces.reader import MAX_EVENTS_ENV


def _fallback_trace(path, events: int) -> None:
    """A trace the streaming reader hands to the plain path (its event list starts with a
    number), holding `events` kernel events."""
    with open(path, "w") as handle:
        handle.write('{"traceEvents": [1')
        for i in range(events):
            handle.write(',{"ph":"X","cat":"kernel","name":"k%d","ts":%d,"dur":1,"pid":0,'
                         '"tid":7,"args":{"correlation":%d,"device":0,"stream":7}}'
                         % (i % 50, i, i))
        handle.write("]}")


def _plain_peak_bytes(path) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        parser._parse_plain(str(path), str(path))
        error = None
    except TraceTooLarge as exc:
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, error


def test_the_plain_fallback_stops_at_the_event_cap_not_after_every_event(tmp_path,
                                                                          monkeypatch):
    path = tmp_path / "crafted.json"
    _fallback_trace(path, 100_000)
    monkeypatch.setenv(MAX_EVENTS_ENV, str(10**9))
    whole_peak, error = _plain_peak_bytes(path)
    assert error is None
    monkeypatch.setenv(MAX_EVENTS_ENV, "100")
    capped_peak, error = _plain_peak_bytes(path)
    assert isinstance(error, TraceTooLarge) and "more than 100" in str(error)
    # Refused with the text in memory but without the 100,000 kept events: well under the
    # whole decode (before, the cap applied after every event was built: the same peak).
    assert capped_peak < 0.75 * whole_peak, (capped_peak, whole_peak)
    with pytest.raises(TraceTooLarge, match="more than 100"):  # and through the front door
        load_trace(path)


@pytest.mark.parametrize(("content", "kind"), [
    (b"\x89PNG\r\n\x1a\n" + bytes(200), "a PNG image"),
    (b"root:*:0:0:root:/root:/bin/sh\ndaemon:*:1:1::/:\n", "plain text"),
    (bytes(range(256)) * 4, "binary data"),
    (b"%PDF-1.7\n", "a PDF document"),
])
def test_a_file_that_is_not_a_trace_is_named_by_its_kind_never_its_bytes(tmp_path, content,
                                                                         kind):
    for name, data in (("x.json", content), ("x.json.gz", gzip.compress(content))):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ValueError) as raised:
            load_trace(path)
        message = str(raised.value)
        assert kind in message and "not a profiler trace" in message
        assert "b'" not in message and "root:" not in message and "PNG\\r" not in message
        assert json.dumps(message)  # one line of text
