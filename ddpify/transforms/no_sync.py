"""DDP502: gradient accumulation syncs gradients only on the step that updates the weights.

A loop that calls ``backward()`` every iteration but ``optimizer.step()`` only under a
condition (every k micro-steps) accumulates gradients. DDP would all-reduce them on every
backward; inside ``model.no_sync()`` it accumulates locally and the backward of the final
micro-step all-reduces the sum. The weights are the same either way (the all-reduce is
linear); the micro-steps just stop paying for communication. Forward and backward both
go inside the context, as DDP requires.

DDP502::

    for i, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accumulation
        loss.backward()
        if (i + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()
    # becomes
    for i, (x, y) in enumerate(loader):
        with model.no_sync() if not ((i + 1) % accumulation == 0) else contextlib.nullcontext():
            loss = loss_fn(model(x), y) / accumulation
            loss.backward()
        if (i + 1) % accumulation == 0:
            ...

Only when the update's condition is the same on every rank (loop counters, settings) and
one wrapped model runs in the micro-step; otherwise the loop is left as it is (correct,
only slower).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import calls_in, dotted, loop_names_around, same_on_every_rank
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

    def _steps_optimizer(self, statement: cst.If) -> bool:
        return any(
            isinstance(call.func, cst.Attribute) and call.func.attr.value == "step" and "opt" in (dotted(call.func.value) or "")
            for call in calls_in(statement.body)
        )

    def _wrap_micro_step(self, block: Block, index: int) -> Block:
        update = block[index][0]
        micro_step = [original for original, _ in block[:index]]
        if any(original is None for original in micro_step):
            return block  # another transform already inserted statements here
        calls = [call for statement in micro_step for call in calls_in(statement)]
        models = {dotted(call.func) for call in calls} & self.facts.model_names
        backward = any(isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward" for c in calls)
        if len(models) != 1 or not backward or not same_on_every_rank(update.test, loop_names_around(update, self.context.parent)):
            return block
        model = models.pop()
        self.context.add_import("contextlib")
        condition = self.context.code(update.test)
        self.context.report(block[0][0], "DDP502", f"micro-steps run in {model}.no_sync(): gradients sync only when the optimizer steps")
        first = block[0][1]
        body = [first.with_changes(leading_lines=[]), *(statement for _, statement in block[1:index])]
        wrapped = cst.parse_statement(f"with {model}.no_sync() if not ({condition}) else contextlib.nullcontext():\n    pass\n")
        wrapped = wrapped.with_changes(body=cst.IndentedBlock(body=body), leading_lines=first.leading_lines)
        return [(None, wrapped), *block[index:]]
