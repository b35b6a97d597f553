"""Where DataParallel's split of the batch must stay where it was: at the model's inputs.

DataParallel scattered the wrapped model's inputs along their first dimension, ran a replica
on each share, and gathered the outputs; everything else in the training loop saw the whole
batch. Sharding the loader moves that split to the data, which is what a person writes and
right for most loops. Two kinds of loop need DataParallel's split kept (``ddp_shard(loader,
whole_batches=True)`` and ``ddp_scattered(model, ...)``): a batch sampler's structured batches
cut before the model, and a loss out of this file's sight that couples the batch's samples.
A loop that counts its steps and trains each step on the whole data, made before it
(whole_data_steps), keeps it too: no loader to shard. This module also finds a loop's loader
bound to something from elsewhere besides.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ScopeProvider

from ddpify.analysis.counted_draws import sliced_draws
from ddpify.analysis.data_sites import DataSite, counted_steps, derived_from
from ddpify.analysis.facts import Facts
from ddpify.analysis.tree import binding_targets, bound_names, calls_in, dotted, innermost_loop, loop_origins, reaching_backward, walk, without_moves


def scattered_at_the_model(site: DataSite, facts: Facts, coupled: frozenset[str] = frozenset()) -> tuple[cst.Call, ...]:
    """The wrapped model's calls of a training loop whose batches must stay whole on every
    rank, split where DataParallel split them: at the model's inputs (none: the batch is
    split where the loop draws it).

    A batch sampler of the user's yields batches with a structure (few-shot-meta-baseline's
    episodes: `ep_per_batch` episodes of `way x (shot + query)` flat indices). When the loop
    feeds the model what it cut from the batch (``split_shot_query(data, way, shot, query,
    ep_per_batch)``, a ``view`` by the sampler's counts) rather than the batch itself, a cut of
    each batch's index list per rank would break that structure; DataParallel scattered the
    model's inputs along their first dimension after the cut. Each rank then draws the whole
    batch, and each call of the model takes its share and gathers everyone's outputs
    (``ddp_scattered``).

    The same holds for a loop whose loss comes from ``coupled``, code out of this file's sight
    that couples the samples of the batch (a project loss normalised by a count of the batch's
    content, DSFD's MultiBoxLoss): computed on the whole batch, it is DataParallel's. Not where
    that loss is the wrapped model itself (YOLOv3's Darknet, whose YOLO layers count the
    boxes inside the forward): each rank's forward sees only its share either way, as each
    replica's did, so a scatter restores nothing and plain sharding is as exact."""
    loop, parent_of = site.loop, facts.analyzer.scopes.parent
    if not isinstance(loop, cst.For) or site.regrouped:
        return ()
    calls = [
        call for call in calls_in(loop.body)
        if (dotted(call.func) or "").removesuffix(".forward") in facts.model_names and innermost_loop(call, parent_of) is loop
    ]
    models = facts.model_names
    if calls and coupled and any(
        computes_with(call, coupled) and (dotted(call.func) or "").removesuffix(".forward") not in models
        and _in_the_step(call, loop, parent_of) and _a_loss(call, loop) for call in calls_in(loop.body)
    ):
        return tuple(calls)
    if not site.loaders or not all(_own_batch_sampler(call) for call in site.loaders):
        return ()
    batch = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
    derived, whole = derived_from(batch, loop.body), _batch_itself(batch, loop, parent_of)
    cut = any(
        {n.value for n in walk(arg.value) if isinstance(n, cst.Name)} & derived
        and not (isinstance(_moved(arg.value), cst.Name) and _moved(arg.value).value in whole)
        for call in calls for arg in call.args
    )
    return tuple(calls) if cut else ()


def computes_with(call: cst.Call, coupled: frozenset[str]) -> bool:
    """The call is such a loss, or is handed one to compute with (Sem_Seg_25's ``SegLoss(outputs,
    targets, criterion, cx1, cx2)`` of ``criterion = HybridLoss(...)``, a Dice of totals over the
    batch): its value is that loss's."""
    return dotted(call.func) in coupled or any(dotted(arg.value) in coupled for arg in call.args)


def whole_data_steps(facts: Facts) -> dict[cst.CSTNode, tuple[cst.Call, ...]]:
    """Training loops that count their steps and run the wrapped model on one tensor made
    before the loop (mcr2's full-batch ``for epoch in range(args.epochs): Z_train =
    net(X_train)``): DataParallel split that tensor among its GPUs at every step, and the loss
    saw all of its outputs. Each rank runs the model on its share and gets every rank's outputs
    (ddp_scattered; a value the model takes that has no first dimension to split, a graph
    object, runs whole on every rank). Not a loop that cuts its batches (DDP315), draws from a
    loader, or hands the model more than one value (a graph's ``model(features, adj)`` would be
    cut row by row): refused there (DDP304). loop -> the model's calls."""
    parent_of, models = facts.analyzer.scopes.parent, facts.model_names
    training = set(facts.training_loops)
    found = {}
    for loop in facts.training_loops:
        if not isinstance(loop, cst.For) or not counted_steps(loop.iter) or loop in facts.fed_loops or sliced_draws(loop):
            continue
        if any(inner in training or inner in facts.fed_loops for inner in walk(loop.body)):
            continue  # (an epoch loop around the steps: its model calls evaluate)
        made_here = {n for node in walk(loop) for t in _bound_targets(node) for n in bound_names(t)}
        calls = [
            call for call in calls_in(loop.body)
            if (dotted(call.func) or "").removesuffix(".forward") in models and innermost_loop(call, parent_of) is loop
        ]
        if calls and all(_one_value_made_before(call, made_here) for call in calls):
            found[loop] = tuple(calls)
    return found


def _bound_targets(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """binding_targets, and a comprehension's or a ``with``'s names."""
    if isinstance(node, cst.CompFor):
        return [node.target]
    if isinstance(node, cst.WithItem) and node.asname is not None:
        return [node.asname.name]
    return binding_targets(node)


def _one_value_made_before(call: cst.Call, made_here: set[str]) -> bool:
    """``net(X_train)``, ``net(X.to(device))``: one positional value, a name the loop does not bind."""
    if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
        return False
    value = _moved(call.args[0].value)
    return isinstance(value, cst.Name) and value.value not in made_here


def _in_the_step(call: cst.Call, loop: cst.For, parent_of) -> bool:
    """In the loop's own step, or in a loop over a count inside it (IIC's ``for i in
    range(config.num_sub_heads): loss = IID_loss(...)``), not in a loop that draws data."""
    inner = innermost_loop(call, parent_of)
    while inner is not loop:
        if not (isinstance(inner, cst.For) and isinstance(inner.iter, cst.Call) and dotted(inner.iter.func) in ("range", "xrange")):
            return False
        inner = innermost_loop(inner, parent_of)
    return True


def _a_loss(call: cst.Call, loop: cst.For) -> bool:
    """Does the call's value reach the loop's backward() (a loss, not a metric a meter is
    given: Taylor_pruning's ``prec1 = accuracy(output, target)``)? A loop whose backward() is
    out of its sight (in a step function it calls) cannot tell: it may."""
    reached = reaching_backward(loop, loop_origins(loop))
    if not reached:
        return True
    return any(node is call for expr in reached for node in walk(expr))


def _own_batch_sampler(call: cst.Call) -> bool:
    """``DataLoader(..., batch_sampler=CategoriesSampler(...))``: the user's, not a distributed one."""
    own = next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == "batch_sampler"), None)
    if own is None or (isinstance(own.value, cst.Name) and own.value.value == "None"):
        return False
    return "Distributed" not in cst.Module([]).code_for_node(own.value)


def _moved(value: cst.BaseExpression) -> cst.BaseExpression:
    """The tensor under its moves and casts (``Variable(x.cuda())``, ``x.to(device).float()``)."""
    value = without_moves(value)
    while isinstance(value, cst.Call) and (dotted(value.func) or "").rpartition(".")[2] == "Variable" and value.args:
        value = without_moves(value.args[0].value)
    return value


def _batch_itself(batch: set[str], loop: cst.For, parent_of) -> set[str]:
    """Names bound in the loop to the batch as drawn: its fields unpacked or indexed
    (``x, y = batch``, ``x = batch["img"]``) and their moves, not cuts of its tensors (a name
    also bound to a cut somewhere in the loop is not)."""
    bindings = [
        (node, {n for target in node.targets for n in bound_names(target.target)})
        for node in walk(loop.body) if isinstance(node, cst.Assign) and innermost_loop(node, parent_of) is loop
    ]
    whole, cut = set(batch), set()
    for _ in range(3):  # a few steps along the assignments
        for node, names in bindings:
            value = _moved(node.value)
            if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name) and len(value.slice) == 1:
                index = value.slice[0].slice
                if isinstance(index, cst.Index) and isinstance(index.value, (cst.Integer, cst.SimpleString)):
                    value = value.value
            if isinstance(value, cst.Name) and value.value in whole - cut:
                whole |= names
            else:
                cut |= names
    return whole - cut


def bound_elsewhere_too(site: DataSite, facts: Facts) -> str | None:
    """What else the name a training loop draws from is bound to, beside this file's DataLoader
    calls (HRank's `trainloader = DataLoader(...)` for CIFAR, `trainloader = data_tmp.loader_train`
    of a project class for ImageNet): sharded where it is built, one binding would train whole
    and the `set_epoch` added for the name would fail on it. The code of that other value."""
    expr = site.expr
    if not site.loaders or not isinstance(expr, cst.Name):
        return None
    analyzer = facts.analyzer
    scope = analyzer.scopes.get_metadata(ScopeProvider, expr, None)
    if scope is None:
        return None
    for assignment in scope[expr.value]:
        node = getattr(assignment, "node", None)
        if node is None:
            continue
        value, index = analyzer.scopes.assigned_value(node)
        if value is None or index is not None:
            continue  # (unpacked from a builder's tuple: traced by loaders_for, or not at all)
        value = _moved(value) if isinstance(value, cst.Call) else value
        if value in site.loaders or isinstance(value, cst.Name) and value.value == "None":
            continue
        if isinstance(value, cst.Call) and (value in facts.loaders or _wraps_a_loader(value, site.loaders)):
            continue
        if isinstance(value, (cst.Name, cst.Attribute, cst.Subscript)) and value is not expr:
            traced = analyzer.loaders.loaders_for(value, facts.contexts[site.loop], depth=0) if isinstance(value, (cst.Name, cst.Attribute)) else []
            if not traced:  # (another name of the same loaders: `loader = train_loader`)
                return cst.Module([]).code_for_node(value)
    return None


def _wraps_a_loader(call: cst.Call, loaders: tuple[cst.Call, ...]) -> bool:
    """``tqdm(DataLoader(...))``, ``iter(loader)``: a wrapper around one of the loaders."""
    return any(node in loaders for node in walk(call))
