"""Typed, frozen result objects shared by the library API and the CLI.

Nothing here imports libcst or torch, so the CLI can format results without paying for
either.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field


# A file's part in a conversion; project mode (ddpify.project) gives the last two.
SCRIPT, LIBRARY, ENTRY = "script", "library", "entry"
SUPPRESSION = re.compile(r"#\s*(?:noqa|ddpify:\s*ignore)(?::\s*|\[)?([A-Z0-9, ]*)\]?", re.IGNORECASE)


def suppressed(line: str, code: str) -> bool:
    """`# noqa`, `# noqa: DDP611`, `# ddpify: ignore[DDP611]` (codes by prefix) on the line."""
    match = SUPPRESSION.search(line)
    if match is None:
        return False
    codes = [c.strip() for c in match.group(1).split(",") if c.strip()]
    return not codes or any(code.startswith(c) for c in codes)


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
    # With several processes the converted script checks itself after optimizer steps 1, 2,
    # 4, 8, ... (every rank the same weights and learning rates). Off by default: `ddpify
    # verify` proves the same before launch without code in the script.
    self_check: bool = False


@dataclass
class ProjectLinks:
    """Project mode (ddpify.project): what the rest of the project tells the engine about
    one file, and what the engine learns back from it."""

    names: frozenset[str] = frozenset()  # bound from other project modules
    trains_elsewhere: bool = False  # another module of the group has a training step
    # qualified names here that another project module re-exports from a library:
    # "dataset.DataLoader" -> "torch.utils.data.DataLoader"
    reexports: dict[str, str] = field(default_factory=dict)
    # calls here of other modules' functions that run a training step (`train_step(model,
    # x, y, optimizer)` in steps.py): the loop around such a call is a training loop
    training_calls: frozenset[str] = frozenset()
    # this module's functions whose returned loaders another module trains on
    loader_functions: dict[str, set[int | None]] | None = None
    # calls here of other modules' functions that train on a loader parameter
    parameter_loaders: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    # learnt: loaders trained on here that other modules' functions return
    foreign_loaders: list = field(default_factory=list)
    # learnt: this module's functions that train on a loader parameter its callers pass
    loader_parameters: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    # learnt: which parameter_loaders calls passed a loader that is sharded here
    sharded_parameter_calls: set[str] = field(default_factory=set)
    # this module's functions and trainer classes that train on a loader parameter no module of
    # the project ddpify can follow passes (a trainer picked from a table): sharded where drawn
    unfed: frozenset[str] = frozenset()
    # project functions called here that the project calls in other places too (a loader
    # builder for training and validation): what they return is sharded where training draws it
    shared_builders: frozenset[str] = frozenset()
    # every DataParallel wrap of the group stays inside the function that makes it, and this
    # module wraps none: what it trains is a model of its own, not the wrapped one (the second
    # stage of Thin-Plate-Spline-Motion-Model, which never used DataParallel)
    models_unwrapped: bool = False

    def rewrite_key(self) -> tuple:
        """Everything here that a file's rewrite depends on (not what it learns)."""
        return (*self.learning_key(), self.trains_elsewhere)

    def learning_key(self) -> tuple:
        """Everything here that what a file learns depends on."""
        return (
            self.names,
            _frozen(self.reexports),
            self.training_calls,
            _frozen(self.loader_functions),
            _frozen(self.parameter_loaders),
            self.unfed,
            self.shared_builders,
            self.models_unwrapped,
        )


def _frozen(value):
    """A hashable, order-free stand-in for a dict of sets or lists (or None)."""
    if isinstance(value, dict):
        return frozenset((key, _frozen(item)) for key, item in value.items())
    if isinstance(value, (set, frozenset)):
        return frozenset(value)
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    return value
