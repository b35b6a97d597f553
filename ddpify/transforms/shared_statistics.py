"""DDP810-DDP811: a training statistic a decision or the next losses read is averaged across ranks where it is computed.

DataParallel's running loss (``loss_sum += loss.item()``) added up the global batch's; each DDP
rank adds up its own share's. A value computed from it that a test reads decided on rank 0's
share once converted: a deraining trainer's ``avg_loss = loss_sum / iteration``, then ``if
min_avg_loss > avg_loss: save_checkpoint(...)``, skipped a checkpoint the original wrote (and
would write one it did not), while its log, averaged where printed (DDP608), showed the global
value. Averaged where it is computed, every use sees the global batch's value DataParallel saw:
the test, what the branch keeps (``min_avg_loss = avg_loss``), the print, what is saved.

DDP810  a value computed from a loss the training loop adds up, or a loss's number
(``last_loss = loss.item()``), read by a test, is its mean across ranks (``ddp_mean``, one
all-reduce every rank runs)::

    avg_loss = loss_sum / iteration   ->   avg_loss = ddp_mean(loss_sum / iteration)
    if min_avg_loss > avg_loss:            if min_avg_loss > avg_loss:
        save_checkpoint(model)                 save_checkpoint(model)

DDP811  a loss's number that the next losses are computed from (a controller: BEGAN's balance term,
``real = getValue(loss_d_real)``, then ``kt = kt + lambda_k * (gamma * real - fake)`` and the next
step's ``loss_d = loss_d_real - kt * loss_d_fake``) is its mean across ranks where it is made:
DataParallel fed back the global batch's value; each rank's own would give every rank its own
``kt``, and their gradients, averaged by DDP, would belong to no one loss::

    real = getValue(loss_d_real)   ->   real = ddp_mean(getValue(loss_d_real))

DDP812  what a training function returns, computed from the loss its loop adds up (``return
total / n``, a name bound to such a value), is its mean across ranks where it is returned: its
callers, in this module or another (a base class's ``self.sched.step(metrics=self.train())``, a
checkpoint, a log), see the global batch's value, as DataParallel's caller did (the sum across
ranks for a share divided by the whole data set's size)::

    return total / n   ->   return ddp_mean(total / n)

A loop adds up by ``+=`` or by updating a meter with each batch's number (OKDDip's
``loss_avg.update(loss.item())``; not a clock's ``batch_time.update(time.time() - end)``), and a dict
written out of such values is averaged entry by entry::

    train_metrics = {'train_loss': loss_avg.value(), 'train_accTop1': accTop1_avg.value()}
    # becomes
    train_metrics = ddp_mean({'train_loss': loss_avg.value(), 'train_accTop1': accTop1_avg.value()})

The callers' names for an averaged return, and text made of it (``metrics_string``), are printed as
they are (DDP608 adds no second mean).

Only where every rank computes it (conditions on counters and settings, no exception handler,
no rank guard), in the script itself (an imported module's callers are out of sight), and never
for a loss that backward() takes (its gradient is DDP's to average).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import dotted, names_in, same_path_on_every_rank, under_rank_guard, walk
from ddpify.analysis.entry import callers_run_after_setup, runs_after_setup
from ddpify.analysis.tree import derived_from, differentiated, scope_of, loop_origins, own_nodes, reaching_backward, unconverted
from ddpify.analysis.data_sites import training_condition
from ddpify.analysis.statistics import constructs, is_loss, loss_derived, names_holding, over_whole_data, text_value
from ddpify.transforms.base import Transform
from ddpify.transforms.step_results import bound_results


class SharedStatisticsTransform(Transform):
    CODE_PREFIX = "DDP81"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._averaged: dict[cst.Assign, str] = {}  # assignment -> the name it binds
        self._numbers: set[cst.Assign] = set()  # of those, a loss's number (`last = loss.item()`)
        self._controls: set[cst.Assign] = set()  # of those, numbers the next steps' losses read (BEGAN's kt)
        self._returned: dict[cst.CSTNode, set[str]] = {}  # a returned value (original node) -> what its loop adds up
        self._added_up_for: dict[cst.Assign, set[str]] = {}  # an averaged assignment -> what its loop adds up
        self._returned_bindings: set[cst.Assign] = set()  # of those, the ones only a return reads (DDP812)
        self._scaled_names: frozenset[str] | None = None

    def check(self) -> None:
        if self.context.rank_read_at_run_time or not self.facts.training_loops:
            return
        derived = loss_derived(self.context.module)
        self._callers = callers_run_after_setup(self.facts, self.context.parent, self._reaches)
        for loop in self.facts.training_loops:
            scope = self._scope_of(loop)
            added_up = _added_up(loop, derived)
            tested, taken = _tested_names(scope), differentiated(scope)
            # (a training function's returned statistic: its callers decide, save or log from it, DDP812)
            returned = _returned_names(scope) if self._returns_its_statistics(scope, loop) else set()
            fed_back = _read_by_the_losses(loop)
            for node in own_nodes(scope):
                number = _loss_number_bound(node, derived)
                name = _statistic_bound(node, added_up) or number
                if name is None or name in taken or taken & added_up:
                    continue
                controls = number is not None and bool(derived_from({name}, loop.body) & fed_back)
                if (name in tested or controls or name in returned) and self._every_rank_computes(node):
                    self._averaged[node] = name
                    # (a loop over phases holds a share after a training pass, the whole set after
                    # another: no sum across ranks for it, its mean as before)
                    self._added_up_for[node] = added_up if self._returns_its_statistics(scope, loop) else set()
                    if name not in tested and not controls:
                        self._returned_bindings.add(node)
                    if number:
                        self._numbers.add(node)
                    if controls:
                        self._controls.add(node)
            if isinstance(scope, cst.FunctionDef):
                self._plan_returned(scope, loop, added_up)
        self.context.averaged_statistics |= {(self._scope_of(node), name) for node, name in self._averaged.items()}
        # (and the callers' names for what a training function returns averaged, DDP812: OKDDip's
        # `train_metrics = train(...)`, then logged: no second mean there)
        averaged_returns = {self._scope_of(node) for node in [*self._returned, *self._returned_bindings]}
        if averaged_returns:
            results = bound_results(self.context.module, self.context.parent)
            for function in averaged_returns:
                if isinstance(function, cst.FunctionDef):
                    self.context.averaged_statistics |= results.get(function.name.value, set())

    @property
    def _world_scaled_names(self) -> frozenset[str]:
        """Names holding a summed loss DDP116 scaled by the world size: the global batch's already."""
        if self._scaled_names is None:
            self._scaled_names = names_holding(self.context.module, self.context.world_scaled)
        return self._scaled_names

    def _returns_its_statistics(self, scope: cst.CSTNode, loop: cst.CSTNode) -> bool:
        """A training function whose loop only trains (one that also evaluates returns a share
        after a training pass, the whole set's after another)."""
        return isinstance(scope, cst.FunctionDef) and scope not in self.facts.training_and_evaluating and training_condition(loop, self.facts) is None

    def _plan_returned(self, function: cst.FunctionDef, loop: cst.CSTNode, added_up: set[str]) -> None:
        """The values ``function`` returns that it computed from what its training loop adds up
        (DDP812), where every rank returns them; not a loop that also evaluates (its value is
        a share after a training pass, the whole set's after another)."""
        if not added_up or not self._returns_its_statistics(function, loop):
            return
        scaled = self._world_scaled_names
        for node in own_nodes(function):
            if not (isinstance(node, cst.Return) and node.value is not None) or not self._reaches(self.context.parent(node)):
                continue
            values = [element.value for element in node.value.elements] if isinstance(node.value, cst.Tuple) else [node.value]
            for value in values:
                names = {found.value for found in names_in(value)}
                if not names & added_up or text_value(value) or constructs(value) or names & scaled:
                    continue
                if isinstance(value, cst.Name) or any(isinstance(found, (cst.Lambda, cst.ListComp, cst.Dict, cst.List)) for found in walk(value)):
                    continue  # (a name: its binding is averaged as any statistic is; a container: left as it is)
                self._returned[value] = added_up

    def _scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        return scope_of(node, self.context.parent)

    def _every_rank_computes(self, node: cst.Assign) -> bool:
        """On every rank's path in its function, not for rank 0 alone (a rank guard, or a block
        rank_zero puts on rank 0: a `with open(...)` one), after the set-up, and, in a
        function, at every call of it (a helper called from an `except` is not)."""
        statement = self.context.parent(node)
        return self._reaches(statement) and runs_after_setup(statement, self.facts, self.context.parent, self._callers)

    def _reaches(self, statement: cst.CSTNode) -> bool:
        guarded = self.context.rank_zero_only
        return (
            same_path_on_every_rank(statement, self.context.parent)
            and not under_rank_guard(statement, self.context.parent, self.context.code)
            and not (guarded is not None and guarded(statement))
        )

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> cst.Return:
        if isinstance(original_node.value, cst.Tuple) and isinstance(updated_node.value, cst.Tuple):
            elements = [
                new.with_changes(value=self._across_ranks(old.value, new.value))
                for old, new in zip(original_node.value.elements, updated_node.value.elements)
            ]
            return updated_node.with_changes(value=updated_node.value.with_changes(elements=elements))
        if original_node.value is None or updated_node.value is None:
            return updated_node
        return updated_node.with_changes(value=self._across_ranks(original_node.value, updated_node.value))

    def _across_ranks(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
        added_up = self._returned.get(original)
        if added_up is None:
            return updated
        # (read when left: BatchSize made `len(loader.dataset)` the shard's length by then, DDP405)
        divided, whole = over_whole_data(original, self.context.code, self.context.shard_lengths)
        helper = "ddp_sum" if whole and divided & added_up else "ddp_mean"
        self.context.use_helper(helper)
        what = "sum" if helper == "ddp_sum" else "mean"
        self.context.report(
            original,
            "DDP812",
            f"`{self.context.code(original)}`, returned by a training function, is computed from the loss its loop adds "
            f"up: it is the {what} across ranks, the global batch's value DataParallel's callers saw (a scheduler, a "
            "checkpoint, a log)",
        )
        return cst.Call(cst.Name(helper), [cst.Arg(updated.with_changes(lpar=[], rpar=[]) if hasattr(updated, "lpar") else updated)])

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        name = self._averaged.get(original_node)
        if name is None:
            return updated_node
        self.context.use_helper("ddp_mean")
        if original_node in self._controls:
            self.context.report(
                original_node,
                "DDP811",
                f"`{name}` is a loss of this rank and what the training's losses are computed from is made from it (a "
                "controller: BEGAN's kt): it is the mean across ranks, the global batch's value DataParallel fed back, "
                "so every rank trains with the same one",
            )
            return updated_node.with_changes(value=cst.Call(cst.Name("ddp_mean"), [cst.Arg(updated_node.value)]))
        # (a share of the loss divided by the whole data set's size adds up across ranks; read when
        # left: BatchSize made `len(loader.dataset)` the shard's length by then, DDP405)
        divided, whole = over_whole_data(original_node.value, self.context.code, self.context.shard_lengths)
        summed = divided & self._added_up_for.get(original_node, set()) and not divided & self._world_scaled_names
        helper = "ddp_sum" if whole and summed else "ddp_mean"
        self.context.use_helper(helper)
        what = "sum" if helper == "ddp_sum" else "mean"
        if original_node in self._returned_bindings:
            self.context.report(
                original_node,
                "DDP812",
                f"`{name}`, returned by a training function, is computed from the loss its loop adds up: it is the {what} "
                "across ranks, the global batch's value DataParallel's callers saw (a scheduler, a checkpoint, a log)",
            )
        else:
            self.context.report(
                original_node,
                "DDP810",
                f"`{name}` is {'a loss of this rank' if original_node in self._numbers else 'computed from a loss the training adds up'} "
                f"and a test reads it: it is the {what} across ranks, the global batch's value DataParallel decided on "
                "(every use sees it, prints included)",
            )
        return updated_node.with_changes(value=cst.Call(cst.Name(helper), [cst.Arg(updated_node.value)]))


def _returned_names(function: cst.CSTNode) -> set[str]:
    """Names ``function`` returns itself (``return avg_loss``, ``return avg_loss, acc``)."""
    found = set()
    for node in own_nodes(function):
        if isinstance(node, cst.Return) and node.value is not None:
            values = [element.value for element in node.value.elements] if isinstance(node.value, cst.Tuple) else [node.value]
            found |= {value.value for value in values if isinstance(value, cst.Name)}
    return found


def _added_up(loop: cst.CSTNode, derived: frozenset[str]) -> set[str]:
    """Names the training loop adds a loss's value to (``loss_sum += loss.item()``), and meters
    it updates with each batch's statistic (OKDDip's ``loss_avg.update(loss.item())``, an accuracy
    meter's ``update(metrics[0].item())``; not a clock's ``batch_time.update(time.time() - end)``)."""
    sums = {
        node.target.value
        for node in walk(loop)
        if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign)
        and isinstance(node.target, cst.Name) and node.target.value in derived
    }
    meters = {
        node.func.value.value
        for node in walk(loop)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "update"
        and isinstance(node.func.value, cst.Name) and node.args and node.args[0].keyword is None
        and not any(name.value == "time" for name in names_in(node.args[0].value))
        and _a_statistic(node.args[0].value)
    }
    return sums | meters


def _a_statistic(value: cst.BaseExpression) -> bool:
    """A batch's number (``loss.item()``, ``acc[0]``, ``float(x)``), not a container or an object made here."""
    return not constructs(value) and not text_value(value) and not isinstance(value, (cst.Dict, cst.List, cst.Tuple, cst.Set))


def _statistic_bound(node: cst.CSTNode, added_up: set[str]) -> str | None:
    """``avg_loss = loss_sum / iteration``: one name bound to a number made from what the
    training adds up (not the running sum itself, nor text or an object)."""
    if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)):
        return None
    name = node.targets[0].target.value
    value = node.value
    if name in added_up or text_value(value) or constructs(value):
        return None
    if not any(found.value in added_up for found in names_in(value)):
        return None
    # (a dict written out of such numbers, OKDDip's `train_metrics = {'train_loss': loss_avg.value(), ...}`:
    # averaged entry by entry)
    parts = [element.value for element in value.elements if isinstance(element, cst.DictElement)] if isinstance(value, cst.Dict) else [value]
    if isinstance(value, cst.Dict) and len(parts) != len(value.elements):
        return None
    if any(isinstance(found, (cst.Lambda, cst.ListComp, cst.List, cst.Dict, cst.Tuple)) for part in parts for found in walk(part)):
        return None
    return name


def _loss_number_bound(node: cst.CSTNode, derived: frozenset[str]) -> str | None:
    """``last_loss = loss.item()``: one name bound to the number a loss holds (also
    ``float(loss)``, ``loss.detach().item()``, a helper's ``getValue(loss)``)."""
    if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)):
        return None
    value = node.value
    if not isinstance(value, cst.Call):
        return None
    if isinstance(value.func, cst.Attribute) and value.func.attr.value == "item" and not value.args:
        owner = unconverted(value)
    elif isinstance(value.func, cst.Name) and len(value.args) == 1 and not value.args[0].keyword and not constructs(value):
        owner = value.args[0].value  # (adversarial-pose's `loss_d_real_ = getValue(loss_d_real)`)
    else:
        return None
    return node.targets[0].target.value if isinstance(owner, cst.Name) and is_loss(owner.value, derived) else None



def _read_by_the_losses(loop: cst.CSTNode) -> set[str]:
    """The names what the loop's backward() calls take is computed from, through the loop's
    assignments (``loss_d = loss_d_real - kt * loss_d_fake``: ``kt``, read before this step
    makes it again)."""
    return {n.value for expr in reaching_backward(loop, loop_origins(loop)) for n in walk(expr) if isinstance(n, cst.Name)}


def _tested_names(scope: cst.CSTNode) -> set[str]:
    return {
        found.value
        for node in walk(scope)
        if isinstance(node, (cst.If, cst.While, cst.IfExp))
        for found in names_in(node.test)
    }
