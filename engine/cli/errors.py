"""How the command line says no: exit codes, the one-line UsageError, the parser that
raises it, and the flag names a field's error is reported under.

Contract (scripts depend on it): invalid input exits 2 with one line on stderr naming
the field, the value and the fix.
"""

from __future__ import annotations

import argparse
import copy
import os
import re

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2
# `speedup --require`: no requirement failed, yet one could not be judged (busy, too wide)
EXIT_INCONCLUSIVE = 3

_FLAG_ALIASES = {"grad_scaler_init_scale": "--init-scale",
                 "grad_scaler_growth_interval": "--growth-interval"}
_EXPECTED = {int: "a whole number, e.g. 2", float: "a number, e.g. 0.001"}
# Plain ASCII numbers only: Python's int()/float() also take " 5 ", "1_0" and other
# scripts' digits ("٣"), which a flag must not silently accept.
_NUMBER_RE = {int: re.compile(r"[+-]?[0-9]+", re.ASCII),
              float: re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
                                re.ASCII)}
MAX_SHOWN_CHARS = 80  # of a value repeated in an error line


def shown(value) -> str:
    """`value` as an error line repeats it: its repr, cut to MAX_SHOWN_CHARS (with the
    length) so a pasted 100 kB value is not echoed in full."""
    text = repr(value)
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return f"{text[:MAX_SHOWN_CHARS]}... ({len(text)} characters)"


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


# A lone "%" in a help text ("95 % intervals") is literal; "%%" and "%(default)s" are
# argparse's own. argparse %-formats every help string, so a lone "%" crashed `--help`.
_HELP_PERCENT_RE = re.compile(r"%%|%\(|%")


def escape_help_percent(text: str) -> str:
    """`text` with each literal "%" doubled for argparse; "%%" and "%(name)s" kept."""
    return _HELP_PERCENT_RE.sub(lambda m: "%%" if m.group() == "%" else m.group(), text)


class _PercentSafeFormatter(argparse.HelpFormatter):
    def _expand_help(self, action: argparse.Action) -> str:
        if action.help:
            action = copy.copy(action)
            action.help = escape_help_percent(action.help)
        return super()._expand_help(action)


class Parser(argparse.ArgumentParser):
    """Every CLI parser: errors as one line (exit 2), help that any text can go into."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _PercentSafeFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, no usage dump, exit 2
        raise UsageError(message)


def flag_for(field_name: str) -> str:
    """The CLI flag of a RunConfig field (what an error about that field names)."""
    return _FLAG_ALIASES.get(field_name, "--" + field_name.replace("_", "-"))


def typed(kind: type, flag: str):
    """An argparse `type=` that names the flag and what was expected when it fails."""
    def convert(text: str):
        pattern = _NUMBER_RE.get(kind)
        try:
            if pattern is not None and not pattern.fullmatch(text):
                raise ValueError(text)
            return kind(text)
        except ValueError:
            expected = _EXPECTED.get(kind, f"a {kind.__name__}")
            raise argparse.ArgumentTypeError(f"{flag} {shown(text)}: expected {expected}") from None
    convert.__name__ = kind.__name__
    return convert


PATH_MAX_BYTES, NAME_MAX_BYTES = 4096, 255  # Linux's limits on a path and on one name


def path_problem(text: str) -> str | None:
    """Why `text` cannot name a file at all (before any file call raises on it), or None."""
    if not text.strip():
        return "empty"
    if "\x00" in text:
        return "holds a NUL character, which no file name can"
    encoded = os.fsencode(text)
    if len(encoded) > PATH_MAX_BYTES or any(len(part) > NAME_MAX_BYTES
                                            for part in encoded.split(b"/")):
        return (f"too long ({PATH_MAX_BYTES} bytes in all and {NAME_MAX_BYTES} per name at "
                "most)")
    return None


def checked_path_text(text: str, flag: str, example: str, what: str = "a file name") -> str:
    """`text` when it can name a file; else a UsageError naming the flag and an example."""
    problem = path_problem(text)
    if problem:
        raise UsageError(f"{flag} {shown(text)}: {problem}; give {what}, e.g. {example}")
    return text
