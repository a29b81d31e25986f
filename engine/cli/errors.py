"""How the command line says no: exit codes, the one-line UsageError, the parser that
raises it, and the flag names a field's error is reported under.

Contract (scripts depend on it): invalid input exits 2 with one line on stderr naming
the field, the value and the fix.
"""

from __future__ import annotations

import argparse

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2

_FLAG_ALIASES = {"grad_scaler_init_scale": "--init-scale",
                 "grad_scaler_growth_interval": "--growth-interval"}
_EXPECTED = {int: "a whole number, e.g. 2", float: "a number, e.g. 0.001"}


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump, exit 2
        raise UsageError(message)


def flag_for(field_name: str) -> str:
    """The CLI flag of a RunConfig field (what an error about that field names)."""
    return _FLAG_ALIASES.get(field_name, "--" + field_name.replace("_", "-"))


def typed(kind: type, flag: str):
    """An argparse `type=` that names the flag and what was expected when it fails."""
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            expected = _EXPECTED.get(kind, f"a {kind.__name__}")
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected {expected}") from None
    convert.__name__ = kind.__name__
    return convert
