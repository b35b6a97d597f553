"""Text rendering of a verify report: one line per check, then a rank-by-rank table."""

from __future__ import annotations

from ddpify.verify.runner import VerifyReport

COLUMNS = (
    ("rank", "rank"),
    ("local", "local_rank"),
    ("exit", "exit"),
    ("seconds", "seconds"),
    ("steps", "steps"),
    ("backend", "backend"),
    ("ddp", "ddp_models"),
    ("train passes", "training_passes"),
    ("print lines", "printed_lines"),
    ("saves", "saves"),
    ("files", "files_written"),
    ("params", "param_hash"),
)


def render_text(report: VerifyReport) -> str:
    lines = [f"verify {report.converted}: {report.setup}"]
    lines += [f"note: {note}" for note in report.notes]
    lines += [f"{check.verdict:4}  {check.name}: {check.reason}" for check in report.checks]
    if report.ranks:
        lines += ["", *_table(report.ranks)]
    failed = sum(check.passed is False for check in report.checks)
    if report.output_tail:
        lines += ["", "last output of the run:", *("  " + line for line in report.output_tail.splitlines()[-25:])]
    lines += ["", f"{failed} check(s) failed" if failed else "all checks passed"]
    return "\n".join(lines) + "\n"


def _table(rows: tuple[dict, ...]) -> list[str]:
    cells = [[title for title, _ in COLUMNS]] + [[_cell(row[key]) for _, key in COLUMNS] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)
