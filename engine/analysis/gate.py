"""A speedup check as a CI gate: `--require 'bf16-amp>=1.3'` (speedup over the baseline)
and `--require-mem 'bf16-amp<=0.8'` (peak memory over the baseline's), judged on the
check's result as the CLI prints it (engine.cli.speedup.check_result).

A speed requirement passes only when the 95 % interval's lower end clears it (`>=`; for
`<=`, the upper end), fails when the whole interval is on the wrong side, and is
inconclusive when the interval straddles the bound (too wide: more budget narrows it),
has no interval yet, or the machine was busy (no figure measured under load is a claim).
A memory requirement compares the two peaks (one figure each, no interval). The gate:
0 when every requirement passes, 1 when one fails, 3 when none fails and one is
inconclusive.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from engine.analysis.speedup import mode_row
from engine.display import memory_text, memory_unit

GATE_PASS, GATE_FAIL, GATE_INCONCLUSIVE = 0, 1, 3
SPEED, MEMORY = "speedup", "memory"
_REQUIREMENT = re.compile(
    r"^\s*(?P<mode>[^<>=]+?)\s*(?P<op>>=|<=)\s*(?P<bound>[0-9]*\.?[0-9]+)\s*$"
)


class RequirementError(ValueError):
    """A requirement the user wrote that cannot be read: names the flag, the text, the fix."""


@dataclass(frozen=True)
class Requirement:
    kind: str    # SPEED | MEMORY
    mode: str    # a mode label of the check: "bf16-amp", "fp32 (2)"
    op: str      # ">=" | "<="
    bound: float

    @property
    def text(self) -> str:
        return f"{self.mode}{self.op}{self.bound:g}"


def parse_requirement(text: str, kind: str) -> Requirement:
    flag = "--require" if kind == SPEED else "--require-mem"
    match = _REQUIREMENT.match(text or "")
    if not match:
        raise RequirementError(f"{flag} {text!r}: write MODE>=RATIO or MODE<=RATIO, e.g. "
                               f"{flag} 'bf16-amp{'>=1.3' if kind == SPEED else '<=0.8'}'")
    bound = float(match.group("bound"))
    if not math.isfinite(bound) or bound <= 0:
        raise RequirementError(f"{flag} {text!r}: the ratio must be a positive number")
    return Requirement(kind, match.group("mode"), match.group("op"), bound)


def check_modes(requirements: list[Requirement], labels: list[str]) -> None:
    """Refuse, before anything runs, a requirement on a mode the check does not measure,
    or on its baseline (always 1.0)."""
    baseline, others = labels[0], labels[1:]
    for req in requirements:
        flag = "--require" if req.kind == SPEED else "--require-mem"
        if req.mode == baseline or req.mode not in others:
            raise RequirementError(
                f"{flag} {req.text!r}: {req.mode!r} is "
                f"{'the baseline' if req.mode == baseline else 'not a mode of this check'}; "
                f"require one of {', '.join(others)}")


@dataclass(frozen=True)
class Judgement:
    requirement: str
    kind: str
    outcome: str        # "pass" | "fail" | "inconclusive"
    words: str          # the figures it was judged on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge_requirement(req: Requirement, result: dict[str, Any]) -> Judgement:
    left_out = {entry.get("mode"): entry.get("reason") for entry in result.get("dropped") or []}
    if req.mode in left_out:  # its step could not fit the budget: not measured, why said
        return Judgement(req.text, req.kind, "inconclusive", str(left_out[req.mode]))
    row = mode_row(result, req.mode)
    if req.kind == MEMORY:
        return _judge_memory(req, row, mode_row(result, result.get("baseline")))
    if (result.get("contention") or {}).get("busy"):
        return Judgement(req.text, req.kind, "inconclusive",
                         "the machine was busy during the check: no speedup is claimed")
    low, high, ratio = row.get("ci_low"), row.get("ci_high"), row.get("speedup")
    if low is None or high is None:
        return Judgement(req.text, req.kind, "inconclusive",
                         f"no 95 % interval yet (too few rounds; speedup {_x(ratio)})")
    figures = f"speedup {_x(ratio)}, 95 % interval {low:.3f}-{high:.3f}"
    clears, misses = ((low >= req.bound, high < req.bound) if req.op == ">="
                      else (high <= req.bound, low > req.bound))
    if clears:
        return Judgement(req.text, req.kind, "pass", figures)
    if misses:
        return Judgement(req.text, req.kind, "fail", figures)
    return Judgement(req.text, req.kind, "inconclusive",
                     f"{figures} straddles {req.bound:g}: a longer --budget-s narrows it")


def _judge_memory(req: Requirement, row: dict, base: dict) -> Judgement:
    mine, theirs = row.get("peak_mem_bytes"), base.get("peak_mem_bytes")
    if not mine or not theirs:
        return Judgement(req.text, req.kind, "inconclusive", "the tensor peak was not measured")
    ratio = mine / theirs
    unit = memory_unit([mine, theirs])  # both in one unit, as a table column would be
    figures = (
        f"tensor peak {ratio:.3f}x the baseline's ({memory_text(mine, unit, with_unit=False)}"
        f" vs {memory_text(theirs, unit)})"
    )
    ok = ratio >= req.bound if req.op == ">=" else ratio <= req.bound
    return Judgement(req.text, req.kind, "pass" if ok else "fail", figures)


def gate(requirements: list[Requirement], result: dict[str, Any]) -> dict[str, Any]:
    """{"exit_code", "verdict", "requirements": [judgements]} for the check's result."""
    judgements = [judge_requirement(req, result) for req in requirements]
    outcomes = {j.outcome for j in judgements}
    code = (GATE_FAIL if "fail" in outcomes else GATE_INCONCLUSIVE if "inconclusive" in outcomes
            else GATE_PASS)
    verdict = {GATE_PASS: "passed", GATE_FAIL: "failed", GATE_INCONCLUSIVE: "inconclusive"}[code]
    return {"exit_code": code, "verdict": verdict,
            "requirements": [j.to_dict() for j in judgements]}


def gate_lines(verdict: dict[str, Any]) -> list[str]:
    """One line per requirement, then the gate's verdict, for stderr."""
    lines = [f"gate: {j['requirement']}: {j['outcome']} ({j['words']})"
             for j in verdict["requirements"]]
    return lines + [f"gate: {verdict['verdict']} (exit {verdict['exit_code']})"]


def _x(ratio: float | None) -> str:
    # One digit more than the pages' ratio_text on purpose: the gate judges an interval
    # against a bound the user wrote ("bf16-amp>=1.2"), and "1.20" would hide whether a
    # 1.198 end missed it.
    return "n/a" if ratio is None else f"{ratio:.3f}x"
