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
# What may not run between two passes that become one: it steps, zeroes, clips or reads
# gradients, or changes which parameters take them. Between them only computations may run:
# the wrapped models' calls, methods of tensors (not in place, not named here), torch's own
# functions (not torch.nn.utils' clipping nor torch.autograd) and a few builtins.
BETWEEN = ("step", "zero_grad", "backward", "grad", "requires_grad", "unscale", "clip", "update", "data")
COMPUTING_ROOTS = ("torch", "F", "nn", "np", "numpy", "math")
COMPUTING_BUILTINS = ("float", "int", "len", "abs", "min", "max", "sum", "round", "range", "print", "isinstance")
# What a backward() call may be given beside its gradient and retain_graph: the others change
# what it computes (create_graph, inputs), so a sum would not be the same.
JOINED_KEYWORDS = ("gradient", "retain_graph")
NO_GRAD = ("no_grad", "inference_mode")


@dataclass(frozen=True)
class BackwardPair:
    first: cst.Call  # `g.backward(mone, retain_graph=True)`
    second: cst.Call  # `v.backward()`
    shared: cst.Call  # the wrapped model's call both run through (`SR(px)`)
    joinable: bool


def backward_pairs(step: cst.CSTNode, models: set[str], parent) -> list[BackwardPair]:
    """Each retaining pass of the step and the next pass through one of the same forwards. A
    pass that is the second of one pair and the first of another (three passes through one
    forward) joins neither: a chain is refused, never half joined."""
    origins = loop_origins(step)
    passes = [call for call in calls_in(step.body) if _a_backward(call)]
    found = []
    for at, first in enumerate(passes):
        if not retains(first):
            continue
        through = forwards_of(first.func.value, origins, models, parent)
        for later in passes[at + 1 :]:
            shared = through & forwards_of(later.func.value, origins, models, parent)
            if shared:
                found.append(BackwardPair(first, later, next(iter(shared)), _joinable(first, later, parent, models)))
                break
    chained = {id(pair.first) for pair in found} & {id(pair.second) for pair in found}
    return [
        BackwardPair(pair.first, pair.second, pair.shared, False) if {id(pair.first), id(pair.second)} & chained else pair
        for pair in found
    ]


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


def _joinable(first: cst.Call, second: cst.Call, parent, models: set[str]) -> bool:
    """Both passes are statements of their own (``loss.backward(...)``, alone on their line or
    beside others: ADASR's ``g = D(fake).mean(); g.backward(mone, retain_graph=True)``) in one
    block, and nothing between them steps, zeroes or reads a gradient."""
    expressions = [parent(call) for call in (first, second)]
    if not all(isinstance(e, cst.Expr) for e in expressions):
        return False
    if any(arg.keyword is not None and arg.keyword.value not in JOINED_KEYWORDS for arg in first.args):
        return False  # (create_graph=, inputs=: the sum would compute something else)
    lines = [parent(e) for e in expressions]
    block = parent(lines[0])
    if not all(isinstance(line, cst.SimpleStatementLine) for line in lines) or parent(lines[1]) is not block:
        return False
    # the block's small statements in order (a compound statement counts as one)
    flat = [small for line in block.body for small in (line.body if isinstance(line, cst.SimpleStatementLine) else [line])]
    at, to = flat.index(expressions[0]), flat.index(expressions[1])
    for statement in flat[at + 1 : to]:
        for node in walk(statement):
            if isinstance(node, (cst.BaseCompoundStatement, cst.Return, cst.AugAssign)):
                return False
            if isinstance(node, cst.Call) and not _computes(node, models):
                return False
            if isinstance(node, cst.Attribute) and any(word in node.attr.value for word in BETWEEN):
                return False
    return True


def _computes(call: cst.Call, models: set[str]) -> bool:
    """A call that only computes: a wrapped model's, a tensor method not in place, torch's own
    functions (not clipping, not torch.autograd), a few builtins."""
    name = dotted(call.func) or ""
    last = name.rpartition(".")[2] if name else (call.func.attr.value if isinstance(call.func, cst.Attribute) else "")
    if name in models:
        return True
    if not last or last.endswith("_") or any(word in last for word in BETWEEN):
        return False
    if isinstance(call.func, cst.Name):
        return last in COMPUTING_BUILTINS
    root = name.split(".")[0] if name else ""
    if root in COMPUTING_ROOTS:
        return not ("autograd" in name or ".utils." in name)
    # a method of a value the step computed (`out.mean()`, `(a - b).pow(2)`)
    return root not in models


def forwards_of(expr: cst.BaseExpression, origins: dict, models: set[str], parent, seen: set[str] | None = None) -> set[cst.Call]:
    """The wrapped model's calls whose outputs ``expr`` is computed from, through the step's
    names (a name bound twice there may hold either value where it is read: not followed),
    not through a detach, nor a call made without gradients (a teacher under no_grad)."""
    seen = set() if seen is None else seen
    found: set[cst.Call] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Attribute) and node.attr.value in CUTS:
            continue
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in CUTS:
            continue
        if isinstance(node, cst.Call) and (dotted(node.func) or "") in models and not _without_gradients(node, parent):
            found.add(node)
        if isinstance(node, cst.Name) and node.value not in seen and len(origins.get(node.value, ())) == 1:
            seen.add(node.value)
            found |= forwards_of(origins[node.value][0], origins, models, parent, seen)
        stack.extend(node.children)
    return found


def _without_gradients(node: cst.CSTNode, parent) -> bool:
    """Inside ``with torch.no_grad():`` (or inference_mode)."""
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
        if isinstance(node, cst.With) and any(
            (dotted(item.item.func if isinstance(item.item, cst.Call) else item.item) or "").rpartition(".")[2] in NO_GRAD
            for item in node.items
        ):
            return True
        node = parent(node)
    return False
