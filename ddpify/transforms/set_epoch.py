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
        train_loader.sampler.set_epoch(epoch)
        train(train_loader, model)

(In an imported module of a project, ``ddp_sampler(train_loader).set_epoch(epoch)``: it also
serves a script of the project that was left as it was, whose loader has a plain sampler.)

Where the loader is only used under a condition (``if not opt.no_train: train_epoch(i,
train_loader, ...)``, 3D-ResNets) or is built again inside the epoch loop, set_epoch goes
right before the statement that uses it, under the same conditions and after the new
loader is made: at the top of the loop it would name a loader that may not exist.

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

from ddpify.analysis import EpochHook, walk
from ddpify.transforms.base import Block, Transform, above

COUNTER = "sampler_epoch"
RANGES = ("range", "trange")


class SetEpochTransform(Transform):
    CODE_PREFIX = "DDP5"

    def __init__(self, context) -> None:
        super().__init__(context)
        # statement in an epoch loop (original) -> (loader, epoch variable, its DataLoader calls)
        self._before_use: dict[cst.CSTNode, list[tuple[cst.BaseExpression, str, list[cst.Call]]]] = {}
        self._placed: set[tuple[cst.CSTNode, str]] = set()  # (epoch loop, loader code) set there

    def check(self) -> None:
        for loop, hook in self.facts.epoch_hooks.items():
            # (a loop without an epoch number counts its passes: `while True:` that builds its
            # loader inside, crnn-pytorch, names it only once it is made)
            epoch = _epoch_variable(loop) or COUNTER
            for code, (expr, calls) in hook.loaders.items():
                anchors = [self._statement_of(use, loop) for use in hook.uses.get(code, [])]
                if not anchors or None in anchors:
                    continue
                if all(direct for _, direct in anchors) and not _rebinds(loop, code):
                    continue  # the top of the loop serves
                for anchor, _ in anchors:
                    self._before_use.setdefault(anchor, []).append((expr, epoch, calls))
                self._placed.add((loop, code))

    def _statement_of(self, use: cst.CSTNode, loop: cst.CSTNode) -> tuple[cst.CSTNode, bool] | None:
        """The innermost statement holding ``use``, and whether it sits directly in the epoch
        loop's body; None if a function, a class or another loop lies between them."""
        statement, node = None, use
        while node is not None:
            if node is not use and isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.For, cst.While)):
                return None
            if statement is None and isinstance(node, cst.BaseStatement):
                statement = node
            parent = self.context.parent(node)
            if parent is loop.body:
                return (statement, statement is node) if statement is not None else None
            node = parent
        return None

    def _loaders(self, hook: EpochHook) -> list[tuple[cst.BaseExpression, bool]]:
        """The loaders to move to the next epoch at the top of the loop, and whether every
        DataLoader each may be got a DistributedSampler."""
        sharded = self.context.sharded_loaders
        return [
            (expr, all(call in sharded for call in calls)) for code, (expr, calls) in hook.loaders.items()
            if any(call in sharded for call in calls) and (hook.loop, code) not in self._placed
        ]

    def _counts_or_sets(self, hook: EpochHook) -> bool:
        """Does the loop get a set_epoch at its top, or (without an epoch number) a counter
        for one further down?"""
        sharded = self.context.sharded_loaders
        placed = _epoch_variable(hook.loop) is None and any(
            (hook.loop, code) in self._placed and any(call in sharded for call in calls) for code, (_, calls) in hook.loaders.items()
        )
        return bool(self._loaders(hook)) or placed

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        block = self._add_counters(self._before_uses(self._before_passes(block)))
        hook = self.facts.epoch_hooks.get(owner)
        if hook is None or not self._counts_or_sets(hook):
            return block
        epoch = _epoch_variable(owner)
        statements: Block = []
        for loader, every_one in self._loaders(hook):
            sampler = self._sampler_of(loader)
            self.context.report(owner, "DDP501", f"{sampler}.set_epoch() at the top of the epoch loop")
            statements.append((None, self._set_epoch(sampler, epoch or COUNTER, every_one)))
        if epoch is None:
            statements.append((None, cst.parse_statement(f"{COUNTER} += 1")))
        return [*statements, *block]

    def _before_uses(self, block: Block) -> Block:
        result: Block = []
        for original, updated in block:
            for loader, epoch, calls in self._before_use.get(original, []) if original is not None else []:
                if not any(call in self.context.sharded_loaders for call in calls):
                    continue
                sampler = self._sampler_of(loader)
                self.context.report(original, "DDP501", f"{sampler}.set_epoch() right before the statement that uses it")
                every_one = all(call in self.context.sharded_loaders for call in calls)
                statement, updated = above(self._set_epoch(sampler, epoch, every_one), updated)
                result.append((None, statement))
            result.append((original, updated))
        return result

    def _set_epoch(self, sampler: str, epoch: str, every_one: bool = True) -> cst.BaseStatement:
        if self.context.facts.existing_ddp or not every_one:
            # the script's own DDP path: its DataParallel path samples with a RandomSampler;
            # a loader built in two branches, one sharded where it is built, the other where
            # the loop draws from it (Proxy-Anchor's balanced batch_sampler under --IPC)
            return cst.parse_statement(f'if hasattr({sampler}, "set_epoch"):\n    {sampler}.set_epoch({epoch})\n')
        return cst.parse_statement(f"{sampler}.set_epoch({epoch})")

    def _sampler_of(self, loader: cst.BaseExpression) -> str:
        """``train_loader.sampler``, the DistributedSampler this file gave it; in an imported
        module ``ddp_sampler(train_loader)``, which allows the plain sampler of a project
        script that was left as it was (a world of one)."""
        code = self.context.code(loader)
        if self.context.is_library:
            self.context.use_helper("ddp_sampler")
            return f"ddp_sampler({code})"
        return f"{code}.sampler"

    def _before_passes(self, block: Block) -> Block:
        if self.context.facts.existing_ddp:
            return block  # (ddp_next_epoch is a helper: the script's own DDP path gets none)
        result: Block = []
        for original, updated in block:
            hook = self.facts.pass_hooks.get(original)
            for loader, _ in self._loaders(hook) if hook is not None else []:
                code = self.context.code(loader)
                self.context.report(original, "DDP503", f"each pass over {code} moves its sampler to the next epoch (no epoch loop in sight)")
                self.context.use_helper("ddp_sampler")
                self.context.use_helper("ddp_next_epoch")
                statement, updated = above(cst.parse_statement(f"ddp_next_epoch({code})"), updated)
                result.append((None, statement))
            result.append((original, updated))
        return result

    def _add_counters(self, block: Block) -> Block:
        """Loops without an epoch number get a counter initialised right before them."""
        result: Block = []
        for original, updated in block:
            hook = self.facts.epoch_hooks.get(original)
            if hook is not None and self._counts_or_sets(hook) and _epoch_variable(original) is None:
                counter, updated = above(cst.parse_statement(f"{COUNTER} = 0"), updated)
                result.append((None, counter))
            result.append((original, updated))
        return result


def _rebinds(loop: cst.CSTNode, code: str) -> bool:
    """Is the loader (re)built inside the epoch loop (``train_loader = DataLoader(...)``)?"""
    module = cst.Module([])

    def binds(target: cst.BaseExpression) -> bool:
        # (`train_loader, test_loader = get_loader(args)`: pytorch-siamese-triplet)
        if isinstance(target, (cst.Tuple, cst.List)):
            return any(binds(element.value) for element in target.elements)
        return module.code_for_node(target) == code

    return any(
        isinstance(node, cst.Assign) and any(binds(target.target) for target in node.targets)
        or isinstance(node, (cst.AnnAssign, cst.For)) and binds(node.target)
        or isinstance(node, cst.WithItem) and node.asname is not None and binds(node.asname.name)
        for node in walk(loop.body)
    )


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
