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
from typing import TYPE_CHECKING

from ddpify.diagnostics import ConvertOptions, Diagnostic, FileResult, Severity
from ddpify.names import mentions_data_parallel


if TYPE_CHECKING:
    from ddpify.report import FileFindings

__all__ = ["ConvertOptions", "Diagnostic", "FileResult", "Severity", "convert_source", "convert_file", "write_result"]


def convert_source(source: str, options: ConvertOptions = ConvertOptions(), path: str = "<string>") -> FileResult:
    """Convert one script's text. Never raises for bad input: errors come back in the result."""
    if not mentions_data_parallel(source):
        from ddpify.project.neighbours import wrapped_elsewhere  # ast only: no libcst for nothing to convert

        return wrapped_elsewhere(path, source) or FileResult(path, source, source)
    from ddpify.engine import convert_text  # libcst only when there is something to convert

    return convert_text(source, options, path)


# -- files ------------------------------------------------------------------------------------


NOTEBOOK = (
    "a Jupyter notebook: ddpify converts Python files; export its code first "
    "(`jupyter nbconvert --to script NAME.ipynb`), then convert the .py and run it under torchrun"
)


def read_source(path: Path) -> tuple[str, str]:
    """The file's text and encoding (PEP 263), newlines kept exactly as they are."""
    raw = path.read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding), encoding


def convert_file(path: str | os.PathLike, options: ConvertOptions = ConvertOptions()) -> FileResult:
    path = Path(path)
    if path.suffix == ".ipynb":
        # (a notebook's JSON parses as one Python dict: it would pass for a file with nothing to convert)
        return FileResult(str(path), "", "", (), None, NOTEBOOK)
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


def convert_project(
    root: Path, files: list[Path], options: ConvertOptions = ConvertOptions(), jobs: int = 0
) -> list[FileResult]:
    """Convert a project (ddpify.project): one view across its files, results in ``files``
    order; files that cannot be read come back with their error. Each file is parsed,
    analysed and rewritten once, in ``jobs`` worker processes (0: one per CPU, where the
    project is large enough to pay for them; 1: none)."""
    from ddpify.project import convert_project as convert

    sources: dict[Path, str] = {}
    unreadable: dict[Path, FileResult] = {}
    for path in files:
        try:
            sources[path] = read_source(path)[0]
        except (OSError, UnicodeDecodeError, SyntaxError) as error:
            unreadable[path] = FileResult(str(path), "", "", (), None, f"cannot read: {error}")
    converted = {Path(result.path): result for result in convert(root, sources, options, jobs)}
    return [unreadable.get(path) or converted[path] for path in files]


def _map(function, items: list, jobs: int) -> list:
    workers = min(jobs or os.cpu_count() or 1, len(items))
    if workers <= 1:
        return [function(item) for item in items]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(function, items, chunksize=max(1, len(items) // (workers * 8))))


# -- check -------------------------------------------------------------------------------------


def check_file(path: Path, options=None) -> FileFindings:
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
