"""gpu_checks.py's bookkeeping: the record of every check as it happens, pytest's outcomes read off
its output, and the summary printed last (and written to summary.md)."""

from __future__ import annotations

import contextlib
import gc
import re
import time
from pathlib import Path

from streamback.io import markdown_table, write_json


class Report:
    """Checks, findings and skipped items as they happen; the time budget."""

    def __init__(self, budget: float, out: Path):
        self.start, self.budget, self.out = time.perf_counter(), budget, out
        self.checks: list[dict] = []
        self.env: dict = {}
        self.tests: dict = {}
        self.profile: list[str] = []
        self.bench: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()

    def record(self, group: str, name: str, ok: bool | None, value: str) -> None:
        """ok: True/False for a check, None for a finding (reported, never a failure), "skipped"."""
        status = {True: "PASS", False: "FAIL", None: "INFO", "skipped": "SKIP"}[ok]
        self.checks.append(
            {"group": group, "name": name, "status": status, "value": value, "at_s": round(self.elapsed(), 1)}
        )
        print(f"[{self.elapsed():6.1f} s] {status} {group}/{name}: {value}", flush=True)

    @contextlib.contextmanager
    def guard(self, group: str, name: str):
        """Run a check's body; an exception is that check's failure, and the others go on."""
        try:
            yield
        except Exception as err:  # a check that breaks is a failed check, not the end of the run
            text = str(err).strip().splitlines()
            self.record(group, name, False, f"{type(err).__name__}: {text[0][:300] if text else ''}")
        finally:
            gc.collect()

    def failed(self) -> list[dict]:
        return [c for c in self.checks if c["status"] == "FAIL"]

    def save(self) -> None:
        write_json(
            self.out / "summary.json",
            {
                "env": self.env,
                "checks": self.checks,
                "tests": self.tests,
                "profile": self.profile,
                "bench": self.bench,
                "elapsed_s": round(self.elapsed(), 1),
                "budget_s": self.budget,
                "failed": len(self.failed()),
            },
        )


_OUTCOMES = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
# pytest -v: "tests/x.py::test[a] PASSED [ 10%]"; with xdist: "[gw0] [ 10%] PASSED tests/x.py::test[a]"
_RESULT = re.compile(rf"^(?:(tests/\S+::\S+) ({_OUTCOMES})\b|\[gw\d+\] \[\s*\d+%\] ({_OUTCOMES}) (tests/\S+::\S+))")
_REASON = re.compile(r"^(FAILED|ERROR) (tests/\S+::\S+)(?: - (.*))?$")


def pytest_outcomes(lines) -> tuple[dict[str, str], dict[str, str]]:
    """({test id: outcome}, {test id: failure message}) read off pytest's -v and -rfE lines."""
    outcomes, reasons = {}, {}
    for line in lines:
        if m := _RESULT.match(line):
            test, outcome = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
            outcomes[test] = outcome
        elif m := _REASON.match(line):
            reasons[m.group(2)] = m.group(3) or m.group(1)
    return outcomes, reasons


def met_text(met) -> str:
    return {True: "met", False: "MISSED", None: "n/a"}[met]


def _num(value, fmt: str) -> str:
    """`value` formatted as a number; None is blank and anything else (e.g. a log's "nan") is shown as is."""
    if isinstance(value, (int, float)):
        return format(value, fmt)
    return "" if value is None else str(value)


def summary_text(report: Report, args, test_files: tuple, reference: dict, listed: int) -> str:
    """The table printed last: the machine, checks by group, what failed, the findings, the tests, the bench rows
    against `reference` and the goals."""
    env, parts = report.env, []
    parts.append(
        f"# gpu_checks: {env.get('name', '?')} (capability {env.get('capability', 'n/a')}), torch {env.get('torch')}, "
        f"{'quick' if args.quick else 'full'} sizes, parts {','.join(args.parts)}\n"
    )
    if "matmul_bf16_tflops" in env or "copy_tb_s" in env:
        parts.append(
            f"bf16 matmul {_num(env.get('matmul_bf16_tflops'), '.1f')} TFLOP/s; device copy "
            f"{_num(env.get('copy_tb_s'), '.2f')} TB/s (read + write)\n"
        )
    counts: dict[str, dict[str, int]] = {}
    for c in report.checks:
        counts.setdefault(c["group"], {"PASS": 0, "FAIL": 0, "INFO": 0, "SKIP": 0})[c["status"]] += 1
    parts.append(
        markdown_table(["group", "pass", "fail", "info", "skipped"], [[g, *n.values()] for g, n in counts.items()])
    )
    for status, title in (("FAIL", "Failed"), ("INFO", "Findings"), ("SKIP", "Skipped")):
        items = [c for c in report.checks if c["status"] == status]
        if items:  # at most LISTED each, cut short: the device call returns only the output's last 12,000 characters
            lines = [f"- {c['group']}/{c['name']}: {c['value'][:160]}\n" for c in items[:listed]]
            more = f"- ... and {len(items) - listed} more in summary.json\n" if len(items) > listed else ""
            parts.append(f"{title}:\n" + "".join(lines) + more)
    if report.tests.get("counts") is not None:
        t = report.tests
        parts.append(
            f"Tests (pytest {t['selection']}, {len(test_files)} modules): exit {t['exit_status']} after {t['seconds']} "
            f"s; " + (", ".join(f"{n} {o.lower()}" for o, n in t["counts"].items()) or "none ran") + "\n"
        )
    rows = report.bench.get("rows", [])
    if rows:
        table = []
        for r in rows:
            ref = reference.get((r.get("shape"), r.get("mode"), r.get("variant")))
            base = next(
                (
                    b
                    for b in rows
                    if (b.get("shape"), b.get("mode"), b.get("variant")) == (r.get("shape"), r.get("mode"), "baseline")
                    and b.get("tokens_per_s")
                ),
                None,
            )
            ratio = r["tokens_per_s"] / base["tokens_per_s"] if base and r.get("tokens_per_s") else None
            table.append(
                [
                    r.get("shape"),
                    r.get("mode"),
                    r.get("variant"),
                    r.get("error") or _num(r.get("tokens_per_s"), ",.0f"),
                    _num(ratio, ".3f"),
                    _num(r.get("mfu") and 100 * r["mfu"], ".1f"),
                    _num(r.get("peak_mem_gib"), ".1f"),
                    _num(r.get("est_peak_gib"), ".1f"),
                    f"{ref[0]:,}" if ref else "",
                    _num(ref and ref[1], ".1f"),
                    r.get("call_s"),
                ]
            )
        parts.append(
            markdown_table(
                [
                    "shape",
                    "mode",
                    "variant",
                    "tok/s",
                    "vs base",
                    "MFU %",
                    "peak GiB",
                    "est GiB",
                    "ref tok/s",
                    "ref GiB",
                    "call s",
                ],
                table,
            )
        )
    goals = report.bench.get("goals", [])
    if goals:
        parts.append(
            markdown_table(
                ["goal", "where", "value", "met"],
                [[g["goal"], g["where"], g["value"], met_text(g["met"])] for g in goals],
            )
        )
    failed = len(report.failed())
    parts.append(
        f"{len(report.checks)} checks, {failed} failed; {report.elapsed():.0f} s of a {report.budget:.0f} s budget; "
        f"exit status {1 if failed else 0}; files in {report.out}\n"
    )
    return "\n".join(parts)
