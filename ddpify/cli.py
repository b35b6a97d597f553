"""The ``ddpify`` command line. It only prints what ``ddpify.api`` returns.

Start-up stays cheap: this module imports neither libcst nor torch; each command imports
what it needs when it runs.
"""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from ddpify import __version__
from ddpify.diagnostics import ConvertOptions, FileResult, Severity

app = typer.Typer(
    help="Move PyTorch training scripts from nn.DataParallel to DistributedDataParallel.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

# Exit codes, in the manner of ruff and black (docs/commands.md): 0 nothing to do, or done;
# 1 changes shown (`convert --diff`) or findings (`check`), or a failed `verify` check;
# 2 usage, configuration, parse or internal error; 3 a file `convert` refused (left as it was).
EXIT_OK, EXIT_FINDINGS, EXIT_ERROR, EXIT_REFUSED = 0, 1, 2, 3
# Several files: the exit code of the worst (an error over a refusal over a change).
SEVERITY_ORDER = (EXIT_OK, EXIT_FINDINGS, EXIT_REFUSED, EXIT_ERROR)


def _worst(codes) -> int:
    return max(codes, key=SEVERITY_ORDER.index, default=EXIT_OK)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddpify {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """Move PyTorch training scripts from nn.DataParallel to DistributedDataParallel."""


@app.command()
def convert(
    paths: List[Path] = typer.Argument(..., help="Scripts to convert in place; a folder converts as one project (its entry scripts and the modules they import, together)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the result here instead: one file, or a folder (its converted copy goes there)."),
    diff: bool = typer.Option(False, "--diff", help="Write nothing; print a unified diff. Exit 1 if there is one."),
    per_process_batch: bool = typer.Option(
        False, "--per-process-batch", help="Keep batch_size per process (the global batch grows with the world size)."
    ),
    allow_partial: bool = typer.Option(
        False,
        "--allow-partial",
        help="Convert even where the result would not train one model on sharded data "
        "(unsharded loaders, a model changed after the wrap); those findings become warnings.",
    ),
    no_relaunch: bool = typer.Option(
        False,
        "--no-relaunch",
        help="Leave out the self-relaunch: plain `python train.py` then runs one process even with several GPUs.",
    ),
    self_check: bool = typer.Option(
        False,
        "--self-check",
        help="Add run-time checks to the script: with several processes it stops if the ranks ever hold "
        "different weights or learning rates (checked after optimizer steps 1, 2, 4, 8, ...).",
    ),
    jobs: int = typer.Option(0, "-j", "--jobs", help="Worker processes (0: one per CPU)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="One line per file (and why a file was refused); no diagnostics or launch line."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Every diagnostic on its own line (not folded by kind), with its docs link."),
    exit_non_zero_on_change: bool = typer.Option(
        False, "--exit-non-zero-on-change", help="Exit 1 when a file was rewritten (as --diff does when one would be)."
    ),
) -> None:
    """Rewrite DataParallel scripts into DistributedDataParallel scripts."""
    from ddpify import api
    from ddpify.config import ConfigError, find_config
    from ddpify.files import discover

    try:
        config = find_config(paths)
    except ConfigError as error:
        _fail(str(error))
    if output is not None and len(paths) == 1 and paths[0].is_dir() and not diff:
        paths = [_copied_folder(paths[0], output)]  # a folder converts as a copy, the original kept
        output = None
    files = discover(paths)
    if output is not None and len(files) != 1:
        _fail("-o/--output takes exactly one input file, or one folder (converted as a copy there)")
    if not files:
        _fail("no Python files found")
    options = ConvertOptions(
        per_process_batch=per_process_batch or config.per_process_batch,
        allow_partial=allow_partial,
        relaunch=not no_relaunch,
        self_check=self_check or config.self_check,
    )
    if quiet and verbose:
        _fail("--quiet and --verbose do not go together")
    results = _convert_paths(paths, files, options, jobs)
    view = View(quiet=quiet, verbose=verbose, links=_is_terminal(err=diff))
    # (a project's refusal first: the files left untouched only because of it follow in one line each
    # reason, not one block per file among the blockers)
    held_back = [] if verbose else [result for result in results if _held_back(result)]
    status = _worst(_report_conversion(result, diff, output, view) for result in results if result not in held_back)
    if held_back:
        status = _worst([status, _report_held_back(held_back, diff)])
    if status == EXIT_OK and exit_non_zero_on_change and not diff and any(r.changed and not r.error for r in results):
        status = EXIT_FINDINGS
    if verbose and not quiet:
        _say_docs(results, diff)
    raise typer.Exit(status)


def _copied_folder(folder: Path, output: Path) -> Path:
    """``convert DIR -o OUT``: the project copied to OUT (not its `.git`), then converted
    there in place; OUT must not exist yet."""
    import shutil

    if output.exists():
        _fail(f"{output} exists: -o with a folder writes the converted copy into a new folder")
    shutil.copytree(folder, output, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    return output


class View:
    """How much `convert` prints: --quiet, the default (diagnostics of one kind folded into
    one line), --verbose (each on its own line)."""

    def __init__(self, quiet: bool = False, verbose: bool = False, links: bool = False) -> None:
        self.quiet, self.verbose, self.links = quiet, verbose, links


def _is_terminal(err: bool = False) -> bool:
    stream = sys.stderr if err else sys.stdout
    return hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"


def _diagnostic_lines(result: FileResult, view: View) -> list[str]:
    from ddpify.report import grouped, hyperlink, places

    def line(d, where: str) -> str:
        marker = "" if d.severity is Severity.CHANGE else f" [{d.severity.value}]"
        return f"  {result.path}:{d.line}:{d.col}: {hyperlink(d.code, view.links)} {d.message}{where}{marker}"

    if view.verbose:
        return [line(d, "") for d in result.diagnostics]
    return [line(first, places(lines, count)) for first, lines, count in grouped(result.diagnostics)]


def _launch_lines(result: FileResult, target: str) -> list[str]:
    """The launch line as it runs on this machine (ddpify.launching), and the script's own
    GPU-count options with what they now mean."""
    from ddpify.launching import gpu_options, launch_lines

    canonical = result.launch_command.replace(result.path, target)
    gpu_only = any(d.code == "DDP011" for d in result.diagnostics)
    lines = [f"  {line.label}: {line.command}" for line in launch_lines(canonical, gpu_only=gpu_only)]
    for option in gpu_options(result.source, result.output if result.changed else None):
        lines.append(f"  note: {option.meaning()}")
    return lines


def _say_docs(results: list[FileResult], diff: bool) -> None:
    from ddpify.rules import code_url

    codes = sorted({d.code for r in results for d in r.diagnostics})
    if codes:
        typer.echo("Explained by `ddpify rule CODE` and at:", err=diff)
        for code in codes:
            typer.echo(f"  {code}  {code_url(code)}", err=diff)


def _convert_paths(paths: List[Path], files: list[Path], options: ConvertOptions, jobs: int) -> list[FileResult]:
    """Files named on their own convert alone; a folder converts as one project (its entry
    scripts, and the modules they import, seen together)."""
    from ddpify import api
    from ddpify.files import discover

    by_path: dict[Path, FileResult] = {}
    folders = [path for path in paths if path.is_dir()]
    for folder in folders:
        inside = [file for file in discover([folder]) if file in set(files) and file not in by_path]
        by_path.update((Path(r.path), r) for r in api.convert_project(folder, inside, options, jobs))
    alone = [file for file in files if file not in by_path]
    by_path.update((Path(r.path), r) for r in api.convert_files(alone, options, jobs))
    return [by_path[file] for file in files]


def _held_back(result: FileResult) -> bool:
    """Left untouched only because another file of the project was refused (DDP210)."""
    return bool(result.error) and bool(result.diagnostics) and all(d.code == "DDP210" for d in result.diagnostics)


def _report_held_back(results: list[FileResult], diff: bool) -> int:
    say = (lambda text: typer.echo(text, err=True)) if diff else typer.echo
    by_reason: dict[str, list[str]] = {}
    for result in results:
        for message in dict.fromkeys(d.message for d in result.diagnostics):
            by_reason.setdefault(message, []).append(result.path)
    for message, paths in by_reason.items():
        shown = message.replace("this file", "these files") if len(paths) > 1 else message
        say(f"{', '.join(paths)}: not converted (left untouched)")
        say(f"  DDP210 {shown} [error]")
    return EXIT_REFUSED


def _report_conversion(result: FileResult, diff: bool, output: Path | None, view: View | None = None) -> int:
    from ddpify import api

    view = view or View()
    if result.error and not result.diagnostics:
        typer.echo(f"{result.path}: error: {result.error}", err=True)
        return EXIT_ERROR
    if diff and result.changed:
        typer.echo(_unified_diff(result), nl=False)
    # With --diff, stdout carries only the diff (for `| git apply`); the summary goes to stderr.
    say = (lambda text: typer.echo(text, err=True)) if diff else typer.echo
    if result.error:
        parse_error = any(d.code == "DDP001" for d in result.diagnostics)
        say(f"{result.path}: not converted (file left untouched)")
        for line in _diagnostic_lines(result, view):
            say(line)  # why: even with --quiet
        return EXIT_ERROR if parse_error else EXIT_REFUSED
    target = str(output) if output and not diff else result.path
    if not result.changed:
        if output is not None and not diff:
            # `convert a.py -o b.py && torchrun b.py` works on any input: b.py is a copy.
            try:
                api.write_result(result, output)
            except OSError as error:
                say(f"{result.path}: error: cannot write: {error}")
                return EXIT_ERROR
        copied = f" (copied to {output})" if output and not diff else ""
        if not result.diagnostics:
            say(f"{result.path}: nothing to convert{copied}")
            return EXIT_OK
        say(f"{result.path}: nothing to rewrite{copied}")  # e.g. a DDP path that only needs its switch
        if not view.quiet:
            for line in _diagnostic_lines(result, view):
                say(line)
            if result.launch_command:
                for line in _launch_lines(result, target):
                    say(line)
        return EXIT_OK
    if not diff:
        try:
            api.write_result(result, output)
        except OSError as error:
            say(f"{result.path}: error: cannot write: {error}")
            return EXIT_ERROR
    written = f" -> {output}" if output and not diff else ""
    say(f"{result.path}: {'would convert' if diff else 'converted'}{written}")
    if not view.quiet:
        for line in _diagnostic_lines(result, view):
            say(line)
        if result.launch_command:  # None for a module that only names the class
            for line in _launch_lines(result, target):
                say(line)
    return EXIT_FINDINGS if diff else EXIT_OK


@app.command()
def check(
    paths: List[Path] = typer.Argument(..., help="Files or folders to check; `-` reads standard input."),
    select: List[str] = typer.Option([], "--select", help="Only these codes (by prefix, comma-separated)."),
    ignore: List[str] = typer.Option([], "--ignore", help="Skip these codes (by prefix, comma-separated)."),
    output_format: str = typer.Option("full", "--output-format", help="full, concise, json, github or sarif."),
    output_file: Optional[Path] = typer.Option(None, "--output-file", help="Write the report here."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when there are findings."),
    force_exclude: bool = typer.Option(False, "--force-exclude", help="Apply excludes to files named here too."),
    stdin_filename: Optional[str] = typer.Option(None, "--stdin-filename", help="Name to report for `-`."),
    jobs: int = typer.Option(0, "-j", "--jobs", help="Worker processes (0: one per CPU)."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="The findings only: no summary."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also say which files were checked."),
) -> None:
    """Flag DataParallel use and DDP hazards: file:line:col: CODE message. Exit 1 on findings."""
    from ddpify import api
    from ddpify.check import CheckOptions, check_source
    from ddpify.config import ConfigError, find_config
    from ddpify.files import discover
    from ddpify.report import FORMATS, FileFindings, render

    if output_format not in FORMATS:
        _fail(f"--output-format must be one of {', '.join(FORMATS)}")
    try:
        config = find_config([p for p in paths if str(p) != "-"])
    except ConfigError as error:
        _fail(str(error))
    base = CheckOptions(
        select=_codes(select) or config.select,
        ignore=_codes(ignore) or config.ignore,
    )
    results: list = []
    if any(str(p) == "-" for p in paths):
        name = stdin_filename or "-"
        results.append(FileFindings(name, check_source(sys.stdin.read(), base)))
    files = discover([p for p in paths if str(p) != "-"], config.excluded, force_exclude)
    missing = [f for f in files if not f.is_file()]
    if missing:
        _fail(f"no such file: {missing[0]}")
    pairs = [(f, _with_ignores(base, config.ignores_for(f))) for f in files]
    results += api.check_files(pairs, jobs)
    errors = [r for r in results if r.error or any(d.code == "DDP001" for d in r.diagnostics)]
    found = any(r.diagnostics for r in results)
    failing = bool(errors) or (found and not exit_zero)
    links = output_file is None and output_format == "full" and _is_terminal()
    report = render(results, output_format, config.root, failing=failing, links=links, summary=not quiet)
    if verbose:
        typer.echo(f"checked {len(results)} file{'s' if len(results) != 1 else ''}: {', '.join(r.path for r in results)}", err=True)
    if output_file is not None:
        output_file.write_text(report, encoding="utf-8")
    else:
        typer.echo(report, nl=False)
    for result in errors:
        typer.echo(f"{result.path}: error: {result.error or 'cannot parse'}", err=True)
    if errors:
        raise typer.Exit(EXIT_ERROR)
    raise typer.Exit(EXIT_FINDINGS if found and not exit_zero else EXIT_OK)


@app.command()
def verify(
    original: Path = typer.Argument(..., help="The DataParallel script (or a DDP script to check as it is)."),
    script_args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script, after `--`."),
    converted: Optional[Path] = typer.Option(None, "--converted", help="The converted script (default: convert in memory)."),
    nproc: int = typer.Option(2, "--nproc", help="Processes (ranks) to launch."),
    backend: str = typer.Option("auto", "--backend", help="auto (NCCL when there are enough GPUs), gloo or nccl."),
    nnodes_sim: int = typer.Option(1, "--nnodes-sim", help="Simulate this many nodes: one torchrun launcher each, on loopback."),
    launcher: str = typer.Option("torchrun", "--launcher", help="torchrun, or slurm-sim (plain processes with Slurm's variables)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds before a hung world is killed."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Stop each rank after this many optimizer steps."),
    equivalence: bool = typer.Option(False, "--equivalence", help="Also run the original as one process and compare final weights."),
    cwd: Optional[Path] = typer.Option(None, "--cwd", help="Run the script here (default: a fresh temporary folder)."),
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Stream every rank's output as it runs, tagged with the run and rank."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print only the report: no line as each run starts and ends."),
) -> None:
    """Run a converted script under torch.distributed and check what it did. Exit 1 if a check fails."""
    from ddpify.verify.report import render_text
    from ddpify.verify.runner import VerifyOptions
    from ddpify.verify.runner import verify as run_verify

    options = VerifyOptions(
        nproc=nproc, backend=backend, nnodes_sim=nnodes_sim, launcher=launcher, timeout=timeout,
        max_steps=max_steps, equivalence=equivalence, cwd=cwd, script_args=tuple(script_args or ()),
        verbose=verbose,
    )
    # Each run's start and end as it happens (stdout is the JSON document's with --json).
    progress = None if quiet and not verbose else (lambda line: typer.echo(line, err=json_output))
    report = run_verify(original, converted, options, progress=progress)
    if json_output:
        typer.echo(report.to_json())
    elif report.error:
        typer.echo(f"error: {report.error}", err=True)
    else:
        typer.echo(render_text(report, header=progress is None), nl=False)
    raise typer.Exit(report.exit_code)


def _codes(values: List[str]) -> tuple[str, ...]:
    return tuple(code.strip() for value in values for code in value.split(",") if code.strip())


def _with_ignores(base, extra: tuple[str, ...]):
    from dataclasses import replace

    return replace(base, ignore=base.ignore + extra) if extra else base


@app.command()
def rule(code: Optional[str] = typer.Argument(None, help="A code, e.g. DDP510; none lists every code.")) -> None:
    """Explain a check or convert code, with a before/after example (no code: list them all)."""
    from ddpify.convert_codes import convert_codes
    from ddpify.rules import RULES

    converting = convert_codes()
    if code is None:
        typer.echo("check codes:")
        for known in RULES.values():
            fixable = "[*]" if known.fixable else ""
            typer.echo(f"  {known.code}  {known.name:<27} {fixable:<3} {_shorten(known.summary, 90)}")
        typer.echo("\nconvert codes:")
        for known, text in converting.items():
            typer.echo(f"  {known}  {_shorten(_convert_summary(text))}")
        typer.echo("\n[*] fixable by `ddpify convert`. `ddpify rule CODE` explains one code.")
        return
    wanted = code.strip().upper()
    if wanted in RULES:
        typer.echo(_check_rule_text(RULES[wanted]), nl=False)
    elif wanted in converting:
        typer.echo(_convert_rule_text(wanted, converting[wanted]), nl=False)
    else:
        import difflib

        close = difflib.get_close_matches(wanted, [*RULES, *converting], n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else "codes look like DDP105; `ddpify rule` lists them"
        _fail(f"unknown code {code}: {hint}")


def _shorten(text: str, width: int = 100) -> str:
    """One line, cut between words (never inside one, nor at a hyphen), marked with ``...``."""
    words = _plain(text).split()
    line = " ".join(words)
    if len(line) <= width:
        return line
    kept: list[str] = []
    for word in words:
        if len(" ".join([*kept, word])) > width - 4:
            break
        kept.append(word)
    return " ".join(kept) + " ..."


def _plain(text: str) -> str:
    """reStructuredText-isms of the transforms' docstrings as plain Markdown: ``x`` -> `x`,
    a closing ``::`` -> ``:``."""
    import re

    text = re.sub(r"(?<!`)``([^`]+?)``(?!`)", r"`\1`", text)
    return re.sub(r"::(\s*)$", r":\1", text, flags=re.MULTILINE)


def _convert_summary(text: str) -> str:
    from ddpify.convert_codes import summary

    return summary(text).rstrip(":").rstrip()


def _check_rule_text(found) -> str:
    """`ruff rule`'s layout: a Markdown page, title, fix availability, what, why, example."""
    from ddpify.rules import code_url

    fix = "Fix is available: `ddpify convert` rewrites it.\n\n" if found.fixable else ""
    return (
        f"# {found.name} ({found.code})\n\n"
        f"Reported by `ddpify check`.\n\n{fix}"
        f"## What it does\n{found.summary}.\n\n"
        f"## Why is this bad?\n{found.explanation}\n\n"
        f"## Example\n```python\n{found.before.rstrip()}\n```\n\n"
        f"Use instead:\n```python\n{found.after.rstrip()}\n```\n\n"
        f"Docs: {code_url(found.code)}\n"
    )


def _convert_rule_text(code: str, text: str) -> str:
    import re

    from ddpify.docs_reference import explanation_markdown
    from ddpify.rules import code_url

    body = _plain(explanation_markdown(text, name_source=False)).strip()
    severity = re.match(r"\((error|warning|refuses)[^)]*\)\s*", body)
    reported = "Reported by `ddpify convert`"
    if severity:
        word = "error: the file is left as it was" if severity.group(1) in ("error", "refuses") else "warning"
        reported += f" ({word})"
        body = body[severity.end():]
        body = body[:1].upper() + body[1:]
    elif body:
        body = body[:1].upper() + body[1:]
    return f"# {code}\n\n{reported}.\n\n## What it does\n{body}\n\nDocs: {code_url(code)}\n"


def _unified_diff(result: FileResult) -> str:
    name = result.path.lstrip("/")
    lines = difflib.unified_diff(
        result.source.splitlines(keepends=True),
        result.output.splitlines(keepends=True),
        fromfile=f"a/{name}",
        tofile=f"b/{name}",
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_ERROR)


def main() -> None:
    """The console script: an unexpected exception is ddpify's own bug, exit 2 (as ruff
    exits on an internal error), never Python's 1, which means findings here."""
    try:
        app(prog_name="ddpify")
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # SystemExit (typer's exits) passes through
        import traceback

        traceback.print_exc()
        print("error: internal error in ddpify (a bug; the traceback above helps to report it)", file=sys.stderr)
        sys.exit(EXIT_ERROR)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
