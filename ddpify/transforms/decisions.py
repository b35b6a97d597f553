"""DDP8xx: decisions taken from a metric are the same on every rank.

DataParallel ran one process: a metric computed from the training batches covered the
whole global batch. Under DDP each rank has only its share, so a scheduler that decides
from it (``ReduceLROnPlateau.step(loss)``) would lower the learning rate on some ranks and
not others, and the ranks would train different models. The metric is averaged across
ranks first (``ddp_mean``, one all-reduce that every rank runs); a metric from the
unsharded evaluation is already the same on every rank, and its mean is itself.

DDP801  a metric-driven scheduler steps on the mean across ranks::

    scheduler.step(epoch_loss)   ->   scheduler.step(ddp_mean(epoch_loss))

DDP802  (warning) the step's conditions may differ between ranks (they read data): the mean
needs a collective that every rank reaches, so the metric is left as it is; check by hand
that it is the same on every rank.

DDP804  a counter of samples seen, built from the batch inside a training loop and used in
a condition (``used_sample += real_image.shape[0]``, then ``if used_sample > phase:``; squad's
countdown ``steps_till_eval -= batch_size`` of ``batch_size = cw_idxs.size(0)``; RWKV-LM's
``self.tokens += (y >= 0).sum()``, a count of the batch's elements, driving its warm-up),
counted the global batch under DataParallel; each rank now sees its share, so it counts the
world's samples::

    used_sample += real_image.shape[0]  ->  used_sample += ddp_sum(real_image.shape[0])

(the sum across ranks: a batch split at run time gives a short last batch's shares unequal
sizes, and every rank must count alike; a count some ranks skip is multiplied by the world
size instead). A learning rate set from the count (``g['lr'] = lr * min(1.0, tokens /
warmup)``) is a decision too.

DDP805  an early stop in the epoch loop on a value the loop computed (``train_loss =
train(...)``, or ``train_loss += ...`` in the training loop, then ``if train_loss < 0.5:
break``) decides on its mean across ranks, so every rank stops together, on the global
value DataParallel saw::

    if train_loss < 0.5:   ->   if ddp_mean(train_loss) < 0.5:

DDP807  an early-stop object that an epoch loop feeds a value it computed from the training
data (``early_stopping(train_loss, model, path)``, then ``if early_stopping.early_stop: break``)
is given the mean across ranks, so every rank's object decides alike and all stop together::

    early_stopping(train_loss, model, path)   ->   early_stopping(ddp_mean(train_loss), model, path)

DDP806  a training loop skips an iteration on what this rank computed or drew (``if loss.isnan():
continue``, CAIN's ``if loss > 10 * first_loss: continue`` after backward(), NetVlad's ``if query
is None: continue`` on its batch; the loop's counters are the same everywhere): one rank would
skip a backward or a step the others take (a hang, or ranks that drift apart). Every rank
reaches the test, so it is decided alike: a test of the loss on its mean across ranks, the
global batch's value DataParallel tested (a NaN share makes the mean NaN; a zero loss is zero on
every share); a test of anything else skips on every rank when it holds on any::

    if loss == 0:           ->   if ddp_mean(loss) == 0:
        continue                     continue
    if grad_norm.isnan():   ->   if ddp_any(grad_norm.isnan()):

DDP810  a test in a training loop of the loss backward() took, with state built in its branch
(datasetGAN's early stop: ``if loss.item() < best_loss: best_loss = loss.item(); break_count = 0``,
then ``if break_count > 50: break``) decides on the loss's mean across ranks, the global batch's
value DataParallel tested, and keeps that mean::

    if loss.item() < best_loss:            ->   if ddp_mean(loss).item() < best_loss:
        best_loss = loss.item()                     best_loss = ddp_mean(loss).item()

DDP808  a training step (``optimizer.step()``, ``backward()``) taken under a test of what this
rank computed (SiamMask's ``if is_valid_number(loss.item()): optimizer.step()``): one rank would
step and another not, and the copies of the model drift apart (or wait in an all-reduce).
A test of the loss decides on its mean across ranks, the value DataParallel tested::

    if is_valid_number(loss.item()):   ->   if is_valid_number(ddp_mean(loss).item()):
        optimizer.step()                        optimizer.step()

A test on anything else than a loss is taken by all ranks only when it holds on all (``ddp_all``).

DDP803  (warning) a training loop skips or leaves an iteration on a per-rank condition that
not every rank reaches (under another per-rank condition), or an ``except`` around
``backward()``: one rank then skips a backward the others run, and DDP's all-reduce waits for
it forever (a hang). Make the decision the same on every rank (all-reduce the condition) or
remove it.
"""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis.ranks import loop_counters, under_rank_guard
from ddpify.analysis.tree import backward_takes
from ddpify.analysis import batch_length, calls_in, dotted, first_positional, innermost_loop, is_training_call, loop_names_around, same_on_every_rank, same_path_on_every_rank, walk
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform


# An assignment that sets a learning rate (`lr = ...`, `g["lr"] = ...`, `self.learning_rate = ...`)
LEARNING_RATE = re.compile(r"(?<![A-Za-z0-9])lr(?![A-Za-z0-9])|learning_rate")


class DecisionsTransform(Transform):
    CODE_PREFIX = "DDP8"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._averaged_tests: dict[cst.If, set[str]] = {}  # early stops decided on the mean
        self._agreed_tests: set[cst.If] = set()  # per-rank skips decided alike on every rank
        self._stepping_tests: set[cst.If] = set()  # training steps taken on a per-rank test
        self._stepping_after_loops: set[cst.If] = set()  # those after a step function's loop, on losses
        self._fed_metrics: dict[cst.Name, str] = {}  # loop-computed values an early-stop object is given
        self._on_the_loss: dict[cst.If, set[str]] = {}  # tests of the training loss decided on its mean

    def check(self) -> None:
        # Training loops, and epoch loops around them (`for epoch ...: train(...)`), where an
        # early stop on a per-rank value leaves the other ranks waiting.
        loops = dict.fromkeys([*self.facts.training_loops, *self.facts.epoch_hooks])
        for loop in loops:
            self._report_per_rank_skips(loop)
        for loop in self._epoch_loops():
            self._average_what_deciders_are_given(loop)
        self._stepping_after_loops = set(self._steps_on_a_loss_after_the_loop())
        self._on_the_loss = self._tests_of_the_training_loss()

    def _tests_of_the_training_loss(self) -> dict[cst.If, set[str]]:
        """A test in a training loop that reads the loss backward() took (datasetGAN's early stop:
        ``if loss.item() < best_loss: best_loss = loss.item(); break_count = 0``, then a counter
        that breaks the loop), every rank reaching it: DataParallel tested the global batch's
        loss; each rank has its share's. It decides on the mean across ranks, and what its branch
        keeps of the loss is that mean, so the state it builds is the same on every rank."""
        found: dict[cst.If, set[str]] = {}
        handled = self._agreed_tests | self._stepping_tests | self._stepping_after_loops | set(self._averaged_tests)
        for loop in self.facts.training_loops:
            taken = {n.value for expr in backward_takes(loop) for n in walk(expr) if isinstance(n, cst.Name)}
            for node in walk(loop.body):
                if not isinstance(node, cst.If) or node in handled or innermost_loop(node, self.context.parent) is not loop:
                    continue
                losses = self._losses_tested(node.test) & taken
                if losses and same_path_on_every_rank(node, self.context.parent) and not under_rank_guard(node, self.context.parent, self.context.code):
                    found[node] = losses
        return found

    def _steps_on_a_loss_after_the_loop(self) -> list[cst.If]:
        """``if loss_batch < self.skip_threshold * self.last_epoch_loss: self.optimizer.step()``
        after a loop of backward() passes, in a step function (SRFBN's train_step(), outside any
        training loop): decided on this rank's loss, one rank would step and another not."""
        found = []
        for node in walk(self.context.module):
            if not isinstance(node, cst.If) or node in self._stepping_tests or isinstance(innermost_loop(node, self.context.parent), (cst.For, cst.While)):
                continue
            function = self.context.parent(node)
            while function is not None and not isinstance(function, (cst.FunctionDef, cst.Module)):
                function = self.context.parent(function)
            if not isinstance(function, cst.FunctionDef) or not any(
                isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward" for call in calls_in(function)
            ):
                continue
            if (
                any(is_training_call(call) for call in calls_in(node.body)) and self._losses_tested(node.test)
                and same_path_on_every_rank(node, self.context.parent)
            ):
                found.append(node)
        return found

    def _epoch_loops(self) -> list[cst.CSTNode]:
        """Loops around a training loop (the epoch loops), whatever draws the data."""
        training = set(self.facts.training_loops)
        return [
            loop for loop in dict.fromkeys([*self.facts.epoch_hooks, *self.facts.training_loops])
            if isinstance(loop, (cst.For, cst.While))
            and (loop in self.facts.epoch_hooks or any(inner in training for inner in walk(loop.body)))
        ]

    def _average_what_deciders_are_given(self, loop: cst.CSTNode) -> None:
        """An early stop that reads an object's state (``if early_stopping.early_stop: break``)
        which a call in the loop fed a value the loop computed from its share of the data
        (``early_stopping(train_loss, model, path)``, LTSF-Linear's --train_only): each rank's
        object would decide on its own shard's value, one rank would leave and the others wait
        in the next all-reduce. The object is given the mean across ranks, as DataParallel
        gave it the global value, so every rank decides alike."""
        computed = self._computed(loop) - self._evaluated(loop)
        deciders = {
            base
            for node in walk(loop.body)
            if isinstance(node, cst.If) and innermost_loop(node, self.context.parent) is loop
            and any(isinstance(inner, (cst.Break, cst.Return)) for inner in walk(node.body))
            for base in _objects_read(node.test)
        }
        if not deciders or not computed:
            return
        for call in calls_in(loop.body):
            name = dotted(call.func) or ""
            if name not in deciders and name.rpartition(".")[0] not in deciders:
                continue
            if innermost_loop(call, self.context.parent) is not loop or not same_path_on_every_rank(call, self.context.parent):
                continue
            fed = [arg.value for arg in call.args if isinstance(arg.value, cst.Name) and arg.value.value in computed]
            for value in fed:
                self._fed_metrics[value] = name

    def _report_per_rank_skips(self, loop: cst.CSTNode) -> None:
        # (the loop's counters, never what it draws: NetVlad's `if query is None: continue` tests the batch)
        loop_names = loop_names_around(loop, self.context.parent) - _drawn(loop) | loop_counters(loop) if isinstance(loop, cst.For) else set()
        for node in walk(loop.body):
            if innermost_loop(node, self.context.parent) is not loop:
                continue  # checked with its own loop's counters
            if (
                isinstance(node, cst.If) and loop in self.facts.training_loops and self._may_differ(loop, node, loop_names)
                and any(isinstance(inner, cst.Call) and (is_training_call(inner) or self._a_step_function(inner)) for inner in walk(node.body))
                and not any(isinstance(inner, (cst.Continue, cst.Break)) for inner in walk(node.body))
                and same_path_on_every_rank(node, self.context.parent)
            ):
                self._stepping_tests.add(node)
            elif isinstance(node, cst.If) and self._may_differ(loop, node, loop_names):
                if any(isinstance(inner, (cst.Continue, cst.Break)) for inner in walk(node.body)):
                    metrics = self._epoch_metrics(loop, node) if loop in self.facts.epoch_hooks else None
                    if metrics:
                        self._averaged_tests[node] = metrics
                    elif loop in self.facts.training_loops and same_path_on_every_rank(node, self.context.parent):
                        self._agreed_tests.add(node)
                    else:
                        self._hang_risk(node, f"`if {self.context.code(node.test)}:` skips an iteration")
            if isinstance(node, cst.Try) and node.handlers and any(
                isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward" for call in calls_in(node.body)
            ):
                self._hang_risk(node, "an exception handler around backward() skips it")

    def _a_step_function(self, call: cst.Call) -> bool:
        """A call of a step function of the file (NeuroTalk's ``train_G(...)``, which runs
        backward() and the optimizer's step)."""
        return dotted(call.func) in {function.name.value for function in self.facts.step_functions}

    def _may_differ(self, loop: cst.CSTNode, test_owner: cst.If, loop_names: set[str]) -> bool:
        """Does the test read data (a loss, a call) or, in an epoch loop, a value the loop
        computed (``average = train(...)``), and so possibly differ between ranks?"""
        reads = _reads_data(test_owner.test) or (
            loop in self.facts.epoch_hooks and bool(_variables(test_owner.test) & self._computed(loop))
        ) or (
            # (GANet: `valid = target[mask].size()[0]`, then `if valid > 0:` around the whole step)
            loop in self.facts.training_loops and bool(_variables(test_owner.test) & (self._taken_from_data(loop) | _drawn(loop)))
        )
        return reads and not same_on_every_rank(test_owner.test, loop_names)

    def _taken_from_data(self, loop: cst.CSTNode) -> set[str]:
        """Names a training loop binds from an indexing or a call (what it draws and computes
        from the batch), not from counting (``step = step + 1``)."""
        return {
            name
            for node in walk(loop.body)
            if isinstance(node, cst.Assign) and innermost_loop(node, self.context.parent) is loop
            and any(isinstance(part, (cst.Subscript, cst.Call)) for part in walk(node.value))
            for target in node.targets
            for name in [dotted(target.target)]
            if name
        }

    def _epoch_metrics(self, loop: cst.CSTNode, test_owner: cst.If) -> set[str] | None:
        """Names an epoch loop's early stop reads that the loop computes. Averaged across ranks
        they are the same on every rank. None when the test reads anything else that may differ."""
        computed = self._computed(loop)
        reads = _variables(test_owner.test)
        data = {name for name in reads if "loss" in name.lower() or name in computed}
        if not data or not data <= computed or any(name not in computed and not name.isupper() for name in reads - data):
            return None
        return data

    def _computed(self, loop: cst.CSTNode) -> set[str]:
        """Names the loop assigns from a call (``train_loss = train(...)``) or accumulates
        (``train_loss += loss.item()`` in the training loop, then ``train_loss /= n``)."""
        return {
            name
            for node in walk(loop.body)
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and innermost_loop(node, self.context.parent) is loop
            for target in node.targets
            for name in [dotted(target.target)]
            if name
        } | {
            name
            for node in walk(loop.body)
            if isinstance(node, cst.AugAssign) and not self._counts_passes(node)
            for name in [dotted(node.target)]
            if name
        }

    def _counts_passes(self, node: cst.AugAssign) -> bool:
        """``epoch_count += 1`` on every rank's path: a count of the loop's passes, alike on
        every rank (crnn-pytorch's `if epoch_count == max_epochs: break`)."""
        return isinstance(node.value, (cst.Integer, cst.Float)) and same_path_on_every_rank(node, self.context.parent)

    def _evaluated(self, loop: cst.CSTNode) -> set[str]:
        """Names the loop assigns from an evaluation call (``vali_loss = self.vali(...)``): the
        evaluation data is whole on every rank, so the value is already the same everywhere."""
        return {
            name
            for node in walk(loop.body)
            if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call)
            and any(word in (dotted(node.value.func) or "").rpartition(".")[2].lower() for word in ("val", "eval", "test"))
            for target in node.targets
            for name in [dotted(target.target)]
            if name
        }

    def _losses_tested(self, test: cst.BaseExpression) -> set[str]:
        """The loss names a test reads (averaged across ranks, the value DataParallel tested);
        none where the test runs the model itself."""
        if any(dotted(call.func) in self.facts.model_names for call in calls_in(test)):
            return set()
        # (a variable, not a field's name: DIP2021's `if args.loss == 'mseloss':` reads a setting)
        fields = {id(n.attr) for n in walk(test) if isinstance(n, cst.Attribute)}
        return {n.value for n in walk(test) if isinstance(n, cst.Name) and "loss" in n.value.lower() and id(n) not in fields}

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if original_node in self._stepping_after_loops:
            # (the losses a step function keeps, `self.last_epoch_loss = loss_batch`, are each
            # rank's own too: their mean is the global batch's, as DataParallel kept it)
            self.context.use_helper("ddp_mean")
            self.context.report(
                original_node, "DDP808",
                f"`if {self.context.code(original_node.test)}:` takes a training step on this rank's losses: it decides on "
                "their means across ranks, the global batch's values, so every rank steps alike",
            )
            return updated_node.with_changes(test=updated_node.test.visit(_AverageLossReads()))
        if original_node in self._stepping_tests:
            shown = self.context.code(original_node.test)
            losses = self._losses_tested(original_node.test)
            if losses:
                # on the loss DataParallel saw: the mean of the ranks' losses, the same everywhere
                self.context.use_helper("ddp_mean")
                self.context.report(
                    original_node, "DDP808",
                    f"`if {shown}:` takes a training step on this rank's {', '.join(sorted(losses))}: it decides on the "
                    "mean across ranks, the global batch's value, so every rank steps alike",
                )
                return updated_node.with_changes(test=updated_node.test.visit(_AverageValues(losses)))
            reduced = self._on_global_totals(original_node, updated_node, "DDP808", "takes a training step")
            if reduced is not None:
                return reduced
            self.context.use_helper("ddp_all")
            self.context.report(
                original_node,
                "DDP808",
                f"`if {shown}:` takes a training step on what this rank computed: every rank takes it only when "
                "all may (ddp_all), so the model stays the same on every rank",
            )
            return updated_node.with_changes(test=cst.Call(func=cst.Name("ddp_all"), args=[cst.Arg(updated_node.test)]))
        if original_node in self._agreed_tests:
            shown = self.context.code(original_node.test)
            losses = self._losses_tested(original_node.test)
            if losses:
                # the skip DataParallel decided on the global batch's loss (signatrix EfficientDet's
                # `if loss == 0: continue`: skipped only when no share had a box; a NaN share still
                # makes the mean NaN)
                self.context.use_helper("ddp_mean")
                self.context.report(
                    original_node, "DDP806",
                    f"`if {shown}:` skips a training step on this rank's {', '.join(sorted(losses))}: it decides on the "
                    "mean across ranks, the global batch's value DataParallel tested, so all take the same steps",
                )
                return updated_node.with_changes(test=updated_node.test.visit(_AverageValues(losses)))
            reduced = self._on_global_totals(original_node, updated_node, "DDP806", "skips a training step")
            if reduced is not None:
                return reduced
            self.context.use_helper("ddp_any")
            self.context.report(
                original_node,
                "DDP806",
                f"`if {self.context.code(original_node.test)}:` skips a training step on what this rank computed: "
                "every rank skips when any does (ddp_any), so all take the same steps",
            )
            return updated_node.with_changes(test=cst.Call(func=cst.Name("ddp_any"), args=[cst.Arg(updated_node.test)]))
        if original_node in self._on_the_loss:
            losses = self._on_the_loss[original_node]
            self.context.use_helper("ddp_mean")
            self.context.report(
                original_node, "DDP810",
                f"`if {self.context.code(original_node.test)}:` decides on this rank's {', '.join(sorted(losses))}: it "
                "decides on the mean across ranks, the global batch's value DataParallel tested, and keeps that mean, "
                "so every rank builds the same state from it",
            )
            body = updated_node.body.with_changes(body=[
                statement.visit(_AverageValues(losses)) if _keeps(statement, losses) else statement
                for statement in updated_node.body.body
            ])
            return updated_node.with_changes(test=updated_node.test.visit(_AverageValues(losses)), body=body)
        metrics = self._averaged_tests.get(original_node)
        if not metrics:
            return updated_node
        self.context.use_helper("ddp_mean")
        shown = ", ".join(sorted(metrics))
        self.context.report(original_node, "DDP805", f"the early stop decides on the mean of {shown} across ranks, the same on every rank")
        return updated_node.with_changes(test=updated_node.test.visit(_AverageNames(metrics)))

    def _on_global_totals(self, original: cst.If, updated: cst.If, code: str, what: str) -> cst.If | None:
        """A test on a total of the batch (ReInfoSelect's ``if action.sum().item() < 1 and step %
        args.T != 0: continue``): DataParallel tested the global batch's total, so the total is
        summed (a mean averaged) across ranks first, and the test is then the same everywhere.
        None where something else in the test is this rank's own."""
        totals = _GlobalTotals()
        original.test.visit(totals)
        if not totals.found:
            return None
        uniform = original.test.visit(_GlobalTotals(stand_in=True))
        if not same_on_every_rank(uniform, loop_names_around(original, self.context.parent)):
            return None
        for helper in totals.helpers:
            self.context.use_helper(helper)
        reduced = ", ".join(self.context.code(node) for node in totals.found)
        self.context.report(
            original, code,
            f"`if {self.context.code(original.test)}:` {what} on a total of this rank's share ({reduced}): it tests the "
            "total across ranks, the global batch's DataParallel tested, so every rank decides alike",
        )
        return updated.with_changes(test=updated.test.visit(_GlobalTotals()))

    def leave_AugAssign(self, original_node: cst.AugAssign, updated_node: cst.AugAssign) -> cst.AugAssign:
        counter = dotted(original_node.target)
        counting = isinstance(original_node.operator, (cst.AddAssign, cst.SubtractAssign))
        if not (counting and counter and self._a_batch_length(original_node.value, original_node)):
            return updated_node
        if not self._in_training_loop(original_node) or not self._decides(counter):
            return updated_node
        if same_path_on_every_rank(original_node, self.context.parent):
            # (the sum across ranks, not this rank's count times the world size: the shares of a
            # batch split at run time differ in a short last batch, and every rank must agree on
            # what the count decides: decision-transformer's learning rate)
            self.context.use_helper("ddp_sum")
            self.context.report(
                original_node,
                "DDP804",
                f"`{counter}` counts samples and decides something: it now counts every rank's (the sum across ranks)",
            )
            return updated_node.with_changes(value=cst.Call(func=cst.Name("ddp_sum"), args=[cst.Arg(updated_node.value)]))
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(
            original_node,
            "DDP804",
            f"`{counter}` counts samples and decides something: it now counts every rank's (x world size)",
        )
        value = self.context.code(updated_node.value)
        return updated_node.with_changes(value=cst.parse_expression(f"{value} * {self.context.world_size}"))

    def _a_batch_length(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``x.shape[0]``, or a name the training loop binds to one (squad's ``batch_size =
        cw_idxs.size(0)``, then ``steps_till_eval -= batch_size``)."""
        if batch_length(value) or _a_batch_count(value):
            return True
        if not isinstance(value, cst.Name):
            return False
        loop = next((loop for loop in self.facts.training_loops if any(node is at for node in walk(loop.body))), None)
        bound = [
            node.value for node in walk(loop.body) if isinstance(node, cst.Assign)
            for target in node.targets if isinstance(target.target, cst.Name) and target.target.value == value.value
        ] if loop is not None else []
        return bool(bound) and all(batch_length(found) for found in bound)

    def _in_training_loop(self, node: cst.CSTNode) -> bool:
        parent = self.context.parent(node)
        while parent is not None and not isinstance(parent, cst.Module):
            if parent in self.facts.training_loops:
                return True
            parent = self.context.parent(parent)
        return False

    def _decides(self, counter: str) -> bool:
        """Is the counter read by an `if`/`while` test anywhere in the file, or in a learning
        rate set from it (``g['lr'] = base * min(1.0, tokens / warmup)``)?"""
        read = lambda node: counter in {dotted(n) for n in walk(node) if isinstance(n, (cst.Name, cst.Attribute))}  # noqa: E731
        if any(isinstance(node, (cst.If, cst.While)) and read(node.test) for node in self._tests()):
            return True
        return any(read(node.value) and any(LEARNING_RATE.search(self.context.code(t.target)) for t in node.targets) for node in self._assignments())

    def _assignments(self) -> list[cst.Assign]:
        if not hasattr(self, "_assigns"):
            self._assigns = [node for node in walk(self.context.module) if isinstance(node, cst.Assign)]
        return self._assigns

    def _tests(self) -> list[cst.CSTNode]:
        if not hasattr(self, "_conditionals"):
            self._conditionals = [node for node in walk(self.context.module) if isinstance(node, (cst.If, cst.While))]
        return self._conditionals

    def _hang_risk(self, node: cst.CSTNode, what: str) -> None:
        self.context.report(
            node,
            "DDP803",
            f"{what} on one rank only: the other ranks wait in DDP's all-reduce (a hang); "
            "make the decision the same on every rank",
            Severity.WARNING,
        )

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        decider = self._fed_metrics.get(original_node)
        if decider is None:
            return updated_node
        self.context.use_helper("ddp_mean")
        self.context.report(
            original_node,
            "DDP807",
            f"`{decider}(...)` decides an early stop from `{original_node.value}`, which may differ between ranks (a "
            "share of the data, or a model's draws that differ per rank): it is given the mean across ranks, so every "
            "rank stops together",
        )
        return cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node)])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = original_node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step"):
            return updated_node
        if dotted(func.value) not in self.facts.metric_schedulers:
            return updated_node
        metric = first_positional(updated_node, "metrics")
        if metric is None:
            return updated_node
        shown = self.context.code(first_positional(original_node, "metrics"))
        if not same_path_on_every_rank(original_node, self.context.parent):
            self.context.report(
                original_node,
                "DDP802",
                f"`{shown}` decides the learning rate, and this step's conditions may differ between ranks: "
                "make sure every rank passes the same value",
                Severity.WARNING,
            )
            return updated_node
        self.context.use_helper("ddp_mean")
        self.context.report(original_node, "DDP801", f"the scheduler decides from `{shown}` averaged across ranks")
        averaged = cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(metric)])
        return updated_node.with_changes(
            args=[arg.with_changes(value=averaged) if arg.value is metric else arg for arg in updated_node.args]
        )


def _a_batch_count(value: cst.BaseExpression) -> bool:
    """A count of the batch's elements: ``(y >= 0).sum()`` (RWKV's tokens seen, which drive its
    learning-rate warm-up), ``mask.sum()`` of a comparison, ``x.numel()``, through ``.item()``
    and ``int()``."""
    while isinstance(value, cst.Call) and (
        isinstance(value.func, cst.Attribute) and value.func.attr.value == "item" and not value.args
        or isinstance(value.func, cst.Name) and value.func.value in ("int", "float") and len(value.args) == 1
    ):
        value = value.func.value if isinstance(value.func, cst.Attribute) else value.args[0].value
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and not value.args):
        return False
    if value.func.attr.value in ("numel", "nelement"):
        return True
    counted = value.func.value
    while isinstance(counted, cst.Call) and isinstance(counted.func, cst.Attribute) and counted.func.attr.value in ("float", "long", "int"):
        counted = counted.func.value
    return value.func.attr.value == "sum" and isinstance(counted, cst.Comparison)


def _drawn(loop: cst.CSTNode) -> set[str]:
    """The names of a loop's target that are not counters (what it draws)."""
    if not isinstance(loop, cst.For):
        return set()
    return {name.value for name in walk(loop.target) if isinstance(name, cst.Name)} - loop_counters(loop)


def _reads_data(test: cst.BaseExpression) -> bool:
    """Does a condition look at data (a call such as ``torch.isnan(loss)``, or a loss)?
    Counters against settings (``i >= epoch_size``) are the same on every rank."""
    calls = [dotted(call.func) for call in calls_in(test)]
    if any(name not in ("len", "range", "min", "max", "int", "float") for name in calls):
        return True
    return any("loss" in node.value.lower() for node in walk(test) if isinstance(node, cst.Name))


def _variables(test: cst.BaseExpression) -> set[str]:
    """Variables a condition reads (not attribute fields, not called names)."""
    nodes = walk(test)
    skip = {id(part) for n in nodes if isinstance(n, cst.Attribute) for part in (n.attr, n.value)}  # `args.delta`: a setting
    skip |= {id(n.func) for n in nodes if isinstance(n, cst.Call)}
    return {
        n.value for n in nodes
        if isinstance(n, cst.Name) and id(n) not in skip and n.value not in ("True", "False", "None")
    }


def _objects_read(test: cst.BaseExpression) -> set[str]:
    """The objects whose state a condition reads: ``early_stopping`` of ``early_stopping.early_stop``,
    ``self.stopper`` of ``self.stopper.should_stop()``."""
    found = set()
    for node in walk(test):
        target = node.func if isinstance(node, cst.Call) else node
        if isinstance(target, cst.Attribute):
            base = dotted(target.value)
            if base and base not in ("args", "self", "opt", "cfg", "config", "np", "torch", "math"):
                found.add(base)
    return found


TOTALS = {"sum": "ddp_sum", "mean": "ddp_mean"}
READS = ("item", "float", "double", "long", "int", "cpu", "detach", "data")


def _total_of(node: cst.BaseExpression) -> str | None:
    """``x.sum()`` / ``x.mean()`` over everything (``.item()``, ``.float()``, ``.data`` around it):
    the helper that takes it across ranks."""
    while isinstance(node, (cst.Call, cst.Attribute)):
        attribute = node.func if isinstance(node, cst.Call) else node
        if not isinstance(attribute, cst.Attribute):
            return None
        name = attribute.attr.value
        if isinstance(node, cst.Call) and name in TOTALS and not node.args:
            return TOTALS[name]
        if name not in READS or isinstance(node, cst.Call) and node.args:
            return None
        node = attribute.value
    return None


class _GlobalTotals(cst.CSTTransformer):
    """Each total of a condition taken across ranks (``ddp_sum(action.sum().item())``), or with
    ``stand_in`` replaced by a constant (to ask whether the rest is the same on every rank)."""

    def __init__(self, stand_in: bool = False) -> None:
        super().__init__()
        self.stand_in, self.found, self.helpers, self._outer = stand_in, [], set(), []

    def visit_Call(self, node: cst.Call) -> bool:
        helper = _total_of(node)
        if helper is None:
            return True
        self.found.append(node)
        self.helpers.add(helper)
        self._outer.append(node)
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self._outer:
            return updated_node
        if self.stand_in:
            return cst.Name("TOTAL")
        return cst.Call(func=cst.Name(_total_of(original_node)), args=[cst.Arg(updated_node)])


def _keeps(statement: cst.CSTNode, losses: set[str]) -> bool:
    """``best_loss = loss.item()``: an assignment in a branch that keeps the loss's value."""
    return (
        isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 and isinstance(statement.body[0], cst.Assign)
        and any(isinstance(n, cst.Name) and n.value in losses for n in walk(statement.body[0].value))
    )


class _AverageValues(cst.CSTTransformer):
    """``loss`` -> ``ddp_mean(loss)`` inside one condition, also where a value is read from it
    (``loss.item()``), never a field of the same name (``self.loss``, ``x.loss``)."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if original_node.attr.value in self.names:
            return updated_node.with_changes(attr=original_node.attr)  # a field: left as it is
        return updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node.value in self.names:
            return cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node)])
        return updated_node


class _AverageLossReads(cst.CSTTransformer):
    """``loss_batch`` and ``self.last_epoch_loss`` -> their ``ddp_mean(...)`` inside one condition."""

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return "loss" not in node.attr.value.lower()

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if "loss" in original_node.attr.value.lower():
            return cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node)])
        return updated_node

    def visit_Call(self, node: cst.Call) -> bool:
        return True

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node)]) if "loss" in original_node.value.lower() else updated_node


class _AverageNames(cst.CSTTransformer):
    """``train_loss`` -> ``ddp_mean(train_loss)`` inside one condition."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # `self.loss` / `x.loss`: fields, not the variable

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node.value in self.names:
            return cst.Call(func=cst.Name("ddp_mean"), args=[cst.Arg(updated_node)])
        return updated_node
