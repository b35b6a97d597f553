"""The docs site's code references: the transforms reference, generated from the golden
fixtures, and the check rules reference, generated from ``ddpify.rules``.

For every convert code, the page gives the code's explanation (``ddpify.convert_codes``,
read from the transforms' docstrings) and a before/after excerpt from one golden fixture
that reports it: ``fixtures/<area>/<name>.py`` against ``<name>.ddp.py`` around the line in
``<name>.diag.txt`` (or a project fixture's ``report.txt``). Nothing is copied by hand, so
the page follows the converter.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml): ``on_files`` adds
``transforms.md`` and ``rules.md`` to the site in memory; they are never written to
``docs/``. ``generate()`` and ``generate_rules()`` are plain Python (no mkdocs, libcst or
torch) and are what the tests call. Every code has an anchor (``#ddp105``) on one of the
two pages: ``ddpify.rules.code_url`` links it from the CLI's outputs.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path

PAGE = "transforms.md"
RULES_PAGE = "rules.md"
DIAG_LINE = re.compile(
    r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?P<col>\d+): (?P<code>DDP\d{3}) (?P<message>.*) \[(?P<severity>change|warning|error)\]$"
)
REPORT_FILE = re.compile(r"^(?P<file>\S[^:]*\.pyi?): ")
REPORT_LINE = re.compile(r"^  (?P<line>\d+):(?P<col>\d+): (?P<code>DDP\d{3}) (?P<message>.*) \[(?P<severity>change|warning|error)\]$")
GROUPS = {
    "0": "Parsing, file-level refusals, scripts with their own DDP path",
    "1": "The model wrap",
    "2": "Process-group set-up",
    "3": "Samplers on training loaders",
    "4": "Batch size",
    "5": "set_epoch and gradient accumulation",
    "6": "Side effects on rank 0",
    "7": "Devices",
    "8": "Decisions the same on every rank",
}
# Fixture areas whose examples fit a code group best (tried first).
AREAS = {
    "0": ("existing_ddp", "wrap"), "1": ("wrap",), "2": ("process_group",), "3": ("loaders",),
    "4": ("loaders",), "5": ("epochs",), "6": ("rank_zero",), "7": ("devices",), "8": ("epochs", "e2e"),
}
CONTEXT = 3  # unchanged lines kept around a change
BEFORE, AFTER = 4, 8  # source lines kept above and below the reported line
NEAR = 6  # a change further than this from the reported line is not its change
LONG_RUN = 10  # added lines beyond this in one run are summarised


@dataclass(frozen=True)
class Occurrence:
    """One diagnostic line of a golden fixture."""

    source: Path  # the fixture's input
    output: Path  # its golden output
    line: int
    col: int
    code: str
    message: str
    severity: str
    project: bool  # from a project fixture's report.txt

    def sort_key(self, prefer_change: bool) -> tuple:
        """Single-file fixtures first, a rewrite where the code has one, the area of the
        code's group, then the shortest file."""
        lines = len(_read(self.source).splitlines())
        area = self.source.parent.name not in AREAS.get(self.code[3], ())
        return (self.project, prefer_change and self.severity != "change", area, lines, self.source.as_posix(), self.line, self.col)


def occurrences(fixtures: Path) -> list[Occurrence]:
    """Every diagnostic the golden fixtures record, in a fixed order."""
    found: list[Occurrence] = []
    for diag in sorted(fixtures.glob("*/*.diag.txt")):
        stem = diag.name.removesuffix(".diag.txt")
        source, output = diag.with_name(f"{stem}.py"), diag.with_name(f"{stem}.ddp.py")
        if not (source.is_file() and output.is_file()):
            continue
        for text in _read(diag).splitlines():
            match = DIAG_LINE.match(text)
            if match:
                found.append(_occurrence(match, source, output, project=False))
    for report in sorted(fixtures.glob("projects/*.ddp/report.txt")):
        converted = report.parent
        original = converted.with_name(converted.name.removesuffix(".ddp"))
        current: str | None = None
        for text in _read(report).splitlines():
            header, match = REPORT_FILE.match(text), REPORT_LINE.match(text)
            if header:
                current = header.group("file")
            elif match and current and (original / current).is_file() and (converted / current).is_file():
                found.append(_occurrence(match, original / current, converted / current, project=True))
    return found


def _occurrence(match: re.Match, source: Path, output: Path, project: bool) -> Occurrence:
    return Occurrence(
        source, output, int(match.group("line")), int(match.group("col")), match.group("code"),
        match.group("message"), match.group("severity"), project,
    )


def generate(fixtures: Path) -> str:
    """The reference page (Markdown) for every convert code, examples from ``fixtures``."""
    from ddpify.convert_codes import convert_codes, summary

    root = fixtures.resolve().parent
    codes = convert_codes()
    by_code: dict[str, list[Occurrence]] = {}
    for occurrence in occurrences(fixtures):
        by_code.setdefault(occurrence.code, []).append(occurrence)
    everything = sorted(set(codes) | set(by_code))
    out = [
        "# Transforms reference\n",
        "Every code `ddpify convert` reports, with what it means and, where a golden fixture "
        "reports it, a before/after excerpt of that fixture's conversion. This page is generated "
        "when the site is built, from the transforms' docstrings (what `ddpify rule CODE` prints) "
        "and from `fixtures/<area>/<name>.py`, `<name>.ddp.py` and `<name>.diag.txt`, the files "
        "the golden tests compare the converter against; it cannot drift from what the converter does.\n",
        "Severities: *change* (rewritten), *warning* (left as it is and reported), *error* (the "
        "whole file is left byte-identical; see [Limitations and refusals](limitations.md)). "
        "The check codes of `ddpify check` are in the [Check rules reference](rules.md).\n",
        "| code | reported as | meaning |",
        "|---|---|---|",
    ]
    for code in everything:
        severities = ", ".join(_severities(by_code.get(code, [])))
        meaning = summary(codes[code]).removesuffix("::") if code in codes else ""
        out.append(f"| [{code}](#{code.lower()}) | {severities or '-'} | {_cell(meaning)} |")
    out.append("")
    for group in sorted({code[3] for code in everything}):
        out.append(f"## DDP{group}xx: {GROUPS.get(group, 'Other codes')}\n")
        for code in (c for c in everything if c[3] == group):
            out.append(_section(code, codes.get(code), by_code.get(code, []), root))
    return "\n".join(out).rstrip() + "\n"


def _section(code: str, explanation: str | None, found: list[Occurrence], root: Path) -> str:
    parts = [f"### {code} {{#{code.lower()}}}\n"]
    if explanation:
        parts.append(explanation_markdown(explanation))
    else:
        parts.append("*No explanation found in the transforms' docstrings.*\n")
    if not found:
        parts.append("*No golden fixture reports this code.*\n")
        return "\n".join(parts)
    prefer_change = any(o.severity == "change" for o in found)
    example = min(found, key=lambda o: o.sort_key(prefer_change))
    files = sorted({_relative(o.source, root) for o in found})
    where = _relative(example.source, root)
    parts.append(
        f"**In the fixtures**: reported {len(found)} time{'s' if len(found) != 1 else ''} in "
        f"{len(files)} file{'s' if len(files) != 1 else ''} ({', '.join(_severities(found))}). "
        f"Example, `{where}` line {example.line}:\n"
    )
    parts.append(f"> `{example.code} {_inline(example.message)}` [{example.severity}]\n")
    parts.append(excerpt(example, where))
    return "\n".join(parts)


def excerpt(occurrence: Occurrence, name: str) -> str:
    """A fenced before/after excerpt around the reported line: a short unified diff (the
    emitted helpers shown as one line), or the source lines themselves where nothing changed
    there (a refusal, a warning)."""
    before = _read(occurrence.source).splitlines()
    after = collapse_helpers(_read(occurrence.output).splitlines())
    line = occurrence.line - 1
    groups = list(difflib.SequenceMatcher(None, before, after, autojunk=False).get_grouped_opcodes(CONTEXT))
    best = min(groups, key=lambda group: _distance(group, line), default=None)
    if best is None or _distance(best, line) > NEAR:
        note = "left byte-identical (refused)" if occurrence.severity == "error" else "not rewritten here"
        low, high = max(0, line - 3), min(len(before), line + 4)
        body = "\n".join(before[low:high])
        return f'```python title="{name}, lines {low + 1}-{high}: {note}"\n{body}\n```\n'
    low, high = max(0, line - BEFORE), line + AFTER
    rendered: list[str] = []
    for tag, i1, i2, j1, j2 in best:
        if tag == "equal":
            rendered += [f" {text}" for text in before[max(i1, low):min(i2, high)]]
        elif i2 >= low and i1 <= high:
            rendered += [f"-{text}" for text in before[i1:i2]]
            added = after[j1:j2]
            rendered += [f"+{text}" for text in added[:LONG_RUN]]
            if len(added) > LONG_RUN:
                rendered.append(f"+# ... {len(added) - LONG_RUN} more added lines")
    body = "\n".join(rendered)
    return f'```diff title="{name} -> {Path(name).stem}.ddp.py, around line {occurrence.line}"\n{body}\n```\n'


HELPERS = re.compile(r"^# Distributed (set-up|helpers) added by ddpify")
HELPER_DEF = re.compile(r"^(?:def (ddp_\w+)|class (Ddp\w+)|@)")


def collapse_helpers(lines: list[str]) -> list[str]:
    """The set-up helpers ddpify emits (``ddp_setup`` and the rest, the same in every
    converted script) as one comment line, so that an excerpt shows the script's own changes."""
    start = next((i for i, text in enumerate(lines) if HELPERS.match(text)), None)
    if start is None:
        return lines
    end, names = start + 1, []
    for i in range(start + 1, len(lines)):
        text = lines[i]
        definition = HELPER_DEF.match(text)
        if definition:
            names += [name for name in definition.groups() if name]
        elif text.strip() and not text[0].isspace() and not text.startswith("#"):
            break
        if text.strip():
            end = i + 1
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    summary = f"# ... ddpify's distributed helpers, {end - start} lines ({shown})"
    return [*lines[:start], summary, *lines[end:]]


def _distance(group: list[tuple], line: int) -> int:
    """Lines between ``line`` (0-based) and the nearest change of an opcode group."""
    distances = []
    for tag, i1, i2, _j1, _j2 in group:
        if tag == "equal":
            continue
        end = max(i1, i2 - 1)  # an insertion (i1 == i2) sits just before line i1
        distances.append(0 if i1 - 1 <= line <= end else min(abs(line - i1), abs(line - end)))
    return min(distances, default=1 << 30)


def generate_rules() -> str:
    """The check rules reference (Markdown): every code of ``ddpify check``, from ``ddpify.rules``."""
    from ddpify.rules import RULES

    out = [
        "# Check rules reference\n",
        "Every code `ddpify check` reports, with why it matters and a before/after example. This page "
        "is generated when the site is built from `ddpify/rules.py`, the text `ddpify rule CODE` prints. "
        "Codes marked *fixable* are rewritten by `ddpify convert`; the codes `convert` reports are in the "
        "[Transforms reference](transforms.md).\n",
        "| code | name | summary |",
        "|---|---|---|",
    ]
    for rule in RULES.values():
        fixable = " (fixable)" if rule.fixable else ""
        out.append(f"| [{rule.code}](#{rule.code.lower()}) | {rule.name}{fixable} | {_cell(rule.summary)} |")
    out.append("")
    for rule in RULES.values():
        out.append(f"### {rule.code} {rule.name} {{#{rule.code.lower()}}}\n")
        if rule.fixable:
            out.append("*Fixable*: `ddpify convert` rewrites this.\n")
        out.append(f"**What it finds**: {rule.summary}.\n")
        out.append(f"**Why it matters**: {rule.explanation}\n")
        out.append(f"Example:\n\n```python\n{rule.before.rstrip()}\n```\n")
        out.append(f"Use instead:\n\n```python\n{rule.after.rstrip()}\n```\n")
    return "\n".join(out).rstrip() + "\n"


def explanation_markdown(text: str, name_source: bool = True) -> str:
    """A transform docstring paragraph (reStructuredText-ish) as Markdown: the code
    dropped from its first line, ``::`` examples fenced, the source module named (unless
    ``name_source`` is False: ``ddpify rule`` does not show internal paths)."""
    lines = text.splitlines()
    lines[0] = re.sub(r"^DDP\d{3}\s+", "", lines[0])
    source = None
    if lines and re.fullmatch(r"\((ddpify/[\w/]+\.py)\)", lines[-1].strip()):
        source = lines.pop().strip()[1:-1]
    out: list[str] = []
    block: list[str] = []

    def flush() -> None:
        while block and not block[-1].strip():
            block.pop()
        if block:
            out.extend(["```python", *(b[4:] if b.startswith("    ") else b.lstrip() for b in block), "```"])
            block.clear()

    for text_line in lines:
        indented = text_line.startswith("    ") or (block and not text_line.strip())
        previous_blank = not out or not out[-1].strip()
        if indented and (block or previous_blank):
            block.append(text_line)
            continue
        if block:
            flush()
            out.append("")
        if text_line.rstrip().endswith("::"):
            text_line = text_line.rstrip()[:-2].rstrip() + ":"
        out.append(text_line.strip() if out else text_line)
    flush()
    markdown = "\n".join(out).strip() + "\n"
    if source and name_source:
        markdown += f"\nEmitted by `{source}`; `ddpify rule CODE` prints this explanation.\n"
    return markdown


def _severities(found: list[Occurrence]) -> list[str]:
    order = ("change", "warning", "error")
    return [severity for severity in order if any(o.severity == severity for o in found)]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _inline(text: str) -> str:
    """A message inside a code span: backticks cannot nest, so they become quotes."""
    return text.replace("`", "'")


def _relative(path: Path, root: Path) -> str:
    return path.resolve().relative_to(root).as_posix()


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --- mkdocs hook -------------------------------------------------------------------------


def on_files(files, config):
    """Add the generated reference page (in memory) to the site's files."""
    from mkdocs.structure.files import File

    root = Path(config.config_file_path).resolve().parent
    for page, content in ((PAGE, lambda: generate(root / "fixtures")), (RULES_PAGE, generate_rules)):
        existing = files.get_file_from_path(page)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, page, content=content()))
    return files
