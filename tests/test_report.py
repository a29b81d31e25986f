"""engine.report.html / engine.cli.report: one self-contained HTML file per export, from real
tiny CPU runs; every system- or user-produced string escaped."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _real_runs import record_run, tiny_config
from conftest import REPO_ROOT, cli_env

from engine.store import Store

HOSTILE = "<script>alert('x')</script>"
PLOTLY_BLOCK = re.compile(r"<script id=plotly-js>(.*?)</script>", re.S)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Two real finished runs and one failed run whose device name and reason hold markup
    (the store accepts any text there: device names come from the system, reasons from
    exception messages)."""
    home = tmp_path_factory.mktemp("report_lab")
    store = Store(home)
    ids = [record_run(store, tiny_config("fp32", steps=6)),
           record_run(store, tiny_config("bf16-amp", steps=6)),
           record_run(store, tiny_config("fp16-amp", steps=6, loss_scaling=False),
                      device_name=f"{HOSTILE} CPU", status="failed",
                      reason=f"RuntimeError: {HOSTILE} <b>boom</b>")]
    return home, store, ids


def _outside_plotly(text: str) -> str:
    return PLOTLY_BLOCK.sub("", text)


def assert_self_contained(text: str, run_ids: list[str]) -> None:
    bundles = PLOTLY_BLOCK.findall(text)
    assert len(bundles) == 1, "plotly.js must be inlined exactly once"
    assert "plotly.js v" in bundles[0][:200] and len(bundles[0]) > 1_000_000
    # Nothing is fetched: no external scripts, stylesheets, images or frames.
    assert not re.search(r"<script[^>]*\bsrc\s*=", text, re.I)
    assert not re.search(r"<(link|img|iframe)\b", _outside_plotly(text), re.I)
    # Outside the bundle there are no URLs at all; inside it (attribution links plotly
    # never loads for these charts) nothing is loaded from http(s).
    assert not re.search(r"https?://", _outside_plotly(text))
    assert not re.search(r"""\bsrc\s*=\s*["']?https?:""", text, re.I)
    assert not re.search(r"""url\(\s*["']?https?:""", text, re.I)
    assert text.count("Plotly.newPlot(") == 3  # loss, throughput, memory
    for run_id in run_ids:
        assert run_id in text


def test_export_html_is_self_contained_and_escaped(lab, tmp_path):
    from engine.report.html import export_html

    _home, store, ids = lab
    path = export_html(store, ids, tmp_path / "report.html")
    text = path.read_text(encoding="utf-8")
    assert_self_contained(text, ids)
    assert HOSTILE not in text and "<b>boom</b>" not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; CPU" in text  # device name
    assert "&lt;b&gt;boom&lt;/b&gt;" in text  # reason
    for section in ("Devices", "Findings", "Summary", "Charts", "Config differences"):
        assert f"<h2>{section}" in text
    assert "Baseline fp32:" in text  # findings are in
    assert "fp16-amp without loss scaling" in text  # the variant is named in the table
    assert "<td>loss_scaling</td>" in text  # config diff lists the differing field
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, no leftovers


def test_export_html_rejects_unknown_runs(lab, tmp_path):
    from engine.report.html import export_html
    from engine.store import RunNotFound

    _home, store, ids = lab
    with pytest.raises(RunNotFound):
        export_html(store, [ids[0], "no-such-run"], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def _run_export_in_process(argv: list[str]) -> tuple[int, str]:
    """The `export` subcommand through its own parser (only that command group)."""
    from engine.cli import errors
    from engine.cli import report as cli_report

    parser = errors.Parser(prog="python -m engine")
    cli_report.add_subparsers(parser.add_subparsers(dest="command", required=True,
                                                    parser_class=errors.Parser))
    try:
        args = parser.parse_args(argv)
        return args.func(args), ""
    except errors.UsageError as exc:
        return errors.EXIT_USAGE, str(exc)


def test_export_command_in_process(lab, tmp_path, monkeypatch, capsys):
    home, _store, ids = lab
    monkeypatch.setenv("PRECISION_LAB_HOME", str(home))
    out = tmp_path / "r.html"
    code, _ = _run_export_in_process(["export", *ids[:2], "--html", str(out), "--json"])
    assert code == 0 and out.exists()
    assert str(out) in capsys.readouterr().out.strip().splitlines()[-1]
    code, message = _run_export_in_process(["export", "bad id!", "--html", str(out)])
    assert code == 2 and message.startswith("RUN_ID 'bad id!'")
    code, message = _run_export_in_process(["export", "no-such-run", "--html", str(out)])
    assert code == 2 and "RUN_ID 'no-such-run': no such run" in message
    code, message = _run_export_in_process(["export", ids[0], "--html",
                                            str(tmp_path / "missing" / "r.html")])
    assert code == 2 and message.startswith("--html") and "does not exist" in message
    code, message = _run_export_in_process(["export", ids[0], "--html", str(tmp_path)])
    assert code == 2 and "is a directory" in message
    code, message = _run_export_in_process(["export", ids[0], "--html", str(out),
                                            "--baseline", ids[1]])
    assert code == 2 and message.startswith("--baseline")


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=str(REPO_ROOT),
                          env=cli_env(home), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_export_command_end_to_end(lab, tmp_path):
    home, _store, ids = lab
    out = tmp_path / "cli-report.html"
    result = _cli(home, "export", *ids, "--html", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    assert_self_contained(out.read_text(encoding="utf-8"), ids)

    bad = _cli(home, "export", "no-such-run", "--html", str(out))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "RUN_ID 'no-such-run'" in bad.stderr
    unwritable = _cli(home, "export", ids[0], "--html", str(tmp_path / "nope" / "r.html"))
    assert unwritable.returncode == 2 and len(unwritable.stderr.strip().splitlines()) == 1
    assert unwritable.stderr.startswith("error: --html")
