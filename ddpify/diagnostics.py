"""Typed, frozen result objects shared by the library API and the CLI.

Nothing here imports libcst or torch, so the CLI can format results without paying for
either.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


# A file's part in a conversion; project mode (ddpify.project) gives the last two.
SCRIPT, LIBRARY, ENTRY = "script", "library", "entry"


class Severity(str, enum.Enum):
    """How a diagnostic affects the file."""

    CHANGE = "change"  # the converter rewrote something
    WARNING = "warning"  # left alone and reported: the user must look at it
    ERROR = "error"  # the whole file was left untouched


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding at a position in a file (1-based line, 1-based column)."""

    line: int
    col: int
    code: str
    message: str
    severity: Severity = Severity.CHANGE

    def concise(self, path: str) -> str:
        return f"{path}:{self.line}:{self.col}: {self.code} {self.message}"


@dataclass(frozen=True)
class FileResult:
    """What converting one file produced.

    ``output`` equals ``source`` whenever ``error`` is set: a file is converted whole or
    not at all.
    """

    path: str
    source: str
    output: str
    diagnostics: tuple[Diagnostic, ...] = ()
    launch_command: str | None = None
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.output != self.source

    @property
    def skipped(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity is not Severity.CHANGE)


@dataclass(frozen=True)
class ConvertOptions:
    """Choices a user can make about the conversion."""

    # DataParallel's batch size is global. By default each process gets its share so the
    # global batch (and so the training) stays the same; True keeps the number per process.
    per_process_batch: bool = False
    # Findings that mean "this would not train one model on sharded data" refuse the file;
    # True turns them into warnings and converts the rest (the user finishes by hand).
    allow_partial: bool = False
    # Plain `python train.py` on a machine with several GPUs re-launches itself under
    # torchrun (one process per GPU), as DataParallel used every GPU; False leaves it out.
    relaunch: bool = True
