"""DDP14x: what DataParallel gathered from each GPU, one entry per GPU, is this process's own.

A model that returns its loss (a 0-d tensor, or a one-element one) hands back, under
DataParallel over N GPUs, a vector of N losses: one per replica, gathered along dimension 0.
Scripts written for it reduce that vector by hand: Python's ``sum()`` over it, or
``backward()`` with one gradient entry per GPU. Under DDP the forward returns this process's
loss alone: ``sum()`` iterates a 0-d tensor and the gradient no longer fits (a crash at the
first step). Each process's loss is one replica's, and DDP averages the gradients across the
N processes: the sum over replicas is the world size times this process's loss, which keeps
DataParallel's gradient (and its printed sum).

DDP140  Python's ``sum()`` over the wrapped model's output (the replicas' losses)::

    loss = model(x, y)                    loss = model(x, y)
    if multi_gpu:                   ->    if multi_gpu:
        loss = sum(loss)                      loss = loss.sum() * dist.get_world_size()

DDP141  ``backward()`` given one gradient entry per GPU::

    loss.backward(loss.new_ones(len(gpus)))   ->   loss.backward(loss.new_ones(loss.shape) * len(gpus))

DataParallel summed as many replicas' losses as the gradient had entries: the factor is the
count the script named (under torchrun on as many GPUs, the world size; on one GPU, 1).

Only a name every assignment of which in its scope is a call of a wrapped model (or the
reduction itself) is read as the replicas' losses; a gradient of anything but ones is left
as it is, with a warning (DDP142).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ScopeProvider

from ddpify.analysis import dotted, walk
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform


class ReplicaOutputsTransform(Transform):
    CODE_PREFIX = "DDP14"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._summed: dict[cst.Call, str] = {}  # sum(loss) -> the name
        self._gradients: dict[cst.Call, str] = {}  # loss.backward(...) -> the name

    def check(self) -> None:
        if not self.facts.wraps:
            return
        for name in self._replica_losses():
            for use in self._uses(name):
                self._note(use)

    def _replica_losses(self) -> list[cst.Name]:
        """Names bound to a wrapped model's output, everywhere they are bound (one per scope)."""
        found, seen = [], set()
        for node in walk(self.context.module):
            if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)):
                continue
            if not (isinstance(node.value, cst.Call) and dotted(node.value.func) in self.facts.model_names):
                continue
            target = node.targets[0].target
            scope = self.context.metadata.get_metadata(ScopeProvider, target, None)
            if scope is None or (id(scope), target.value) in seen:
                continue
            seen.add((id(scope), target.value))
            if all(self._a_replica_value(assignment.node, target.value) for assignment in scope.assignments[target.value]):
                found.append(target)
        return found

    def _a_replica_value(self, bound: cst.CSTNode, name: str) -> bool:
        """Is this binding of ``name`` a wrapped model's output, or a reduction of it?"""
        assign = self.context.parent(self.context.parent(bound)) if isinstance(bound, cst.Name) else None
        if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
            return False
        value = assign.value
        if dotted(value.func) in self.facts.model_names:
            return True
        return _builtin_sum_of(value, name) or (
            isinstance(value.func, cst.Attribute) and dotted(value.func.value) == name and value.func.attr.value in ("sum", "mean")
        )

    def _uses(self, target: cst.Name) -> list[cst.Name]:
        scope = self.context.metadata.get_metadata(ScopeProvider, target, None)
        return [access.node for access in scope.accesses[target.value] if isinstance(access.node, cst.Name)]

    def _note(self, use: cst.Name) -> None:
        parent = self.context.parent(use)
        call = self.context.parent(self.context.parent(use)) if isinstance(parent, cst.Arg) else None
        if isinstance(call, cst.Call) and _builtin_sum_of(call, use.value) and "sum" not in self._shadowed():
            self._summed[call] = use.value
            return
        method = self.context.parent(parent) if isinstance(parent, cst.Attribute) and parent.value is use else None
        if not (isinstance(method, cst.Call) and method.func is parent and parent.attr.value == "backward"):
            return
        gradient = next((arg for arg in method.args if arg.keyword is None or arg.keyword.value == "gradient"), None)
        if gradient is None:
            return
        if "ones" not in self.context.code(gradient.value):
            self.context.report(
                method, "DDP142",
                f"`{self.context.code(method)}`: the gradient has one entry per GPU of DataParallel's gathered losses; "
                "under DDP the loss is this process's alone: give it a gradient of its own shape",
                Severity.WARNING,
            )
            return
        self._gradients[method] = use.value

    def _replica_count(self, backward: cst.Call) -> str:
        """The GPU count the original's gradient named (``len(TARGET_GPUS)``: DataParallel summed
        that many replicas' losses), else the world size."""
        gradient = next(arg.value for arg in backward.args if arg.keyword is None or arg.keyword.value == "gradient")
        count = _ones_count(gradient)
        name = self._gradients[backward]
        if count is None or any(isinstance(n, cst.Name) and n.value == name for n in walk(count)):
            return self.context.world_size  # (`len(loss)`, `loss.shape[0]`: under DDP this process's own, 1)
        shown = self.context.code(count)
        return shown if isinstance(count, (cst.Name, cst.Attribute, cst.Call, cst.Integer, cst.Subscript)) else f"({shown})"

    def _shadowed(self) -> set[str]:
        """Names the file binds (a `sum` of its own is not Python's)."""
        if not hasattr(self, "_bound"):
            self._bound = {dotted(t.target) for node in walk(self.context.module) if isinstance(node, cst.Assign) for t in node.targets}
            self._bound |= {node.name.value for node in walk(self.context.module) if isinstance(node, cst.FunctionDef)}
        return self._bound

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._summed:
            name = self._summed[original_node]
            self.context.add_import("torch.distributed", None, "dist")
            self.context.report(
                original_node, "DDP140",
                f"`{self.context.code(original_node)}` summed DataParallel's per-GPU losses (one per replica): under DDP "
                f"`{name}` is this process's loss, and the sum over the replicas is the world size times it (DDP "
                "averages the gradients)",
            )
            return cst.parse_expression(f"{name}.sum() * {self.context.world_size}")
        if original_node in self._gradients:
            name, count = self._gradients[original_node], self._replica_count(original_node)
            if count == self.context.world_size:
                self.context.add_import("torch.distributed", None, "dist")
            self.context.report(
                original_node, "DDP141",
                f"`{self.context.code(original_node)}` gave one gradient entry per GPU of DataParallel's gathered losses: "
                f"under DDP `{name}` is this process's loss, with a gradient of its shape, times `{count}` (the sum over "
                "the replicas; DDP averages the gradients)",
            )
            gradient = cst.parse_expression(f"{name}.new_ones({name}.shape) * {count}")
            slot = next(i for i, arg in enumerate(updated_node.args) if arg.keyword is None or arg.keyword.value == "gradient")
            args = list(updated_node.args)
            args[slot] = args[slot].with_changes(value=gradient)
            return updated_node.with_changes(args=args)
        return updated_node


def _ones_count(gradient: cst.BaseExpression) -> cst.BaseExpression | None:
    """N in ``loss.new_ones(N)``, ``torch.ones(N, ...)``: the number of replicas the script named."""
    if not isinstance(gradient, cst.Call) or (dotted(gradient.func) or "").rpartition(".")[2] not in ("ones", "new_ones"):
        return None
    positional = [arg.value for arg in gradient.args if arg.keyword is None and not arg.star]
    return positional[0] if len(positional) == 1 and not isinstance(positional[0], (cst.Tuple, cst.List)) else None


def _builtin_sum_of(call: cst.Call, name: str) -> bool:
    """``sum(name)``: Python's sum over one name, no start value."""
    return (
        isinstance(call.func, cst.Name)
        and call.func.value == "sum"
        and len(call.args) == 1
        and call.args[0].keyword is None
        and not call.args[0].star
        and isinstance(call.args[0].value, cst.Name)
        and call.args[0].value.value == name
    )
