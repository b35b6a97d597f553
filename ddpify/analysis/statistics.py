"""Training statistics: values computed from the training batch's loss.

A name is a loss's by data, not only by what it is called: ``l = loss.item()``, ``running += l``,
``avg = running / n``. Read by transforms/rank_zero.py (DDP608, a printed loss shown as its mean
across ranks) and transforms/shared_statistics.py (DDP810, a statistic a decision reads averaged
where it is computed).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.tree import dotted, names_in, walk


def is_loss(name: str, derived: frozenset[str] = frozenset()) -> bool:
    return "loss" in name.lower() or name in derived


def loss_derived(scope: cst.CSTNode) -> frozenset[str]:
    """Names whose values come from a loss: `l = loss.item()`, `running += l` (by data, not
    only by a name that says "loss")."""
    derived: set[str] = set()
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


def text_value(value: cst.BaseExpression) -> bool:
    """A string made from values: an f-string, ``"...".format(...)``, ``"..." % x``, ``str(x)``,
    or a sum that starts with one."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Add, cst.Modulo, cst.Multiply)):
        # (`("%10s" * 2) % (...)`: Rotation-RetinaNet's log line)
        return text_value(value.left)
    if isinstance(value, (cst.FormattedString, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "format":
        return isinstance(value.func.value, (cst.SimpleString, cst.FormattedString))
    return isinstance(value, cst.Call) and dotted(value.func) == "str"


def constructs(value: cst.BaseExpression) -> bool:
    """``nn.CrossEntropyLoss(...)``, ``MyLoss()``: an object built from a class."""
    return isinstance(value, cst.Call) and (dotted(value.func) or "_").rpartition(".")[2][:1].isupper()
