"""Output formats for findings: full, concise, json, github, sarif (no libcst, no torch)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ddpify import __version__
from ddpify.diagnostics import Diagnostic
from ddpify.rules import RULES

FORMATS = ("full", "concise", "json", "github", "sarif")
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


@dataclass(frozen=True)
class FileFindings:
    path: str
    diagnostics: tuple[Diagnostic, ...] = ()
    error: str | None = None


def render(results: list[FileFindings], output_format: str, root: Path | None = None) -> str:
    return {
        "full": _full,
        "concise": _concise,
        "json": _json,
        "github": _github,
        "sarif": lambda r: _sarif(r, root or Path.cwd()),
    }[output_format](results)


def _concise(results: list[FileFindings]) -> str:
    return "".join(f"{d.concise(r.path)}\n" for r in results for d in r.diagnostics)


def _full(results: list[FileFindings]) -> str:
    out = []
    for result in results:
        for d in result.diagnostics:
            rule = RULES.get(d.code)
            fix = "  (fixable with `ddpify convert`)" if rule and rule.fixable else ""
            out.append(f"{d.concise(result.path)}{fix}\n")
            if rule:
                out.append(f"    help: `ddpify rule {d.code}` explains it with an example\n")
    count = sum(len(r.diagnostics) for r in results)
    out.append(f"Found {count} finding{'s' if count != 1 else ''}.\n" if count else "All checks passed.\n")
    return "".join(out)


def _json(results: list[FileFindings]) -> str:
    rows = [
        {"path": r.path, "line": d.line, "column": d.col, "code": d.code, "message": d.message}
        for r in results
        for d in r.diagnostics
    ]
    return json.dumps(rows, indent=2) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _github(results: list[FileFindings]) -> str:
    return "".join(
        f"::warning file={_escape_property(r.path)},line={d.line},col={d.col},"
        f"title={_escape_property(d.code)}::{_escape_data(d.message)}\n"
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
