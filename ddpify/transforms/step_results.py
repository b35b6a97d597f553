"""DDP814: what a step function returns of its losses is their mean across ranks, where it returns them.

A loop that calls a step function per batch (``err = train_step(x, y)``) logs, adds up or decides
from what the step returns: under DataParallel, the loss of the global batch; under DDP, each
rank's own share. Printed in the loop, a loss-named value was averaged there (DDP608); a dict of
numbers (AttGAN's ``errD = attgan.trainD(...)``, then ``add_scalar_dict(writer, errD, ...)``), a
value handed to a logging helper or kept in a history showed rank 0's share. Every rank runs the
step (its backward() is collective), so the step's own return is a point every rank reaches: a
mean there gives every use the global batch's value, as DataParallel's loop had.

DDP814  a step function's return whose values are all its losses (a loss, its ``.item()``,
``float(loss)``, a tuple, list or dict of them) is their mean across ranks (``ddp_mean``; a
dict or tuple entry by entry)::

    def train_step(x, y):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        return {"loss": loss.item()}
    # becomes
        return ddp_mean({"loss": loss.item()})

Only where every rank returns it (conditions on counters and settings, no exception handler, no
rank guard), where the step's callers use its value (a statement that drops it costs nothing; in
an imported module of a converted project the callers are the entry's loops, out of sight),
and never a value a caller calls backward() on (its gradient is DDP's to average). A return that
also holds something else (the model's outputs, a count) keeps its other entries: each loss of a
tuple is averaged alone; a dict with other values is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ddpify.analysis import dotted, same_path_on_every_rank, under_rank_guard, walk
from ddpify.analysis.statistics import constructs, is_loss, loss_derived, text_value
from ddpify.analysis.tree import differentiated, is_backward, scope_of, loop_origins, own_nodes, reaching_backward
from ddpify.transforms.base import Transform

# Calls that only read a loss's number: `loss.item()`, `loss.detach()`, `float(loss)`.
NUMBER_METHODS = {"item", "detach", "cpu", "tolist", "clone"}
NUMBER_FUNCTIONS = {"float"}


class StepResultsTransform(Transform):
    CODE_PREFIX = "DDP814"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._averaged: dict[cst.BaseExpression, str] = {}  # a returned value (original) -> its step's name

    def check(self) -> None:
        library = self.context.is_library  # (its step functions' callers are the project's training loops)
        if self.context.rank_read_at_run_time and not library or not (self.facts.training_loops or library and self.facts.step_functions):
            return
        uses = bound_results(self.context.module, self.context.parent)
        for function in self.facts.step_functions:
            bound = uses.get(function.name.value, set())
            if not bound and not library:
                continue  # (no caller keeps its value: nothing to average)
            origins = loop_origins(function)
            # (the loss's parts, read as numbers: AttGAN's `gc_loss.item()`, a `fit.item()` of `loss = fit + ...`)
            parts = {n.value for e in reaching_backward(function, origins) for n in walk(e) if isinstance(n, cst.Name)} & set(origins)
            losses = _Losses(loss_derived(function), frozenset(parts), numbers_only=_keeps_graph(function))
            for node in own_nodes(function):
                if isinstance(node, cst.Return) and node.value is not None and self._every_rank_reaches(node):
                    for value in self._loss_values(node.value, losses):
                        self._averaged[value] = function.name.value
            if any(self._scope_of(value) is function for value in self._averaged):
                # (the callers' names hold the global value now: no second mean where printed, DDP608)
                self.context.averaged_statistics |= bound

    def _loss_values(self, value: cst.BaseExpression, losses: _Losses) -> list[cst.BaseExpression]:
        """The parts of a returned value to average: the whole value when it holds only losses,
        else each loss of a tuple or list on its own."""
        if _a_loss(value, losses) and not isinstance(value, (cst.Integer, cst.Float)):
            return [value]
        if isinstance(value, cst.Dict):
            return [value] if value.elements and all(isinstance(e, cst.DictElement) and _a_loss(e.value, losses) for e in value.elements) else []
        if isinstance(value, (cst.Tuple, cst.List)):
            parts = [element.value for element in value.elements if not isinstance(element, cst.StarredElement)]
            if parts and len(parts) == len(value.elements) and all(_a_loss(part, losses) for part in parts):
                return [value]
            return [part for part in parts if _a_loss(part, losses) and not isinstance(part, (cst.Integer, cst.Float))]
        return []

    def _every_rank_reaches(self, node: cst.Return) -> bool:
        statement = self.context.parent(node)
        guarded = self.context.rank_zero_only
        return (
            same_path_on_every_rank(statement, self.context.parent)
            and not under_rank_guard(statement, self.context.parent, self.context.code)
            and not (guarded is not None and guarded(statement))
        )

    def _scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        return scope_of(node, self.context.parent)

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> cst.Return:
        if original_node.value in self._averaged:
            return updated_node.with_changes(value=self._mean(original_node.value, updated_node.value))
        if isinstance(original_node.value, (cst.Tuple, cst.List)) and isinstance(updated_node.value, type(original_node.value)):
            elements = [
                new.with_changes(value=self._mean(old.value, new.value)) if old.value in self._averaged else new
                for old, new in zip(original_node.value.elements, updated_node.value.elements)
            ]
            return updated_node.with_changes(value=updated_node.value.with_changes(elements=elements))
        return updated_node

    def _mean(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
        self.context.use_helper("ddp_mean")
        self.context.report(
            original,
            "DDP814",
            f"`{self.context.code(original)}`, what `{self._averaged[original]}()` returns of its step's losses, is the mean "
            "across ranks: the loop that calls it logs, adds up and decides from the global batch's value, as "
            "DataParallel's did",
        )
        bare = updated.with_changes(lpar=[], rpar=[]) if getattr(updated, "lpar", None) and not isinstance(updated, cst.Tuple) else updated
        if isinstance(bare, cst.Tuple) and not bare.lpar:
            bare = bare.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return cst.Call(cst.Name("ddp_mean"), [cst.Arg(bare)])


@dataclass(frozen=True)
class _Losses:
    derived: frozenset[str]  # names computed from a loss (or named one)
    parts: frozenset[str]  # names what backward() takes is computed from (a number of one is a loss's part)
    numbers_only: bool = False  # a tensor may still be differentiated: only `.item()`, `float()` averaged


def bound_results(module: cst.Module, parent) -> dict[str, set[tuple[cst.CSTNode, str]]]:
    """Function name -> (scope, name) of every name a call of it is bound to (``err =
    train_step(x, y)``, ``loss, acc = train(...)``), where no caller calls backward() on what it
    keeps: the names that hold a function's averaged return (DDP608 prints them as they are)."""
    found: dict[str, set] = {}
    refused: set[str] = set()
    taken: dict[int, set[str]] = {}  # scope -> what backward() is called on there (walked once per scope)
    for node in walk(module):
        if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)):
            continue
        name = (dotted(node.value.func) or "").rpartition(".")[2]
        scope = scope_of(node, parent)
        for target in node.targets:
            elements = target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else [target.target]
            for element in elements:
                element = element.value if isinstance(element, cst.BaseElement) else element
                if isinstance(element, cst.Name):
                    found.setdefault(name, set()).add((scope, element.value))
                    if id(scope) not in taken:
                        taken[id(scope)] = differentiated(scope)
                    if element.value in taken[id(scope)]:
                        refused.add(name)
    return {name: uses for name, uses in found.items() if name not in refused}


def _keeps_graph(function: cst.FunctionDef) -> bool:
    """A graph kept past backward() (``retain_graph=True``): a returned loss tensor may be
    differentiated again by the caller, so only its number is averaged."""
    return any(
        arg.keyword is not None and arg.keyword.value in ("retain_graph", "create_graph")
        for node in walk(function) if isinstance(node, cst.Call) and is_backward(node) for arg in node.args
    )


def _a_loss(value: cst.BaseExpression, losses: _Losses) -> bool:
    """A loss of the step (a name derived from one), or the number of a loss or of one of its
    parts (``loss.item()``, ``float(loss)``, ``fit.item()`` of ``loss = fit + ...``): not text,
    not an object made here, not an output (a number of one, ``.item()``, is a single value)."""
    if isinstance(value, (cst.Integer, cst.Float)):
        return True  # (a setting returned beside the losses: its mean is itself)
    if text_value(value) or constructs(value):
        return False
    number = False
    while isinstance(value, cst.Call):
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in NUMBER_METHODS and not value.args:
            number |= value.func.attr.value == "item"
            value = value.func.value
        elif isinstance(value.func, cst.Name) and value.func.value in NUMBER_FUNCTIONS and len(value.args) == 1:
            number = True
            value = value.args[0].value
        else:
            return False
    if isinstance(value, cst.Attribute) and value.attr.value == "data":
        value = value.value
    if not isinstance(value, cst.Name) or losses.numbers_only and not number:
        return False
    return is_loss(value.value, losses.derived) or number and value.value in losses.parts
