"""Where each training loop draws its data: the expressions ``ddp_shard`` may wrap.

A training loop is known by what it does (it calls ``backward()``/``step()``, or a function
that does); what matters for sharding is what it iterates, not where a DataLoader was
built. For every training loop this finds the expressions that name its data, as the loop's
code has them:

- ``for x in loader`` / ``enumerate(tqdm(loader))`` / ``zip(a, b)``: the loader names inside;
- a progress bar made above the loop (``pbar = tqdm(self.train_loader)``): the loader inside it;
- ``next(it)`` with ``it = iter(loader)``, or ``next(iter(loader))``: the loader inside ``iter``;

each with the DataLoader calls of this file it may be bound to (none when it comes from
elsewhere: a helper of another module, a parameter no caller here feeds, a project object).
The sampler transform shards the loaders it can rewrite where they are built, and wraps
the others where the loop draws from them (``ddp_shard(loader)``, sharded at run time).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import ScopeProvider

from ddpify.analysis.calls import carried_names
from ddpify.analysis.facts import Facts
from ddpify.analysis.loaders import ITERABLE_WRAPPERS
from ddpify.analysis.tree import bound_names, calls_in, derived_from, dotted, is_training_call, iterator_of, walk
from ddpify.names import DATA_LOADER

# Calls that count steps rather than draw data.
COUNTS = {"range", "trange", "xrange", "count", "arange", "repeat", "len", "list", "sorted", "reversed", "items", "keys", "values"}
# A batch cut into parts (chunked_backward's `x.chunk(n)`): the batch was drawn already.
TENSOR_PARTS = {"chunk", "split", "tensor_split", "unbind", "narrow", "view", "reshape", "t", "transpose", "permute", "flatten"}
# What a data expression may be bound to in this file that is surely not a DataLoader.
NOT_A_LOADER = (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp, cst.Dict, cst.DictComp, cst.Integer, cst.SimpleString)


@dataclass(frozen=True)
class DataSite:
    """One expression a training loop draws its data from."""

    loop: cst.CSTNode
    expr: cst.BaseExpression  # a node of the tree: Name or Attribute
    loaders: tuple[cst.Call, ...]  # DataLoader calls of this file it may be bound to
    function: cst.FunctionDef | None  # where the loop is
    # each item it yields is cut into the step's batches (FastSpeech2's collate_fn returns a
    # list of sub-batches, `for batchs in loader: for batch in batchs:`): the loader's
    # batch is not the step's batch
    regrouped: bool = False

    @property
    def traced(self) -> bool:
        return bool(self.loaders)


def data_sites(facts: Facts) -> list[DataSite]:
    """Every data expression of every training loop, each node once, in source order."""
    analyzer = facts.analyzer
    sites: list[DataSite] = []
    seen: set[int] = set()
    for loop in facts.training_loops:
        if not _draws_data(loop, facts):
            continue  # an epoch loop: its passes draw their data in the loops inside or the calls
        context = facts.contexts[loop]
        found = data_expressions(loop.iter, analyzer) if isinstance(loop, cst.For) else []
        for call in _draws_in(loop, facts):
            found += _iterator_sources(call, analyzer)
        regrouped = False
        if len(found) == 1 and isinstance(found[0], cst.Name):
            outer = _enclosing_loop_binding(loop, found[0].value, analyzer.scopes.parent)
            outer_found = data_expressions(outer.iter, analyzer) if outer is not None else []
            if outer_found:  # `for batchs in loader: for batch in batchs:` (not `for loader in (a, b):`)
                loop, regrouped, found = outer, True, outer_found
                context = facts.contexts[outer]
        for expr in found:
            if isinstance(expr, (cst.Name, cst.Attribute)):
                expr = analyzer.loaders.through_progress_variable(expr)
            if id(expr) in seen or _counts_steps(expr, analyzer) or part_of_a_model(expr, loop) or _model_state(expr):
                continue
            seen.add(id(expr))
            if isinstance(expr, cst.Call):
                loaders = [expr] if expr in facts.loaders else []
            elif isinstance(expr, cst.Subscript):
                loaders = []
            else:
                loaders = analyzer.loaders.loaders_for(expr, context, depth=0)
            sites.append(DataSite(loop, expr, tuple(loaders), context.function, regrouped))
    return _regrouped_through_calls(sites, analyzer)


def _regrouped_through_calls(sites: list[DataSite], analyzer) -> list[DataSite]:
    """A parameter a function iterates, fed at every call by what a loop drawing data draws
    (``for batchs in loader: self.train_step(self.prepare(batchs))``, whose loop runs over its
    ``parts``): the loader's items are cut into the steps' batches, as ``for batch in batchs:``
    in the loop itself; only the loader is sharded (sharding both would split each batch twice)."""
    for site in list(sites):
        host = analyzer.calls.fed_by_a_drawing_loop(site, [other.loop for other in sites if other is not site])
        if host is not None:
            sites.remove(site)
            if isinstance(site.expr, cst.Name):
                sites[:] = [DataSite(o.loop, o.expr, o.loaders, o.function, True) if o.loop is host else o for o in sites]
            # (else a part of the drawn batch, degradation-model's `data['LQs']`: collated, each of its
            # items holds the whole batch; the loader is sharded as it is)
    return sites


def _counts_steps(expr: cst.BaseExpression, analyzer) -> bool:
    """``t = trange(params.train_steps)`` then ``for i in t:``: a progress bar over a count of
    steps (the batches come from ``next(...)`` inside), not data."""
    if not isinstance(expr, cst.Name):
        return False
    scope = analyzer.scopes.get_metadata(ScopeProvider, expr, None)
    assignments = list(scope[expr.value]) if scope is not None else []
    values = [analyzer.scopes.assigned_value(a.node) for a in assignments if getattr(a, "node", None) is not None]
    return bool(values) and len(values) == len(assignments) and all(index is None and counted_steps(value) for value, index in values)


# What a model or an optimizer holds, never data (NAIC's `for param in criterion_center.parameters():`
# that rescales the centre loss's gradients before its step).
MODEL_STATE = {"parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children", "named_children", "state_dict"}


def _model_state(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, cst.Attribute):
        return expr.attr.value == "param_groups"
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in MODEL_STATE


def part_of_a_model(expr: cst.BaseExpression, loop: cst.CSTNode) -> bool:
    """``for inst in model.instruments: output = model(inputs, inst)`` (Wave-U-Net's
    compute_loss, a backward() per instrument): what the loop iterates belongs to something
    it calls, the model; its parts are not data."""
    if not isinstance(expr, (cst.Attribute, cst.Subscript)):
        return False
    owner = dotted(expr.value)
    return owner is not None and any(dotted(call.func) == owner for call in calls_in(loop.body))


def _enclosing_loop_binding(loop: cst.CSTNode, name: str, parent_of) -> cst.For | None:
    """The loop around ``loop`` (in the same function) whose target binds ``name``."""
    node = parent_of(loop)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
        if isinstance(node, cst.For) and name in bound_names(node.target):
            return node
        node = parent_of(node)
    return None


def _draws_data(loop: cst.CSTNode, facts: Facts) -> bool:
    """Does the loop itself take training steps on what it draws: backward()/step() in its own
    body (not in a loop inside it), or a step function of the file given its batch
    (``loss = train(imgL, imgR)``)? An epoch loop calls ``train(loader, ...)`` instead."""
    targets = {name.value for name in walk(loop.target) if isinstance(name, cst.Name)} if isinstance(loop, cst.For) else set()
    if isinstance(loop, cst.For) and counted_steps(loop.iter):
        targets = set()  # an epoch counter handed to a training call (`trainer.train(epoch, loader)`) is not data
    # (and what it draws with next(): MCCNet's `content_images = next(content_iter).to(device)`,
    # then `train_step(content_images, style_images, ...)` in a counted loop)
    targets |= {
        name for node in walk(loop.body) if isinstance(node, cst.Assign) and any(dotted(c.func) == "next" for c in calls_in(node.value))
        for target in node.targets for name in bound_names(target.target)
    }
    if isinstance(loop, cst.For) and iterates_training_objects(loop):
        return False  # (MEG: `for opt_adj, adj_generator in zip(optimizer_adj, adj_generators): opt_adj.step()`)
    derived = derived_from(targets, loop.body)
    calls = _own_calls(loop.body)
    graph, context = facts.analyzer.calls, facts.contexts.get(loop)
    # (an object fed the batch by one method and trained by another: SRFBN's
    # `solver.feed_data(batch)`, then `solver.train_step()`)
    carried = {id(call): carried_names(call, graph.sources_handed(call, context), derived) for call in calls}
    fed = {
        dotted(call.func.value) for call in calls if isinstance(call.func, cst.Attribute) and carried[id(call)] & derived
        and not _handed_on(call, calls, facts, loop)
    } - {None}
    for call in calls:
        if is_training_call(call):
            return True
        if dotted(call.func) in facts.training_calls:
            arguments = carried[id(call)]
            if (not targets and not isinstance(loop, cst.For)) or arguments & derived:
                return True
            if any(isinstance(node, cst.Call) and dotted(node.func) == "next" for arg in call.args for node in walk(arg.value)):
                return True  # (`step(model, opt, next(it)[0])`)
            if arguments & _iterators_made(loop, facts):
                return True  # (handed an iterator it draws from: `train_one_iter(loader, loader_iterator, ...)`)
            if isinstance(call.func, cst.Attribute) and dotted(call.func.value) in fed:
                return True
    return False


def _handed_on(call: cst.Call, calls: list[cst.Call], facts: Facts, loop: cst.CSTNode) -> bool:
    """Is this call's result handed to a training call as a source it iterates
    (``self.train_epoch(self.get_dataloader(key))``): it picks a loader, it is not fed a batch."""
    graph, context = facts.analyzer.calls, facts.contexts.get(loop)
    trained = [other for other in calls if other is not call and dotted(other.func) in facts.training_calls]
    return any(call in walk(arg) for other in trained for arg in graph.sources_handed(other, context))


# Methods called on a model or an optimizer, never on a batch.
OBJECT_METHODS = {
    "step", "zero_grad", "parameters", "named_parameters", "state_dict", "load_state_dict", "train", "eval",
    "modules", "children", "add_param_group", "module",
}


def iterates_training_objects(loop: cst.For) -> bool:
    """Every name the loop draws and uses (an enumerate's count aside) is used as a model or an
    optimizer: called (`adj_generator(x)`), stepped, zeroed, asked for its parameters. A loop
    over the training's parts (MEG's lists of optimizers and wrapped layers), not over data."""
    target = loop.target
    if isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "enumerate" and isinstance(target, cst.Tuple) and target.elements:
        target = target.elements[-1].value
    drawn = {name.value for name in walk(target) if isinstance(name, cst.Name)}
    if not drawn:
        return False
    used_as_objects = set()
    for call in calls_in(loop.body):
        func = call.func
        if isinstance(func, cst.Name) and func.value in drawn:
            used_as_objects.add(func.value)
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.attr.value in OBJECT_METHODS:
            used_as_objects.add(func.value.value)
        elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute) and func.value.attr.value == "module":
            used_as_objects.add(dotted(func.value.value) or "")
    # (a drawn name handed to a call is data: `out = model(x)`, a Jacobian's `autograd.grad(out, x)`)
    handed = {name.value for call in calls_in(loop.body) for arg in call.args for name in walk(arg.value) if isinstance(name, cst.Name)}
    used = {name.value for name in walk(loop.body) if isinstance(name, cst.Name)} & drawn
    return bool(used & used_as_objects) and used <= used_as_objects and not used & handed  # (a name drawn and left unused says nothing)


def _iterators_made(loop: cst.CSTNode, facts: Facts) -> set[str]:
    """Names bound to ``iter(...)`` in the function around ``loop`` (or at module level)."""
    context = facts.contexts.get(loop)
    around = context.function if context is not None and context.function is not None else facts.analyzer.scopes.module
    return {
        name for node in walk(around) if isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and dotted(node.value.func) == "iter"
        for target in node.targets for name in bound_names(target.target)
    }


def counted_steps(iterated: cst.BaseExpression) -> bool:
    """``range(n)``, ``trange(n)``, or a progress bar or list over one (``tqdm(range(args.max_iter))``,
    simple_shot's ``warp_tqdm(list(range(start, epochs)))``): a count of steps, not data."""
    if not isinstance(iterated, cst.Call):
        return False
    name = (dotted(iterated.func) or "").rpartition(".")[2]
    if name in ("range", "trange"):
        return True
    wraps_one = name in ("list", "tuple", "iter", "enumerate", "reversed") or "tqdm" in name.lower()
    return wraps_one and bool(iterated.args) and counted_steps(iterated.args[0].value)


def _own_calls(node: cst.CSTNode) -> list[cst.Call]:
    """Calls in ``node`` that are not inside a loop or function within it."""
    found: list[cst.Call] = []

    class Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

        def visit_For(self, inner: cst.For) -> bool:
            return False

        def visit_While(self, inner: cst.While) -> bool:
            return False

        def visit_FunctionDef(self, inner: cst.FunctionDef) -> bool:
            return False

    node.visit(Calls())
    return found


def data_expressions(expr: cst.BaseExpression, analyzer) -> list[cst.BaseExpression]:
    """What a loop iterates, seen through enumerate/zip/tqdm: names, attributes, subscripts
    (``self.data_loader["train"]``), DataLoader calls written in place, through ``(bar := ...)``."""
    if isinstance(expr, cst.NamedExpr):
        return data_expressions(expr.value, analyzer)
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript)):
        return [expr]
    if not isinstance(expr, cst.Call):
        return []
    names = analyzer.scopes.qualified(expr.func) | {dotted(expr.func) or ""}
    if names & DATA_LOADER:
        return [expr]
    positional = [a.value for a in expr.args if a.keyword is None and not a.star]
    if "builtins.zip" in names:
        if any(a.star for a in expr.args):
            return [expr]  # (IIC's `zip(*iterators)`: what it zips is out of sight, split at run time)
        return [found for value in positional for found in data_expressions(value, analyzer)]
    wraps = names & ITERABLE_WRAPPERS or any(n.split(".")[-1] == "tqdm" for n in names)  # trange(n): a count
    if wraps and positional:
        return data_expressions(positional[0], analyzer)
    # a generator function of this file yielding the batches (UER-py's batch_loader(...)), or
    # any other call whose result the loop draws batches from (PoseFormer's
    # train_generator.next_epoch()): split at run time (ddp_shard); a count is not data
    name = (dotted(expr.func) or "").rpartition(".")[2]
    if name in COUNTS or name in TENSOR_PARTS or names & DATA_LOADER:
        return []
    if analyzer.scopes.local_function(expr.func) is not None:
        # a pass-through generator of this file handed the loader (big_transfer's
        # `for x, y in recycle(train_loader):`): the loader inside is what is drawn
        handed = _loaders_handed(expr, analyzer)
        if handed:
            return [found for arg in handed for found in data_expressions(arg, analyzer)]
    return [expr]


def _draws_in(loop: cst.CSTNode, facts: Facts) -> list[cst.BaseExpression]:
    """What the loop draws batches from with ``next(it)`` (or Python 2's ``it.next()``), in
    its body or in the step functions of the file it calls (crnn's ``trainBatch()`` reads a
    global ``train_iter``)."""
    bodies = [loop.body]
    functions = facts.analyzer.scopes.module_functions
    called = [functions[dotted(call.func)] for call in _own_calls(loop.body) if dotted(call.func) in functions]
    # only those that train: an evaluation the loop calls (crnn's val()) draws its own data whole
    bodies += [function.body for function in called if any(is_training_call(c) for c in calls_in(function.body))]
    sources = []
    for body in bodies:
        for call in calls_in(body):
            if dotted(call.func) == "next" and call.args:
                sources.append(call.args[0].value)
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value in ("next", "__next__") and not call.args:
                sources.append(call.func.value)
    return sources


def _returned_iterators(call: cst.Call, index: int | None, analyzer, depth: int) -> list[cst.BaseExpression]:
    """What the iterators a function of this file returns iterate (its ``return content_iter,
    style_iter`` of ``content_iter = iter(DataLoader(...))``), at ``index`` of a returned tuple."""
    function = analyzer.scopes.local_function(call.func)
    if function is None or any(isinstance(node, cst.Yield) for node in walk(function.body)):
        return []
    found = []
    for node in walk(function.body):
        if not isinstance(node, cst.Return) or node.value is None:
            continue
        value = node.value
        if index is not None:
            if not isinstance(value, (cst.Tuple, cst.List)) or index >= len(value.elements):
                continue
            value = value.elements[index].value
        if isinstance(value, cst.Call) and iterator_of(value) is not None:
            found += _iterated_by_call(value, analyzer)
        elif isinstance(value, cst.Name):
            found += _iterator_sources(value, analyzer, depth + 1)
    return found


def _handed_iterators(param: cst.Param, analyzer, depth: int) -> list[cst.BaseExpression]:
    """What the iterators the callers of a function of this file hand it for ``param`` iterate."""
    function = analyzer.scopes.parent(analyzer.scopes.parent(param))
    if not isinstance(function, cst.FunctionDef):
        return []
    found = []
    for call, _ in analyzer.calls.call_sites(function):
        argument = analyzer.calls.argument_for(function, param, call)
        if isinstance(argument, cst.Name):
            found += _iterator_sources(argument, analyzer, depth + 1)
    return found


def _iterator_sources(source: cst.BaseExpression, analyzer, depth: int = 0) -> list[cst.BaseExpression]:
    """``iter(loader)`` -> loader; ``it`` -> what every ``it = iter(...)`` iterates; a
    generator function of this file handed the loader (``datalooper = infiniteloop(loader)``,
    pytorch-ddpm) -> the loader it is handed."""
    if isinstance(source, cst.Call):
        return _iterated_by_call(source, analyzer)
    if isinstance(source, cst.Attribute):
        # `next(self.dl)` with `self.dl = cycle(DataLoader(...))` made in another method
        # (Cold-Diffusion's Trainer): drawn as it is, split batch by batch
        return [source]
    if not isinstance(source, cst.Name):
        return []
    found = []
    generators = False
    for assignment in analyzer.scopes.assignments_of(source):
        node = getattr(assignment, "node", None)
        if isinstance(node, cst.Param) and depth < 2:
            # an iterator handed in (AnimeStyleTransfer's train_one_iter(..., train_loader_src_iterator),
            # primed by `iter(train_loader_src)` in the caller before its loop)
            found += _handed_iterators(node, analyzer, depth)
            continue
        value, index = analyzer.scopes.assigned_value(node) if node is not None else (None, None)
        if isinstance(value, cst.Call) and depth < 2 and (made := _returned_iterators(value, index, analyzer, depth)):
            found += made  # (MCCNet's `content_iter, style_iter = load_dataset(...)`, iter(DataLoader(...)) each)
            continue
        if isinstance(value, cst.Call):
            handed = _iterated_by_call(value, analyzer)
            loaders = _loaders_handed(value, analyzer, handed)
            found += loaders
            # (PytorchWaveNetVocoder's train_generator(wav_list, feat_list, ...): lists of file
            # names, not loaders: the batches it yields are split, not its arguments)
            generators |= bool(handed) and not loaders
    return found or ([source] if generators else [])


def _loaders_handed(call: cst.Call, analyzer, handed: list[cst.BaseExpression] | None = None) -> list[cst.BaseExpression]:
    """What a generator or iterable wrapper is handed that is (or may be) a DataLoader."""
    handed = _iterated_by_call(call, analyzer) if handed is None else handed
    return [arg for arg in handed if _a_loader(arg, call, analyzer)]


def _a_loader(arg: cst.BaseExpression, call: cst.Call, analyzer) -> bool:
    """Is a generator's argument bound to a DataLoader, or to nothing this file builds (a
    parameter, another module's loader)? Not a list or comprehension made here."""
    context = analyzer.facts.contexts.get(call)
    if context is not None and analyzer.loaders.loaders_for(arg, context, depth=0):
        return True
    if not isinstance(arg, cst.Name):
        return True
    values = [analyzer.scopes.assigned_value(a.node)[0] for a in analyzer.scopes.assignments_of(arg) if getattr(a, "node", None) is not None]
    return not values or not all(isinstance(v, NOT_A_LOADER) or isinstance(v, cst.Call) for v in values)


def _iterated_by_call(call: cst.Call, analyzer) -> list[cst.BaseExpression]:
    if iterator_of(call) is not None:
        return data_expressions(iterator_of(call), analyzer)
    if analyzer.scopes.qualified(call.func) & ITERABLE_WRAPPERS:
        # `iter_t = cycle(target_loader)` drawn with next(iter_t) (domain adaptation's second loader)
        return data_expressions(call, analyzer)
    function = analyzer.scopes.local_function(call.func)
    if function is None or not any(isinstance(node, (cst.Yield)) for node in walk(function.body)):
        return []
    params = [param.name.value for param in function.params.params]
    iterated = {
        name.value for loop in walk(function.body) if isinstance(loop, cst.For)
        for name in walk(loop.iter) if isinstance(name, cst.Name)
    }
    found = []
    for position, arg in enumerate(call.args):
        if arg.star:
            return []
        param = arg.keyword.value if arg.keyword is not None else params[position] if position < len(params) else None
        if param in iterated and isinstance(arg.value, (cst.Name, cst.Attribute)):
            found.append(arg.value)
    return found


def surely_not_a_loader(site: DataSite, facts: Facts) -> cst.BaseExpression | None:
    """The value a data name is bound to in this file when every binding is a literal or a
    comprehension (a list of batches made here): no DataLoader to shard at run time."""
    if not isinstance(site.expr, cst.Name):
        return None
    analyzer = facts.analyzer
    values = []
    for assignment in analyzer.scopes.assignments_of(site.expr):
        node = getattr(assignment, "node", None)
        if node is None:
            return None
        value, index = analyzer.scopes.assigned_value(node)
        if value is None:
            return None
        if index is not None and isinstance(value, (cst.Tuple, cst.List)) and index < len(value.elements):
            value = value.elements[index].value
        values.append(value)
    return values[0] if values and all(isinstance(value, NOT_A_LOADER) for value in values) else None


def training_condition(loop: cst.CSTNode, facts: Facts) -> tuple[cst.BaseExpression, bool] | None:
    """The test that decides whether a pass of ``loop`` trains: every backward()/step() in it
    sits under ``if phase == "train":`` / ``if train:`` (True) or ``if not is_validate:``'s
    else (False), on names the loop does not bind itself. None when every pass trains."""
    calls = [call for call in calls_in(loop.body) if is_training_call(call) or dotted(call.func) in facts.training_calls]
    if not calls:
        return None
    parent = facts.analyzer.scopes.parent
    common: dict[tuple[str, bool], cst.BaseExpression] | None = None
    for call in calls:
        tests = {}
        node = call
        while node is not loop and node is not None:
            owner = parent(node)
            if isinstance(owner, cst.If) and node in (owner.body, owner.orelse):
                tests[(cst.Module([]).code_for_node(owner.test), node is owner.body)] = owner.test
            node = owner
        common = tests if common is None else {key: test for key, test in common.items() if key in tests}
    if not common:
        return None
    bound_inside = _bound_in(loop)
    for (_, when), test in common.items():
        if not {name.value for name in walk(test) if isinstance(name, cst.Name)} & bound_inside:
            return test, when
    return None


def _bound_in(loop: cst.CSTNode) -> set[str]:
    """Names the loop binds: its targets and what its body assigns."""
    bound: set[str] = set()
    for node in walk(loop):
        if isinstance(node, (cst.For, cst.CompFor)):
            bound.update(bound_names(node.target))
        elif isinstance(node, cst.Assign):
            for target in node.targets:
                bound.update(bound_names(target.target))
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
            bound.update(bound_names(node.target))
        elif isinstance(node, cst.NamedExpr):
            bound.update(bound_names(node.target))
    return bound
