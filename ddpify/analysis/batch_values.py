"""Where DataParallel's global batch size lives under other names.

A training loader's ``batch_size=options.bs`` is read again as ``bs`` after ``bs =
options.bs``; each such name says the global batch as much as the loader's argument does.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.tree import walk


def with_aliases(module: cst.Module, sizes: set[str]) -> frozenset[str]:
    """``sizes`` (code) and every name bound only ever to one of them (``bs = options.bs``),
    and names bound to those in turn. A name bound to anything else too (``bs = x.size(0)``
    in the loop) is not one: which value it holds depends on where it is read."""
    bindings: dict[str, list[cst.BaseExpression | None]] = {}
    for node in walk(module):
        for name, value in _bound(node):
            bindings.setdefault(name, []).append(value)
    found = set(sizes)
    while True:
        more = {
            name for name, values in bindings.items()
            if name not in found and all(value is not None and module.code_for_node(value) in found for value in values)
        }
        if not more:
            return frozenset(found)
        found |= more


def _bound(node: cst.CSTNode) -> list[tuple[str, cst.BaseExpression | None]]:
    """Names ``node`` binds and the value it binds each to (None: not a plain value)."""
    if isinstance(node, cst.Assign):
        return [
            (target.target.value, node.value if len(node.targets) == 1 else None) if isinstance(target.target, cst.Name)
            else (name.value, None)
            for target in node.targets
            for name in ([target.target] if isinstance(target.target, cst.Name) else _names(target.target))
        ]
    if isinstance(node, cst.AnnAssign) and isinstance(node.target, cst.Name):
        return [(node.target.value, node.value)]
    if isinstance(node, (cst.AugAssign, cst.For)):
        return [(name.value, None) for name in _names(node.target)]
    if isinstance(node, cst.Param):
        return [(node.name.value, None)]
    if isinstance(node, cst.AsName):
        return [(name.value, None) for name in _names(node.name)]
    return []


def _names(target: cst.CSTNode) -> list[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _names(element.value)]
    if isinstance(target, cst.StarredElement):
        return _names(target.value)
    return []
