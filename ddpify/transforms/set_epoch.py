"""DDP5xx: ``sampler.set_epoch(epoch)`` first thing in every epoch loop.

Without it a DistributedSampler yields the same order every epoch. The epoch loop is the
loop around the training loop, found in the same function or, when the training loop sits
in a function or method, around its call (``train(train_loader, ...)`` in the loop).
The loader is named as that loop sees it: the argument passed, or ``self.x`` / ``obj.x``.

DDP501  set_epoch added::

    for epoch in range(epochs):
        train(train_loader, model)
    # becomes
    for epoch in range(epochs):
        ddp_sampler(train_loader).set_epoch(epoch)
        train(train_loader, model)

``ddp_sampler`` (an emitted helper) returns the loader's DistributedSampler, and is the
run-time backstop for the data: if the loader does not shard after all (a shape the static
analysis misread), training stops at the first epoch with a clear error instead of every
rank training on all the data.

When the loop has no epoch number (``while True:``, ``for batch_set in schedule:``) a counter
is added before it and incremented at the top of the loop.

DDP503  no epoch loop in sight: the pass over the loader is a method or function that only
another module calls (EDSR's ``Trainer.train()``, run by ``while not t.terminate()`` in
main.py); each pass moves the sampler on by one epoch itself::

    for batch, (lr, hr) in enumerate(self.loader_train):
    # becomes
    ddp_next_epoch(self.loader_train)
    for batch, (lr, hr) in enumerate(self.loader_train):
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import EpochHook
from ddpify.transforms.base import Block, Transform

COUNTER = "sampler_epoch"
RANGES = ("range", "trange")


class SetEpochTransform(Transform):
    CODE_PREFIX = "DDP5"

    def _loaders(self, hook: EpochHook) -> list[cst.BaseExpression]:
        sharded = self.context.sharded_loaders
        return [expr for expr, calls in hook.loaders.values() if any(call in sharded for call in calls)]

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        block = self._add_counters(self._before_passes(block))
        hook = self.facts.epoch_hooks.get(owner)
        if hook is None or not self._loaders(hook):
            return block
        epoch = _epoch_variable(owner)
        statements: Block = []
        for loader in self._loaders(hook):
            code = self.context.code(loader)
            self.context.report(owner, "DDP501", f"ddp_sampler({code}).set_epoch() at the top of the epoch loop")
            # ddp_sampler stops with a clear error if the loader does not shard after all.
            statements.append((None, cst.parse_statement(f"ddp_sampler({code}).set_epoch({epoch or COUNTER})")))
            self.context.use_helper("ddp_sampler")
        if epoch is None:
            statements.append((None, cst.parse_statement(f"{COUNTER} += 1")))
        return [*statements, *block]

    def _before_passes(self, block: Block) -> Block:
        result: Block = []
        for original, updated in block:
            hook = self.facts.pass_hooks.get(original)
            for loader in self._loaders(hook) if hook is not None else []:
                code = self.context.code(loader)
                self.context.report(original, "DDP503", f"each pass over {code} moves its sampler to the next epoch (no epoch loop in sight)")
                self.context.use_helper("ddp_sampler")
                self.context.use_helper("ddp_next_epoch")
                statement = cst.parse_statement(f"ddp_next_epoch({code})")
                result.append((None, statement.with_changes(leading_lines=updated.leading_lines)))
                updated = updated.with_changes(leading_lines=[])
            result.append((original, updated))
        return result

    def _add_counters(self, block: Block) -> Block:
        """Loops without an epoch number get a counter initialised right before them."""
        result: Block = []
        for original, updated in block:
            hook = self.facts.epoch_hooks.get(original)
            if hook is not None and self._loaders(hook) and _epoch_variable(original) is None:
                counter = cst.parse_statement(f"{COUNTER} = 0").with_changes(leading_lines=updated.leading_lines)
                result.append((None, counter))
                updated = updated.with_changes(leading_lines=[])
            result.append((original, updated))
        return result


def _epoch_variable(loop: cst.CSTNode) -> str | None:
    """`epoch` in `for epoch in range(...)` (or trange/tqdm(range(...)))."""
    if not isinstance(loop, cst.For) or not isinstance(loop.target, cst.Name):
        return None
    iterable = loop.iter
    while isinstance(iterable, cst.Call):
        func = iterable.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
        if name in RANGES:
            return loop.target.value
        if name != "tqdm" or not iterable.args:
            return None
        iterable = iterable.args[0].value
    return None
