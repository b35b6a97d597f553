"""DDP41x: reads of DataParallel's global batch size that size or cut the step's tensors.

DDP401 gives each process its share of the loader's batch. The same value, read again in
the training step (under its own name, or a name bound to it: ``bs = options.bs``), still
says the global batch: a step that cuts its outputs at it, repeats a list to it or loops
over its samples then works on a batch of the wrong size (SICNN's ``features[0:bs]`` took
every row of a joined batch and left the other half empty; crnn-pytorch's CTC input lengths
``[T] * batch_size`` no longer matched the batch).

DDP413  each read of the training loader's batch size in the loop that trains (or a step
function it calls) that cuts, repeats or counts the batch is the share::

    f1, f2 = features[0:bs], features[bs:]
    # becomes
    f1, f2 = features[0:ddp_local_batch_size(bs)], features[ddp_local_batch_size(bs):]

    pred_lens = Tensor([preds.size(0)] * batch_size)   ->   [preds.size(0)] * ddp_local_batch_size(batch_size)
    for k in range(bs):                                 ->   for k in range(ddp_local_batch_size(bs)):

A training loss divided by the global batch size is a sum over the batch made a mean (a
loss whose reduction this file cannot see, warpctc's CTCLoss, sums): each process divides
its share's sum by its share, and DDP's average is DataParallel's mean again (divided by the
global size, every step was 1/world size of DataParallel's)::

    loss = ctc_loss(preds, labels, pred_lens, label_lens) / batch_size
    # becomes
    loss = ctc_loss(preds, labels, pred_lens, label_lens) / ddp_local_batch_size(batch_size)

A loss torch computes as a mean (the default reduction; not one built with ``reduction="sum"``
or ``size_average=False``, which sums), or one DDP116 already scaled by the world size, keeps
its divisor. Prints, counters and statistics keep the global value.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import walk
from ddpify.analysis.statistics import is_loss
from ddpify.analysis.tree import innermost_loop
from ddpify.transforms.base import Transform
from ddpify.transforms.batch_size import read_batch_sizes
from ddpify.transforms.selected_means import MEAN_LOSS_MODULES, MEAN_LOSSES

LOCAL = "ddp_local_batch_size"


class BatchReadsTransform(Transform):
    CODE_PREFIX = "DDP41"

    def check(self) -> None:
        options = self.context.options
        self._sizes = frozenset() if options.per_process_batch else read_batch_sizes(self.context)
        self._torch_built = frozenset(
            self.context.code(t.target)
            for node in walk(self.context.module) if self._sizes and isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)
            and any(name.startswith("torch.") for name in self.context.qualified(node.value.func)) and not _summed(node.value)
            for t in node.targets
        )  # (names bound to a torch module that averages: `criterion = nn.CrossEntropyLoss()`)

    def leave_Slice(self, original_node: cst.Slice, updated_node: cst.Slice) -> cst.Slice:
        if not self._sizes or not self._in_the_step(original_node) or self._written_to(original_node):
            return updated_node
        changes = {
            part: self._localised(getattr(original_node, part), getattr(updated_node, part))
            for part in ("lower", "upper") if getattr(original_node, part) is not None
        }
        changes = {part: value for part, value in changes.items() if value is not None}
        if not changes:
            return updated_node
        self._report(original_node, "cuts the step's tensors at it")
        return updated_node.with_changes(**changes)

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation) -> cst.BaseExpression:
        if not self._sizes or not self._in_the_step(original_node):
            return updated_node
        operator = original_node.operator
        if isinstance(operator, cst.Multiply):
            for side, other in (("left", original_node.right), ("right", original_node.left)):
                if isinstance(other, (cst.List, cst.Tuple, cst.ListComp)) and self._a_size(getattr(original_node, side)):
                    self._report(original_node, "repeats a list to it")
                    return updated_node.with_changes(**{side: _local(getattr(updated_node, side))})
        if isinstance(operator, cst.Divide) and self._a_size(original_node.right) and self._a_summed_loss(original_node):
            self._report(original_node, "makes a mean of a training loss summed over the batch")
            return updated_node.with_changes(right=_local(updated_node.right))
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self._sizes or not isinstance(original_node.func, cst.Name) or original_node.func.value != "range":
            return updated_node
        if "builtins.range" not in self.context.qualified(original_node.func) or not self._in_the_step(original_node):
            return updated_node
        args = [new.with_changes(value=_local(new.value)) if self._a_size(old.value) and old.keyword is None else new for old, new in zip(original_node.args, updated_node.args)]
        if all(new is old for new, old in zip(args, updated_node.args)):
            return updated_node
        self._report(original_node, "counts the batch's samples with it")
        return updated_node.with_changes(args=args)

    def _written_to(self, cut: cst.Slice) -> bool:
        """A slice of what the step writes to (MoCo's queue ``queue[ptr:ptr + bs] = keys``, its
        pointer moved by the global size in another statement): left as it is."""
        subscript = self.context.parent(self.context.parent(cut))
        holder = self.context.parent(subscript)
        return isinstance(holder, cst.AssignTarget) or isinstance(holder, (cst.AugAssign, cst.AnnAssign)) and holder.target is subscript

    def _a_size(self, node: cst.BaseExpression | None) -> bool:
        return node is not None and isinstance(node, (cst.Name, cst.Attribute)) and self.context.code(node) in self._sizes

    def _localised(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression | None:
        """A slice bound with every read of the global size in it made the share (``bs``,
        ``2 * bs``, ``i * bs``); None when it reads none."""
        if self._a_size(original):
            return _local(updated)
        if not any(self._a_size(node) for node in walk(original)):
            return None
        return updated.visit(_Localise(self._sizes, self.context.code))

    def _in_the_step(self, node: cst.CSTNode) -> bool:
        """In the loop that draws the batches and trains on each, or a step function of this
        file; not in a loop whose batches are split at run time (the split keeps the size)."""
        if self.context.in_a_scattered_loop(node):
            return False
        parent = self.context.parent(node)
        if isinstance(parent, cst.For) and parent.iter is node:
            node = parent  # (`for k in range(bs):` counts in the loop around it)
        loop = innermost_loop(node, self.context.parent)
        training = set(self.facts.training_loops)
        if loop in training and not any(inner in training for inner in walk(loop.body)):
            return True
        steps = set(self.facts.step_functions)
        while loop is not None and not isinstance(loop, cst.FunctionDef):
            loop = self.context.parent(loop)
        return loop is not None and loop in steps

    def _a_summed_loss(self, division: cst.BinaryOperation) -> bool:
        """The numerator is a training loss (bound to a loss's name) computed by a call whose
        reduction torch does not make a mean, and that DDP116 did not scale."""
        target = self.context.parent(division)
        while isinstance(target, (cst.BinaryOperation, cst.UnaryOperation)):
            target = self.context.parent(target)
        named = isinstance(target, cst.Assign) and any(is_loss(self.context.code(t.target)) for t in target.targets)
        if not named or any(node in self.context.world_scaled for node in walk(division.left)):
            return False
        calls = _outer_calls(division.left)
        return bool(calls) and not any(self._a_mean(call) for call in calls)

    def _a_mean(self, call: cst.Call) -> bool:
        """A call torch reduces by the mean: a torch loss function, a torch loss module (or a
        name bound to one), a `.mean()`."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("mean", "sum", "item"):
            return True  # (a `.sum()` by hand is DDP116's)
        names = self.context.qualified(call.func)
        if names & (MEAN_LOSSES | MEAN_LOSS_MODULES) or any(name.startswith("torch.") for name in names):
            return not _summed(call)
        return isinstance(call.func, (cst.Name, cst.Attribute)) and self.context.code(call.func) in self._torch_built

    def _report(self, node: cst.CSTNode, how: str) -> None:
        self.context.report(
            node, "DDP413",
            f"`{self.context.code(node)}` reads DataParallel's global batch size and {how}: each process holds its "
            "share of the batch, so it reads the share (ddp_local_batch_size)",
        )


class _Localise(cst.CSTTransformer):
    """Every read of one of the sizes in an expression made the share."""

    def __init__(self, sizes: frozenset[str], code) -> None:
        self.sizes, self.code = sizes, code

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return _local(updated_node) if self.code(original_node) in self.sizes else updated_node

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # (its `.attr` is no read of a name: left below)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if self.code(original_node) in self.sizes:
            return _local(updated_node)
        return updated_node.with_changes(value=updated_node.value.visit(self))


def _outer_calls(value: cst.BaseExpression) -> list[cst.Call]:
    """The calls an expression makes itself, not those that make their arguments (the CTC
    loss of ``ctc(preds, torch.IntTensor(lengths)) / batch_size``, not the tensor)."""
    if isinstance(value, cst.Call):
        inner = value.func.value if isinstance(value.func, cst.Attribute) else None
        return [value, *(_outer_calls(inner) if inner is not None else [])]
    if isinstance(value, cst.BinaryOperation):
        return [*_outer_calls(value.left), *_outer_calls(value.right)]
    if isinstance(value, (cst.UnaryOperation, cst.Attribute)):
        return _outer_calls(value.expression if isinstance(value, cst.UnaryOperation) else value.value)
    return []


def _summed(call: cst.Call) -> bool:
    """A torch loss told not to average: ``reduction="sum"`` (or ``"none"``), ``size_average=False``,
    ``reduce=False``."""
    for arg in call.args:
        name = arg.keyword.value if arg.keyword is not None else None
        if name == "reduction" and isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value in ("sum", "none"):
            return True
        if name in ("size_average", "reduce") and isinstance(arg.value, cst.Name) and arg.value.value == "False":
            return True
    return False


def _local(size: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Name(LOCAL), args=[cst.Arg(size)])
