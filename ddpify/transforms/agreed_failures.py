"""DDP813: a training step's exceptions are agreed across ranks.

DataParallel ran one process: when a step raised (an out-of-memory on one GPU, a degenerate
sample), the script's ``except`` branch skipped the whole global step. Under DDP the failure
is one rank's: it takes the ``except`` branch while the others go on into the step's
collectives (the buffers' broadcast of the next forward, backward's all-reduce) and wait for it
forever. The ranks agree on failures instead, in the manner of fairseq's out-of-memory recovery:
the ``try`` holding a training step gets agreement points (one tiny all-reduce each) at its top and
right before each statement that may run the model or a collective, up to the one that calls
backward(); the ``except`` branches start by handing this rank's error to the others. A rank that
failed before the gradients were exchanged makes every rank raise its error at their next point,
so all take the same ``except`` branch (its handler may test the error: it is the same kind, with
the same text). A failure while the gradients are exchanged cannot be skipped by one rank: it
stops the run with that rank's error, where it would have hung.

DDP813  a ``try`` around a training step (``backward()`` in its body) in a training loop or a
step function, met by every rank::

    try:                                    try:
                                                ddp_failures_agreed()
        out = model(x)                          out = model(x)
        loss = criterion(out, y)                loss = criterion(out, y)
                                                ddp_failures_agreed(before_backward=True)
        loss.backward()                         loss.backward()
        optimizer.step()                        optimizer.step()
    except Exception as e:                  except Exception as e:
                                                ddp_failed_here()
        print(e)                                print(e)
        continue                                continue

A ``try`` that not every rank reaches (under a test of this rank's data, or in an ``except``
branch) keeps DDP803's warning: a collective there would wait for the ranks that skipped it.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import calls_in, dotted, enclosing_function, innermost_loop, same_path_on_every_rank, under_rank_guard, walk
from ddpify.transforms.base import Block, Transform, above, keyword

AGREE, FAILED = "ddp_failures_agreed", "ddp_failed_here"
# Emitted helpers that never exchange anything with the other ranks
LOCAL_HELPERS = ("ddp_rank", "ddp_world_size", "ddp_device", "ddp_here", "ddp_no_sync", "ddp_failed_here")


class AgreedFailuresTransform(Transform):
    CODE_PREFIX = "DDP8"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._steps: dict[cst.Try, set[str]] = {}  # a try around a step -> callees there that may run a collective
        self._handlers: set[cst.ExceptHandler] = set()

    def check(self) -> None:
        if self.context.is_library:
            return  # (its callers are out of sight: one may call it on rank 0 alone)
        scopes = {*self.facts.training_loops, *self.facts.step_functions}
        for node in walk(self.context.module):
            if isinstance(node, cst.Try) and isinstance(node.body, cst.IndentedBlock) and node.handlers and self._a_step(node, scopes):
                self._steps[node] = self._collective_callees(node)
                self._handlers.update(node.handlers)

    def _a_step(self, node: cst.Try, scopes: set[cst.CSTNode]) -> bool:
        """A try whose body calls backward(), right inside a training loop or a step function,
        that every rank reaches."""
        if not any(_calls_backward(call) for call in calls_in(node.body)):
            return False
        if innermost_loop(node, self.context.parent) not in scopes and enclosing_function(node, self.context.parent) not in scopes:
            return False
        if under_rank_guard(node, self.context.parent, self.context.code):
            return False
        return same_path_on_every_rank(node, self.context.parent)

    def _collective_callees(self, node: cst.Try) -> set[str]:
        function = enclosing_function(node, self.context.parent)
        params = {p.name.value for p in function.params.params} if function is not None else set()
        return {
            dotted(call.func) for call in calls_in(node.body)
            if dotted(call.func) and self.facts.analyzer.call_is_unsafe(call, params)
        }

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        if owner in self._handlers:
            first, *rest = block
            told, statement = above(_call_line(FAILED), first[1])
            return [(None, told), (first[0], statement), *rest]
        callees = self._steps.get(owner)
        if callees is None:
            return block
        return self._with_points(owner, block, callees)

    def _with_points(self, step: cst.Try, block: Block, callees: set[str]) -> Block:
        backward = next((i for i, (_, updated) in enumerate(block) if any(_calls_backward(c) for c in calls_in(updated))), None)
        if backward is None:
            return block
        result: Block = []
        for index, (original, updated) in enumerate(block):
            if index == backward:
                point, updated = above(_call_line(AGREE, before_backward=True), updated)
                result.append((None, point))
            elif index == 0 or index < backward and self._exchanges(updated, callees):
                point, updated = above(_call_line(AGREE), updated)
                result.append((None, point))
            result.append((original, updated))
        self.context.use_helper(AGREE)
        self.context.use_helper(FAILED)
        # (the hang DDP803 warned of here is gone: every rank takes the except branch together)
        self.context.withdraw(step, "DDP803")
        self.context.report(
            step,
            "DDP813",
            "an exception in this training step is agreed across ranks: where one rank fails before backward(), every "
            "rank takes the except branch with its error; a failure in backward() stops the run instead of hanging it",
        )
        return result

    def _exchanges(self, statement: cst.CSTNode, callees: set[str]) -> bool:
        """May the statement run the model or a collective (a call the analysis marks, or a
        helper another transform put there: a printed loss's mean)?"""
        for call in calls_in(statement):
            name = dotted(call.func) or ""
            if name in callees or name.startswith(("ddp_", "Ddp")) and name not in LOCAL_HELPERS:
                return True
        return False

    def leave_ExceptHandler(self, original_node: cst.ExceptHandler, updated_node: cst.ExceptHandler) -> cst.ExceptHandler:
        body = updated_node.body
        if original_node not in self._handlers or not isinstance(body, cst.SimpleStatementSuite):
            return updated_node
        # (`except Exception: continue` on one line)
        told = cst.Expr(cst.Call(func=cst.Name(FAILED)))
        return updated_node.with_changes(body=body.with_changes(body=[told, *body.body]))


def _calls_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _call_line(name: str, before_backward: bool = False) -> cst.SimpleStatementLine:
    args = [keyword("before_backward", cst.Name("True"))] if before_backward else []
    return cst.SimpleStatementLine([cst.Expr(cst.Call(func=cst.Name(name), args=args))])
