"""A script's own project modules, read (never rewritten) when the script is converted alone.

`ddpify convert train.py` converts one file, but what that file calls decides what the
conversion must do: a helper that writes a log file or the experiment folder
(`io = IOStream(path)`, `save_args(args)`, `create_exp_dir(path)`) must run on rank 0 only;
a star import (`from network import *`) may bind torch under another name (`t.save`); a
model wrapped in DataParallel inside an imported module leaves nothing to convert here,
and the folder is what must be converted. The modules the script imports are found as
Python would find them next to it (the script's folder, a package there, relative imports,
folders a literal `sys.path.append`/`insert` adds), parsed with `ast` (fast, no libcst),
and summarised:

- **writers**: names the script binds to functions or classes of those modules whose code
  writes files (open for writing, torch.save, json/pickle/numpy dumps, figures, folders,
  log files, trackers) and never runs a model step or a collective;
- **torch aliases**: names a star-imported module binds to torch modules (`t` for
  ``import torch as t``), as qualified names;
- **wrapping modules**: imported modules that wrap a model in DataParallel.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ddpify.diagnostics import Diagnostic, FileResult, Severity

# Calls (by their last name) that write files or folders, and those that do only when called
# on a module of the standard library (`os.remove`, not `items.remove`).
WRITING_CALLS = {
    "save", "savez", "savez_compressed", "savetxt", "dump", "savefig", "imwrite", "imsave", "save_image",
    "makedirs", "mkdir", "FileHandler", "SummaryWriter", "write_text", "write_bytes", "to_csv",
}
WRITING_MODULE_CALLS = {
    "shutil": {"copy", "copy2", "copyfile", "copytree", "rmtree", "move"},
    "os": {"remove", "unlink", "rename", "replace", "rmdir"},
}
# Words that say a function trains or synchronises: it must run on every rank.
# (a function that runs a model may reach DDP's buffer broadcast: never rank 0 alone)
EVERY_RANK_WORDS = re.compile(
    r"backward\(|\.step\(|all_reduce|barrier|broadcast|torch\.distributed|\bdist\.|no_grad|\.eval\(\)|forward\("
    r"|(?<!\w)(model|net|network)\("
)
WRITE_MODES = ("w", "a", "x", "+")


@dataclass(frozen=True)
class Neighbours:
    """What the script's own project modules tell its single-file conversion."""

    writers: frozenset[str] = frozenset()  # callables bound in the script that only write files
    writer_classes: frozenset[str] = frozenset()  # classes among them: their objects keep files open
    reexports: dict[str, str] = field(default_factory=dict)  # name bound by a star import -> torch path
    wrapping_modules: tuple[str, ...] = ()  # imported modules that wrap a model in DataParallel
    # model classes that change which parameters train outside __init__ (TSM's partial
    # BatchNorm freezing in its own train()): DDP must register every parameter
    freezing_classes: frozenset[str] = frozenset()
    wrapping_files: tuple[Path, ...] = ()  # the files of wrapping_modules
    # classes and functions that compare the samples of a batch with each other (batch-hard
    # triplet mining, contrastive losses): DataParallel ran them on the whole global batch
    pairwise: frozenset[str] = frozenset()


def wrapping_neighbour(path: str, source: str) -> tuple[str, Path] | None:
    """The module this script imports that wraps a model in DataParallel (and the folder that
    holds both), for a script that names no DataParallel itself but trains: a single-file
    conversion would miss the wrap."""
    if not re.search(r"backward\(|optimi[sz]er|\.step\(", source):
        return None
    found = read_neighbours(path, source)
    if not found.wrapping_modules:
        return None
    script = Path(path).parent
    common = Path(os.path.commonpath([script.resolve(), found.wrapping_files[0].resolve()]))
    try:
        folder = common.relative_to(Path.cwd().resolve()) if not script.is_absolute() else common
    except ValueError:
        folder = common
    return found.wrapping_modules[0], folder


def read_neighbours(path: str, source: str) -> Neighbours:
    """The project modules `source` (the file at `path`) imports, summarised; nothing for a
    file that is not on disk."""
    script = Path(path)
    if not script.is_file():
        return Neighbours()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return Neighbours()
    folders = _search_folders(script.parent, tree)
    writers, classes, reexports, wrapping, freezing, files, pairwise = set(), set(), {}, [], set(), [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = _module_file(folders, node.module or "", node.level, script.parent)
            if module is None:
                continue
            summary = _summary(module)
            # `from drqa import reader`: names that are submodules of a package are modules too
            submodules = [_module_file([module.parent], alias.name, 0, module.parent) for alias in node.names] if module.name == "__init__.py" else []
            if summary.wraps or any(sub is not None and _summary(sub).wraps for sub in submodules):
                wrapping.append(node.module or ".")
                files.append(module)
            for alias in node.names:
                if alias.name == "*":
                    reexports.update(summary.torch_aliases)
                    writers.update(summary.writers)
                    classes.update(summary.writer_classes)
                    freezing.update(summary.freezing_classes)
                    pairwise.update(summary.pairwise)
                elif alias.name in summary.pairwise:
                    pairwise.add(alias.asname or alias.name)
                elif alias.name in summary.freezing_classes:
                    freezing.add(alias.asname or alias.name)
                elif alias.name in summary.writers:
                    writers.add(alias.asname or alias.name)
                    if alias.name in summary.writer_classes:
                        classes.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module = _module_file(folders, alias.name, 0, script.parent)
                if module is None:
                    continue
                summary = _summary(module)
                if summary.wraps:
                    wrapping.append(alias.name)
                    files.append(module)
                bound = alias.asname or alias.name
                writers.update(f"{bound}.{name}" for name in summary.writers)
                classes.update(f"{bound}.{name}" for name in summary.writer_classes)
                freezing.update(f"{bound}.{name}" for name in summary.freezing_classes)
                pairwise.update(f"{bound}.{name}" for name in summary.pairwise)
    return Neighbours(
        frozenset(writers), frozenset(classes), reexports, tuple(dict.fromkeys(wrapping)), frozenset(freezing), tuple(files),
        frozenset(pairwise),
    )


# Code that compares the samples of a batch with each other: a distance of the batch with
# itself, a product with its own transpose, a label-equality matrix.
PAIRWISE = re.compile(
    r"\w*dist\w*\(\s*(\w+)\s*,\s*\1\s*\)"
    r"|(\w+)\.mm\(\s*\2\.t\(\)\s*\)|matmul\(\s*(\w+)\s*,\s*\3\.T\s*\)|(\w+)\s*@\s*\4\.T\b"
    r"|(\w+)\s*==\s*\5\.T\b|(\w+)\s*==\s*\6\.t\(\)|(\w+)\.eq\(\s*\7\.t\(\)\s*\)|eq\(\s*(\w+)\s*,\s*\8\.T\s*\)"
    r"|expand\((\w+),\s*\9\)\.eq\("
)
# Files that mark a project's root: a package there is importable once installed (`pip install -e .`).
ROOT_MARKERS = ("setup.py", "setup.cfg", "pyproject.toml", ".git")


def _search_folders(folder: Path, tree: ast.Module) -> list[Path]:
    """The script's folder, folders it puts on sys.path with a literal, and the project root
    above it (DrQA's scripts/reader/train.py imports the installed `drqa` package of its root)."""
    found = [folder]
    root = next((up for up in list(folder.parents)[:4] if any((up / marker).exists() for marker in ROOT_MARKERS)), None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "insert"):
            if ast.unparse(node.func.value) != "sys.path" or not node.args:
                continue
            literal = [arg for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            literal += [
                part for arg in node.args if isinstance(arg, ast.Call)
                for part in arg.args if isinstance(part, ast.Constant) and isinstance(part.value, str)
            ]
            for constant in literal:
                candidate = (folder / constant.value).resolve()
                if candidate.is_dir() and candidate not in found:
                    found.append(candidate)
    if root is not None and root not in found:
        found.append(root)
    return found


def _module_file(folders: list[Path], dotted: str, level: int, here: Path) -> Path | None:
    if level:
        base = here
        for _ in range(level - 1):
            base = base.parent
        roots = [base]
    else:
        roots = folders
    parts = [part for part in dotted.split(".") if part]
    for root in roots:
        target = root.joinpath(*parts) if parts else root
        for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
            if candidate is not None and candidate.is_file():
                return candidate
    return None


@dataclass(frozen=True)
class ModuleSummary:
    writers: frozenset[str] = frozenset()
    writer_classes: frozenset[str] = frozenset()
    torch_aliases: dict[str, str] = field(default_factory=dict)
    wraps: bool = False
    freezing_classes: frozenset[str] = frozenset()
    pairwise: frozenset[str] = frozenset()


@functools.lru_cache(maxsize=256)
def _summary(path: Path) -> ModuleSummary:
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return ModuleSummary()
    aliases = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch" and alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    writers, classes = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _only_writes(node):
            writers.add(node.name)
        elif isinstance(node, ast.ClassDef) and _keeps_files(node):
            writers.add(node.name)
            classes.add(node.name)
    wraps = re.search(r"(?<!Distributed)DataParallel\(", source) is not None
    if path.name == "__init__.py" and not wraps:  # a package re-exporting its modules' classes (DrQA's DocReader)
        wraps = any(
            _summary(sub).wraps
            for node in tree.body if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
            for sub in [_module_file([path.parent], node.module, 0, path.parent)] if sub is not None
        )
    freezing = frozenset(node.name for node in tree.body if isinstance(node, ast.ClassDef) and _freezes_after_init(node))
    pairwise = frozenset(
        node.name for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and PAIRWISE.search(ast.unparse(node))
    )
    return ModuleSummary(frozenset(writers), frozenset(classes), aliases, wraps, freezing, pairwise)


def _freezes_after_init(cls: ast.ClassDef) -> bool:
    """A method other than __init__ sets `requires_grad` (TSM's train() freezing BatchNorm)."""
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef) or method.name == "__init__":
            continue
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and node.attr in ("requires_grad", "requires_grad_") and (
                isinstance(node.ctx, ast.Store) or node.attr == "requires_grad_"
            ):
                return True
    return False


def _only_writes(function: ast.FunctionDef) -> bool:
    """Writes files, and runs no model step or collective."""
    text = ast.unparse(function)
    return _writes(function) and not EVERY_RANK_WORDS.search(text)


def _keeps_files(cls: ast.ClassDef) -> bool:
    """A logger-like class: its constructor opens a file for writing (or a writer), and none
    of its methods trains or synchronises."""
    text = ast.unparse(cls)
    init = next((item for item in cls.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
    return init is not None and _writes(init) and not EVERY_RANK_WORDS.search(text)


def _writes(node: ast.AST) -> bool:
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id if isinstance(call.func, ast.Name) else ""
        if name in WRITING_CALLS:
            return True
        owner = call.func.value.id if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) else None
        if owner in WRITING_MODULE_CALLS and name in WRITING_MODULE_CALLS[owner]:
            return True
        if name == "open" and _write_mode(call):
            return True
    return False


def _write_mode(call: ast.Call) -> bool:
    mode = next((k.value for k in call.keywords if k.arg == "mode"), call.args[1] if len(call.args) > 1 else None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(flag in mode.value for flag in WRITE_MODES)


def wrapped_elsewhere(path: str, source: str) -> FileResult | None:
    """Single-file mode: a script that trains a model a module it imports wraps in
    DataParallel (MedicalNet's generate_model, DrQA's model.parallelize()) is refused: this
    file alone cannot be converted, the folder can."""
    found = wrapping_neighbour(path, source)
    if found is None:
        return None
    module, folder = found
    message = (
        f"this script trains a model that the module it imports, `{module}`, wraps in DataParallel: converting "
        f"this file alone would leave that wrap; convert the folder that holds both (`ddpify convert {folder}`), "
        "which converts the script and that module together"
    )
    error = Diagnostic(1, 1, "DDP214", message, Severity.ERROR)
    return FileResult(path, source, source, (error,), None, f"not converted: 1:1: DDP214 {message}")
