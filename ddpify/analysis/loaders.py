"""Loaders: every DataLoader call, and which calls an expression a loop iterates may be.

A training loop names its loader in many ways: a local variable, ``self.train_loader`` set
in ``__init__`` (from a DataLoader, a builder's returned tuple, or a constructor
parameter), a parameter its callers pass, ``tqdm(loader)`` or ``enumerate(loader)``, an
iterator drawn with ``next()``, or what a function of another project module returns.
``Loaders.loaders_for`` follows all of these back to the DataLoader calls (``facts.loaders``)
or, in project mode, to a stand-in for a loader built elsewhere.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider, ScopeProvider

from ddpify.analysis.facts import Context, ForeignLoader, Function, LoaderSite
from ddpify.analysis.scopes import Room
from ddpify.analysis.tree import dotted, iterator_of, returns, root_name, walk

# Calls that only wrap an iterable: the loader is their first argument.
ITERABLE_WRAPPERS = {
    "builtins.enumerate", "builtins.iter", "builtins.zip",
    # progress bars and iteration helpers of other libraries: they hand the loader's batches on
    # (AttGAN's `for img_a, att_a in progressbar(train_dataloader):`)
    "progressbar.progressbar", "rich.progress.track", "itertools.islice", "itertools.cycle",
}


class Loaders(Room):
    def __init__(self, scopes, calls) -> None:
        super().__init__(scopes)
        self.calls = calls  # the CallGraph
        self._attr_loaders: dict[str, list[cst.Call]] = {}  # "x" for self.x = DataLoader()
        self._attr_targets: dict[str, list[cst.Attribute]] = {}  # "x" for self.x (, ...) = f(...)
        self._attr_contexts: dict[cst.Attribute, Context] = {}  # where `self.x = name` is
        self._foreign: dict[tuple[cst.Call, int | None], cst.Call] = {}  # see _foreign_loader

    def forget_stand_ins(self) -> None:
        """A new resolution: its facts get their own stand-ins for other modules' loaders."""
        self._foreign = {}

    # -- during the walk -----------------------------------------------------------------
    def record(self, call: cst.Call) -> None:
        target = self.scopes.assigned_name(call)
        self.facts.loaders[call] = LoaderSite(call, target)
        if target and target.startswith("self."):
            self._attr_loaders.setdefault(target[5:], []).append(call)

    def assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            # `self.train_loader, self.val_loader = make_data_loader(args)`: followed in loaders_for
            elements = [e.value for e in target.target.elements] if isinstance(target.target, (cst.Tuple, cst.List)) else [target.target]
            for element in elements:
                name = dotted(element) if isinstance(element, cst.Attribute) else None
                if name and name.startswith("self.") and name.count(".") == 1 and isinstance(node.value, cst.Call):
                    self._attr_targets.setdefault(name[5:], []).append(element)
                elif name and name.startswith("self.") and name.count(".") == 1 and isinstance(node.value, cst.Name):
                    # `self.loader = loader` in __init__: followed to what the constructor's callers pass
                    self._attr_targets.setdefault(name[5:], []).append(element)
                    self._attr_contexts[element] = self.scopes.context()

    # -- what a loop iterates --------------------------------------------------------------
    def iterated(self, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        """What a loop iterates: `enumerate(tqdm(loader))`, `(bar := tqdm(loader))` -> loader."""
        if isinstance(expr, cst.NamedExpr):
            return self.iterated(expr.value)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            return [expr]
        if isinstance(expr, cst.Call):
            names = self.scopes.qualified(expr.func) | {dotted(expr.func) or ""}
            positional = [a.value for a in expr.args if a.keyword is None and not a.star]
            if names & {"builtins.zip"}:
                return [e for value in positional for e in self.iterated(value)]
            is_tqdm = any(n.split(".")[-1] == "tqdm" for n in names)  # not trange(n): a count, not data
            if (names & ITERABLE_WRAPPERS or is_tqdm) and positional:
                return self.iterated(positional[0])
        return []

    def through_progress_variable(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """`tbar` of `tbar = tqdm(self.train_loader)` (its only binding) -> `self.train_loader`:
        set_epoch must name the loader, not the progress bar."""
        if not isinstance(expr, cst.Name):
            return expr
        scope = self.scopes.get_metadata(ScopeProvider, expr, None)
        assignments = self._reaching(expr, list(scope[expr.value]) if scope is not None else [])
        wrapped_codes: dict[str, cst.BaseExpression] = {}
        for assignment in assignments:  # flownet2 makes it in two branches: tqdm(loader, desc=...)
            if getattr(assignment, "node", None) is None:
                return expr
            value, index = self.scopes.assigned_value(assignment.node)
            if not isinstance(value, cst.Call) or index is not None or value in self.facts.loaders:
                return expr
            wrapped = [e for e in self.iterated(value) if e is not value]
            if len(wrapped) != 1:
                return expr
            wrapped_codes.setdefault(cst.Module([]).code_for_node(wrapped[0]), wrapped[0])
        return next(iter(wrapped_codes.values())) if len(wrapped_codes) == 1 else expr

    def _reaching(self, use: cst.Name, assignments: list) -> list:
        """The bindings of a progress bar that reach ``use``: of several bars bound to one name
        in a function (ST-PlusPlus's ``tbar = tqdm(trainloader)``, later ``tbar =
        tqdm(valloader)``), those made last before it, in the branches of one statement."""
        at = self.scopes.get_metadata(PositionProvider, use, None)
        nodes = [a for a in assignments if getattr(a, "node", None) is not None]
        if at is None or len(nodes) < 2 or len(nodes) != len(assignments):
            return assignments
        made = [(self.scopes.get_metadata(PositionProvider, a.node, None), a) for a in nodes]
        before = [(position, a) for position, a in made if position is not None and position.start.line < at.start.line]
        if not before:
            return assignments
        last = max(position.start.line for position, _ in before)
        statement = self._statement_of(next(a for position, a in before if position.start.line == last).node)
        # the bindings in the branches of the statement that made the last one (`if`/`else`)
        return [a for _, a in before if self._statement_of(a.node) is statement or a.node is statement]

    def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement holding ``node``: its line, or the ``if`` whose branches hold it."""
        statement = node
        while not isinstance(statement, cst.BaseStatement):
            statement = self.scopes.parent(statement)
        while True:
            block = self.scopes.parent(statement)
            owner = self.scopes.parent(block) if isinstance(block, cst.IndentedBlock) else None
            if not isinstance(owner, (cst.If, cst.Else)):
                return statement
            statement = owner if isinstance(owner, cst.If) else self.scopes.parent(owner)
            while isinstance(self.scopes.parent(statement), cst.If) and self.scopes.parent(statement).orelse is statement:
                statement = self.scopes.parent(statement)  # an `elif`: the `if` it belongs to

    def iterator_sources(self, source: cst.BaseExpression) -> list[cst.BaseExpression]:
        """`iter(loader)` -> loader; `it` -> the loaders of every `it = iter(loader)`."""
        if iterator_of(source) is not None:
            return self.iterated(iterator_of(source))
        if not isinstance(source, cst.Name):
            return []
        scope = self.scopes.get_metadata(ScopeProvider, source, None)
        found = []
        for assignment in scope[source.value] if scope is not None else ():
            value, _ = self.scopes.assigned_value(assignment.node) if getattr(assignment, "node", None) is not None else (None, None)
            if iterator_of(value) is not None:
                found += self.iterated(iterator_of(value))
        return found

    # -- which DataLoader calls an expression may be ---------------------------------------
    def loaders_for(self, expr: cst.BaseExpression, context: Context, depth: int) -> list[cst.Call]:
        """The DataLoader calls that `expr` (read where `context` is) may be bound to."""
        if depth > 4:
            return []
        if isinstance(expr, cst.Call) and expr in self.facts.loaders:
            return [expr]  # (built where it is handed on: `train(net, DataLoader(...), opt)`)
        if isinstance(expr, cst.Attribute) and dotted(expr) and dotted(expr).startswith("self."):
            attribute = dotted(expr)[5:]
            found = list(self._attr_loaders.get(attribute, []))
            for target in self._attr_targets.get(attribute, []):
                value, index = self.scopes.assigned_value(target)
                if isinstance(value, cst.Name) and target in self._attr_contexts:
                    loaders = self.loaders_for(value, self._attr_contexts[target], depth + 1)
                else:
                    loaders = self._loaders_in_value(value, index, depth + 1)
                found += [c for c in loaders if c not in found]
            return found
        if isinstance(expr, cst.Attribute):
            return list(self._attr_loaders.get(expr.attr.value, []))
        if not isinstance(expr, cst.Name):
            return []
        scope = self.scopes.get_metadata(ScopeProvider, expr, None)
        if scope is None:
            return []
        found: list[cst.Call] = []
        for assignment in scope[expr.value]:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.Param) and context.function is not None:
                found += self._loaders_via_parameter(context.function, node, depth)
                continue
            value, index = self.scopes.assigned_value(node) if node is not None else (None, None)
            if isinstance(value, cst.Call) and index is None and value not in self.facts.loaders:
                # `tbar = tqdm(self.train_loader)`, `batches = enumerate(loader)`: what it wraps
                wrapped = [e for e in self.iterated(value) if e is not value]
                if wrapped:
                    found += [c for e in wrapped for c in self.loaders_for(e, context, depth + 1)]
                    continue
            found += self._loaders_in_value(value, index, depth)
        return found

    def _loaders_in_value(self, value: cst.BaseExpression | None, index: int | None, depth: int) -> list[cst.Call]:
        """DataLoader calls an assigned value stands for: the call itself, element `index` of
        a tuple, or what a function of this module returns (``make_loaders(args)``)."""
        if isinstance(value, (cst.Tuple, cst.List)) and index is not None:
            elements = value.elements
            return self._loaders_in_value(elements[index].value, None, depth) if index < len(elements) else []
        if not isinstance(value, cst.Call):
            return []
        if value in self.facts.loaders:
            return [value] if index is None else []
        function = self.scopes.local_function(value.func)
        if function is None and self._from_project(value.func):
            # (or one loader, which a module of the project that trains nothing builds with it
            # too: loqui's validation module)
            if self._builds_others_too(value) or index is None and dotted(value.func) in self.facts.shared_builders:
                return []  # (sharded where the training loop draws it: the builder stays whole)
            if handed_a_loader(value, self.scopes.parent, self.facts):
                return []  # (what it makes of a loader, pytorch-template's `inf_loop(data_loader)`: sharded where drawn)
            return [self._foreign_loader(value, index)]
        if function is None or depth > 4:
            return []
        return self.loaders_returned(function, index, depth)

    def _builds_others_too(self, call: cst.Call) -> bool:
        """Does this file call the project's loader builder for other loaders too (SRFBN's
        ``create_dataloader(val_set, opt)``)? Sharded in the builder, its evaluation loaders
        would be sharded with the training one."""
        name = dotted(call.func)
        if sum(1 for other, _ in self.scopes.calls if dotted(other.func) == name) > 1:
            return True
        # (or handed the phase an `if` around the call tested, SR3's `create_dataloader(train_set,
        # dataset_opt, phase)` under `if phase == 'train':`: the builder picks its loader by it)
        handed = {arg.value.value for arg in call.args if isinstance(arg.value, cst.Name)}
        node = self.scopes.parent(call)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            tests = [n for n in walk(node.test) if isinstance(n, cst.Comparison)] if isinstance(node, cst.If) else []
            for test in tests:
                strings = [c.comparator for c in test.comparisons if isinstance(c.comparator, cst.SimpleString)]
                if isinstance(test.left, cst.Name) and test.left.value in handed and strings:
                    return True
            node = self.scopes.parent(node)
        return False

    def _from_project(self, func: cst.BaseExpression) -> bool:
        root = root_name(func)
        return root is not None and root.value in self.facts.project_names and dotted(func) is not None

    def _foreign_loader(self, call: cst.Call, index: int | None) -> cst.Call:
        """A stand-in node for element ``index`` of what ``call`` returns, as a loader site."""
        key = (call, index)
        if key not in self._foreign:
            stand_in = call.deep_clone()
            foreign = ForeignLoader(call, dotted(call.func), index)
            self.facts.loaders[stand_in] = LoaderSite(stand_in, None, foreign=foreign)
            self._foreign[key] = stand_in
        return self._foreign[key]

    def loaders_returned(self, function: Function, index: int | None, depth: int) -> list[cst.Call]:
        found = []
        shared = len(self.calls.call_sites(function)) > 1  # the same DataLoader call builds other loaders too
        for returned in returns(function):
            if isinstance(returned, (cst.Name, cst.Attribute)) and index is None:
                found += self.loaders_for(returned, self.facts.contexts.get(returned) or Context(function, None, ()), depth + 1)
            elif isinstance(returned, (cst.Tuple, cst.List)) and index is not None and index < len(returned.elements):
                element = returned.elements[index].value
                found += self._loaders_in_value(element, None, depth + 1) if isinstance(element, cst.Call) else (
                    self.loaders_for(element, Context(function, None, ()), depth + 1)
                )
            else:
                found += self._loaders_in_value(returned, index, depth + 1)
        if shared:
            self.facts.shared_loaders.update(found)
        return found

    def _loaders_via_parameter(self, function: Function, param: cst.Param, depth: int) -> list[cst.Call]:
        found = []
        for call, context in self.calls.call_sites(function):
            if not self.calls.trains_at(function, call):
                self.facts.training_and_evaluating.add(function)
                continue  # `iteration(epoch, val_loader, train=False)`: that loader is evaluated
            argument = self.calls.argument_for(function, param, call)
            if argument is not None:
                found += self.loaders_for(argument, context, depth + 1)
        return found

    # -- project mode: loaders other modules pass in ---------------------------------------
    def constructor_fed(self, expr: cst.BaseExpression, context: Context) -> list[cst.Call]:
        """Project mode: `self.loader` set from a constructor parameter (`self.loader = loader`
        in `Trainer.__init__`) of a top-level class that nothing in this module builds. The
        modules that build it shard what they pass (loader_parameters, keyed by the class
        name); here a stand-in loader call carries set_epoch (the caller's loader, checked at
        run time by ddp_sampler)."""
        name = dotted(expr)
        if self.facts.parameter_loaders is None or not name or not name.startswith("self.") or name.count(".") != 1:
            return []
        cls = context.cls
        if cls is None or cls.name.value in self.facts.unfed or self.scopes.parent(cls) is not self.scopes.module or any(
            dotted(call.func) and dotted(call.func).rpartition(".")[2] == cls.name.value for call, _ in self.scopes.calls
        ):
            return []
        for target in self._attr_targets.get(name[5:], []):
            value, _ = self.scopes.assigned_value(target)
            init = self._attr_contexts.get(target)
            if not isinstance(value, cst.Name) or init is None or init.function is None or init.cls is not cls:
                continue
            if init.function.name.value != "__init__":
                continue
            params = list(init.function.params.params)[1:]
            for index, param in enumerate(params):
                if param.name.value == value.value:
                    self.facts.loader_parameters.setdefault(cls.name.value, []).append((index, param.name.value))
                    stand_in = cst.Call(func=cst.Name(cls.name.value))
                    self.facts.loaders[stand_in] = LoaderSite(stand_in, None, training=True)
                    self.facts.parameter_stand_ins.add(stand_in)
                    return [stand_in]
        return []

    def fed_by_other_modules(self, expr: cst.BaseExpression, context: Context) -> bool:
        """Project mode: `loader` is a parameter of a top-level function that no caller in this
        module feeds: recorded in loader_parameters, for the callers elsewhere to shard."""
        function = context.function
        if self.facts.parameter_loaders is None or not isinstance(expr, cst.Name) or function is None:
            return False
        if self.scopes.module_functions.get(function.name.value) is not function or self.calls.call_sites(function):
            return False
        if function.name.value in self.facts.unfed:
            return False
        params = [p for p in function.params.params]
        name = self._aliased_parameter(expr) or expr.value
        for index, param in enumerate(params):
            if param.name.value == name:
                self.facts.loader_parameters.setdefault(function.name.value, []).append((index, param.name.value))
                return True
        return False

    def _aliased_parameter(self, expr: cst.Name) -> str | None:
        """`tl = train_loader` then `for ... in tl` (robot-surgery-segmentation's utils.train):
        the name it aliases, when that is its only binding."""
        scope = self.scopes.get_metadata(ScopeProvider, expr, None)
        assignments = list(scope[expr.value]) if scope is not None else []
        if len(assignments) != 1 or getattr(assignments[0], "node", None) is None:
            return None
        value, index = self.scopes.assigned_value(assignments[0].node)
        return value.value if isinstance(value, cst.Name) and index is None else None


def handed_a_loader(call: cst.Call, parent_of, facts) -> bool:
    """Is a project function handed a loader (a parameter of the function around the call,
    or a name bound to a DataLoader here) rather than the settings to build one? It makes
    something of that loader (an endless generator over it, a prefetcher), which the
    training loop draws from where it is sharded at run time."""
    function = parent_of(call)
    while function is not None and not isinstance(function, (cst.FunctionDef, cst.Module)):
        function = parent_of(function)
    params = {p.name.value for p in function.params.params} if isinstance(function, cst.FunctionDef) else set()
    for arg in call.args:
        name = arg.value
        if isinstance(name, cst.Name) and (name.value in params and "loader" in name.value.lower()):
            return True
        if isinstance(name, cst.Name) and any(site.target == name.value for site in facts.loaders.values()):
            return True
    return False
