"""Names and scopes: where the walk is, and what a name or an expression refers to.

``Scopes`` is the one object every room of the analysis shares. It keeps the walk's
position (the function, class and loops around the current node), the calls seen so far
with their contexts, the module's top-level functions, and reads libcst's metadata for the
original tree: parents, scopes, qualified names (through a project's re-exports and star
imports).
"""

from __future__ import annotations

import functools

from typing import Any

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider
from libcst.metadata.base_provider import LazyValue

from ddpify.analysis.facts import Context, Facts, Function, Loop, Problem
from ddpify.analysis.tree import dotted
from ddpify.names import STAR_NAME

PROVIDERS = (QualifiedNameProvider, ScopeProvider, ParentNodeProvider, PositionProvider)
_UNDEFINED = object()
# Names a star import (``from models import *``) commonly brings in, and what they stand for.
STAR_IMPORTED_ROOTS = {
    "torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional", "np": "numpy", "numpy": "numpy",
    "plt": "matplotlib.pyplot", "os": "os", "shutil": "shutil", "cv2": "cv2", "json": "json", "pickle": "pickle",
}  # (gopt's `np.savetxt` after `from models import *`: a file write)


def through_reexports(name: str, reexports: dict[str, str]) -> str:
    """A qualified name read through a project module's re-exports, the longest re-exported
    prefix first: `model.nn.DataParallel` where model.py does `import torch.nn as nn` is
    torch.nn.DataParallel (rsfn's `from model import Generator, nn`)."""
    if not reexports or name in reexports:
        return reexports.get(name, name)
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in reexports:
            return ".".join([reexports[prefix], *parts[end:]])
    return name


def star_roots(reexports: dict[str, str]) -> dict[str, str]:
    """Names a star import binds to a library: the usual ones, and (project mode) those the
    project's star-imported modules bind (``import torch as t`` there: ``t`` is torch)."""
    found = {name[len(STAR_NAME):]: library for name, library in reexports.items() if name.startswith(STAR_NAME)}
    return {**STAR_IMPORTED_ROOTS, **found} if found else STAR_IMPORTED_ROOTS


def star_imported_torch(node: cst.CSTNode, scope_of, roots: dict[str, str] = STAR_IMPORTED_ROOTS) -> set[str]:
    """``torch.nn.DataParallel`` / ``nn.DataParallel`` where ``torch`` / ``nn`` is bound by
    nothing but a star import: taken to be torch's (the spelled-out path says so)."""
    name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
    if not name or "." not in name:
        return set()
    root, rest = name.split(".", 1)
    base = node
    while isinstance(base, cst.Attribute):
        base = base.value
    scope = scope_of(base)
    if root not in roots or scope is None or list(scope[root]):
        return set()
    return {f"{roots[root]}.{rest}"}


class Room:
    """One part of the analysis: reads the shared ``Scopes``, records into the walk's facts,
    and decides into each resolution's (``Analyzer.resolve``)."""

    def __init__(self, scopes: Scopes) -> None:
        self.scopes = scopes

    @property
    def facts(self) -> Facts:
        return self.scopes.facts


class Scopes:
    """The walk's position and the original tree's metadata, shared by the analysis rooms."""

    def __init__(self, facts: Facts, metadata: dict[type, Any]) -> None:
        self.facts = facts
        self.metadata = metadata
        self.functions: list[Function] = []
        self.classes: list[cst.ClassDef | None] = [None]
        self.loops: list[list[Loop]] = [[]]  # one list of open loops per function level
        self.calls: list[tuple[cst.Call, Context]] = []  # every call, with where it sits
        self.module_functions: dict[str, Function] = {}  # top-level functions, by name
        self.in_main_guard = False
        self.module: cst.Module | None = None

    # -- metadata ------------------------------------------------------------------------
    def get_metadata(self, key: type, node: cst.CSTNode, default: Any = _UNDEFINED) -> Any:
        if default is not _UNDEFINED:
            value = self.metadata[key].get(node, default)
        else:
            value = self.metadata[key][node]
        return value() if isinstance(value, LazyValue) else value

    def parent(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.get_metadata(ParentNodeProvider, node)

    def scope_of(self, node: cst.CSTNode):
        return self.get_metadata(ScopeProvider, node, None)

    def assignments_of(self, name: cst.Name) -> list:
        scope = self.get_metadata(ScopeProvider, name, None)
        return list(scope[name.value]) if scope is not None else []

    def qualified(self, node: cst.CSTNode, depth: int = 0) -> set[str]:
        reexports = self.facts.reexports
        names = {through_reexports(q.name, reexports) for q in self.get_metadata(QualifiedNameProvider, node, set())}
        alias = module_aliases(self.module).get(node.value) if isinstance(node, cst.Name) and self.module is not None and depth < 3 else None
        if alias is not None and names <= {node.value}:
            return self.qualified(alias, depth + 1)
        if names or not self.facts.star_imports:
            return names
        return star_imported_torch(node, lambda name: self.get_metadata(ScopeProvider, name, None), star_roots(reexports))

    # -- where the walk is -----------------------------------------------------------------
    def context(self) -> Context:
        return Context(
            self.functions[-1] if self.functions else None,
            self.classes[-1],
            tuple(self.loops[-1]),
        )

    def problem(self, node: cst.CSTNode, code: str, message: str) -> None:
        self.facts.problems.append(Problem(node, code, message))

    def enter_function(self, node: cst.FunctionDef) -> None:
        if not self.functions and self.classes == [None]:
            self.module_functions[node.name.value] = node
        self.functions.append(node)
        self.classes.append(self.classes[-1] if self._is_method(node) else None)
        self.loops.append([])

    def leave_function(self) -> None:
        self.functions.pop()
        self.classes.pop()
        self.loops.pop()

    def _is_method(self, node: cst.FunctionDef) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.IndentedBlock) and isinstance(self.parent(parent), cst.ClassDef)

    # -- what a target or a call refers to -------------------------------------------------
    def assigned_name(self, value: cst.BaseExpression) -> str | None:
        parent = self.parent(value)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return dotted(parent.targets[0].target)
        if isinstance(parent, cst.AnnAssign):
            return dotted(parent.target)
        return None

    def assigned_value(self, target: cst.CSTNode) -> tuple[cst.BaseExpression | None, int | None]:
        """The value assigned to a target name, and its index when it is unpacked from a tuple."""
        index = None
        parent = self.parent(target)
        if isinstance(parent, cst.Element):
            sequence = self.parent(parent)
            index = [element for element in sequence.elements].index(parent)
            if any(isinstance(element, cst.StarredElement) for element in sequence.elements):
                return None, None
            parent = self.parent(sequence)
        if isinstance(parent, cst.AssignTarget):
            parent = self.parent(parent)
        if isinstance(parent, (cst.Assign, cst.AnnAssign)):
            return parent.value, index
        if isinstance(parent, cst.AsName) and isinstance(self.parent(parent), cst.WithItem) and index is None:
            return self.parent(parent).item, None  # `with trange(n) as pbar:` (pytorch-ddpm)
        return None, None

    def local_function(self, func: cst.BaseExpression) -> Function | None:
        """The function of this module that a call's name refers to."""
        if not isinstance(func, cst.Name):
            return None
        scope = self.get_metadata(ScopeProvider, func, None)
        if scope is None:
            return None
        for assignment in scope[func.value]:
            if isinstance(getattr(assignment, "node", None), cst.FunctionDef):
                return assignment.node
        return None


@functools.lru_cache(maxsize=8)
def module_aliases(module: cst.Module) -> dict[str, cst.BaseExpression]:
    """Module-level names bound once, to another name: TFPnP's ``DataParallel = nn.DataParallel``
    after a star import (read as what it names, not as the star import's)."""
    bound: dict[str, list[cst.BaseExpression]] = {}
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    if isinstance(target.target, cst.Name):
                        bound.setdefault(target.target.value, []).append(small.value)
    return {
        name: values[0] for name, values in bound.items()
        if len(values) == 1 and isinstance(values[0], (cst.Name, cst.Attribute)) and dotted(values[0]) != name
    }
