"""DDP135: a training loss averaged over the elements a mask selects keeps DataParallel's mean.

DataParallel computed a mean-reduced loss over the selected elements of the whole global batch
(valid pixels of a depth or disparity map, tokens that are not padding, labels that are not the
ignored class): the sum over every selected element divided by their number. Each DDP process
averages over its own share's selection and DDP averages the processes' gradients: a share with
few selected elements weighs as much as one with many (LEAStereo's sparse ground truth: a 22%
different update). Weighted by its count over the mean count across ranks, each process's mean
is its share's sum over the mean count, and DDP's average is the global mean again.

DDP135  a mean-reduced loss of masked elements (``x[mask]``, ``x.masked_select(mask)``, a loss with
``ignore_index``, the tokens of ``pack_padded_sequence(...).data``) that backward() takes is weighted
by its selection's share::

    mask = target < opt.maxdisp
    loss = F.smooth_l1_loss(disp[mask], target[mask])
    # becomes
    loss = ddp_selected_mean(F.smooth_l1_loss(disp[mask], target[mask]), mask)

    criterion = nn.CrossEntropyLoss(ignore_index=255)
    loss = criterion(out, y)   ->   loss = ddp_selected_mean(criterion(out, y), y != 255)

    criterion = nn.NLLLoss(weight=weights)   # classes weighted: the mean divides by the targets' weights
    loss = criterion(out, y)   ->   loss = ddp_selected_mean(criterion(out, y), ddp_class_weights(criterion.weight, y), weighted=True)

    scores = pack_padded_sequence(scores, lengths, batch_first=True).data
    targets = pack_padded_sequence(targets, lengths, batch_first=True).data
    loss = criterion(scores, targets)   ->   loss = ddp_selected_mean(criterion(scores, targets), targets)

A loss class's ``forward`` counts as what backward() takes (``class FastSpeech2Loss(nn.Module)``: in
the file, a class the file makes; in a project's module, every class named as a loss), and an
input selected in the branches of a test (``pitch = pitch.masked_select(src_masks)`` under one
branch, ``mel_masks`` under another) is counted by its own size::

    loss = self.mse_loss(pitch, pitch_targets)   ->   loss = ddp_selected_mean(self.mse_loss(pitch, pitch_targets), pitch)

Only what backward() takes, where every rank computes it (the count's mean is a collective);
a metric averaged so is left as it is.

DDP146  (refuses; a warning with ``--allow-partial``) single-file mode: the training loss is a
class or function of another project module that averages over what a mask selects inside
(FastSpeech2's ``FastSpeech2Loss`` of model/loss.py): read only there, each rank would average
over its own share's selection. Convert the folder (``ddpify convert DIR``): its means are
weighted per rank in that module (DDP135).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import dotted, same_path_on_every_rank, walk
from ddpify.analysis.tree import calls_bound, loop_origins, names_bound_in, reaching_backward
from ddpify.project.neighbours import LOSS_CLASS_NAME
from ddpify.transforms.base import Transform

# torch.nn.functional losses that average over their input's elements (reduction="mean")
MEAN_LOSSES = {
    f"torch.nn.functional.{name}"
    for name in (
        "l1_loss", "mse_loss", "smooth_l1_loss", "huber_loss", "cross_entropy", "nll_loss",
        "binary_cross_entropy", "binary_cross_entropy_with_logits", "soft_margin_loss",
    )
}
MEAN_LOSS_MODULES = {
    f"torch.nn.{name}"
    for name in ("L1Loss", "MSELoss", "SmoothL1Loss", "HuberLoss", "CrossEntropyLoss", "NLLLoss", "BCELoss", "BCEWithLogitsLoss")
}
IGNORING = {"torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss", "torch.nn.CrossEntropyLoss", "torch.nn.NLLLoss"}
# What a mask is made of: a comparison, a logical test, or a tensor said to be boolean.
# Methods that reshape a mask and keep it one (what it selects is counted the same, up to a factor)
RESHAPING = {"unsqueeze", "view", "reshape", "expand", "expand_as", "squeeze", "flatten", "contiguous"}
MASK_METHODS = {"bool", "ne", "eq", "gt", "lt", "ge", "le", "isfinite", "logical_and", "logical_or", "logical_not", "detach", "detach_"}


def _packed(value: cst.BaseExpression, origins: dict[str, list[cst.BaseExpression]]) -> bool:
    """``pack_padded_sequence(scores, lengths, batch_first=True).data`` (or ``[0]``), itself or
    last bound to the name: the tokens of every sequence, as many as the batch's lengths add up
    to (a captioning decoder's words), not a row per sample."""
    if isinstance(value, cst.Name) and origins.get(value.value):
        value = origins[value.value][-1]
    if isinstance(value, cst.Attribute) and value.attr.value == "data":
        value = value.value
    elif isinstance(value, cst.Subscript):
        value = value.value
    return isinstance(value, cst.Call) and (dotted(value.func) or "").endswith("pack_padded_sequence")


class SelectedMeansTransform(Transform):
    CODE_PREFIX = "DDP13"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._selected: dict[cst.Call, str] = {}  # loss call -> the selection's code

    def check(self) -> None:
        steps = self._loss_forwards()
        if self.facts.has_training_step and (self.facts.wraps or self.context.model_elsewhere):
            steps = [*self.facts.training_steps, *steps]
        for loop in steps:
            origins = loop_origins(loop)
            if isinstance(loop, cst.FunctionDef):  # (a step or loss function: MCPDepth's trainDisp(..., mask, ...))
                origins = {**self._given(loop), **origins}
            for node in (node for expr in reaching_backward(loop, origins) for node in walk(expr)):
                if not isinstance(node, cst.Call) or node in self._selected or self.context.on_the_whole_batch(node):
                    continue
                selection = self._selection(node, origins)
                if selection is not None and same_path_on_every_rank(node, self.context.parent):
                    self._selected[node] = selection
                elif self._masked_out_of_reach(node):
                    self.context.report_unsound(
                        node,
                        "DDP146",
                        f"`{self.context.code(node.func)}` averages over what a mask selects inside a loss of another module, "
                        "which single-file mode only reads: each rank would average over its own share's selection (another "
                        "model on padded or masked data); convert the folder (`ddpify convert DIR`): there its means are "
                        "weighted per rank where they are computed (DDP135)",
                    )

    def _masked_out_of_reach(self, call: cst.Call) -> bool:
        """A call of a loss class or function of another project module that selects by a mask
        inside (neighbours' masked_losses), the script converted alone."""
        masked = self.context.neighbours.masked_losses if self.context.neighbours else frozenset()
        name = dotted(call.func) or ""
        made = self._calls_bound.get(name, []) if isinstance(call.func, (cst.Name, cst.Attribute)) else []
        return bool(masked) and (name in masked or len(made) == 1 and dotted(made[0].func) in masked)

    def _loss_forwards(self) -> list[cst.FunctionDef]:
        """The ``forward`` of each loss class of the file (``class FastSpeech2Loss(nn.Module)``):
        what it returns is the loss backward() takes where the class trains. Converted alone, a
        class the file makes (a loss the training calls); in a project's module, every one (the
        scripts that train with it are converted with it)."""
        made = {dotted(call.func) for calls in self._calls_bound.values() for call in calls}
        found = []
        for node in walk(self.context.module):
            if not isinstance(node, cst.ClassDef) or not LOSS_CLASS_NAME.search(node.name.value):
                continue
            if not self.context.is_library and (node.name.value not in made or not self.facts.has_training_step):
                continue
            forward = next((f for f in node.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "forward"), None)
            if forward is not None and any(isinstance(n, cst.Return) and n.value is not None for n in walk(forward.body)):
                found.append(forward)
        return found

    def _given(self, function: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
        """A loss function's parameters -> what its calls pass for them, read through the names
        the calling step binds (GwcNet's ``model_loss(disp_ests, disp_gt, mask)`` with ``mask =
        (disp_gt < maxdisp) & (disp_gt > 0)``): what it selects with a parameter, its callers
        chose."""
        given: dict[str, list[cst.BaseExpression]] = {}
        analyzer = self.facts.analyzer
        for call, context in analyzer.calls.call_sites(function):
            step = context.loops[-1] if context.loops else context.function
            bound = loop_origins(step) if step is not None and step in self.facts.training_steps else {}
            for param in function.params.params:
                value = analyzer.calls.argument_for(function, param, call)
                if value is not None:
                    given.setdefault(param.name.value, []).extend(bound.get(value.value, [value]) if isinstance(value, cst.Name) else [value])
        return given

    def _selection(self, call: cst.Call, origins: dict[str, list[cst.BaseExpression]]) -> str | None:
        """The code of what the mean-reduced loss ``call`` averages over, if a mask selects it."""
        index = self.context.neighbours.selecting.get(dotted(call.func) or "") if self.context.neighbours else None
        if index is not None:  # (a project loss function averaging over what a parameter selects)
            positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
            selected = positional[index] if index < len(positional) else None
            return self.context.code(selected) if selected is not None and self._a_mask(selected, origins) else None
        kind = self._mean_loss(call)
        options = [arg for arg in self._constructor_args(call) + list(call.args) if arg.keyword is not None]
        if kind is None or not call.args or any(
            arg.keyword.value in ("reduction", "size_average", "reduce") and not _says_mean(arg.value) for arg in options
        ):
            return None  # (a sum: not a mean over the selection)
        ignored = next((arg.value for arg in options if arg.keyword.value == "ignore_index"), None)
        positional = [arg.value for arg in call.args if arg.keyword is None]
        weighted = next((arg for arg in options if arg.keyword.value == "weight" and not _says_mean(arg.value)), None)
        if weighted is None and kind in IGNORING:
            # (by position: `nn.CrossEntropyLoss(class_weights)`, `F.cross_entropy(x, y, class_weights)`)
            made = [arg for arg in self._constructor_args(call) if arg.keyword is None and not arg.star]
            given = [arg for arg in call.args if arg.keyword is None and not arg.star]
            weighted = made[0] if made else given[2] if len(given) > 2 else None
            weighted = None if weighted is not None and _says_mean(weighted.value) else weighted
        if weighted is not None:
            if kind not in IGNORING or len(positional) < 2:
                return None  # (an element-wise weight of another loss: a plain mean of weighted terms)
            # classes weighted (ersatz's `nn.NLLLoss(weight=torch.tensor([args.eos_weight, 1]))`): the mean
            # divides by the weights of the batch's targets, which differ between shares
            weight = self.context.code(weighted.value) if weighted in call.args else f"{self.context.code(call.func)}.weight"
            ignore = f", {self.context.code(ignored)}" if ignored is not None else ""
            return f"ddp_class_weights({weight}, {self.context.code(positional[1])}{ignore})"
        if ignored is not None and kind in IGNORING and len(positional) > 1:
            target = self.context.code(positional[1])
            return f"{target} != {self.context.code(ignored)}"
        for node in walk(positional[0]):
            mask = _mask_of(node)
            if mask is not None and self._a_mask(mask, origins):
                return self.context.code(mask)
        if _packed(positional[0], origins) and len(positional) > 1:
            return self.context.code(positional[1])  # (its elements are the batch's tokens: counted by numel)
        mask = self._rebound_selection(positional[0], call) if isinstance(positional[0], cst.Name) else None
        if mask is not None and self._a_mask(mask, origins):
            return self.context.code(mask)
        if isinstance(positional[0], cst.Name) and self._selected_in_branches(positional[0].value, origins):
            return positional[0].value  # (its elements are the selected ones: counted by numel)
        return None

    def _selected_in_branches(self, name: str, origins: dict[str, list[cst.BaseExpression]]) -> bool:
        """Is the loss's input bound to a masked selection in the branches of a test before it
        (FastSpeech2's ``pitch_predictions = pitch_predictions.masked_select(src_masks)`` under
        ``if self.pitch_feature_level == "phoneme_level":``, ``mel_masks`` under ``elif``), and
        otherwise only to itself reshaped? Its elements are then the selected ones."""
        values = origins.get(name, [])
        selections = [
            value for value in values
            if any((mask := _mask_of(node)) is not None and self._a_mask(mask, origins) for node in walk(value))
        ]
        others = [value for value in values if value not in selections]
        return bool(selections) and all(not isinstance(value, cst.Call) or dotted(value.func) is None for value in others)

    def _rebound_selection(self, name: cst.Name, call: cst.Call) -> cst.BaseExpression | None:
        """The mask of a selection the loss's input was rebound to in the statements before it
        (reformer's MLM: ``output = output[loss_mx].view(-1, V)``, ``labels = labels[loss_mx]``,
        then ``loss_fn(output, labels)``), through rebindings of the name to itself (``.view``),
        in the same block; None where a compound statement between may rebind it, or where what
        the mask reads is rebound after the selection (the count would not be the selection's)."""
        statement = self.context.parent(call)
        while statement is not None and not isinstance(statement, cst.SimpleStatementLine):
            statement = self.context.parent(statement)
        block = self.context.parent(statement) if statement is not None else None
        body = list(getattr(block, "body", ()))
        if statement not in body:
            return None
        rebound: set[str] = set()  # names bound between the selection and the loss
        for before in reversed(body[: body.index(statement)]):
            if not isinstance(before, cst.SimpleStatementLine):
                if name.value in names_bound_in(before):
                    return None
                rebound |= names_bound_in(before)
                continue
            bound = names_bound_in(before)
            if name.value not in bound:
                rebound |= bound
                continue
            value = _the_value_bound(before, name.value)
            if value is None:
                return None
            masks = [mask for mask in map(_mask_of, walk(value)) if mask is not None]
            if masks:  # (`out = out[out > 0]` reads what it rebinds: the mask is not there later)
                reads = {n.value for n in walk(masks[0]) if isinstance(n, cst.Name)}
                return masks[0] if not reads & (rebound | {name.value}) else None
            rebound |= bound
            if not any(isinstance(n, cst.Name) and n.value == name.value for n in walk(value)):
                return None  # (bound to something else: no selection)
        return None

    def _mean_loss(self, call: cst.Call) -> str | None:
        """The loss the call computes: a functional loss, or a loss module bound to a name."""
        names = self.context.qualified(call.func)
        if names & MEAN_LOSSES:
            return next(iter(names & MEAN_LOSSES))
        made = self._constructor(call)
        if made is not None and self.context.qualified(made.func) & MEAN_LOSS_MODULES:
            return next(iter(self.context.qualified(made.func) & MEAN_LOSS_MODULES))
        return None

    def _constructor(self, call: cst.Call) -> cst.Call | None:
        """``nn.CrossEntropyLoss(...)`` when ``call`` calls the one name it is bound to."""
        made = self._calls_bound.get(dotted(call.func) or "", []) if isinstance(call.func, (cst.Name, cst.Attribute)) else []
        return made[0] if len(made) == 1 else None

    @property
    def _calls_bound(self) -> dict[str, list[cst.Call]]:
        """Each name (``criterion``, ``self.seg_loss``) -> the calls assigned to it (read once)."""
        if not hasattr(self, "_bound"):
            self._bound = calls_bound(self.context.module)
        return self._bound

    def _constructor_args(self, call: cst.Call) -> list[cst.Arg]:
        made = self._constructor(call)
        return list(made.args) if made is not None else []

    def _a_mask(self, mask: cst.BaseExpression, origins: dict[str, list[cst.BaseExpression]]) -> bool:
        """A comparison or a logical test of the batch, written in place or bound in the loop;
        or whatever ``masked_select`` is given (a mask by what the call is: one drawn from the
        data, a loss class's parameter)."""
        holder = self.context.parent(mask)
        call = self.context.parent(holder) if isinstance(holder, cst.Arg) else None
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "masked_select":
            return True
        if isinstance(mask, cst.Comparison) or isinstance(mask, cst.UnaryOperation) and isinstance(mask.operator, cst.BitInvert):
            return True
        if isinstance(mask, cst.BinaryOperation) and isinstance(mask.operator, (cst.BitAnd, cst.BitOr)):
            return True
        if isinstance(mask, cst.Call) and isinstance(mask.func, cst.Attribute) and mask.func.attr.value in MASK_METHODS:
            return mask.func.attr.value not in ("detach", "detach_") or self._a_mask(mask.func.value, origins)
        if isinstance(mask, cst.Call) and isinstance(mask.func, cst.Attribute) and mask.func.attr.value in RESHAPING:
            return self._a_mask(mask.func.value, origins)  # (FastSpeech2's `mel_masks.unsqueeze(-1)`: the mask again)
        if isinstance(mask, cst.Name):
            return any(self._a_mask(value, {}) for value in origins.get(mask.value, []))
        return False

    def _said(self, call: cst.Call, selection: str) -> str:
        if selection.startswith("ddp_class_weights("):
            return f"of its targets, weighted by class (`{selection}`: the mean divides by their weights' sum)"
        first = next((arg.value for arg in call.args if arg.keyword is None), None)
        if first is not None and self.context.code(first) == selection:
            return f"of `{selection}`, a masked selection (counted by its size)"
        return f"`{selection}` selects"

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        selection = self._selected.get(original_node)
        if selection is None:
            return updated_node
        self.context.use_helper("ddp_selected_mean")
        self.context.report(
            original_node,
            "DDP135",
            f"`{self.context.code(original_node)}` averages over the elements {self._said(original_node, selection)}: each process's mean "
            "is weighted by its count over the mean count across ranks (ddp_selected_mean), so DDP's average is the "
            "mean over every selected element of the global batch, as DataParallel's was",
        )
        args = [cst.Arg(updated_node), cst.Arg(cst.parse_expression(selection))]
        if selection.startswith("ddp_class_weights("):  # (weights add up; an input's selected elements are counted)
            args.append(cst.Arg(cst.Name("True"), keyword=cst.Name("weighted"), equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
        return cst.Call(func=cst.Name("ddp_selected_mean"), args=args)


def _the_value_bound(line: cst.SimpleStatementLine, name: str) -> cst.BaseExpression | None:
    """The value a line binds to ``name`` alone (``name = value``), else None."""
    values = [
        small.value for small in line.body
        if isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets)
    ]
    return values[-1] if values else None


def _says_mean(value: cst.BaseExpression) -> bool:
    """``reduction="mean"``, ``size_average=True``, ``reduce=True``, ``weight=None``."""
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value == "mean"
    return isinstance(value, cst.Name) and value.value in ("True", "None")


def _mask_of(node: cst.CSTNode) -> cst.BaseExpression | None:
    """The mask of ``x[mask]`` (the one index that is not a slice or a number) or of
    ``x.masked_select(mask)``."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "masked_select" and node.args:
        return node.args[0].value
    if not isinstance(node, cst.Subscript):
        return None
    indices = [element.slice.value for element in node.slice if isinstance(element.slice, cst.Index)]
    if len(node.slice) != 1 or len(indices) != 1 or isinstance(indices[0], (cst.BaseNumber, cst.BaseString, cst.Ellipsis)):
        return None
    return indices[0]
