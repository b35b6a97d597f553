"""Output formats for findings: full, concise, json, github, sarif (no libcst, no torch).

Every format gives one finding per line (or per JSON object): ``full`` adds a summary with
the number of findings, which are fixable by ``ddpify convert`` and a docs link for each code
it showed; ``github`` annotations are errors when the command fails on them (the default)
and warnings under ``--exit-zero``. :func:`grouped` is how ``convert`` folds repeated
diagnostics of one kind into one line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ddpify import __version__
from ddpify.diagnostics import Diagnostic
from ddpify.rules import RULES, code_url

FORMATS = ("full", "concise", "json", "github", "sarif")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


@dataclass(frozen=True)
class FileFindings:
    path: str
    diagnostics: tuple[Diagnostic, ...] = ()
    error: str | None = None


def render(
    results: list[FileFindings],
    output_format: str,
    root: Path | None = None,
    failing: bool = True,
    links: bool = False,
    summary: bool = True,
) -> str:
    """``failing``: the command exits non-zero on these findings (github annotations are
    errors then); ``links``: codes are terminal hyperlinks to their docs (a terminal);
    ``summary``: the full format's closing lines (not with --quiet)."""
    return {
        "full": lambda r: _full(r, links, summary),
        "concise": _concise,
        "json": _json,
        "github": lambda r: _github(r, failing),
        "sarif": lambda r: _sarif(r, root or Path.cwd()),
    }[output_format](results)


def hyperlink(code: str, enabled: bool) -> str:
    """The code as an OSC 8 terminal hyperlink to its docs anchor (as ruff shows its codes)."""
    return f"\x1b]8;;{code_url(code)}\x1b\\{code}\x1b]8;;\x1b\\" if enabled else code


def _concise(results: list[FileFindings]) -> str:
    return "".join(f"{d.concise(r.path)}\n" for r in results for d in r.diagnostics)


def _full(results: list[FileFindings], links: bool = False, summary: bool = True) -> str:
    """One line per finding (``[*]``: `ddpify convert` rewrites it), then a summary: the
    count, the fixable count, and each code shown with its docs link."""
    out = []
    for result in results:
        for d in result.diagnostics:
            rule = RULES.get(d.code)
            fix = " [*]" if rule and rule.fixable else ""
            out.append(f"{result.path}:{d.line}:{d.col}: {hyperlink(d.code, links)}{fix} {d.message}\n")
    count = sum(len(r.diagnostics) for r in results)
    if not summary:
        return "".join(out)
    if not count:
        return "All checks passed.\n"
    out.append(f"Found {count} finding{'s' if count != 1 else ''}.\n")
    fixable = sum(1 for r in results for d in r.diagnostics if d.code in RULES and RULES[d.code].fixable)
    if fixable:
        out.append(f"[*] {fixable} fixable with `ddpify convert`.\n")
    shown = sorted({d.code for r in results for d in r.diagnostics})
    out.append("Explained by `ddpify rule CODE` and at:\n")
    out += [f"  {code}  {code_url(code)}\n" for code in shown]
    return "".join(out)


def grouped(diagnostics) -> list[tuple]:
    """Diagnostics of one kind (code, message and severity alike) folded into one entry, at
    the first one's place: ``[(first, lines, count)]``, ``lines`` every line it was
    reported on, ``count`` how many times."""
    groups: dict[tuple, list] = {}
    for d in diagnostics:
        groups.setdefault((d.code, d.message, d.severity), []).append(d)
    return [(found[0], sorted({d.line for d in found}), len(found)) for found in groups.values()]


def places(lines: list[int], count: int, limit: int = 8) -> str:
    """`` (8 places: lines 12, 40, 41, ...)`` for a folded diagnostic, '' for one place."""
    if count < 2:
        return ""
    shown = ", ".join(str(n) for n in lines[:limit]) + (", ..." if len(lines) > limit else "")
    return f" ({count} places: line{'s' if len(lines) > 1 else ''} {shown})"


def _json(results: list[FileFindings]) -> str:
    rows = [
        {"path": r.path, "line": d.line, "column": d.col, "code": d.code, "message": d.message, "url": code_url(d.code)}
        for r in results
        for d in r.diagnostics
    ]
    return json.dumps(rows, indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _github(results: list[FileFindings], failing: bool = True) -> str:
    """Workflow commands: ``::error`` when the command fails on the findings, ``::warning``
    under ``--exit-zero`` (a failed job whose annotations say warning reads as a contradiction)."""
    level = "error" if failing else "warning"
    return "".join(
        f"::{level} file={_escape_property(r.path)},line={d.line},col={d.col},"
        f"title={_escape_property(d.code)}::{_escape_data(f'{d.message} ({code_url(d.code)})')}\n"
        for r in results
        for d in r.diagnostics
    )


def _relative_uri(path: str, root: Path) -> str:
    absolute = Path(path).resolve()
    try:
        return absolute.relative_to(root.resolve()).as_posix()
    except ValueError:
        return Path(os.path.relpath(absolute, root.resolve())).as_posix()


def _sarif(results: list[FileFindings], root: Path) -> str:
    codes = sorted({d.code for r in results for d in r.diagnostics} | set(RULES))
    rules = [
        {
            "id": code,
            "name": RULES[code].name if code in RULES else code,
            "shortDescription": {"text": RULES[code].summary if code in RULES else code},
            "fullDescription": {"text": RULES[code].explanation if code in RULES else code},
            "help": {"text": f"ddpify rule {code}"},
            "helpUri": code_url(code),
        }
        for code in codes
    ]
    index = {code: i for i, code in enumerate(codes)}
    findings = [
        {
            "ruleId": d.code,
            "ruleIndex": index[d.code],
            "level": "warning",
            "message": {"text": d.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _relative_uri(r.path, root)},
                        "region": {"startLine": d.line, "startColumn": d.col},
                    }
                }
            ],
        }
        for r in results
        for d in r.diagnostics
    ]
    document = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "ddpify", "version": __version__, "informationUri": "https://pypi.org/project/ddpify/", "rules": rules}},
                "results": findings,
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"
