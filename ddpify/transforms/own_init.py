"""DDP208: the script's own ``init_process_group`` runs only when no process group is set up yet.

ddpify's set-up joins the process group where the script starts (torchrun, Slurm, or a world
of one). A call of the script's own that the converted code still reaches (a ``setup(rank,
world_size)`` helper called on the DataParallel path too, a project module's start-up
function) would then start a second one, and every rank stops at start-up with "trying to
initialize the default process group twice". It keeps its place and runs where no group
exists (the script's own DDP path, a process ddpify did not set up)::

    def setup(rank, world_size):
        os.environ["MASTER_PORT"] = "12355"
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
    # becomes
    def setup(rank, world_size):
        os.environ["MASTER_PORT"] = "12355"
        if not dist.is_initialized():
            dist.init_process_group("nccl", rank=rank, world_size=world_size)

A call already under a test of ``is_initialized()`` is left as it is; one that is not a
statement of its own (its value used) refuses the file.

DDP208  the script's own init_process_group() now runs only where no process group exists.
DDP209  (error) an init_process_group() whose value is used: it cannot keep its place under a
        test, and a second set-up stops every rank; make it a statement of its own.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import walk
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform

INIT = "torch.distributed.init_process_group"


class OwnInitTransform(Transform):
    CODE_PREFIX = "DDP2"

    def check(self) -> None:
        self._guarded: set[cst.Call] = set()  # calls that become `if not ...is_initialized():` statements
        for node in walk(self.context.module):
            if isinstance(node, cst.Call) and INIT in self.context.qualified(node.func) and not self._tested_already(node):
                if self._alone_on_its_line(node):
                    self._guarded.add(node)
                else:
                    self.context.report(
                        node,
                        "DDP209",
                        "the script's own init_process_group() is used as a value: it would start a second process "
                        "group after ddpify's set-up (every rank stops); make it a statement of its own, then convert",
                        Severity.ERROR,
                    )

    def _tested_already(self, call: cst.Call) -> bool:
        """Under an ``if``/``while``/conditional whose test asks ``is_initialized()`` (the
        script's own, or this transform's on a second run)."""
        node = self.context.parent(call)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            test = getattr(node, "test", None)
            if test is not None and "is_initialized" in self.context.code(test):
                return True
            node = self.context.parent(node)
        return False

    def _alone_on_its_line(self, call: cst.Call) -> bool:
        expression = self.context.parent(call)
        line = self.context.parent(expression) if isinstance(expression, cst.Expr) else None
        return isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine):
        call = original_node.body[0].value if isinstance(original_node.body[0], cst.Expr) else None
        if call not in self._guarded:
            return updated_node
        self.context.report(
            call,
            "DDP208",
            "the script's own init_process_group() now runs only where no process group exists: ddpify's set-up "
            "comes first, and a second one would stop every rank at start-up",
        )
        test = cst.parse_expression(f"not {self._module_prefix(call)}is_initialized()")
        body = cst.IndentedBlock(body=[updated_node.with_changes(leading_lines=[])])
        return cst.If(test=test, body=body, leading_lines=updated_node.leading_lines)

    def _module_prefix(self, call: cst.Call) -> str:
        """``dist.`` as the script names the module (``torch.distributed.``, ``td.``); a bare
        ``init_process_group`` gets ``dist.``, imported."""
        if isinstance(call.func, cst.Attribute):
            return self.context.code(call.func.value) + "."
        self.context.add_import("torch.distributed", None, "dist")
        return "dist."
