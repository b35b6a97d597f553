"""Two backward() passes through one forward of a wrapped model (transforms/merged_backwards.py).

A pass that keeps its graph (``retain_graph=True``) and a later pass whose loss is computed
from the same call of a wrapped model run backward through that forward twice: DDP averages
the first only. The forward a pass runs through is followed through the names its loss is
computed from in the training step, each bound once there; ``.detach()``, ``.data`` and
``.item()`` cut the way (a critic's step on ``fake.detach()`` does not run through the
generator). A pair is joinable when both passes are statements of their own in one block and
nothing between them steps, zeroes or reads a gradient: one backward() of their sum is then
what the two computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpify.analysis.tree import calls_in, dotted, loop_origins, walk

CUTS = ("detach", "detach_", "item", "data", "numpy", "tolist")
# What may not run between two passes that become one: it steps, zeroes or reads gradients,
# or changes which parameters take them.
BETWEEN = ("step", "zero_grad", "backward", "grad", "requires_grad", "requires_grad_")


@dataclass(frozen=True)
class BackwardPair:
    first: cst.Call  # `g.backward(mone, retain_graph=True)`
    second: cst.Call  # `v.backward()`
    shared: cst.Call  # the wrapped model's call both run through (`SR(px)`)
    joinable: bool


def backward_pairs(step: cst.CSTNode, models: set[str], parent) -> list[BackwardPair]:
    """Each retaining pass of the step and the next pass through one of the same forwards."""
    origins = loop_origins(step)
    passes = [call for call in calls_in(step.body) if _a_backward(call)]
    found = []
    for at, first in enumerate(passes):
        if not retains(first):
            continue
        through = forwards_of(first.func.value, origins, models)
        for later in passes[at + 1 :]:
            shared = through & forwards_of(later.func.value, origins, models)
            if shared:
                found.append(BackwardPair(first, later, next(iter(shared)), _joinable(first, later, parent)))
                break
    return found


def wrapped_in_tuples(module: cst.Module, wrap_calls: list[cst.Call]) -> set[str]:
    """Names a tuple assignment binds to wraps (ADASR's ``SR, D, vgg = DataParallel(SR),
    DataParallel(D), DataParallel(vgg)``)."""
    calls = {id(call) for call in wrap_calls}
    names = set()
    for node in walk(module):
        if isinstance(node, cst.Assign) and isinstance(node.value, cst.Tuple):
            for target in node.targets:
                if isinstance(target.target, cst.Tuple) and len(target.target.elements) == len(node.value.elements):
                    names.update(
                        dotted(t.value) for t, v in zip(target.target.elements, node.value.elements)
                        if id(v.value) in calls and dotted(t.value)
                    )
    return names


def retains(call: cst.Call) -> bool:
    return any(
        arg.keyword is not None and arg.keyword.value == "retain_graph"
        and not (isinstance(arg.value, cst.Name) and arg.value.value in ("False", "None"))
        for arg in call.args
    )


def _a_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _joinable(first: cst.Call, second: cst.Call, parent) -> bool:
    """Both passes are statements of their own (``loss.backward(...)``, alone on their line or
    beside others: ADASR's ``g = D(fake).mean(); g.backward(mone, retain_graph=True)``) in one
    block, and nothing between them steps, zeroes or reads a gradient."""
    expressions = [parent(call) for call in (first, second)]
    if not all(isinstance(e, cst.Expr) for e in expressions):
        return False
    lines = [parent(e) for e in expressions]
    block = parent(lines[0])
    if not all(isinstance(line, cst.SimpleStatementLine) for line in lines) or parent(lines[1]) is not block:
        return False
    # the block's small statements in order (a compound statement counts as one)
    flat = [small for line in block.body for small in (line.body if isinstance(line, cst.SimpleStatementLine) else [line])]
    at, to = flat.index(expressions[0]), flat.index(expressions[1])
    for statement in flat[at + 1 : to]:
        for node in walk(statement):
            name = node.attr.value if isinstance(node, cst.Attribute) else None
            if name in BETWEEN or isinstance(node, (cst.BaseCompoundStatement, cst.Return)):
                return False
    return True


def forwards_of(expr: cst.BaseExpression, origins: dict, models: set[str], seen: set[str] | None = None) -> set[cst.Call]:
    """The wrapped model's calls whose outputs ``expr`` is computed from, through the step's
    names (a name bound twice there may hold either value where it is read: not followed),
    not through a detach."""
    seen = set() if seen is None else seen
    found: set[cst.Call] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Attribute) and node.attr.value in CUTS:
            continue
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in CUTS:
            continue
        if isinstance(node, cst.Call) and (dotted(node.func) or "") in models:
            found.add(node)
        if isinstance(node, cst.Name) and node.value not in seen and len(origins.get(node.value, ())) == 1:
            seen.add(node.value)
            found |= forwards_of(origins[node.value][0], origins, models, seen)
        stack.extend(node.children)
    return found
