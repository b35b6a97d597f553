"""DDP117-DDP119: losses that need the whole batch, keep state, or train outside the wrap.

DataParallel gathered every GPU's outputs on one device before the loss ran, and kept one
copy of the loss module. Two kinds of loss change meaning when each DDP process computes
its own:

DDP117  a loss that compares the samples of a batch with each other: batch-hard triplet mining,
contrastive, InfoNCE and SupCon losses (``torch.cdist(x, x)``, ``x.mm(x.t())``,
``feats @ feats.T``, ``dist.addmm_(1, -2, x, x.t())``). Under DataParallel it mined and
contrasted across the whole global batch; each DDP process alone would see only its share
(fewer positives and negatives, another loss). The loss gets the whole global batch: each
call of it in a training loop gathers its tensor arguments from every process
(``ddp_whole_batch``), every process computes the same loss, and the gradient of each share
goes back to its process, so DDP's mean of the gradients is DataParallel's::

    def triplet_loss(inputs, targets):
        d = torch.cdist(inputs, inputs)      # every pair of the batch
        ...
    loss = triplet_loss(model(x), y)   ->   loss = ddp_whole_batch(triplet_loss, model(x), y)

A project loss class made for one batch size (thesis_SIMCLR's NT-Xent, ``SimCLR_Loss(batch_size,
temperature)``, whose forward lays out the batch's samples against each other with
``self.batch_size``) counts as one: fed a share it crashed, fed the share's size it would see fewer
negatives.

A comparison written in the training loop's own statements (SimCLR's, DCL's
``torch.mm(out, out.t())``) in a loop that reads its batch only through the model gets the
model's outputs gathered instead, and the loop computes on the global batch::

    out = F.normalize(model(x), dim=1)   ->   out = F.normalize(ddp_gathered(model(x)), dim=1)

and so does a product of two outputs of the wrapped model (two towers' in-batch negatives, BLINK's
``ctxt @ cands.t()`` of ``ctxt, _ = model(x, None)`` and ``_, cands = model(None, y)``).

Outputs centred on their mean over the batch (a relativistic GAN, HSR/ESRGAN:
``cri(pred_real - torch.mean(pred_fake), True)``) are gathered where they are made, when all they
meet in the loop is each other and constants (the loop's other losses stay the share's)::

    pred_fake = netD(fake)   ->   pred_fake = ddp_gathered(netD(fake))

A training loss computed out of sight (analysis/losses_out_of_sight.py: a callable the step takes
as a parameter whose callers are in another module, reid-strong-baseline's ``loss_fn``; one made
by a factory of another module, pytorch-semseg's ``get_loss_function(cfg)``, a partial whose
reduction a config decides) may sum, mean or mine: it gets the whole global batch too, which is
DataParallel's loss whatever it computes::

    loss = loss_fn(score, feat, target)   ->   loss = ddp_whole_batch(loss_fn, score, feat, target)

Refused (a warning with ``--allow-partial``) where such a loop also reads the batch beside the
outputs (its labels would be the share's: move the loss into a loss function), or the loss is
handed to a helper of another module without the model's outputs (a step that runs the model
itself: convert the folder); handed on with them (AlignedReID's ``DeepSupervision(criterion,
outputs, y)``), that call is gathered.

DDP118  (refuses; a warning with ``--allow-partial``) a loss module that keeps a buffer it
updates while training (open-reid's OIM lookup table, an NCE memory bank): each process
would update its own copy with its own share of the samples, and the copies would drift
apart; DDP synchronises gradients, not buffers of modules it does not wrap::

    class OIMLoss(nn.Module):
        def __init__(self, ...):
            self.register_buffer("lut", torch.zeros(classes, features))
    ...
    ctx.lut[y] = momentum * ctx.lut[y] + (1 - momentum) * x    # refused

DDP119  a module the optimizer trains and the training loop calls that is not wrapped
(face.evoLVe's ``HEAD`` beside the wrapped ``BACKBONE``, CosFace's margin head picked from a
dict): DataParallel computed its gradients from the whole batch on one device; under DDP
nothing would average them across processes, and each rank would train its own copy. A head
gets a DDP wrap of its own after its binding (or after the model's wrap), its state_dict
keeping the keys it had, and DDP told that some of its parameters may get no gradient (a
detector whose classification losses the script leaves out: dl-final-project's FasterRCNN)::

    BACKBONE = nn.DataParallel(BACKBONE)          BACKBONE = ddp_wrap(BACKBONE)
    HEAD = ArcFace(512, classes)            ->    HEAD = ArcFace(512, classes)
                                                  HEAD = ddp_wrap(HEAD, keys_unwrapped=True,
                                                                  find_unused_parameters=True)

A loss with weights of its own (Proxy-Anchor's proxies, a centre loss) gets the same wrap, and
its calls in the training loops the whole global batch (``ddp_whole_batch``, as DDP117): every
process computes it from what DataParallel gave it, so its gradients are DataParallel's,
whatever it computes::

    criterion = ProxyAnchor(classes, size)        criterion = ProxyAnchor(classes, size)
                                            ->    criterion = ddp_wrap(criterion, keys_unwrapped=True,
                                                                       find_unused_parameters=True)
    loss = criterion(model(x), y)                 loss = ddp_whole_batch(criterion, model(x), y)

Losses defined in the converted file are read (DDP117, DDP118): a class whose name says it is a loss
(``...Loss``, ``...Criterion``, ``Triplet...``, ``NCE...``, ``Memory...``) or a function whose
name holds ``loss``, ``triplet`` or ``contrast``, called in a training loop; the operands of
a pairwise product must both come from the batch (no ``self.`` weight or centre table). In
single-file mode the script's project modules are read too (DDP117): a class or function
there that takes a distance of a batch with itself or builds a label-equality matrix
(triplet-reid's ``BatchHardTripletSelector``), called in a training loop.
"""

from __future__ import annotations

import re
import textwrap

import libcst as cst

from ddpify.analysis.data_sites import derived_from
from ddpify.analysis.losses_out_of_sight import losses_out_of_sight
from ddpify.analysis.tree import binding_targets, calls_in, dotted, walk, without_gradients, without_moves
from ddpify.names import MATRIX_PRODUCTS
from ddpify.project.neighbours import mines_the_batch, normalised_by_a_count
from ddpify.transforms.base import Transform, builds_torch_optimizer, keyword

LOSS_CLASS = re.compile(r"Loss|Criterion|Triplet|Contrast|NCE|Memory", re.IGNORECASE)
LOSS_FUNCTION = re.compile(r"loss|triplet|contrast", re.IGNORECASE)
PAIRWISE_FUNCTIONS = {"torch.cdist", "torch.pdist", "torch.nn.functional.pdist"}
IN_PLACE = re.compile(r"\.(index_copy_|index_add_|copy_|mul_|add_|sub_|div_|fill_|index_fill_|scatter_|zero_)\(")


EVALUATION_NAME = re.compile(r"^(test|eval|valid|evaluate|validate)", re.IGNORECASE)


class BatchLossesTransform(Transform):
    CODE_PREFIX = "DDP11"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._head_wraps: dict[cst.SimpleStatementLine, str] = {}  # statement -> head wrapped after it
        self._gathered_outputs: set[cst.Call] = set()  # the model's calls whose outputs are gathered

    def check(self) -> None:
        if self.facts.wraps and not self.facts.training_loops:
            # (the training loop in another module it hands the model and the loss to)
            self._refuse_memory_bank(self._made_beside_the_wrap(self.context.neighbours.memory_banks))
        if self.facts.wraps or self.context.model_elsewhere:
            self._gather_out_of_sight()
        if not self.facts.wraps or not self.facts.training_loops:
            return
        definitions = self._definitions()
        for name, (definition, calls) in self._losses_trained(definitions).items():
            whole = [call for call in calls if self.context.in_a_scattered_loop(call)]
            if whole and len(whole) == len(calls):
                continue  # (the loop holds the whole batch already: DataParallel's loss as it is)
            calls = [call for call in calls if call not in whole]
            pairwise = self._pairwise(definition)
            totals = self._over_batch_totals(definition) if pairwise is None else None
            if totals is not None:
                self._gather_for(calls, definition)
                self.context.report(
                    definition,
                    "DDP117",
                    f"`{name}` {totals}: as DataParallel did, it gets the whole global batch, its arguments gathered "
                    "from every process (ddp_whole_batch), each share's gradient sent back",
                )
            if pairwise is not None:
                self._gather_for(calls, definition)
                self.context.report(
                    pairwise,
                    "DDP117",
                    f"`{name}` compares the samples of the batch with each other "
                    f"(`{self.context.code(pairwise)}`): as DataParallel did, it gets the whole global batch, its "
                    "arguments gathered from every process (ddp_whole_batch), each share's gradient sent back",
                )
            buffer = self._updated_buffer(definition) if isinstance(definition, cst.ClassDef) else None
            if buffer is not None:
                self.context.report_unsound(
                    definition,
                    "DDP118",
                    f"`{name}` keeps the buffer `{buffer}` and updates it while training: each process would "
                    "update its own copy with its own samples and the copies would drift apart; keep it "
                    "in sync across ranks by hand",
                )

        self._check_inline_pairwise()
        self._check_centred_outputs()
        self._check_neighbour_pairwise()
        self._check_unwrapped_trained()

    def _gather_out_of_sight(self) -> None:
        """A training loss computed out of sight (a parameter whose callers are elsewhere, a
        factory's product): whatever it computes, on the whole global batch it is DataParallel's."""
        found = losses_out_of_sight(self.facts, self.context.module, self.context.parent, self.context.qualified)
        for call, why in found:
            if self.context.in_a_scattered_loop(call) or self._evaluates(call, dotted(call.func) or ""):
                continue
            self._gather_for([call])
            self.context.report(
                call,
                "DDP117",
                f"`{self.context.code(call.func)}` computes the training loss out of sight ({why}): it may sum over the "
                "batch or compare its samples, so, as DataParallel computed it, it gets the whole global batch, its "
                "arguments gathered from every process (ddp_whole_batch), each share's gradient sent back",
            )

    def _check_inline_pairwise(self) -> None:
        """A training loop that multiplies a batch's outputs with their own transpose
        (DCL's ``torch.mm(out, out.t().contiguous())``: every other sample a negative)."""
        # (a loss function's products are its definition's: the calls give it the whole batch)
        for loop in [*self.facts.training_loops, *self.facts.step_functions]:
            if self.context.in_a_scattered_loop(loop):
                continue
            for node in walk(loop.body):
                operands = _product_operands(node, {"mm", "matmul"})
                if len(operands) >= 2 and any(_transposed(o) for o in operands[1:2]) and not any(_reads_self(o) for o in operands):
                    roots = {_root(o) for o in operands[:2]}
                    drawn = self._drawn_in(self._innermost_loop(node))
                    if drawn is not None and roots - drawn:
                        continue  # (the classes' weights compared with each other: alike on every rank)
                    if None not in roots and (len(roots) == 1 or self._outputs_of_the_model(roots, self._innermost_loop(node))):
                        model_calls = self._only_through_the_model(self._innermost_loop(node))
                        if model_calls:
                            self._gathered_outputs.update(model_calls)
                            self.context.report(
                                node,
                                "DDP117",
                                f"the training loop compares the samples of the batch with each other "
                                f"(`{self.context.code(node)}`), and reads its batch only through the model: as "
                                "DataParallel did, the model's outputs are gathered from every process "
                                "(ddp_gathered), every process computes the loss on the whole global batch, and each "
                                "share's gradient goes back to it",
                            )
                            return
                        self.context.report_unsound(
                            node,
                            "DDP117",
                            f"the training loop compares the samples of the batch with each other "
                            f"(`{self.context.code(node)}`) in the loop's own statements: DataParallel gathered the "
                            "whole global batch for it, each DDP process would see only its share, and the loop's "
                            "other tensors are the share's; move the loss into a function of this file named as a "
                            "loss (`def contrastive_loss(out, ...)`): ddpify gives such a loss the whole global batch",
                        )
                        return

    def _check_centred_outputs(self) -> None:
        """A training loop that centres the model's outputs on their mean over the batch (a
        relativistic GAN, HSR/ESRGAN: ``cri(pred_real - torch.mean(pred_fake), True)``): that mean
        was the global batch's under DataParallel. The calls that make those outputs are gathered
        (ddp_gathered) where everything those outputs meet in the loop is another such output or a
        constant; every process then computes the same term on the whole batch."""
        for loop in self.facts.training_loops:
            if self.context.in_a_scattered_loop(loop) or not isinstance(loop, (cst.For, cst.While)):
                continue
            made = self._model_outputs_in(loop)
            centred = [node for node in walk(loop.body) if _centred(node, set(made))]
            if not centred:
                continue
            names = {n.value for node in centred for n in walk(node) if isinstance(n, cst.Name) and n.value in made}
            per_step = {n.value for node in walk(loop) for t in binding_targets(node) for n in walk(t) if isinstance(n, cst.Name)}
            if not all(_data_names(node) & per_step <= names for node in _readers(loop.body, names)):
                continue  # (an output meets a share of the batch, its labels: left as it is)
            self._gathered_outputs.update(call for name in names for call in made[name])
            self.context.report(
                centred[0],
                "DDP117",
                f"the training loop centres the model's outputs on their mean over the batch "
                f"(`{self.context.code(centred[0])}`): as DataParallel did, the outputs it compares are gathered from "
                "every process (ddp_gathered), every process computes that term on the whole global batch, and each "
                "share's gradient goes back to it",
            )

    def _model_outputs_in(self, loop: cst.CSTNode) -> dict[str, list[cst.Call]]:
        """Names the loop binds to a wrapped model's call (``pred = netD(x)``, or ``.detach()``
        of it) -> those calls."""
        models, found = self._wrapped_names, {}
        for node in walk(loop.body):
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
                value = node.value
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("detach", "float", "squeeze"):
                    value = value.func.value
                if isinstance(value, cst.Call) and dotted(value.func) in models:
                    found.setdefault(node.targets[0].target.value, []).append(value)
        return found

    def _outputs_of_the_model(self, roots: set[str], loop: cst.CSTNode | None) -> bool:
        """Is every name the product compares bound in the loop to what a wrapped model returns
        (BLINK's two towers: `ctxt, _ = model(x, None)`, `_, cands = model(None, y)`, then
        `ctxt @ cands.t()`): DataParallel compared the whole global batches of both."""
        if loop is None:
            return False
        models = self._wrapped_names
        made = {
            name.value for node in walk(loop.body) if isinstance(node, cst.Assign)
            and any(dotted(call.func) in models for call in calls_in(node.value))
            for target in node.targets for name in walk(target.target) if isinstance(name, cst.Name)
        }
        return roots <= made

    def _innermost_loop(self, node: cst.CSTNode) -> cst.CSTNode | None:
        while node is not None and not isinstance(node, (cst.For, cst.While)):
            node = self.context.parent(node)
        return node

    def _drawn_in(self, loop: cst.CSTNode | None) -> set[str] | None:
        """The names a ``for`` loop binds to what it draws, and to what it computes from them
        (None for another loop: its batch is not known)."""
        if not isinstance(loop, cst.For):
            return None
        return set(derived_from({n.value for n in walk(loop.target) if isinstance(n, cst.Name)}, loop.body))

    def _only_through_the_model(self, loop) -> list[cst.Call]:
        """The wrapped model's calls in a ``for`` training loop that reads what it draws (and what
        is made of it: ``x = x.cuda()``) only as those calls' arguments: gathered after the
        calls, everything the loop computes is the global batch's. Empty where the batch is
        read elsewhere too (labels in the loss: the share's)."""
        if not isinstance(loop, cst.For):
            return []
        models = self._wrapped_names
        drawn = {node.value for node in walk(loop.target) if isinstance(node, cst.Name)}
        calls = [call for call in calls_in(loop.body) if dotted(call.func) in models]
        inside = {id(node) for call in calls for arg in call.args for node in walk(arg.value)}
        computed = {n.value for node in walk(loop.body) if isinstance(node, cst.Assign) for t in node.targets for n in walk(t.target) if isinstance(n, cst.Name)}
        for statement in walk(loop.body):  # (made of the batch and of nothing the loop computes: the batch again)
            if isinstance(statement, cst.Assign) and not any(dotted(c.func) in models for c in calls_in(statement.value)):
                names = {n.value for n in walk(statement.value) if isinstance(n, cst.Name)}
                if names & drawn and not names & (computed - drawn):
                    drawn |= {n.value for t in statement.targets for n in walk(t.target) if isinstance(n, cst.Name)}
                    inside |= {id(n) for t in statement.targets for n in walk(t.target)} | {id(n) for n in walk(statement.value)}
        read = [node for node in walk(loop.body) if isinstance(node, cst.Name) and node.value in drawn and id(node) not in inside]
        return calls if calls and drawn and not read else []

    def _check_neighbour_pairwise(self) -> None:
        """Single-file mode: a class or function of the script's project modules that compares
        the samples of the batch (triplet-reid's BatchHardTripletSelector), or keeps a memory
        bank it updates in place (lemniscate's LinearAverage), called in a training loop,
        directly or through an instance made here."""
        neighbours = self.context.neighbours
        found = self._called_in_training(neighbours.pairwise)
        if found is not None and self.context.in_a_scattered_loop(found[0]):
            return  # (the loop holds the whole batch, its model's outputs gathered: DataParallel's as it is)
        if found is not None:
            call, made = found
            # (called, or handed on together with the model's outputs: AlignedReID's
            # DeepSupervision(criterion, outputs, targets) computes it from what it is given)
            if dotted(call.func) in neighbours.pairwise | set(self._made_of(neighbours.pairwise)) or self._given_outputs(call):
                self._gather_for([call])
                self.context.report(
                    call,
                    "DDP117",
                    f"`{made}` (a module of this project) compares the samples of the batch with each other: as "
                    "DataParallel did, it gets the whole global batch, its arguments gathered from every process "
                    "(ddp_whole_batch), each share's gradient sent back",
                )
                return
            inside = self._calls_in_the_step(call, made)
            if inside:  # (handed to a step function of this file: AlignedReID's train(epoch, model, criterion, ...))
                self._gather_for(inside)
                self.context.report(
                    inside[0],
                    "DDP117",
                    f"`{made}` (a module of this project) compares the samples of the batch with each other: as "
                    f"DataParallel did, it gets the whole global batch in `{self.context.code(call.func)}`, its "
                    "arguments gathered from every process (ddp_whole_batch), each share's gradient sent back",
                )
                return
            self.context.report_unsound(
                call,
                "DDP117",
                f"`{made}` (a module of this project) compares the samples of the batch with each other, and the "
                f"training loop hands it to `{self.context.code(call.func)}`, which runs it out of this file's sight: "
                "DataParallel gathered the whole global batch for it, each DDP process would see only its share; "
                "convert the project folder (ddpify convert DIR/), or call it in the loop as "
                "ddp_whole_batch(loss, outputs, targets)",
            )
            return
        self._refuse_memory_bank(self._called_in_training(neighbours.memory_banks) or self._made_beside_the_wrap(neighbours.memory_banks))

    def _refuse_memory_bank(self, found: tuple[cst.Call, str] | None) -> None:
        if found is not None:
            call, made = found
            self.context.report_unsound(
                call,
                "DDP118",
                f"`{made}` (a module of this project) keeps a memory bank it updates in place while training: each "
                "process would update its own copy with its own share of the samples, and the copies would drift "
                "apart (DDP synchronises gradients, not buffers); gather every rank's features and indices before "
                "the update (torch.distributed.all_gather), by hand",
            )

    def _gather_for(self, calls: list[cst.Call], definition: cst.CSTNode | None = None) -> None:
        """Each training call of a loss that compares the batch's samples gets the global batch
        (not in a loop that holds it whole already: its model's calls are scattered)."""
        self.context.whole_batch_calls.update(call for call in calls if not self.context.in_a_scattered_loop(call))
        if definition is not None:
            self.context.whole_batch_definitions.add(definition)

    def _calls_in_the_step(self, call: cst.Call, made: str) -> list[cst.Call]:
        """The calls of the loss inside the step function of this file the loop hands it to:
        its parameter called, or handed on with the model's outputs (DeepSupervision)."""
        definition = self._definitions().get(dotted(call.func) or "")
        if not isinstance(definition, cst.FunctionDef):
            return []
        made_of = self._made_of(frozenset({made}))
        params = [p.name.value for p in definition.params.params]
        handed = {
            (params[index] if arg.keyword is None and index < len(params) else getattr(arg.keyword, "value", None))
            for index, arg in enumerate(call.args) if dotted(arg.value) in made_of
        } - {None}
        return [
            inner for inner in calls_in(definition.body)
            if not self._evaluates(inner, dotted(inner.func) or "")
            and (dotted(inner.func) in handed or any(dotted(a.value) in handed for a in inner.args) and self._given_outputs(inner))
        ]

    def _given_outputs(self, call: cst.Call) -> bool:
        """Does the call take the wrapped model's outputs (``model(x)``) as an argument?"""
        models = self._wrapped_names
        outputs = {  # (or a name bound to them: `out = model(x)`, `outputs, features = model(imgs)`)
            name.value
            for node in walk(self.context.module)
            if isinstance(node, cst.Assign) and any(dotted(inner.func) in models for inner in calls_in(node.value))
            for target in node.targets for name in walk(target.target) if isinstance(name, cst.Name)
        }
        return any(
            dotted(arg.value) in outputs or any(dotted(inner.func) in models for inner in calls_in(arg.value))
            for arg in call.args
        )

    def _made_of(self, names: frozenset[str]) -> dict[str, str]:
        """Names bound to an instance of one of ``names`` -> its class (``criterion = TripletLoss(...)``)."""
        return {
            dotted(target.target): dotted(node.value.func)
            for node in walk(self.context.module)
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and dotted(node.value.func) in names
            for target in node.targets
            if dotted(target.target) is not None  # (`acc_train, acc_test = nearsub(...)`: values, no instance)
        }

    @property
    def _wrapped_names(self) -> set[str]:
        """What the wrapped models are bound to (``model``, ``self.net``)."""
        return self.facts.wrap_targets

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._gathered_outputs:
            self.context.use_helper("ddp_gathered")
            pieces = self._joined_pieces(original_node)
            extra = [cst.Arg(cst.Integer(str(pieces)))] if pieces > 1 else []
            return cst.Call(func=cst.Name("ddp_gathered"), args=[cst.Arg(updated_node), *extra])
        if original_node not in self.context.whole_batch_calls:
            return updated_node
        self.context.use_helper("ddp_whole_batch")
        pieces = max([self._joined_pieces(arg.value) for arg in original_node.args[:1]] or [1])
        extra = [keyword("ddp_pieces", cst.Integer(str(pieces)))] if pieces > 1 else []
        return updated_node.with_changes(
            func=cst.Name("ddp_whole_batch"), args=[cst.Arg(updated_node.func), *updated_node.args, *extra]
        )

    def _joined_pieces(self, expr: cst.BaseExpression, depth: int = 0) -> int:
        """How many pieces the batch behind ``expr`` was joined from along its first dimension
        (``inputs = torch.cat((inputs1, inputs2), 0)``; ``features = net(inputs)``): the two
        views of each sample, which the gather must keep apart (every first view, then every
        second, as DataParallel's batch was laid out)."""
        if depth > 4:
            return 1
        if isinstance(expr, cst.Call):
            if self.context.qualified(expr.func) & {"torch.cat", "torch.concat", "torch.concatenate"} and expr.args:
                joined = expr.args[0].value
                dims = [a.value for a in expr.args[1:] if a.keyword is None or a.keyword.value in ("dim", "axis")]
                if isinstance(joined, (cst.Tuple, cst.List)) and len(joined.elements) > 1 and all(
                    isinstance(d, cst.Integer) and d.value == "0" for d in dims
                ):
                    return len(joined.elements)
            inner = [a.value for a in expr.args if a.keyword is None]
            inner += [expr.func.value] if isinstance(expr.func, cst.Attribute) else []
            return max([self._joined_pieces(value, depth + 1) for value in inner] or [1])
        if isinstance(expr, (cst.Subscript, cst.Attribute)):
            return self._joined_pieces(expr.value, depth + 1)
        if not isinstance(expr, cst.Name):
            return 1
        scopes = self.facts.analyzer.scopes
        values = [scopes.assigned_value(a.node)[0] for a in scopes.assignments_of(expr) if getattr(a, "node", None) is not None]
        return max([self._joined_pieces(value, depth + 1) for value in values if value is not None] or [1])

    def _made_beside_the_wrap(self, names: frozenset[str]) -> tuple[cst.Call, str] | None:
        """A module that wraps the model and makes the memory bank it trains with, the training
        loop in another module it hands both to (folder mode, Bottom-up-Clustering's
        ``self.criterion = ExLoss(...)`` beside the wrap, used by reid/trainers.py)."""
        if not names or not self.facts.wraps:
            return None
        return next(((call, dotted(call.func)) for call in calls_in(self.context.module) if dotted(call.func) in names), None)

    def _called_in_training(self, names: frozenset[str]) -> tuple[cst.Call, str] | None:
        if not names:
            return None
        instances = self._made_of(names)
        # (or handed to an object the loop calls: ECN's `trainer = Trainer(model, model_inv)`, then
        # `trainer.train(...)` in the epoch loop)
        carriers = {
            dotted(target.target): instances[dotted(arg.value)]
            for node in walk(self.context.module)
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)
            for arg in node.value.args if dotted(arg.value) in instances
            for target in node.targets
        }
        for loop in self.facts.training_loops:
            for call in calls_in(loop.body):
                name = dotted(call.func)
                made = name if name in names else instances.get(name) or carriers.get((name or "").rpartition(".")[0])
                # (or handed to a helper that calls it: AlignedReID's DeepSupervision(criterion, ...))
                handed = [instances[arg] for arg in (dotted(a.value) for a in call.args) if arg in instances]
                made = made or (handed[0] if handed else None)
                if made is not None and not self._evaluates(call, name or ""):
                    return call, made
        return None

    def _evaluates(self, call: cst.Call, name: str) -> bool:
        """An evaluation the epoch loop runs (Towards-Realtime-MOT's ``test.test_emb(...)``):
        named so, or under ``torch.no_grad()``; it takes no training step."""
        return bool(EVALUATION_NAME.search(name.rpartition(".")[2])) or without_gradients(
            call, self.context.parent, self.context.code
        )

    def _check_unwrapped_trained(self) -> None:
        if not self.facts.wraps:
            return  # (DataParallel by function in a model's forward: refused for that)
        wrapped = {name for site in self.facts.wraps for name in (site.target, dotted(site.module_arg) if site.module_arg else None) if name}
        called = {dotted(call.func) for loop in self.facts.training_loops for call in calls_in(loop.body)}
        for node in self.facts.contexts:
            if not isinstance(node, cst.Call) or not self._builds_optimizer(node):
                continue
            for trained in self._trained_modules(node):
                if trained in called and trained not in wrapped and trained in self._built_from_classes:
                    after = self._head_wrap_place(trained)
                    if after is None and self._a_loss(trained):
                        after = self._loss_wrap_place(trained)
                        if after is not None:
                            continue
                    if after is not None:
                        self._head_wraps[after] = trained
                        self.context.report(
                            node,
                            "DDP119",
                            f"the optimizer trains `{trained}`, which the training loop calls outside the wrap (a head "
                            "beside the model): it gets a DDP wrap of its own, so its gradients are averaged across "
                            "processes as DataParallel computed them from the whole batch (its checkpoints keep their keys)",
                        )
                        continue
                    # (bound more than once, or handed to a helper: no one place for a wrap of its own)
                    self.context.report(
                        node,
                        "DDP119",
                        f"the optimizer trains `{trained}`, which the training loop calls outside the wrap: its weights "
                        "start as rank 0's and their gradients are averaged across processes before each optimizer step "
                        "(the wrapped model's step hook), as DataParallel computed them from the whole batch",
                    )

    def _a_loss(self, trained: str) -> bool:
        return bool(LOSS_CLASS.search(trained) or any(LOSS_CLASS.search(self.context.code(b.value)) for b in self._bindings(trained)))

    def _loss_wrap_place(self, trained: str) -> cst.SimpleStatementLine | None:
        """A loss with weights of its own (Proxy-Anchor's proxies, a centre loss) is exact under
        DDP, whatever it computes, when every process computes it from the whole global batch,
        as DataParallel did: its calls in the training loops gather their arguments
        (ddp_whole_batch), and its own wrap keeps its weights alike (their gradients are
        averaged). Only where every such call is the loss called by its name."""
        after = self._head_wrap_place(trained, loss=True)
        calls = [
            call for loop in self.facts.training_loops for call in calls_in(loop.body)
            if dotted(call.func) == trained and not self._evaluates(call, trained)
        ]
        handed = [
            call for loop in self.facts.training_loops for call in calls_in(loop.body)
            if any(dotted(arg.value) == trained for arg in call.args)
        ]
        if after is None or not calls or handed:
            return None
        self._head_wraps[after] = trained
        self._gather_for(calls)
        self.context.report(
            calls[0],
            "DDP119",
            f"the optimizer trains `{trained}`, a loss with weights of its own that the training loop calls outside "
            "the wrap: it gets a DDP wrap of its own (its weights stay alike on every rank), and its calls get the "
            "whole global batch as DataParallel gave it (ddp_whole_batch): its gradients are DataParallel's",
        )
        return after

    def _bindings(self, name: str) -> list[cst.Assign]:
        return [
            node for node in walk(self.context.module)
            if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets)
        ]

    def _head_wrap_place(self, trained: str, loss: bool = False) -> cst.SimpleStatementLine | None:
        """Where a head (a loss only with ``loss``: see _loss_wrap_place) gets its own wrap:
        after its one binding, or after the model's wrap when that comes later, both in the
        same function."""
        if not loss and LOSS_CLASS.search(trained):
            return None
        bindings = self._bindings(trained)
        if len(bindings) != 1 or not loss and LOSS_CLASS.search(self.context.code(bindings[0].value)):
            return None
        wrap = next((site.call for site in self.facts.wraps), None)
        calls = [wrap, next(iter(calls_in(bindings[0].value)), None)]  # (their contexts: function, loops)
        contexts = [self.facts.contexts.get(call) for call in calls if call is not None]
        if len(contexts) != 2 or None in contexts or contexts[0].function is not contexts[1].function:
            return None
        if any(context.loops for context in contexts):
            return None
        statements = [self._statement_of(node) for node in (bindings[0], wrap)]
        if None in statements:
            return None
        return max(statements, key=lambda statement: self.context.position(statement))

    def _statement_of(self, node: cst.CSTNode) -> cst.SimpleStatementLine | None:
        while node is not None and not isinstance(node, cst.SimpleStatementLine):
            node = self.context.parent(node)
        return node

    def edit_block(self, owner: cst.CSTNode, block):
        if not self._head_wraps:
            return block
        edited = []
        for original, updated in block:
            edited.append((original, updated))
            if original in self._head_wraps:
                name = self._head_wraps[original]
                self.context.use_helper("ddp_wrap")
                # (find_unused_parameters: a head's outputs may feed only some of the losses, a
                # detector's classification layers where only its box losses are summed:
                # dl-final-project's FasterRCNN stopped at the second step without it)
                statement = f"{name} = ddp_wrap({name}, keys_unwrapped=True, find_unused_parameters=True)"
                edited.append((None, cst.parse_statement(statement)))
        return edited

    @property
    def _built_from_classes(self) -> set[str]:
        """Names only ever bound to a class's instance (``HEAD = ArcFace(...)``): not to what a
        function returns (``model = build_model()`` may return the wrapped model)."""
        if not hasattr(self, "_class_instances"):
            bound: dict[str, bool] = {}
            for node in walk(self.context.module):
                if isinstance(node, cst.Assign):
                    is_class = _makes_an_instance(node.value)
                    for target in node.targets:
                        name = dotted(target.target)
                        if name:
                            bound[name] = bound.get(name, True) and is_class
            self._class_instances = {name for name, only_classes in bound.items() if only_classes}
        return self._class_instances

    def _builds_optimizer(self, call: cst.Call) -> bool:
        if builds_torch_optimizer(call, self.context.qualified):
            return True
        # (an optimizer class looked up in the configuration, given parameter groups:
        # proxynca_pp's `config['opt']['type']([{'params': ...}, ...])`)
        named = isinstance(call.func, cst.Subscript) or "opt" in (dotted(call.func) or "").rpartition(".")[2].lower()
        return named and any(
            isinstance(inner.func, cst.Attribute) and inner.func.attr.value == "parameters"
            for arg in call.args for inner in calls_in(arg.value)
        )

    def _trained_modules(self, optimizer: cst.Call) -> list[str]:
        """``head`` of ``head.parameters()`` in the optimizer's arguments, or in what a name
        passed there is made of (Proxy-Anchor's ``param_groups.append({'params':
        criterion.parameters(), ...})``)."""
        found = []
        names = {arg.value.value for arg in optimizer.args if isinstance(arg.value, cst.Name)}
        sources: list[cst.CSTNode] = [optimizer]
        for node in walk(self.context.module) if names else ():
            if isinstance(node, cst.Assign) and any(dotted(t.target) in names for t in node.targets):
                sources.append(node.value)
            elif isinstance(node, cst.AugAssign) and dotted(node.target) in names:
                sources.append(node.value)
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and dotted(node.func.value) in names \
                    and node.func.attr.value in ("append", "extend", "insert", "add_param_group"):
                sources.append(node)
        for call in (found_call for source in sources for found_call in calls_in(source)):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters") and dotted(func.value):
                found.append(dotted(func.value))
        return found

    def _definitions(self) -> dict[str, cst.ClassDef | cst.FunctionDef]:
        module = self.context.module
        return {
            statement.name.value: statement
            for statement in module.body
            if isinstance(statement, (cst.ClassDef, cst.FunctionDef))
        }

    def _losses_trained(self, definitions: dict) -> dict[str, tuple[cst.ClassDef | cst.FunctionDef, list[cst.Call]]]:
        """Loss classes and functions of this file that a training loop calls (a class
        through the name its instance is bound to: ``criterion = TripletLoss()``), with those
        calls (not an evaluation the loop runs: it takes no step)."""
        instances = self._instances(definitions)
        found: dict[str, tuple[cst.ClassDef | cst.FunctionDef, list[cst.Call]]] = {}
        for loop in self.facts.training_steps:
            handed = self._handed_instances(loop, definitions)
            for call in calls_in(loop.body):
                name = dotted(call.func) or ""
                target = definitions.get(name) or definitions.get(handed.get(name) or instances.get(name, ""))
                if target is None or self._evaluates(call, name):
                    continue
                if isinstance(target, cst.ClassDef) and name == target.name.value:
                    continue  # (`train(..., TripletLoss(0.3))`: the instance is made, its calls are the step's)
                pattern = LOSS_CLASS if isinstance(target, cst.ClassDef) else LOSS_FUNCTION
                # (or a function or class of any name given the model's outputs: HCL's `criterion(out_1,
                # out_2, ...)`, KD-Zoo's relational `RKD(...)`)
                handed_outputs = name not in self.facts.model_names and self._given_outputs(call)
                if pattern.search(target.name.value) or handed_outputs:
                    found.setdefault(target.name.value, (target, []))[1].append(call)
        return found

    def _handed_instances(self, loop: cst.CSTNode, definitions: dict) -> dict[str, str]:
        """The parameters of the function around ``loop`` that its callers in this file hand an
        instance of a class of this file (``criterion`` of ``def train(..., criterion)`` called as
        ``train(..., TripletLoss(0.3))`` or with ``criterion = TripletLoss()``) -> that class."""
        function = self.context.parent(loop)
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = self.context.parent(function)
        if function is None or isinstance(self.context.parent(self.context.parent(function)), cst.ClassDef):
            return {}
        calls, instances, handed = self.facts.analyzer.calls, self._instances(definitions), {}
        for call, _ in calls.call_sites(function):
            for param in function.params.params:
                arg = calls.argument_for(function, param, call)
                made = dotted(arg.func) if isinstance(arg, cst.Call) else None
                cls = made if isinstance(definitions.get(made or ""), cst.ClassDef) else instances.get(dotted(arg) or "") if arg else None
                if cls is not None:
                    handed[param.name.value] = cls
        return handed

    def _instances(self, definitions: dict) -> dict[str, str]:
        """``criterion`` / ``self.criterion`` -> ``TripletLoss`` for ``criterion = TripletLoss(...)``."""
        instances = {}
        for node in walk(self.context.module):
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
                cls = dotted(node.value.func) or ""
                if isinstance(definitions.get(cls), cst.ClassDef):
                    for target in node.targets:
                        if dotted(target.target):
                            instances[dotted(target.target)] = cls
        return instances

    def _over_batch_totals(self, definition: cst.CSTNode) -> str | None:
        """How a loss of this file couples the batch through its totals, read by the rules the
        project's modules are read by: a division by a total over the batch (a soft Dice's
        ``(2 * (p * t).sum() + 1) / (p.sum() + t.sum() + 1)``, a count of valid elements), or
        the batch's hardest elements kept (OHEM). Each rank's share would give another loss."""
        import ast

        try:
            tree = ast.parse(textwrap.dedent(self.context.code(definition)))
        except SyntaxError:
            return None
        read = tree.body[0] if tree.body else None
        if read is None:
            return None
        if mines_the_batch(read):
            return "keeps the hardest elements of the batch"
        if normalised_by_a_count(read):
            return "divides by a total over the batch (its count or sum)"
        return None

    def _pairwise(self, definition: cst.CSTNode) -> cst.CSTNode | None:
        """A product of the batch with itself, both operands from the batch (not ``self.``)."""
        for node in walk(definition):
            if isinstance(node, cst.Call):
                operands = [arg.value for arg in node.args if arg.keyword is None]
                if self.context.qualified(node.func) & PAIRWISE_FUNCTIONS and operands and not any(_reads_self(o) for o in operands[:2]):
                    return node
            operands = _product_operands(node, MATRIX_PRODUCTS)
            # (`a @ b`: the right operand is the transposed one; a call may name either first)
            transposed = operands[1:] if isinstance(node, cst.BinaryOperation) else operands
            if any(_transposed(o) for o in transposed) and not any(_reads_self(o) for o in operands):
                return node
        return None

    def _updated_buffer(self, cls: cst.ClassDef) -> str | None:
        """A buffer the class registers that code of this file updates in place."""
        buffers = [
            call.args[0].value.evaluated_value
            for call in calls_in(cls)
            if (dotted(call.func) or "").endswith("register_buffer")
            and call.args
            and isinstance(call.args[0].value, cst.SimpleString)
        ]
        code = self.context.module.code
        for buffer in buffers:
            word = re.escape(buffer)
            if re.search(rf"\.{word}\[[^\]]*\]\s*=[^=]", code) or re.search(rf"\.{word}(\.data)?{IN_PLACE.pattern}", code):
                return buffer
        return None


def _transposed(node: cst.BaseExpression) -> bool:
    """``x.t()``, ``x.T``, ``x.transpose(0, 1)``, ``x.permute(1, 0)``, ``torch.t(x)`` (and
    ``x.t().contiguous()``)."""
    while isinstance(node, cst.Attribute) and node.attr.value == "data" or (
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("contiguous", "detach", "clone", "float")
    ):
        node = node.value if isinstance(node, cst.Attribute) else node.func.value
    if isinstance(node, cst.Attribute) and node.attr.value == "T":
        return True
    if isinstance(node, cst.Call):
        name = dotted(node.func) or ""
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "t" and not node.args:
            return True
        if name in ("torch.t",):
            return True
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("transpose", "permute"):
            values = [getattr(arg.value, "value", None) for arg in node.args]
            return values in (["0", "1"], ["1", "0"])
    return False


def _reads_self(node: cst.BaseExpression) -> bool:
    """Does the operand use an attribute of ``self`` (a weight, a centre table)?"""
    return any(isinstance(n, cst.Name) and n.value == "self" for n in walk(node))


def _makes_an_instance(value: cst.BaseExpression) -> bool:
    """A class's instance: ``losses.Proxy_Anchor(...).cuda()``, a class looked up in the
    configuration (proxynca_pp's ``config['criterion']['type'](...)``), one of several picked by
    a key or a test (CosFace's ``{'MCP': MarginCosineProduct(...), ...}[args.classifier_type]``)."""
    made = without_moves(value)
    if isinstance(made, cst.Subscript) and isinstance(made.value, cst.Dict):
        return bool(made.value.elements) and all(
            isinstance(element, cst.DictElement) and _makes_an_instance(element.value) for element in made.value.elements
        )
    if isinstance(made, cst.IfExp):
        return _makes_an_instance(made.body) and _makes_an_instance(made.orelse)
    return isinstance(made, cst.Call) and (
        (dotted(made.func) or "_").rpartition(".")[2][:1].isupper() or isinstance(made.func, cst.Subscript)
    )


def _product_operands(node: cst.CSTNode, methods: set[str]) -> list[cst.BaseExpression]:
    """The operands of a matrix product: ``a @ b``, or a call of one of ``methods``
    (``torch.mm(a, b)``, ``a.mm(b)``: the value a method is called on comes first)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return [node.left, node.right]
    if not isinstance(node, cst.Call):
        return []
    name = dotted(node.func) or ""
    method = node.func.attr.value if isinstance(node.func, cst.Attribute) else name.rpartition(".")[2]
    if method not in methods:
        return []
    operands = [arg.value for arg in node.args if arg.keyword is None]
    return [node.func.value, *operands] if isinstance(node.func, cst.Attribute) and not name.startswith("torch.") else operands


def _root(node: cst.BaseExpression) -> str | None:
    """The name a tensor expression starts from (``out`` of ``out.t().contiguous()``)."""
    while isinstance(node, (cst.Call, cst.Attribute, cst.Subscript)):
        node = node.func if isinstance(node, cst.Call) else node.value
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "torch":
            return None
    return node.value if isinstance(node, cst.Name) else None


def _batch_mean_of(node: cst.CSTNode, names: set[str]) -> bool:
    """``torch.mean(pred)``, ``t.mean(pred)``, ``pred.mean()``: the mean over every element."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute) or node.func.attr.value != "mean":
        return False
    if not node.args:
        return isinstance(node.func.value, cst.Name) and node.func.value.value in names
    return len(node.args) == 1 and isinstance(node.args[0].value, cst.Name) and node.args[0].value.value in names


def _centred(node: cst.CSTNode, names: set[str]) -> bool:
    """``pred_real - torch.mean(pred_fake)``: a model output less the batch mean of one."""
    if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, cst.Subtract):
        return False
    return _batch_mean_of(node.right, names) and isinstance(node.left, cst.Name) and node.left.value in names


def _data_names(node: cst.CSTNode) -> set[str]:
    """The names an operation or a call's arguments read: not attribute fields, not keywords
    (the caller keeps those the loop binds each step: the batch, outputs, losses)."""
    skipped = {id(n.attr) for n in walk(node) if isinstance(n, cst.Attribute)}
    skipped |= {id(a.keyword) for a in walk(node) if isinstance(a, cst.Arg) and a.keyword is not None}
    return {n.value for n in walk(node) if isinstance(n, cst.Name) and id(n) not in skipped}


def _readers(body: cst.CSTNode, names: set[str]) -> list[cst.CSTNode]:
    """The operations and calls (their arguments) in the body that read one of ``names``."""
    found = []
    for node in walk(body):
        if isinstance(node, cst.BinaryOperation) and _data_names(node) & names:
            found.append(node)
        elif isinstance(node, cst.Call) and any(_data_names(arg.value) & names for arg in node.args):
            found.append(cst.Tuple([cst.Element(arg.value) for arg in node.args]))
    return found

