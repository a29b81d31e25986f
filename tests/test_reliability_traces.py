"""Traces that are not what they seem: the plain-JSON fallback under the event cap, files
that are not traces named by their kind (never their bytes)."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from engine.traces import parser
from engine.traces.parser import TraceTooLarge, load_trace
from engine.traces.reader import MAX_EVENTS_ENV
from engine.traces.sets import analyze_set, set_members


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


# -- trace sets: links that lead outside, one rank twice ---------------------------------------
RANK_SET = Path(__file__).resolve().parent / "data" / "traces" / "rank_set_hta"


def _rank_trace(path: Path, rank: int | None, source: str = "rank-0.json.gz") -> Path:
    with gzip.open(RANK_SET / source, "rt") as handle:
        data = json.load(handle)
    if rank is None:
        data.pop("distributedInfo", None)
    else:
        data["distributedInfo"] = {**data["distributedInfo"], "rank": rank}
    with gzip.open(path, "wt") as handle:
        json.dump(data, handle)
    return path


def test_a_folders_symbolic_link_to_a_file_elsewhere_is_refused_naming_the_link(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    _rank_trace(folder / "rank-0.json.gz", 0)
    secret = tmp_path / "elsewhere" / "passwd"
    secret.parent.mkdir()
    secret.write_text("root:*:0:0:root:/root:/bin/sh\n")
    (folder / "rank-1.json").symlink_to(secret)
    with pytest.raises(ValueError) as raised:
        analyze_set(set_members([folder]))
    message = str(raised.value)
    assert str(folder / "rank-1.json") in message and "outside the folder" in message
    assert "root:" not in message


def test_a_symbolic_link_inside_the_folder_is_read(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    _rank_trace(folder / "rank-0.json.gz", 0)
    _rank_trace(folder / "real-1.data", 1)
    (folder / "rank-1.json.gz").symlink_to(folder / "real-1.data")
    assert analyze_set(set_members([folder]))["rank_count"] == 2


def test_two_traces_saying_the_same_rank_are_refused_naming_both(tmp_path):
    first = _rank_trace(tmp_path / "a.json.gz", 1)
    second = _rank_trace(tmp_path / "b.json.gz", 1, "rank-1.json.gz")
    with pytest.raises(ValueError) as raised:
        analyze_set(set_members([first, second]))
    message = str(raised.value)
    assert "two traces of rank 1" in message
    assert str(first) in message and str(second) in message


def test_two_files_named_for_the_same_rank_are_refused_naming_both(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    first = _rank_trace(tmp_path / "x" / "worker3.json.gz", None)
    second = _rank_trace(tmp_path / "y" / "worker3.json.gz", None, "rank-1.json.gz")
    with pytest.raises(ValueError) as raised:
        analyze_set(set_members([first, second]))
    assert str(first) in str(raised.value) and str(second) in str(raised.value)


def test_a_zip_with_one_name_in_two_folders_is_refused_naming_both(tmp_path):
    archive = tmp_path / "job.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.write(_rank_trace(tmp_path / "r0.json.gz", 0), "node1/rank-0.json.gz")
        handle.write(_rank_trace(tmp_path / "r1.json.gz", 1), "node2/rank-0.json.gz")
    with pytest.raises(ValueError) as raised:
        analyze_set(set_members([archive]))
    message = str(raised.value)
    assert "node1/rank-0.json.gz" in message and "node2/rank-0.json.gz" in message
