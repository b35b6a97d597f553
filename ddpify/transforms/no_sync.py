"""DDP502: gradient accumulation syncs gradients only on the step that updates the weights.

A loop that calls ``backward()`` every iteration but ``optimizer.step()`` only under a
condition (every k micro-steps) accumulates gradients. DDP would all-reduce them on every
backward; inside ``model.no_sync()`` it accumulates locally and the backward of the final
micro-step all-reduces the sum. The weights are the same either way (the all-reduce is
linear); the micro-steps just stop paying for communication. Forward and backward both
go inside the context, as DDP requires.

DDP502  the micro-steps of gradient accumulation run in ``ddp_no_sync``::

    for i, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accumulation
        loss.backward()
        if (i + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()
    # becomes
    for i, (x, y) in enumerate(loader):
        with ddp_no_sync(model, not ((i + 1) % accumulation == 0)):
            loss = loss_fn(model(x), y) / accumulation
            loss.backward()
        if (i + 1) % accumulation == 0:
            ...

``ddp_no_sync`` (an emitted helper) is ``model.no_sync()`` only while accumulating and only
when ``model`` is DDP, so a wrap that does not run (a world of one) still works.

Only when the update's condition is the same on every rank (loop counters, settings), one
wrapped model runs in the micro-step, no optimizer steps anywhere else in the loop body, and
the micro-step changes nothing the condition reads (KernelGAT's ``global_step += 1`` before
``if global_step % k == 0``: tested before it, the condition would be one step behind): the
last backward before every step must synchronise. Otherwise the loop is left as it is
(correct, only slower).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import calls_in, dotted, loop_names_around, same_on_every_rank, walk
from ddpify.analysis.tree import assigned_in
from ddpify.transforms.base import Block, Transform


class NoSyncTransform(Transform):
    CODE_PREFIX = "DDP5"

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        if not isinstance(owner, cst.For):
            return block
        for index, (original, _) in enumerate(block):
            if index and isinstance(original, cst.If) and self._steps_optimizer(original):
                return self._wrap_micro_step(block, index)
        return block

    def _steps_optimizer(self, statement: cst.CSTNode) -> bool:
        return any(_is_optimizer_step(call) for call in calls_in(statement))

    def _wrap_micro_step(self, block: Block, index: int) -> Block:
        update = block[index][0]
        micro_step = [original for original, _ in block[:index]]
        if any(original is None for original in micro_step):
            return block  # another transform already inserted statements here
        if any(self._steps_optimizer(original) for original, _ in block if original not in (None, update)):
            return block  # an update outside the condition: its backward must synchronise
        calls = [call for statement in micro_step for call in calls_in(statement)]
        models = {dotted(call.func) for call in calls} & self.facts.model_names
        backward = any(isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward" for c in calls)
        if len(models) != 1 or not backward or not same_on_every_rank(update.test, loop_names_around(update, self.context.parent)):
            return block
        if _names(update.test) & {name for statement in micro_step for name in assigned_in(statement)}:
            return block  # (KernelGAT: `global_step += 1` in the micro-step; the test, read before it, would be one behind)
        model = models.pop()
        self.context.add_import("contextlib")
        self.context.use_helper("ddp_no_sync")
        condition = self.context.code(update.test)
        self.context.report(block[0][0], "DDP502", f"micro-steps run in {model}.no_sync(): gradients sync only when the optimizer steps")
        first = block[0][1]
        body = [first.with_changes(leading_lines=[]), *(statement for _, statement in block[1:index])]
        wrapped = cst.parse_statement(f"with ddp_no_sync({model}, not ({condition})):\n    pass\n")
        wrapped = wrapped.with_changes(body=cst.IndentedBlock(body=body), leading_lines=first.leading_lines)
        return [(None, wrapped), *block[index:]]


def _names(node: cst.CSTNode) -> set[str]:
    return {dotted(n) for n in walk(node) if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n)}


def _is_optimizer_step(call: cst.Call) -> bool:
    """``optimizer.step()``, ``opt_g.step()``, ``scaler.step(optimizer)``; not a scheduler's."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"):
        return False
    owner = (dotted(call.func.value) or "").lower()
    return "sched" not in owner and "lr" not in owner.split(".")[-1]
