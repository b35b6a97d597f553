"""DDP116: a training loss summed over the batch is scaled by the world size.

DataParallel computed a summed loss (``reduction="sum"``, ``size_average=False``, YOLO's
losses, ``((model(x) - y) ** 2).sum()``) over the whole global batch, so its gradient was
the sum over every sample. Each DDP process sums its own share and DDP averages the
gradients across processes: every step would be 1/world size of DataParallel's (with SGD, a
learning rate divided by the number of GPUs). Multiplied by the world size where it is
computed, each process's loss is its share of the global sum times the number of shares:
DDP's average is then exactly DataParallel's gradient, and the loss printed as the mean
across ranks is the global batch's sum, as DataParallel printed it.

DDP116  the summed training loss is scaled where it is computed: the call itself, each
training use of a loss module built to sum, or the value summed by hand::

    loss = F.mse_loss(out, y, reduction="sum")
    # becomes
    loss = F.mse_loss(out, y, reduction="sum") * dist.get_world_size()

    criterion = nn.MSELoss(reduction="sum")
    loss = criterion(model(x), y)         ->   loss = criterion(model(x), y) * dist.get_world_size()

A loss module picked among others that do not sum (an ``if``/``elif`` chain of criteria) is
scaled by the world size only when the one it holds sums::

    loss = criterion(pred, y)   ->   loss = criterion(pred, y) * (dist.get_world_size() if getattr(criterion, "reduction", None) == "sum" else 1)

A summed loss read as a number (``.item()``), divided by the batch's own length (``/
len(data)``: a mean), or computed in evaluation code is a metric and is left alone.

A sum divided by a count of the batch's data (a Transformer LM's tokens, DeepRecommender's
ratings) was DataParallel's global sum over the global count; each process divides its share's
sum by the count's mean across ranks, and DDP's average is that again::

    loss = lm_losses.sum() / torch.sum(mask)   ->   loss = lm_losses.sum() / ddp_mean(torch.sum(mask))

The same where the loss summed term by term is divided in a statement of its own (NetVlad's
triplets: ``loss += criterion(...)`` with ``reduction="sum"``, then ``loss /= nNeg.float()``
with ``nNeg = torch.sum(negCounts)``): the count is the mean across ranks, no factor on the sums::

    loss /= nNeg.float()   ->   loss /= ddp_mean(nNeg.float())
"""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis import batch_length, calls_in, dotted, same_path_on_every_rank, walk
from ddpify.analysis.tree import MOVES, backward_takes, loop_origins, names_bound_in, reaching_backward, unconverted, without_moves
from ddpify.transforms.base import Transform, batch_size_arg, keyword_arg, positional_args
from ddpify.transforms.selected_means import MEAN_LOSS_MODULES, MEAN_LOSSES

# Where `x * world size` needs no parentheses around it.
LOOSE_PARENTS = (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Arg, cst.Return, cst.Expr, cst.Element, cst.DictElement, cst.ListComp, cst.SetComp, cst.GeneratorExp)


class SummedLossesTransform(Transform):
    CODE_PREFIX = "DDP11"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scaled: dict[cst.CSTNode, str] = {}  # original expression -> what it sums (shown)
        # uses of a name also bound to losses that do not sum (an if/elif chain of criteria)
        self._by_reduction: set[cst.CSTNode] = set()
        self._while_training: dict[cst.CSTNode, str] = {}  # in a function evaluation calls too -> the test

    def check(self) -> None:
        if not self.facts.has_training_step or not self.facts.wraps and not self.context.model_elsewhere:
            return
        for node in self.facts.contexts:
            if isinstance(node, cst.Call) and _sums_over_batch(node, self.context.code) and self._trains_with(node):
                if (dotted(node.func) or "").rpartition(".")[2].endswith("Loss"):
                    chosen = self._chosen_among_others(node)
                    for use in self._training_uses(node):
                        self._scaled[use] = self.context.code(node)
                        if chosen:
                            self._by_reduction.add(use)
                else:
                    self._scaled[node] = self.context.code(node)
        for value in self._hand_summed():
            self._scaled[value] = self.context.code(value)
        for call in self._project_sums():
            self._scaled[call] = self.context.code(call)
        for name, call in self._project_sum_parts():
            self._scaled[name] = self.context.code(call)
        for node in [node for node in self._scaled if self.context.on_the_whole_batch(node)]:
            del self._scaled[node]
        self._while_training = {node: self._model_of_shared(node) for node in self._scaled if self._shared_with_evaluation(node)}
        self._global_counts = self._sums_over_counts()
        self._global_means = self._divided_by_batch_means()
        for node in [node for node in self._scaled if any(self._inside(node, summed) for summed in self._global_counts.values())]:
            del self._scaled[node]  # (the global count makes it DataParallel's: no factor on top)
        for node in [node for node in self._scaled if self._divided_by_a_batch_size_handed_in(node)]:
            del self._scaled[node]  # (DDP411 hands the function each process's share: a mean already)
        for node in [node for node in self._scaled if self._made_a_mean_later(node)]:
            del self._scaled[node]  # (each process's mean: DDP's average is the global batch's)
        self._counted_later = self._sums_divided_later()
        for node in [node for node in self._scaled if any(self._inside(node, value) for values in self._counted_later.values() for value in values)]:
            del self._scaled[node]

    def _divided_by_a_batch_size_handed_in(self, node: cst.CSTNode) -> bool:
        """``F.binary_cross_entropy_with_logits(..., reduction='sum') / batch_size`` in a function
        a caller hands a training loader's batch size (SiamFC's ``weighted_loss(..., config.
        train_batch_size)``): DDP411 hands it each process's share, and the division makes each
        process's mean; a factor on top made every step N times DataParallel's."""
        division, child = self.context.parent(node), node
        while isinstance(division, (cst.BinaryOperation, cst.Call, cst.Attribute, cst.Arg)) and not (
            isinstance(division, cst.BinaryOperation) and isinstance(division.operator, cst.Divide) and child is division.left
        ):
            child, division = division, self.context.parent(division)
        if not isinstance(division, cst.BinaryOperation) or not isinstance(division.right, cst.Name):
            return False
        function = division
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = self.context.parent(function)
        params = [param.name.value for param in function.params.params] if function is not None else []
        if division.right.value not in params:
            return False
        index, name = params.index(division.right.value), division.right.value
        sizes = {self.context.code(arg.value) for call in self.facts.loaders for arg in [batch_size_arg(call)] if arg is not None}
        for call in (n for n in self.facts.contexts if isinstance(n, cst.Call) and dotted(n.func) == function.name.value):
            positional = positional_args(call)
            passed = keyword_arg(call, name) or (positional[index] if index < len(positional) else None)
            if passed is not None and self.context.code(passed.value) in sizes:
                return True
        return False

    def _made_a_mean_later(self, node: cst.CSTNode) -> bool:
        """``loss = criterion(out, y)`` summed, then ``(loss / x.size(0)).backward()`` or ``loss /=
        len(x)``: every use that trains divides it by the length of the batch in hand, a mean of
        each process's share, which DDP's average makes the global batch's (a factor on top made
        every step N times DataParallel's). Reads of its value (``loss.item()``) do not train."""
        statement = self.context.parent(node)
        if not (isinstance(statement, cst.Assign) and statement.value is node and len(statement.targets) == 1 and isinstance(statement.targets[0].target, cst.Name)):
            return False
        name, function = statement.targets[0].target.value, self.context.parent(statement)
        while function is not None and not isinstance(function, (cst.FunctionDef, cst.Module)):
            function = self.context.parent(function)
        divided = False
        for use in walk(function) if function is not None else ():
            if not isinstance(use, cst.Name) or use.value != name or use is statement.targets[0].target:
                continue
            parent = self.context.parent(use)
            if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide) and parent.left is use and _this_batch(parent.right, self._batch_names):
                divided = True
            elif isinstance(parent, cst.AugAssign) and isinstance(parent.operator, cst.DivideAssign) and _this_batch(parent.value, self._batch_names):
                divided = True
            elif isinstance(parent, cst.AssignTarget):
                value = self.context.parent(parent).value  # (bound again)
                made_a_mean = isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide) and isinstance(value.left, cst.Name)
                return divided or made_a_mean and value.left.value == name and _this_batch(value.right, self._batch_names)
            elif not (isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value in ("item", "detach", "data", "cpu")):
                return False
        return divided

    # -- a sum over a count of the data: the count is the world's ----------------------------

    def _sums_over_counts(self) -> dict[cst.BinaryOperation, cst.BaseExpression]:
        """``lm_losses.sum() / torch.sum(mask)`` (tokens, ratings, valid pixels) in a training loop:
        DataParallel divided the global batch's sum by its count; each process divides its
        share's sum by its mean count instead (``ddp_mean``): DDP's average of the gradients is
        then the global sum over the global count. Each division -> the sum it divides (bound
        to a name first: QuARE's ``los = (... * mask).sum()``, ``return los / torch.sum(mask)``)."""
        found = {}
        for loop in self.facts.training_steps:
            origins = loop_origins(loop)
            # only what backward() takes (a metric divided so in the loop is left alone), where
            # every rank computes it (ddp_mean is a collective)
            for node in (node for expr in reaching_backward(loop, origins) for node in walk(expr)):
                if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide) and same_path_on_every_rank(node, self.context.parent):
                    left = origins.get(node.left.value, [node.left])[-1] if isinstance(node.left, cst.Name) else node.left
                    left = _scaled_sum(left, self.context.qualified) or left  # (`2.0 * torch.sum(...) / n`)
                    if _a_sum(left, self.context.qualified) and not _this_batch(node.right, self._batch_names):
                        right = origins.get(node.right.value, [node.right])[-1] if isinstance(node.right, cst.Name) else node.right
                        if _a_count(right, self.context.qualified):
                            found[node] = left
        return found

    def _divided_by_batch_means(self) -> set[cst.BinaryOperation]:
        """A training loss divided by a mean over the batch's data (edge-connect's
        ``l1_loss(outputs, images) * w / torch.mean(masks)``: the fraction of pixels masked):
        DataParallel divided by the global batch's mean; each process divides by the mean of
        its share's means across ranks (``ddp_mean``), which is that with shares of one size.
        The loss above the division keeps whatever factor it takes."""
        found = set()
        for loop in self.facts.training_steps:
            origins = loop_origins(loop)
            for node in (node for expr in reaching_backward(loop, origins) for node in walk(expr)):
                if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide)) or node in self._global_counts:
                    continue
                right = origins.get(node.right.value, [node.right])[-1] if isinstance(node.right, cst.Name) else node.right
                if not _a_mean_of_data(right, self.context.qualified) or not same_path_on_every_rank(node, self.context.parent):
                    continue
                if self._under_a_conditional_expression(node) or self._carries_gradient(right, origins):
                    continue
                found.add(node)
        return found

    def _under_a_conditional_expression(self, node: cst.CSTNode) -> bool:
        """In an ``a if test else b``, an ``and``/``or``, a comprehension or a lambda: evaluated
        on some ranks only (``l1 / torch.mean(m) if m.sum() > 0 else l1``), no place for a
        collective."""
        node = self.context.parent(node)
        while node is not None and not isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            if isinstance(node, (cst.IfExp, cst.BooleanOperation, cst.Lambda, cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp)):
                return True
            node = self.context.parent(node)
        return False

    def _carries_gradient(self, divisor: cst.BaseExpression, origins, depth: int = 0) -> bool:
        """A divisor computed from the model's outputs or from weights (learned per-sample
        weights, ``self.scale``): its gradient is part of the loss's, and the mean across ranks
        (``ddp_mean``) would cut it; only data is divided so."""
        if any(dotted(call.func) in self.facts.model_names for call in calls_in(divisor)):
            return True
        if any(isinstance(node, cst.Attribute) and dotted(node.value) == "self" for node in walk(divisor)):
            return True
        names = {n.value for n in walk(divisor) if isinstance(n, cst.Name)}
        return depth < 4 and any(
            self._carries_gradient(origin, origins, depth + 1) for name in names for origin in origins.get(name, [])
        )

    def _sums_divided_later(self) -> dict[cst.AugAssign, list[cst.BaseExpression]]:
        """``loss += criterion(...)`` summing over the batch, then ``loss /= nNeg.float()`` with
        ``nNeg = torch.sum(negCounts)`` (NetVlad's triplets): the same sum over a count of the
        data, divided in a statement of its own. Each ``/=`` -> the sums it divides (they take
        no factor: the count's mean makes DDP's average the global sum over the global count)."""
        found: dict[cst.AugAssign, list[cst.BaseExpression]] = {}
        for loop in self.facts.training_steps:
            origins = loop_origins(loop)
            taken = {node.value for expr in backward_takes(loop) for node in walk(expr) if isinstance(node, cst.Name)}
            for node in walk(loop.body):
                if not isinstance(node, cst.AugAssign) or not isinstance(node.operator, cst.DivideAssign) or not isinstance(node.target, cst.Name):
                    continue
                if node.target.value not in taken or not same_path_on_every_rank(node, self.context.parent):
                    continue
                divisor = _counted_value(node.value, origins)
                summed = [value for value in origins.get(node.target.value, []) if value is not node.value and any(
                    self._inside(scaled, value) for scaled in self._scaled
                )]
                if divisor is not None and _a_count(divisor, self.context.qualified) and summed:
                    found[node] = summed  # (every `+=` that feeds it: none keeps a factor)
        return found

    def _shared_with_evaluation(self, node: cst.CSTNode) -> bool:
        """Is the loss computed in a function that evaluation calls too (an ASR script's
        forward_pass() feeding a CTC metric in training and validation)? The factor is for the
        gradient: the value evaluation reads stays the original's."""
        context = self.facts.contexts.get(node)
        function = context.function if context is not None else None
        if function is None or function.name.value in ("forward", "__call__"):
            return False
        return any(self._evaluates(site) or site.loops and site.loops[-1] not in self.facts.training_loops for _, site in self.facts.analyzer.calls.call_sites(function))

    def _model_of_shared(self, node: cst.CSTNode) -> str:
        """The wrapped model the function runs (its ``training`` flag tells training from
        evaluation, as model.train()/model.eval() set it), else whether autograd records."""
        function = self.facts.contexts[node].function
        wrapped = self.facts.wrap_targets
        for call in calls_in(function.body):
            name = dotted(call.func) or ""
            for model in sorted(wrapped, key=len, reverse=True):
                if name == model or name.startswith(model + "."):
                    return f"{model}.training"
        return "torch.is_grad_enabled()"

    def _inside(self, node: cst.CSTNode, within: cst.CSTNode) -> bool:
        while node is not None:
            if node is within:
                return True
            node = self.context.parent(node)
        return False

    # -- what sums ---------------------------------------------------------------------------

    def _trains_with(self, call: cst.Call) -> bool:
        """Is this sum-reduced loss (maybe) a training loss? A functional loss in a training
        loop or in a loss module's forward; a loss module unless every call of the name it is
        bound to is in evaluation code (a loop that trains nothing, a test/eval function)."""
        context = self.facts.contexts[call]
        if self._a_metric(call):
            return False
        in_training = bool(context.loops) and context.loops[-1] in self.facts.training_loops or context.function in self.facts.training_steps
        name = (dotted(call.func) or "").rpartition(".")[2]
        if not name.endswith("Loss"):
            return in_training or (context.function is not None and context.function.name.value == "forward")
        return bool(self._training_uses(call)) or not self._uses(call)

    def _uses(self, constructor: cst.Call) -> list[cst.Call]:
        targets = self._bound_to(constructor)
        return [node for node in self.facts.contexts if isinstance(node, cst.Call) and dotted(node.func) in targets]

    def _bound_to(self, constructor: cst.Call) -> list[str | None]:
        parent = self.context.parent(constructor)
        while isinstance(parent, cst.Attribute) and parent.attr.value in MOVES:
            # `criterion = nn.CrossEntropyLoss(reduction='sum').to(device)` (AudioClassfication)
            moved = self.context.parent(parent)
            if not (isinstance(moved, cst.Call) and moved.func is parent):
                break
            parent = self.context.parent(moved)
        return [dotted(t.target) for t in parent.targets] if isinstance(parent, cst.Assign) else []

    def _chosen_among_others(self, constructor: cst.Call) -> bool:
        """Is the name this summing loss is bound to also bound to a loss that does not sum
        (``if args.loss_type == "focal": criterion = FocalLoss()``)? Then the use is scaled by
        the world size only when the loss it holds sums (its ``reduction``)."""
        targets = set(self._bound_to(constructor)) - {None}
        for node in walk(self.context.module):
            if isinstance(node, cst.Assign) and any(dotted(t.target) in targets for t in node.targets):
                value = without_moves(node.value)
                if not (isinstance(value, cst.Call) and _sums_over_batch(value, self.context.code)):
                    return True
        return False

    def _training_uses(self, constructor: cst.Call) -> list[cst.Call]:
        # DnCNN: `criterion(out, noise) / (imgn.size()[0] * 2)` at every use is a batch mean
        return [use for use in self._uses(constructor) if not self._a_metric(use) and not self._evaluates(self.facts.contexts[use])]

    def _hand_summed(self) -> list[cst.BaseExpression]:
        """The terms of what a training step's backward() takes (or a loss function returns)
        that sum over the batch without a keyword: ``((model(x) - y) ** 2).sum()``, VAE's
        ``-0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())``, ``F.mse_loss(out, y) *
        x.size(0)``, followed through the names the step binds; each is scaled where it sums."""
        found: list[cst.BaseExpression] = []
        for step in self.facts.training_steps:
            # every name a statement binds -> its value (`out, loss_c, loss_s = network(x)`)
            self._bindings_in_step, self._step = loop_origins(step), step
            self._origins = {name: values[-1] for name, values in self._bindings_in_step.items()}
            # (a loss function's parameters are what the step hands it: the model's outputs)
            self._given = {p.name.value for p in step.params.params} if step in self.facts.loss_functions else set()
            for start in backward_takes(step):
                for term in self._summed_terms(start, set()):
                    if term not in found:
                        found.append(term)
        return found

    def _summed_terms(self, value: cst.BaseExpression, seen: set[str]) -> list[cst.BaseExpression]:
        """The terms of ``value`` that sum over the batch: through signs, sums, coefficients
        and the dividend (never a divisor: a count), and the names bound in the step."""
        if isinstance(value, cst.UnaryOperation):
            return self._summed_terms(value.expression, seen)
        if isinstance(value, cst.BinaryOperation):
            if isinstance(value.operator, cst.Multiply) and (_this_batch(value.left, self._batch_names) or _this_batch(value.right, self._batch_names)):
                return [value]  # a mean times the batch's length
            if isinstance(value.operator, (cst.Add, cst.Subtract, cst.Multiply)):
                return self._summed_terms(value.left, seen) + self._summed_terms(value.right, seen)
            if isinstance(value.operator, cst.Divide) and not _this_batch(value.right, self._batch_names):
                return self._summed_terms(value.left, seen)
            return []
        if isinstance(value, cst.Name) and self._bound_value(value) is not None and value.value not in seen:
            return self._summed_terms(self._bound_value(value), seen | {value.value})
        if isinstance(value, cst.Call) and self._a_total_sum(value) and not self._a_metric(value):
            return [value]
        return []

    def _a_total_sum(self, value: cst.Call) -> bool:
        """A sum of everything (``.sum()`` / ``torch.sum(x)``, no dimension) over what the model
        computed."""
        if "torch.sum" in self.context.qualified(value.func) and len(value.args) == 1:
            summed = value.args[0].value
        elif isinstance(value.func, cst.Attribute) and value.func.attr.value == "sum" and not value.args:
            summed = value.func.value
        else:
            return False
        return self._from_the_model(summed) and not self._a_mean(summed, set()) and not self._stacked_means(summed)

    def _stacked_means(self, value: cst.BaseExpression) -> bool:
        """``torch.cat(loss_att)`` / ``torch.stack([...])`` of losses that are each a mean
        already (Person-ReID's one loss per attribute head, appended in a loop): their sum runs
        over the losses, not over the batch."""
        if isinstance(value, cst.Name) and self._bound_value(value) is not None:
            value = self._bound_value(value)
        if not (isinstance(value, cst.Call) and self.context.qualified(value.func) & {"torch.cat", "torch.stack"} and value.args):
            return False
        held = value.args[0].value
        if isinstance(held, (cst.List, cst.Tuple)):
            items = [element.value for element in held.elements]
        elif isinstance(held, cst.ListComp):
            items = [held.elt]
        elif isinstance(held, cst.Name):
            bound = self._bound_value(held)
            items = [element.value for element in bound.elements] if isinstance(bound, (cst.List, cst.Tuple)) else (
                [bound.elt] if isinstance(bound, cst.ListComp) else []
            )
            items += [
                call.args[0].value for call in calls_in(self._step) if isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "append" and dotted(call.func.value) == held.value and call.args
            ]
        else:
            return False
        return bool(items) and all(self._a_mean(_unshaped(item), set()) for item in items)

    def _a_mean(self, value: cst.BaseExpression, seen: set[str]) -> bool:
        """Is ``value`` (through the names the step binds) a mean already: ``.mean()``, a loss
        averaged by default (PC-DARTS' ``loss_a = criterion(logits, target)``, then
        ``loss_a.sum().backward()``: the sum of one number is that number)?"""
        if isinstance(value, cst.Name) and self._bound_value(value) is not None and value.value not in seen:
            return self._a_mean(self._bound_value(value), seen | {value.value})
        if not isinstance(value, cst.Call):
            return False
        if isinstance(value.func, cst.Attribute) and value.func.attr.value == "mean" and not value.args:
            return True
        if isinstance(value.func, cst.Attribute) and value.func.attr.value == "mean" and self._over_stacked_batches(value.func.value):
            return True
        if any(arg.keyword is not None and arg.keyword.value in ("reduction", "size_average", "reduce") for arg in value.args):
            return False
        if self.context.qualified(value.func) & MEAN_LOSSES:
            return True
        made = [without_moves(node.value) for node in self._loss_bindings.get(dotted(value.func) or "", [])]
        return len(made) == 1 and isinstance(made[0], cst.Call) and bool(self.context.qualified(made[0].func) & MEAN_LOSS_MODULES) and not any(
            arg.keyword is not None and arg.keyword.value in ("reduction", "size_average", "reduce") for arg in made[0].args
        )

    def _over_stacked_batches(self, reshaped: cst.BaseExpression) -> bool:
        """``out.view(len(outputs), -1)`` of ``out = torch.stack(outputs, 0)`` (adversarial-pose's
        hourglass stacks): its rows are the stacked outputs, each holding the whole batch, so a
        mean along them averages the batch and the sum after it runs over the stacks only."""
        if not (isinstance(reshaped, cst.Call) and isinstance(reshaped.func, cst.Attribute) and reshaped.func.attr.value in ("view", "reshape")):
            return False
        if len(reshaped.args) != 2 or self.context.code(reshaped.args[1].value).replace(" ", "") != "-1":
            return False
        for name in walk(reshaped.func.value):
            bound = self._bound_value(name) if isinstance(name, cst.Name) else None
            if isinstance(bound, cst.Call) and "torch.stack" in self.context.qualified(bound.func):
                dim = keyword_arg(bound, "dim") or (bound.args[1] if len(bound.args) > 1 and bound.args[1].keyword is None else None)
                if dim is None or self.context.code(dim.value) == "0":
                    return True
        return False

    @property
    def _loss_bindings(self) -> dict[str, list[cst.Assign]]:
        """Each name -> the statements that bind it (read once)."""
        if not hasattr(self, "_bindings"):
            self._bindings: dict[str, list[cst.Assign]] = {}
            for node in walk(self.context.module):
                if isinstance(node, cst.Assign):
                    for target in node.targets:
                        self._bindings.setdefault(dotted(target.target) or "", []).append(node)
        return self._bindings

    def _project_sums(self) -> list[cst.Call]:
        """Calls of a project function that returns a sum over everything (StyleGAN's
        ``R1Penalty(real_img, D)``), in what a training loop's backward() takes: directly, or
        through the names the loop binds (``d_loss = d_loss + r1_penalty * gamma``)."""
        summing = self.context.neighbours.summing
        if not summing:
            return []
        found: list[cst.Call] = []
        for loop in self.facts.training_steps:
            for expr in reaching_backward(loop, loop_origins(loop)):
                found += [call for call in calls_in(expr) if dotted(call.func) in summing and call not in found]
                if isinstance(expr, cst.Call) and dotted(expr.func) in summing and expr not in found:
                    found.append(expr)
        return found

    def _project_sum_parts(self) -> list[tuple[cst.Name, cst.Call]]:
        """The reads, in what a training step's backward() takes, of a name unpacked from the
        place of a project function's returned tuple that holds a sum (hs-math-nlp's ``loss,
        n_correct = compute_performance(pred, gold)``, its loss ``F.cross_entropy(...,
        reduction="sum")``), with that call: scaled where read, the tuple cannot be."""
        parts = self.context.neighbours.summing_parts
        found: list[tuple[cst.Name, cst.Call]] = []
        for loop in self.facts.training_steps if parts else ():
            summed: dict[str, cst.Call] = {}
            bound: dict[str, int] = {}
            for node in walk(loop.body):
                if not isinstance(node, (cst.Assign, cst.AugAssign)):
                    continue
                for name in names_bound_in(node):
                    bound[name] = bound.get(name, 0) + 1
                place = parts.get(dotted(node.value.func) or "") if isinstance(node.value, cst.Call) else None
                target = node.targets[0].target if isinstance(node, cst.Assign) and len(node.targets) == 1 else None
                if place is not None and isinstance(target, (cst.Tuple, cst.List)) and place < len(target.elements):
                    element = target.elements[place].value
                    if isinstance(element, cst.Name):
                        summed[element.value] = node.value
            # (a name bound again in the step is another value there: left alone)
            summed = {name: call for name, call in summed.items() if bound.get(name) == 1}
            reads = {id(n): n for expr in reaching_backward(loop, loop_origins(loop)) for n in walk(expr) if isinstance(n, cst.Name)}
            found += [(n, summed[n.value]) for n in reads.values() if n.value in summed]
        return found

    def _from_the_model(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        """Does ``expr`` call the wrapped model, or read a name bound from such a value in the
        training loop (StyTR-2's ``loss = loss_c + loss_s`` of ``out, loss_c, loss_s = network(...)``:
        the losses each replica returned, which DataParallel gathered)?"""
        if any(dotted(inner.func) in self.facts.model_names for inner in calls_in(expr)):
            return True
        names = [n for n in walk(expr) if isinstance(n, cst.Name)]
        if {n.value for n in names} & getattr(self, "_given", set()):
            return True
        return depth < 4 and any(
            (bound := self._bound_value(name)) is not None and self._from_the_model(bound, depth + 1) for name in names
        )

    def _bound_value(self, name: cst.Name) -> cst.BaseExpression | None:
        """The value the step bound to the name read here: the step's last binding, or, read in
        a value the name is bound to again (torchxrayvision's ``loss = (out - x) ** 2``, then
        ``loss = loss.sum()``), the binding before that one (None: bound before the step)."""
        values = getattr(self, "_bindings_in_step", {}).get(name.value, [])
        node = self.context.parent(name)
        while node is not None and not isinstance(node, (cst.Assign, cst.AugAssign, cst.BaseStatement)):
            node = self.context.parent(node)
        around = node.value if isinstance(node, (cst.Assign, cst.AugAssign)) else None
        for index, value in enumerate(values):
            if value is around:
                return values[index - 1] if index else None
        return values[-1] if values else None

    @property
    def _batch_names(self) -> frozenset[str]:
        """Names bound to the batch's length: ``n = x.size(0)``, the first of ``N, C, H, W =
        x.size()`` (or ``= x.shape``)."""
        if not hasattr(self, "_lengths"):
            found = set()
            for node in walk(self.context.module):
                if not isinstance(node, cst.Assign) or len(node.targets) != 1:
                    continue
                target, value = node.targets[0].target, node.value
                if isinstance(target, cst.Name) and _this_batch(value):
                    found.add(target.value)
                elif isinstance(target, (cst.Tuple, cst.List)) and target.elements and isinstance(target.elements[0].value, cst.Name):
                    shape = (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size" and not value.args) or (
                        isinstance(value, cst.Attribute) and value.attr.value == "shape"
                    )
                    if shape:
                        found.add(target.elements[0].value.value)
            self._lengths = frozenset(found)
        return self._lengths

    def _a_metric(self, call: cst.Call) -> bool:
        """`F.mse_loss(..., reduction="sum").item()`, divided by the batch's length, or in a
        comprehension over another loader: not a summed training loss."""
        parent = self.context.parent(call)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("item", "detach", "tolist"):
            return True
        if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide) and _this_batch(parent.right, self._batch_names):
            return True  # `F.mse_loss(..., reduction="sum") / len(data)`: the batch's mean
        while parent is not None and not isinstance(parent, cst.BaseStatement):
            if isinstance(parent, (cst.GeneratorExp, cst.ListComp, cst.SetComp, cst.DictComp)) and not _over_parts(parent):
                return True
            parent = self.context.parent(parent)
        return False

    def _evaluates(self, context) -> bool:
        if context.function is not None and context.function.name.value in ("forward", "__call__"):
            return False  # a loss module's own loop (YOLOv4's `for output in xin:`)
        if context.function is not None and re.search(r"test|eval|valid|infer", context.function.name.value):
            return True
        return bool(context.loops) and not any(loop in self.facts.training_loops for loop in context.loops)

    # -- the rewrite -------------------------------------------------------------------------

    def _scale(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
        if original not in self._scaled:
            return updated
        self.context.world_scaled.add(original)
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(
            original,
            "DDP116",
            f"`{self._scaled[original]}` sums the loss over the batch: each process sums its share and DDP averages "
            "the gradients, so it is scaled by the world size: every step equals DataParallel's",
        )
        left = updated
        if isinstance(updated, cst.BinaryOperation) and not isinstance(updated.operator, (cst.Multiply, cst.Divide)) and not updated.lpar:
            left = updated.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        factor = self.context.world_size
        if original in self._by_reduction:
            held = self.context.code(original.func)
            factor = f'({factor} if getattr({held}, "reduction", None) == "sum" else 1)'
        elif original in self._while_training:
            factor = f"({factor} if {self._while_training[original]} else 1)"
        scaled = cst.BinaryOperation(left=left, operator=cst.Multiply(), right=cst.parse_expression(factor))
        if not isinstance(self.context.parent(original), LOOSE_PARENTS + (cst.BinaryOperation,)) or (
            isinstance(self.context.parent(original), cst.BinaryOperation)
            and isinstance(self.context.parent(original).operator, cst.Power)
        ):
            scaled = scaled.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return scaled

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return self._scale(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._scale(original_node, updated_node)

    def leave_BinaryOperation(self, original_node, updated_node) -> cst.BaseExpression:
        if original_node in getattr(self, "_global_counts", ()):
            self.context.use_helper("ddp_mean")
            self.context.report(
                original_node,
                "DDP116",
                f"`{self.context.code(original_node)}` divides a sum over the batch by a count of its data: each process "
                f"divides its share's sum by the mean count across ranks (ddp_mean), so DDP's average is the global "
                "sum over the global count, as DataParallel computed it",
            )
            mean = cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node.right)])
            return updated_node.with_changes(right=mean)
        if original_node in getattr(self, "_global_means", ()):
            self.context.use_helper("ddp_mean")
            self.context.report(
                original_node,
                "DDP116",
                f"`{self.context.code(original_node)}` divides the loss by a mean over the batch's data: each process "
                "divides by that mean across ranks (ddp_mean), the global batch's, as DataParallel divided by it",
            )
            mean = cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node.right)])
            return self._scale(original_node, updated_node.with_changes(right=mean))
        return self._scale(original_node, updated_node)

    def leave_UnaryOperation(self, original_node, updated_node) -> cst.BaseExpression:
        return self._scale(original_node, updated_node)

    def leave_AugAssign(self, original_node: cst.AugAssign, updated_node: cst.AugAssign) -> cst.AugAssign:
        if original_node not in getattr(self, "_counted_later", {}):
            return updated_node
        self.context.use_helper("ddp_mean")
        self.context.report(
            original_node,
            "DDP116",
            f"`{self.context.code(original_node)}` divides a loss summed over the batch by a count of its data: each process "
            "divides its share's sum by the mean count across ranks (ddp_mean), so DDP's average is the global sum over "
            "the global count, as DataParallel computed it",
        )
        return updated_node.with_changes(value=cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node.value)]))


def _over_parts(comprehension: cst.BaseComp | cst.DictComp) -> bool:
    """A comprehension over the parts of one batch's loss (DeepCTR's tasks: ``sum([loss_func[i](
    y_pred[:, i], y[:, i], reduction='sum') for i in range(self.num_tasks)])``), not over the
    batches of a loader (``sum(F.mse_loss(model(x), y, reduction="sum") for x, y in val_loader)``,
    a metric): every ``for`` counts with ``range()`` or walks a literal list or tuple."""
    clause = comprehension.for_in
    while clause is not None:
        values = clause.iter
        counted = isinstance(values, cst.Call) and dotted(values.func) == "range"
        if not counted and not isinstance(values, (cst.List, cst.Tuple)):
            return False
        clause = clause.inner_for_in
    return True


def _counted_value(value: cst.BaseExpression, origins: dict[str, list[cst.BaseExpression]]) -> cst.BaseExpression | None:
    """What a divisor counts, through its conversions and the name it was bound to
    (``nNeg.float()`` with ``nNeg = torch.sum(negCounts)``)."""
    value = unconverted(value)
    if isinstance(value, cst.Name):
        bound = origins.get(value.value, [])
        return bound[-1] if len(bound) == 1 else None
    return value


def _scaled_sum(value: cst.BaseExpression, qualified) -> cst.BaseExpression | None:
    """The sum in a product of it and constants (``2.0 * torch.sum(err * mask)``)."""
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply)):
        return None
    for factor, other in ((value.left, value.right), (value.right, value.left)):
        if isinstance(other, (cst.Integer, cst.Float)):
            return factor if _a_sum(factor, qualified) else _scaled_sum(factor, qualified)
    return None


def _a_sum(value: cst.BaseExpression, qualified) -> bool:
    """``x.sum()`` / ``torch.sum(x)``: a sum over everything."""
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "sum" and not value.args:
        return True
    return "torch.sum" in qualified(value.func) and len(value.args) == 1


def _a_count(value: cst.BaseExpression, qualified) -> bool:
    """A count over the batch's data: ``torch.sum(mask)``, ``(y != pad).sum()``,
    ``mask.count_nonzero()``, ``.float()`` or ``.item()`` of one."""
    value = unconverted(value)
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "count_nonzero":
        return True
    return _a_sum(value, qualified) or "torch.count_nonzero" in qualified(value.func)


def _a_mean_of_data(value: cst.BaseExpression, qualified) -> bool:
    """``torch.mean(masks)``, ``masks.mean()`` (or ``.float()``/``.item()`` of one): a mean over
    everything a tensor holds."""
    value = unconverted(value)
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "mean" and not value.args:
        return True
    return "torch.mean" in qualified(value.func) and len(value.args) == 1


def _unshaped(value: cst.BaseExpression) -> cst.BaseExpression:
    """``loss.unsqueeze(0)``, ``loss.view(1)``, ``loss.cuda()``: the value, its shape or place aside."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in (
        "unsqueeze", "view", "reshape", "squeeze", "flatten", "cuda", "cpu", "to", "float", "double"
    ):
        value = value.func.value
    return value


def _this_batch(divisor: cst.BaseExpression, names: frozenset[str] = frozenset()) -> bool:
    """``len(data)``, ``data.size(0)``, ``data.shape[0]``, ``data.size()[0] * 2``, a product with
    it among the factors (PD-Denoising's ``img.size()[0] * 3 * img.size()[2] * ...``), or one of
    ``names`` bound to it (fastdvdnet's ``N, _, H, W = img.size()``, then ``/ (N*2)``): the
    length of the batch in hand, not of a dataset (``len(loader.dataset)``, ``args.batch_size``)."""
    if isinstance(divisor, cst.Name) and divisor.value in names:
        return True
    if isinstance(divisor, cst.Call) and dotted(divisor.func) == "len":
        return len(divisor.args) == 1 and isinstance(divisor.args[0].value, (cst.Name, cst.Subscript))
    if isinstance(divisor, cst.BinaryOperation) and isinstance(divisor.operator, cst.Multiply):
        return _this_batch(divisor.left, names) or _this_batch(divisor.right, names)
    if isinstance(divisor, cst.Subscript) and isinstance(divisor.value, cst.Call):
        func = divisor.value.func  # `imgn.size()[0]`
        return isinstance(func, cst.Attribute) and func.attr.value == "size" and not divisor.value.args
    return batch_length(divisor)


def _sums_over_batch(call: cst.Call, code) -> bool:
    """``nn.MSELoss(reduction="sum")``, ``F.l1_loss(x, y, reduction='sum')``,
    ``nn.BCELoss(size_average=False)``: a loss summed over the batch."""
    for arg in call.args:
        if arg.keyword is None:
            continue
        value = code(arg.value).strip()
        if arg.keyword.value == "reduction" and value in ('"sum"', "'sum'"):
            return True
        if arg.keyword.value == "size_average" and value == "False":
            return True
    return False
