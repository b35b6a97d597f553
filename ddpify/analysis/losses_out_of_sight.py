"""Training losses computed by code out of the converter's sight.

The rules about a loss (a sum scaled by the world size, a comparison of the batch's samples
given the whole batch, a division by a count made global) read the loss where it is made. A
loss the training step calls through a parameter whose callers are not in this file
(reid-strong-baseline's ``create_supervised_trainer(model, optimizer, loss_fn)``, handed a
triplet + cross-entropy function made in another module), or made by a factory of another
module (pytorch-semseg's ``loss_fn = get_loss_function(cfg)``, a ``functools.partial`` whose
reduction a config decides), may be any of those. Computed on the whole global batch
(``ddp_whole_batch``: every rank gathers the arguments, each share's gradient goes back to
its rank) it is DataParallel's loss whatever it computes; that is what is done with it.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.facts import Facts
from ddpify.analysis.tree import MOVES, calls_in, dotted, loop_origins, reaching_backward, walk, without_moves


def losses_out_of_sight(facts: Facts, module: cst.Module, parent, qualified) -> list[tuple[cst.Call, str]]:
    """(call, why) for each call of a training step that computes its loss out of sight."""
    defined = {node.name.value for node in walk(module) if isinstance(node, (cst.FunctionDef, cst.ClassDef))}
    models = set(facts.model_names) | {site.target for site in facts.wraps if site.target}
    found: list[tuple[cst.Call, str]] = []
    for step in [*facts.training_loops, *facts.step_functions]:
        origins = loop_origins(step)
        for expr in reaching_backward(step, origins):
            for call in [expr, *calls_in(expr)] if isinstance(expr, cst.Call) else calls_in(expr):
                if not isinstance(call.func, cst.Name) or any(seen is call for seen, _ in found) or not call.args:
                    continue
                if call.func.value in models:
                    continue  # (the wrapped model, a parameter of the step's function too)
                if any(dotted(arg.value) in models for arg in call.args):
                    continue  # (a regulariser given the model itself)
                if not any(_computed(arg.value, origins) for arg in call.args):
                    continue  # (given the batch itself: the model, built or handed in out of sight, not a loss)
                if _fed_its_own_outputs(call, origins) or call.func.value in _switched_modes(module):
                    continue  # (a model decoding step by step, or one the file puts in train()/eval() mode)
                why = _out_of_sight(call, facts, module, parent, qualified, defined)
                if why is not None:
                    found.append((call, why))
    return found


def _fed_its_own_outputs(call: cst.Call, origins: dict[str, list[cst.BaseExpression]]) -> bool:
    """``prev, logp = model(x, prev)`` in a loop (TSP-improve's policy decoding step by step):
    what the call returned comes back as its input, as a model's outputs do, never a loss's."""
    given = {n.value for arg in call.args for n in walk(arg.value) if isinstance(n, cst.Name)}
    return any(origin is call for name in given for origin in origins.get(name, []))


def _switched_modes(module: cst.Module) -> set[str]:
    """Names the file calls ``.train()`` or ``.eval()`` on: modules it trains, not losses."""
    return {
        dotted(call.func.value) for call in calls_in(module) if isinstance(call.func, cst.Attribute)
        and call.func.attr.value in ("train", "eval") and not call.args and dotted(call.func.value)
    }


def _out_of_sight(call: cst.Call, facts: Facts, module: cst.Module, parent, qualified, defined: set[str]) -> str | None:
    name = call.func.value
    if name in defined or qualified(call.func) & {f"builtins.{name}"}:
        return None
    return _named_out_of_sight(call.func, facts, module, parent, qualified, defined, depth=0)


def _named_out_of_sight(used: cst.Name, facts: Facts, module: cst.Module, parent, qualified, defined: set[str], depth: int) -> str | None:
    """Why what ``used`` holds is out of sight: a parameter, followed to the arguments its
    callers in this file give (through their own parameters, a few calls up), or a name bound
    to a factory's product."""
    holder = _parameter_holder(used, used.value, parent)
    if holder is None:
        return _made_out_of_sight(used, module, qualified, defined)
    graph = facts.analyzer.calls
    sites = graph.call_sites(holder)
    if not sites:
        return f"handed in as `{holder.name.value}()`'s parameter by callers out of this file's sight"
    if depth > 3:
        return None
    param = next(p for p in holder.params.params if p.name.value == used.value)
    for site, _ in sites:
        given = graph.argument_for(holder, param, site)
        if isinstance(given, cst.Name):
            why = _named_out_of_sight(given, facts, module, parent, qualified, defined, depth + 1)
        else:
            why = _made_out_of_sight(given, module, qualified, defined) if given is not None else None
        if why is not None:
            return why
    return None


def _parameter_holder(node: cst.CSTNode, name: str, parent) -> cst.FunctionDef | None:
    """The function (the node's own, or one around it: a closure's) that takes ``name`` as a
    parameter."""
    node = parent(node)
    while node is not None:
        if isinstance(node, cst.FunctionDef) and any(p.name.value == name for p in node.params.params):
            return node
        node = parent(node)
    return None


def _made_out_of_sight(value: cst.BaseExpression, module: cst.Module, qualified, defined: set[str]) -> str | None:
    """Why what a name holds is made out of sight (None: a loss in sight): a call of a function
    of another module (a factory: lower-case, not torch's), through the name's one binding."""
    if isinstance(value, cst.Name):
        bound = [
            node.value for node in walk(module) if isinstance(node, cst.Assign)
            for target in node.targets if isinstance(target.target, cst.Name) and target.target.value == value.value
        ]
        if len(bound) != 1:
            return None
        value = without_moves(bound[0])
    if not isinstance(value, cst.Call):
        return None
    maker = dotted(value.func) or ""
    last = maker.rpartition(".")[2]
    if not last or last[0].isupper() or last in defined or any(q.split(".")[0] in ("torch", "builtins", "functools") for q in qualified(value.func)):
        return None
    return f"made by `{maker}(...)`, a function of another module"


def _computed(value: cst.BaseExpression, origins: dict[str, list[cst.BaseExpression]], depth: int = 0) -> bool:
    """Is ``value`` computed by a call from what the step drew (the model's outputs: ``score`` of
    ``score, feat = model(img)``), not the batch itself (``img``, ``img.to(device)``, ``x, y = batch``)?
    A loss is given outputs; the model is given the batch."""
    for node in walk(value):
        if isinstance(node, cst.Call) and not _reshapes(node):
            return True
    if depth > 4:
        return False
    names = {n.value for n in walk(value) if isinstance(n, cst.Name)}
    return any(_computed(origin, origins, depth + 1) for name in names for origin in origins.get(name, []))


# What the batch goes through on its way to the model: moves and reshapes, not computations.
RESHAPES = {
    *MOVES, "view", "reshape", "permute", "squeeze", "unsqueeze", "flatten", "contiguous", "transpose", "detach",
    "clone", "type", "long", "int", "expand", "repeat", "narrow", "split", "chunk", "to_dense", "requires_grad_",
}

# Builtins that only hold or regroup the batch's parts.
CONTAINERS = {"map", "tuple", "list", "zip", "iter", "next", "dict", "enumerate"}


def _reshapes(call: cst.Call) -> bool:
    """``x.view(-1, d)``, ``x.to(device)``, ``torch.cat((a, b))``, ``Variable(x)``: the data again."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in RESHAPES:
        return True
    name = dotted(call.func) or ""
    if name in CONTAINERS:
        return True  # (hs-math-nlp's `map(lambda x: x.to(device), batch)`: what they hold is checked on its own)
    return name.split(".")[0] in ("torch", "np", "numpy") and name.rpartition(".")[2] in {"cat", "stack", "from_numpy", "tensor", "as_tensor", "autograd", "Variable"} or name == "Variable"
