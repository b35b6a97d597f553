"""Loss functions of the project's modules that average over what a parameter selects.

GwcNet's ``models/loss.py``::

    def model_loss(disp_ests, disp_gt, mask):
        all_losses = []
        for disp_est, weight in zip(disp_ests, weights):
            all_losses.append(weight * F.smooth_l1_loss(disp_est[mask], disp_gt[mask], size_average=True))
        return sum(all_losses)

returns a mean over the elements its ``mask`` parameter selects. Called in a training step
with a mask the script computes, it is a selected mean as much as one written in the step
(DDP135): the call is weighted by the share of what its argument selects
(``ddp_selected_mean(model_loss(ests, gt, mask), mask)``), the module left as it is.
"""

from __future__ import annotations

import ast

# torch.nn.functional losses that average over their input's elements by default
MEAN_LOSSES = frozenset({
    "l1_loss", "mse_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "soft_margin_loss",
})
NOT_A_MEAN = {"reduction": ("mean",), "size_average": (True, None), "reduce": (True, None)}


def selecting_parameter(function: ast.FunctionDef) -> int | None:
    """The position (among the arguments a call passes) of the parameter whose selection every
    loss the function returns averages over; None if it returns anything else."""
    params = [arg.arg for arg in function.args.args]
    if params and params[0] in ("self", "cls"):
        return None
    returned = [node.value for node in ast.walk(function) if isinstance(node, ast.Return) and node.value is not None]
    if len(returned) != 1:
        return None
    bound = _bound_values(function)
    selections = set()
    for loss in _losses_in(returned[0], bound, set()):
        selection = _selected_by(loss)
        if selection not in params:
            return None
        selections.add(selection)
    if len(selections) != 1:
        return None
    return params.index(selections.pop())


def _bound_values(function: ast.FunctionDef) -> dict[str, list[ast.AST]]:
    """Each local name -> what is assigned to it and appended to it."""
    bound: dict[str, list[ast.AST]] = {}
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend"):
            if isinstance(node.func.value, ast.Name) and len(node.args) == 1:
                bound.setdefault(node.func.value.id, []).append(node.args[0])
    return bound


def _losses_in(value: ast.AST, bound: dict[str, list[ast.AST]], seen: set[str]) -> list[ast.Call]:
    """The loss calls ``value`` adds up (weights, sums and the names it reads)."""
    found = []
    for node in ast.walk(value):
        if isinstance(node, ast.Call) and _loss_name(node) is not None:
            found.append(node)
        elif isinstance(node, ast.Name) and node.id in bound and node.id not in seen:
            seen.add(node.id)
            for bound_value in bound[node.id]:
                found += _losses_in(bound_value, bound, seen)
    return found


def _loss_name(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name if name in MEAN_LOSSES else None


def _selected_by(loss: ast.Call) -> str | None:
    """The name of the mask the mean-reduced ``loss`` call's input is indexed by
    (``F.smooth_l1_loss(est[mask], gt[mask])``); None if it sums, or selects otherwise."""
    for keyword in loss.keywords:
        if keyword.arg in NOT_A_MEAN and not (isinstance(keyword.value, ast.Constant) and keyword.value.value in NOT_A_MEAN[keyword.arg]):
            return None
        if keyword.arg == "weight":
            return None
    if not loss.args or not isinstance(loss.args[0], ast.Subscript):
        return None
    index = loss.args[0].slice
    return index.id if isinstance(index, ast.Name) else None
