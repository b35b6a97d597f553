"""Training statistics: values computed from the training batch's loss.

A name is a loss's by data, not only by what it is called: ``l = loss.item()``, ``running += l``,
``avg = running / n``. Read by transforms/rank_zero.py (DDP608, a printed loss shown as its mean
across ranks) and transforms/shared_statistics.py (DDP810, a statistic a decision reads averaged
where it is computed).
"""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis.tree import dotted, names_in, walk


def is_loss(name: str, derived: frozenset[str] = frozenset()) -> bool:
    return "loss" in name.lower() or name in derived


def loss_derived(scope: cst.CSTNode) -> frozenset[str]:
    """Names whose values come from a loss: `l = loss.item()`, `running += l` (by data, not
    only by a name that says "loss")."""
    derived: set[str] = _backward_taken(scope)
    assignments = [
        (found.target.value, found.value) if isinstance(found, cst.AugAssign) else (found.targets[0].target.value, found.value)
        for found in walk(scope)
        if (isinstance(found, cst.AugAssign) and isinstance(found.target, cst.Name))
        or (isinstance(found, cst.Assign) and len(found.targets) == 1 and isinstance(found.targets[0].target, cst.Name))
    ]
    # `criterion = nn.MSELoss()`: a loss module, not a loss value; `print_str = f"loss {loss:.4f}"`:
    # text, which no mean across ranks changes (the loss inside it is rank 0's)
    assignments = [(name, value) for name, value in assignments if not constructs(value) and not text_value(value)]
    grown = True
    while grown:
        grown = False
        for name, value in assignments:
            if name not in derived and any(is_loss(n.value, frozenset(derived)) for n in names_in(value)):
                derived.add(name)
                grown = True
    return frozenset(derived)


def _backward_taken(scope: cst.CSTNode) -> set[str]:
    """Names backward() is called on, whatever they are called (DCGAN's ``errD.backward()``,
    ``scaler.scale(cost).backward()``): losses by what they do."""
    taken = set()
    for node in walk(scope):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            receiver = node.func.value
            if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) and receiver.func.attr.value == "scale" and receiver.args:
                receiver = receiver.args[0].value
            if isinstance(receiver, cst.Name):
                taken.add(receiver.value)
    return taken


def text_value(value: cst.BaseExpression) -> bool:
    """A string made from values: an f-string, ``"...".format(...)``, ``"...".join(...)``, ``"..." % x``,
    ``str(x)``, or a sum that starts with one."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Modulo, cst.Multiply)):
        # (`("%10s" * 2) % (...)`: Rotation-RetinaNet's log line)
        return text_value(value.left)
    if isinstance(value, (cst.FormattedString, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("format", "join"):
        # (and `" ; ".join(...)`: OKDDip's metrics_string)
        return isinstance(value.func.value, (cst.SimpleString, cst.FormattedString))
    return isinstance(value, cst.Call) and dotted(value.func) == "str"


def constructs(value: cst.BaseExpression) -> bool:
    """``nn.CrossEntropyLoss(...)``, ``MyLoss()``: an object built from a class."""
    return isinstance(value, cst.Call) and (dotted(value.func) or "_").rpartition(".")[2][:1].isupper()


# a size of the whole data set, the same on every rank whatever each rank draws
# (`len(loader.dataset)`, `len(train_set)`, `dataset_sizes[phase]`); not a count a loop keeps
# (`num_samples += x.size(0)`: this rank's own)
_WHOLE_DATA = re.compile(r"dataset|data_set|_set\b", re.IGNORECASE)


def over_whole_data(value: cst.BaseExpression, code, shard_lengths=frozenset()) -> tuple[set[str], bool]:
    """``running_loss / len(loader.dataset)``: (the names divided, True) when ``value`` divides
    by a size of the whole data set: the quotient of each rank's share adds up across ranks
    to the original's (its mean would be a share of it). Not a length made the shard's
    (``shard_lengths``, DDP405): that quotient is a mean already."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("item", "float", "double", "cpu"):
        value = value.func.value
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide)):
        return set(), False
    divided = {name.value for name in names_in(value.left)}
    if any(node in shard_lengths for node in walk(value.right)):
        return divided, False
    return divided, _WHOLE_DATA.search(code(value.right)) is not None


def names_holding(scope: cst.CSTNode, held: set[cst.CSTNode]) -> frozenset[str]:
    """Names whose values hold one of the ``held`` nodes, directly or through other such names
    (``loss = criterion(...) * dist.get_world_size()``, ``total += loss.item()``: both)."""
    if not held:
        return frozenset()
    assignments = [
        (found.target.value, found.value) if isinstance(found, cst.AugAssign) else (found.targets[0].target.value, found.value)
        for found in walk(scope)
        if (isinstance(found, cst.AugAssign) and isinstance(found.target, cst.Name))
        or (isinstance(found, cst.Assign) and len(found.targets) == 1 and isinstance(found.targets[0].target, cst.Name))
    ]
    holding = {name for name, value in assignments if any(node in held for node in walk(value))}
    grown = True
    while grown:
        grown = False
        for name, value in assignments:
            if name not in holding and any(n.value in holding for n in names_in(value)):
                holding.add(name)
                grown = True
    return frozenset(holding)
