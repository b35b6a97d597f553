"""The library API. The CLI only prints what these functions return.

    from ddpify.api import convert_source
    result = convert_source(open("train.py").read(), path="train.py")
    result.output, result.diagnostics, result.launch_command
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
import tokenize
from pathlib import Path

import libcst as cst

from ddpify.analysis import analyze
from ddpify.diagnostics import ConvertOptions, Diagnostic, FileResult, Severity
from ddpify.transforms import TRANSFORMS
from ddpify.transforms.base import ConversionContext, MetadataView, Pipeline

# Text pre-filter: a file that never says DataParallel has nothing to convert.
MARKER = "DataParallel"

__all__ = ["ConvertOptions", "Diagnostic", "FileResult", "Severity", "convert_source", "convert_file", "write_result"]


def convert_source(source: str, options: ConvertOptions = ConvertOptions(), path: str = "<string>") -> FileResult:
    """Convert one script's text. Never raises for bad input: errors come back in the result."""
    if MARKER not in source:
        return FileResult(path, source, source)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        return _refused(path, source, [Diagnostic(error.raw_line, error.raw_column + 1, "DDP001", f"cannot parse: {error.message}", Severity.ERROR)])
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    facts = analyze(wrapper)
    if not facts.wraps and not facts.dp_references and not facts.problems:
        return FileResult(path, source, source)
    context = ConversionContext(module, facts, options, MetadataView(wrapper))
    for problem in facts.problems:
        context.report(problem.node, problem.code, problem.message, Severity.ERROR)
    transforms = [transform(context) for transform in TRANSFORMS]
    for transform in transforms:
        transform.check()
    if context.has_errors:
        return _refused(path, source, context.diagnostics)
    converted = module.visit(Pipeline(context, transforms))
    return FileResult(
        path,
        source,
        converted.code,
        tuple(sorted(set(context.diagnostics))),
        launch_command(path, context),
    )


def _refused(path: str, source: str, diagnostics: list[Diagnostic]) -> FileResult:
    errors = sorted({d for d in diagnostics if d.severity is Severity.ERROR})
    message = "; ".join(f"{d.line}:{d.col}: {d.code} {d.message}" for d in errors)
    return FileResult(path, source, source, tuple(errors), None, f"not converted: {message}")


def launch_command(path: str, context: ConversionContext) -> str:
    """`torchrun --standalone --nproc-per-node=N path`, N as many GPUs as DataParallel used."""
    counts = [site.device_count for site in context.facts.wraps if site.device_count]
    visible = context.visible_devices
    if counts:
        nproc = str(max(counts))
    elif visible and all(part.strip().isdigit() for part in visible.split(",")):
        nproc = str(len(visible.split(",")))
    else:
        nproc = "gpu"  # torchrun: one process per visible GPU, as DataParallel used them all
    prefix = f"CUDA_VISIBLE_DEVICES={visible} " if visible else ""
    return f"{prefix}torchrun --standalone --nproc-per-node={nproc} {path}"


# -- files ------------------------------------------------------------------------------------


def read_source(path: Path) -> tuple[str, str]:
    """The file's text and encoding (PEP 263), newlines kept exactly as they are."""
    raw = path.read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding), encoding


def convert_file(path: str | os.PathLike, options: ConvertOptions = ConvertOptions()) -> FileResult:
    path = Path(path)
    try:
        source, _ = read_source(path)
    except (OSError, UnicodeDecodeError, SyntaxError) as error:
        return FileResult(str(path), "", "", (), None, f"cannot read: {error}")
    return convert_source(source, options, str(path))


def write_result(result: FileResult, destination: str | os.PathLike | None = None) -> None:
    """Write the converted text atomically, keeping the source's encoding and file mode."""
    source_path = Path(result.path)
    target = Path(destination) if destination is not None else source_path
    _, encoding = read_source(source_path)
    mode = source_path.stat().st_mode & 0o7777
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding=encoding, newline="") as stream:
            stream.write(result.output)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def convert_files(paths: list[Path], options: ConvertOptions = ConvertOptions(), jobs: int = 0) -> list[FileResult]:
    """Convert many files, in worker processes when there are several; results in input order."""
    return _map(functools.partial(convert_file, options=options), paths, jobs)


def _map(function, items: list, jobs: int) -> list:
    workers = min(jobs or os.cpu_count() or 1, len(items))
    if workers <= 1:
        return [function(item) for item in items]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(function, items, chunksize=max(1, len(items) // (workers * 8))))


# -- check -------------------------------------------------------------------------------------


def check_file(path: Path, options=None) -> "FileFindings":
    from ddpify.check import CheckOptions, check_source
    from ddpify.report import FileFindings

    try:
        source, _ = read_source(Path(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as error:
        return FileFindings(str(path), (), f"cannot read: {error}")
    return FileFindings(str(path), check_source(source, options or CheckOptions()))


def check_files(pairs: list[tuple[Path, object]], jobs: int = 0) -> list:
    """Check (path, CheckOptions) pairs, in worker processes when there are many."""
    return _map(_check_pair, pairs, jobs if len(pairs) > 8 else 1)


def _check_pair(pair: tuple[Path, object]):
    return check_file(*pair)
