"""The analysis walk: one visitor over the original tree that hands each node to the rooms
that record something about it; ``resolve`` then lets each room decide what it found.

The visitor itself decides nothing: ``Scopes`` keeps the position, ``Wraps``, ``Loaders``,
``TrainingLoops``, ``Entry`` and ``Collectives`` record and resolve (see the package's
docstring for which facts each one owns). The walk's facts depend on the file alone (and,
in project mode, on the names it binds from other modules); a resolution also on what the
project says about it (its loaders another module trains on, the loader parameters of the
functions it calls), so it can run again on a copy of the walk's facts when the project
learns more, without a second walk.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpify.analysis.calls import CallGraph
from ddpify.analysis.entry import Entry
from ddpify.analysis.facts import Facts
from ddpify.analysis.functional_wraps import FunctionalWraps
from ddpify.analysis.loaders import Loaders
from ddpify.analysis.loops import TrainingLoops
from ddpify.analysis.ranks import Collectives
from ddpify.analysis.scopes import Scopes
from ddpify.analysis.tree import Subtrees, bound_names, dotted, is_main_guard, is_training_call, without_gradients
from ddpify.analysis.wraps import Wraps
from ddpify.names import DATA_LOADER, DATA_PARALLEL, DATA_PARALLEL_FUNCTION, METRIC_SCHEDULERS


class Analyzer(cst.CSTVisitor):
    def __init__(self, facts: Facts, metadata: dict[type, Any], subtrees: Subtrees) -> None:
        super().__init__()
        self.subtrees = subtrees
        self.scopes = Scopes(facts, metadata)
        self.calls = CallGraph(self.scopes)
        self.wraps = Wraps(self.scopes)
        self.functional = FunctionalWraps(self.scopes, self.wraps)
        self.loaders = Loaders(self.scopes, self.calls)
        self.loops = TrainingLoops(self.scopes, self.calls, self.loaders)
        self.entry = Entry(self.scopes)
        self.collectives = Collectives(self.scopes)

    @property
    def facts(self) -> Facts:
        return self.scopes.facts

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.subtrees.enter(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self.subtrees.leave(original_node)

    def call_is_unsafe(self, call: cst.Call, local_params: set[str]) -> bool:
        """Does this call (maybe) run a model forward/backward or a collective? (for the
        transforms that guard side effects on rank 0)"""
        return self.collectives.call_is_unsafe(call, local_params)

    # -- scopes ------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.module = node

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            self.facts.star_imports = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.wraps.definition(node)
        self.scopes.enter_function(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scopes.leave_function()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.wraps.class_bases(node)
        self.wraps.definition(node)
        self.scopes.classes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.scopes.classes.pop()

    def visit_For(self, node: cst.For) -> None:
        self.facts.contexts[node] = self.scopes.context()
        self.scopes.loops[-1].append(node)
        self.wraps.bind(bound_names(node.target))

    def leave_For(self, original_node: cst.For) -> None:
        self.scopes.loops[-1].pop()

    def visit_While(self, node: cst.While) -> None:
        self.facts.contexts[node] = self.scopes.context()
        self.scopes.loops[-1].append(node)

    def leave_While(self, original_node: cst.While) -> None:
        self.scopes.loops[-1].pop()

    def visit_If(self, node: cst.If) -> None:
        if is_main_guard(node) and isinstance(self.scopes.parent(node), cst.Module):
            self.facts.main_guard = node
            self.scopes.in_main_guard = True

    def leave_If(self, original_node: cst.If) -> None:
        if original_node is self.facts.main_guard:
            self.scopes.in_main_guard = False

    # -- calls and references ------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        names = self.scopes.qualified(node.func)
        context = self.scopes.context()
        self.scopes.calls.append((node, context))
        self.facts.contexts[node] = context
        if names & DATA_PARALLEL or self.wraps.subclass_called(node):
            self.wraps.record_wrap(node)
        elif (plan := self.wraps.planned_subclass(node)) is not None:
            self.wraps.record_wrap(node, (plan.index, plan.keyword), sync_bn=plan.sync_bn)
        elif names & DATA_PARALLEL_FUNCTION:
            self.functional.record(node)
        elif names & DATA_LOADER:
            self.loaders.record(node)
        elif names & METRIC_SCHEDULERS and isinstance(assignment := self.scopes.parent(node), cst.Assign):
            self.facts.metric_schedulers.update(name for t in assignment.targets for name in bound_names(t.target))
        else:
            self.wraps.variant_call(node)
        if context.function is None and context.cls is None and self.entry.runs_here(node, names):
            self.facts.module_level_runs = True
            self.facts.import_time_runs |= not self.scopes.in_main_guard
            if not self.scopes.in_main_guard:
                self.facts.import_time_calls.append(node)
        if is_training_call(node) or dotted(node.func) in self.facts.training_calls and not self._without_gradients(node):
            # (a function that trains, called under no_grad, evaluates: Wave-U-Net's validate()
            # calls compute_loss(), whose backward() runs only when asked)
            self.loops.training_step()

    def _without_gradients(self, node: cst.CSTNode) -> bool:
        return without_gradients(node, self.scopes.parent, cst.Module([]).code_for_node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.wraps.reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.facts.names.add(node.value)
        self.wraps.reference(node)

    # -- bindings ------------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        self.wraps.assign(node)
        self.loaders.assign(node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.wraps.bind(bound_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.wraps.bind(bound_names(node.target))

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self.wraps.bind(bound_names(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.wraps.bind(bound_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
        self.wraps.bind(bound_names(node.name))

    # -- after the walk ------------------------------------------------------------------
    def leave_Module(self, original_node: cst.Module) -> None:
        self.functional.finish()
        self.wraps.finish()
        self.facts.setup_anchor = self.entry.setup_anchor(original_node)
        self.facts.setup_function = self.entry.setup_function(original_node)

    def resolve(self, facts: Facts) -> None:
        """Decide on ``facts`` (a copy of the walk's, with what the project says): training
        loops and their loaders, epoch hooks, loaders passed to or built for other modules,
        functions that reach a collective, passes that do not train."""
        self.scopes.facts = facts
        self.loaders.forget_stand_ins()
        self.loops.resolve()
        self.loops.shard_passed_loaders()
        self.loops.check_backward_in_forward()
        self.loops.check_backward_per_forward()
        self.loops.mark_loader_functions()
        self.collectives.find_unsafe_functions()
        self.loops.find_side_passes()
