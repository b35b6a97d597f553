"""DDP138: the switch an entry script tests to take the path on which a project module wraps.

Folder mode: the entry script picks a trainer or a model builder of another module by a
multi-GPU switch (segmentation_distributed's ``-p dp``: ``DPTrainer(...)``, whose constructor
wraps the model in DataParallel; ``SingleGPUTrainer(...)`` otherwise). The wrap, converted in
that module, runs only on that path: launched without the switch, every rank would train a
model of its own on its share of the data. As for a wrap in the file (DDP103), the world size
now decides too::

    if args.parallel == "dp":          ->   if dist.get_world_size() > 1 or args.parallel == "dp":
        trainer = DPTrainer(model)              trainer = DPTrainer(model)
    else:
        trainer = SingleGPUTrainer(model)

    if args.single:                    ->   if dist.get_world_size() == 1 and args.single:
        trainer = SingleGPUTrainer(model)       trainer = SingleGPUTrainer(model)
    else:
        trainer = DPTrainer(model)

Only a test about devices (its words: gpu, parallel, dp, multi, ...), and only where the
other path makes no such call; a test that runs before the process group is set up is
left as it is and reported.

DDP138  the world size now also selects the path where a project module wraps.
DDP139  (warning) that switch is tested before the process group is set up: left as it is;
        launch with it set.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import dotted, same_path_on_every_rank, walk
from ddpify.analysis.entry import callers_run_after_setup, runs_after_setup
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform
from ddpify.transforms.wrap_model import about_devices


class WrapSwitchesTransform(Transform):
    CODE_PREFIX = "DDP1"

    def check(self) -> None:
        self._widened: dict[cst.If, bool] = {}  # switch -> does its body take the wrapping path
        wrapping = set(self.context.neighbours.wrapping_calls)
        if not wrapping:
            return
        calls = [node for node in walk(self.context.module) if isinstance(node, cst.Call) and dotted(node.func) in wrapping]
        reaches = lambda statement: same_path_on_every_rank(statement, self.context.parent)  # noqa: E731
        callers_run_after = callers_run_after_setup(self.facts, self.context.parent, reaches)
        for call in calls:
            found = self._switch_of(call)
            if found is None:
                continue
            switch, in_body = found
            if runs_after_setup(switch, self.facts, self.context.parent, callers_run_after):
                self._widened[switch] = in_body
            else:
                self.context.report(
                    switch.test,
                    "DDP139",
                    f"`{self.context.code(switch.test)}` selects the path where a module of this project wraps the model, "
                    "and it is tested before the process group is set up: left as it is; launch with it set (without "
                    "it every rank would train a model of its own)",
                    Severity.WARNING,
                )

    def _switch_of(self, call: cst.Call) -> tuple[cst.If, bool] | None:
        """The innermost ``if`` around the call whose test is about devices, and whether the
        call is in its body; None where the other branches wrap too (the test decides nothing)."""
        child, node = call, self.context.parent(call)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            if isinstance(node, cst.If) and child is not node.test and about_devices(self.context.code(node.test)):
                in_body = child is node.body
                other = node.orelse if in_body else node.body
                if other is not None and self._wraps(other):
                    return None
                return node, in_body
            child, node = node, self.context.parent(node)
        return None

    def _wraps(self, block: cst.CSTNode) -> bool:
        wrapping = self.context.neighbours.wrapping_calls
        return any(isinstance(node, cst.Call) and dotted(node.func) in wrapping for node in walk(block))

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        in_body = self._widened.get(original_node)
        if in_body is None:
            return updated_node
        self.context.add_import("torch.distributed", None, "dist")
        test = self.context.code(original_node.test)
        self.context.report(
            original_node.test,
            "DDP138",
            f"`{test}` selected the path where a module of this project wraps the model: the world size decides too "
            "(every rank must wrap)",
        )
        loose = isinstance(updated_node.test, (cst.IfExp, cst.Lambda, cst.NamedExpr)) or (
            not in_body and isinstance(updated_node.test, cst.BooleanOperation) and isinstance(updated_node.test.operator, cst.Or)
        )
        operand = f"({test})" if loose and not updated_node.test.lpar else test
        code = f"{self.context.world_size} > 1 or {operand}" if in_body else f"{self.context.world_size} == 1 and {operand}"
        return updated_node.with_changes(test=cst.parse_expression(code))
