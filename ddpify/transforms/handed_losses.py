"""DDP145: a loss handed to a trainer of another module gets the whole global batch.

Converted alone, a script that hands its loss to a training function of another project
module (Deep_Metric's ``train(epoch, model, criterion, optimizer, train_loader, args)`` of
trainer.py) has its loader sharded at the call, but the step that calls the loss is out of
reach: each rank would compute it on its share. A loss that compares the batch's samples
(Binomial, contrastive, lifted-structure), sums over it or divides by a count of it then
trains another model. Whatever it computes, on the whole global batch it is DataParallel's
loss: the loss handed on is wrapped so that each call gathers its tensor arguments from
every process (``ddp_whole_batch``; each share's gradient goes back to its process).

DDP145  a name that holds a loss (``criterion``, ``loss_fn``), made here by a call other than
one of torch's own losses, handed to a training function of another module::

    criterion = losses.create(args.loss, margin=args.margin)
    train(epoch, model, criterion, optimizer, train_loader, args)
    # becomes
    train(epoch, model, DdpWholeBatchLoss(criterion), optimizer, train_loader, args)

So is one handed to the constructor of a trainer object whose method trains (RAGA's ``trainer =
ImgTrainer(model, criterion, writer)``, then ``trainer.train(...)``), and each loss of a list of
them handed on (``criterion = [criterion_cls, criterion_tri]``: each element wrapped where the
list is made).

One of torch's losses (``nn.CrossEntropyLoss()``) is a mean over the samples: each rank's
share gives DDP's mean of the gradients already, and it is handed on as it is. In folder
mode the trainer's module is converted with the script: its calls of the loss are read there
(DDP117).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import dotted, walk
from ddpify.analysis.tree import without_moves
from ddpify.project.neighbours import LOSS_NAME
from ddpify.transforms.base import Transform

WRAPPER = "DdpWholeBatchLoss"


class HandedLossesTransform(Transform):
    CODE_PREFIX = "DDP14"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._handed: set[cst.Arg] = set()

    def check(self) -> None:
        trainers = self.context.neighbours.trainers
        if not trainers or not (self.facts.wraps or self.context.model_elsewhere):
            return
        bindings = self._bindings()
        calls = [node for node in walk(self.context.module) if isinstance(node, cst.Call)]
        # (and the constructor of a trainer object whose method trains: RAGA's `trainer =
        # ImgTrainer(model, criterion, writer)`, then `trainer.train(...)`)
        built = {value for name, value in bindings.items() if any(key.startswith(f"{name}.") for key in trainers)}
        for call in calls:
            if dotted(call.func) not in trainers and call not in built:
                continue
            for arg in call.args:
                name = arg.value.value if isinstance(arg.value, cst.Name) else None
                made = bindings.get(name) if name and LOSS_NAME.search(name) else None
                if isinstance(made, cst.Call) and not self._torchs_own(made):
                    self._handed.add(arg)
                    self._report(arg, name, call)
                elif isinstance(made, (cst.List, cst.Tuple)):
                    # (a list of losses the trainer's methods call by position: RAGA's `[criterion_cls, criterion_tri]`)
                    for element in made.elements:
                        inner = element.value.value if isinstance(element.value, cst.Name) else None
                        part = bindings.get(inner) if inner else None
                        if isinstance(part, cst.Call) and not self._torchs_own(part):
                            self._handed.add(element)
                            self._report(element, inner, call)

    def _report(self, node: cst.CSTNode, name: str, call: cst.Call) -> None:
        self.context.report(
            node,
            "DDP145",
            f"`{name}` is handed to `{dotted(call.func)}()` of another module, which computes the loss out of "
            "sight on each rank's share: as DataParallel computed it, it gets the whole global batch "
            "(DdpWholeBatchLoss gathers its arguments from every process, each share's gradient sent back)",
        )

    def _bindings(self) -> dict[str, cst.BaseExpression]:
        """Names bound once in the file, to a call or a list of names (``criterion =
        losses.create(...)``, ``criterion = [criterion_cls, criterion_tri]``)."""
        found: dict[str, list] = {}
        for node in walk(self.context.module):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        found.setdefault(target.target.value, []).append(node.value)
        kept = (cst.Call, cst.List, cst.Tuple)
        return {name: values[0] for name, values in found.items() if len(values) == 1 and isinstance(values[0], kept)}

    def _torchs_own(self, made: cst.Call) -> bool:
        """One of torch's losses (``nn.CrossEntropyLoss()``, ``.to(device)`` of one)."""
        made = without_moves(made)
        return isinstance(made, cst.Call) and any(name.startswith("torch.") for name in self.context.qualified(made.func))

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return self._wrapped(original_node, updated_node)

    def leave_Element(self, original_node: cst.Element, updated_node: cst.Element) -> cst.Element:
        return self._wrapped(original_node, updated_node)

    def _wrapped(self, original_node, updated_node):
        if original_node not in self._handed:
            return updated_node
        self.context.use_helper(WRAPPER)
        return updated_node.with_changes(value=cst.Call(func=cst.Name(WRAPPER), args=[cst.Arg(updated_node.value)]))
