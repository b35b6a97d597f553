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


def render_text(report: VerifyReport, header: bool = True) -> str:
    """The checks, the rank table and a summary naming every run's time. ``header=False``
    when the header and notes were already printed as verify started."""
    lines = [f"verify {report.converted}: {report.setup}", *(f"note: {note}" for note in report.notes)] if header else []
    lines += [f"{check.verdict:4}  {check.name}: {check.reason}" for check in report.checks]
    if report.ranks:
        lines += ["", *_table(report.ranks)]
    failed = sum(check.passed is False for check in report.checks)
    if report.output_tail:
        lines += ["", "last output of the run:", *("  " + line for line in report.output_tail.splitlines()[-25:])]
    verdict = f"{failed} check(s) failed" if failed else "all checks passed"
    lines += ["", f"{verdict}; {runs_summary(report.runs)}" if report.runs else verdict]
    return "\n".join(lines) + "\n"


def runs_summary(runs: tuple[dict, ...]) -> str:
    """``runs: converted 2 ranks 8.7 s, original 1 process 3.1 s, ...; 20.3 s in all``."""
    parts = []
    for run in runs:
        count = run["processes"]
        who = f"{count} ranks" if count > 1 else "1 process"
        ending = "timed out" if run["timed_out"] else f"{run['seconds']:.1f} s"
        again = f" ({run['attempts']} attempts)" if run.get("attempts", 1) > 1 else ""
        parts.append(f"{run['label']} {who} {ending}{again}")
    total = sum(run["seconds"] for run in runs)
    return f"runs: {', '.join(parts)}; {total:.1f} s in all"


def _table(rows: tuple[dict, ...]) -> list[str]:
    cells = [[title for title, _ in COLUMNS]] + [[_cell(row[key]) for _, key in COLUMNS] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)
