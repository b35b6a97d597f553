"""The module's call graph: who calls a function of this file, with which arguments, and
whether that call trains.

Loaders and epoch loops are traced through calls (a loader passed to ``train(loader)``, the
epoch loop in the caller of a function that trains); this room answers where a function is
called, what a parameter is bound to at a call, and how the caller names an expression of
the callee.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import GlobalScope, ScopeProvider

from ddpify.analysis.facts import Context, Function
from ddpify.analysis.scopes import Room
from ddpify.analysis.tree import derived_from, dotted, is_training_call, iterator_of, walk


class CallGraph(Room):
    def __init__(self, scopes) -> None:
        super().__init__(scopes)
        self._switches: dict[Function, tuple[cst.Param, bool] | None] = {}  # see trains_at
        self._iterated: dict[Function, set[str]] = {}  # see iterated_arguments

    def call_sites(self, function: Function) -> list[tuple[cst.Call, Context]]:
        name = function.name.value
        owner = self.owner_class(function)
        calls = self.scopes.calls
        if name == "__init__" and owner is not None:
            # `Trainer(model, loader, optimizer)` runs Trainer.__init__
            return [(call, context) for call, context in calls if dotted(call.func) and dotted(call.func).rpartition(".")[2] == owner.name.value]
        # This module calls its top-level `train` by name; `model.train()` is another method.
        top_level = self.scopes.module_functions.get(name) is function
        sites = []
        for call, context in calls:
            func = call.func
            if isinstance(func, cst.Name) and func.value == name:
                sites.append((call, context))
            elif isinstance(func, cst.Attribute) and func.attr.value == name and not top_level:
                if owner is None or self._instance_of(func.value, owner):
                    sites.append((call, context))
        return sites

    def callee(self, call: cst.Call, context: Context | None) -> Function | None:
        """The function of this file a call runs: a top-level function by its name, one defined
        in the caller's own scope, or a method of the caller's own class through ``self``."""
        func = call.func
        if isinstance(func, cst.Name):
            # (or a function defined in the caller: QuARE's loss() closure in its train())
            return self.scopes.module_functions.get(func.value) or self.scopes.local_function(func)
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self" and context is not None and context.cls is not None:
            return next(
                (node for node in context.cls.body.body if isinstance(node, cst.FunctionDef) and node.name.value == func.attr.value), None
            )
        return None

    def _instance_of(self, receiver: cst.BaseExpression, cls: cst.ClassDef) -> bool:
        """Is ``receiver`` (of ``receiver.method()``) an instance of ``cls``: ``self`` in its
        methods, or a name bound to ``Cls(...)``? ``self.model.train()`` is the model's."""
        if isinstance(receiver, cst.Name) and receiver.value in ("self", "cls"):
            return True
        if not isinstance(receiver, cst.Name):
            return False
        scope = self.scopes.get_metadata(ScopeProvider, receiver, None)
        for assignment in scope[receiver.value] if scope is not None else []:
            node = getattr(assignment, "node", None)
            value, _ = self.scopes.assigned_value(node) if node is not None else (None, None)
            if isinstance(value, cst.Call) and (dotted(value.func) or "").rpartition(".")[2] == cls.name.value:
                return True
        return False

    def owner_class(self, function: Function) -> cst.ClassDef | None:
        block = self.scopes.parent(function)
        owner = self.scopes.parent(block) if isinstance(block, cst.IndentedBlock) else None
        return owner if isinstance(owner, cst.ClassDef) else None

    def argument_for(self, function: Function, param: cst.Param, call: cst.Call) -> cst.BaseExpression | None:
        params = list(function.params.params)
        bound = isinstance(call.func, cst.Attribute) or function.name.value == "__init__"
        if bound and params and params[0].name.value in ("self", "cls"):
            params = params[1:]
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == param.name.value:
                return arg.value
        if param not in params:
            return None
        index = params.index(param)
        positional = [a for a in call.args if a.keyword is None and not a.star]
        return positional[index].value if index < len(positional) else None

    def fed_by_a_drawing_loop(self, site, loops: list[cst.CSTNode]) -> cst.CSTNode | None:
        """The loop among ``loops`` (loops that draw data) around every call of the site's
        function, each passing for the parameter the site iterates what that loop drew."""
        function = site.function
        # (or a part of it: degradation-model's `for x in data['LQs']:`, `data` a batch the loop drew)
        root = _root_of_parts(site.expr)
        params = [p for p in function.params.params if root is not None and p.name.value == root] if function else []
        sites = self.call_sites(function) if params else []
        hosts = set()
        for call, _ in sites:
            argument = self.argument_for(function, params[0], call)
            host = next((loop for loop in loops if isinstance(loop, cst.For) and call in walk(loop.body)), None)
            drawn = derived_from(set(_names(host.target)), host.body) if host is not None else set()
            if argument is None or not set(_names(argument)) & drawn:
                return None
            hosts.add(host)
        return hosts.pop() if len(hosts) == 1 else None

    def kept_on_self(self, function: cst.FunctionDef, param: str) -> list[tuple[str, Context]]:
        """A constructor's parameter kept as ``self.loader = loader``: the attribute, in every
        method of its class (Dual-Path-RNN's Trainer validates on the loader it trains on)."""
        owner = self.owner_class(function)
        if owner is None or function.name.value != "__init__":
            return []
        return [
            (dotted(target.target), Context(function, owner, ())) for node in walk(function.body) if isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Name) and node.value.value == param
            for target in node.targets if (dotted(target.target) or "").startswith("self.") and dotted(target.target).count(".") == 1
        ]

    def constructors(self) -> list[Function]:
        """The ``__init__`` of every class of this file."""
        return [
            node for cls in walk(self.scopes.module) if isinstance(cls, cst.ClassDef) for node in cls.body.body
            if isinstance(node, cst.FunctionDef) and node.name.value == "__init__"
        ]

    def sources_handed(self, call: cst.Call, context: Context | None) -> list[cst.BaseExpression]:
        """The arguments of a call of this file's function that it iterates (see iterated_arguments)."""
        function = self.callee(call, context)
        return self.iterated_arguments(function, call) if function is not None else []

    def iterated_arguments(self, function: Function, call: cst.Call) -> list[cst.BaseExpression]:
        """The arguments of this call bound to parameters ``function`` iterates (``for x, y in
        loader:``, ``enumerate(tqdm(loader))``, ``iter(loader)``): data sources it draws from
        itself, handed on (thaw-slump's ``self.train_epoch(self.get_dataloader(key))`` in a loop
        over the schedule's steps), not a batch."""
        iterated = self._iterated.get(function)
        if iterated is None:
            iterated = self._iterated[function] = {
                name for node in walk(function.body) for name in _drawn_names(
                    node.iter if isinstance(node, cst.For) else iterator_of(node) if isinstance(node, cst.Call) else None
                )
            }
        arguments = []
        for param in function.params.params:
            if param.name.value in iterated:
                argument = self.argument_for(function, param, call)
                if argument is not None:
                    arguments.append(argument)
        return arguments

    def trains_at(self, function: Function, call: cst.Call) -> bool:
        """Does this call of ``function`` train? Not when every backward()/step() in it sits
        under ``if train:`` (or ``if not is_validate:``) on a parameter this call sets to the
        other literal (BERT-pytorch's ``iteration(..., train=False)``, flownet2's
        ``train(..., is_validate=True)``)."""
        step = self._step_parameter(function)
        if step is not None:
            # it trains through the function it is passed (PatchmatchNet's process_samples
            # with train_sample, not with test_sample)
            value = self.argument_for(function, step, call)
            return not isinstance(value, cst.Name) or value.value in self.facts.training_calls
        switch = self._switch(function)
        if switch is None:
            return True
        param, trains_when = switch
        value = self.argument_for(function, param, call)
        if value is None and param.default is not None:
            value = param.default
        if isinstance(trains_when, tuple):  # `if mode == 'train':` (self-supervised-depth-completion)
            operator, literal = trains_when
            if not isinstance(value, cst.SimpleString):
                return True
            return (value.evaluated_value == literal) == (operator == "==")
        if not isinstance(value, cst.Name) or value.value not in ("True", "False"):
            return True
        return (value.value == "True") == trains_when

    def switch_passed(self, function: Function, call: cst.Call) -> tuple[cst.BaseExpression, bool] | None:
        """What this call passes for the parameter that switches ``function``'s training on,
        when it is a test the caller computes (echonet's ``run_epoch(model, dataloader, phase ==
        "train", ...)``), and the value that trains; literals are trains_at's to decide."""
        switch = self._switch(function)
        if switch is None or isinstance(switch[1], tuple):
            return None
        param, trains_when = switch
        value = self.argument_for(function, param, call)
        if value is None or isinstance(value, cst.Name) and value.value in ("True", "False", "None"):
            return None
        return value, trains_when

    def _switch(self, function: Function) -> tuple[cst.Param, bool | tuple] | None:
        if function not in self._switches:
            self._switches[function] = None  # (a function that calls itself: no switch through it)
            self._switches[function] = self._training_switch(function)
        return self._switches[function]

    def _step_parameter(self, function: Function) -> cst.Param | None:
        """The parameter through which alone ``function`` trains: every training call in it is
        a call of that parameter (``sample_function(model, sample, ...)``)."""
        training = [call for call, context in self.scopes.calls if context.function is function and self._trains_here(call)]
        params = {p.name.value: p for p in function.params.params}
        names = {call.func.value if isinstance(call.func, cst.Name) else None for call in training}
        if len(names) != 1 or None in names or next(iter(names)) not in params:
            return None
        return params[next(iter(names))]

    def _trains_here(self, call: cst.Call) -> bool:
        return is_training_call(call) or (dotted(call.func) or "") in self.facts.training_calls

    def _training_switch(self, function: Function) -> tuple[cst.Param, bool] | None:
        """The parameter that switches every training call of ``function`` on, and the value
        that does; None if there is none."""
        switches = set()
        for call, context in self.scopes.calls:
            if context.function is not function:
                continue
            if is_training_call(call):
                switches.add(self._switch_around(call, function))
                continue
            callee = self.scopes.local_function(call.func)
            if callee is not None and callee is not function and callee in self.facts.step_functions:
                switches.add(self._switch_around(call, function) or self._switch_handed_on(call, callee, function))
        if len(switches) != 1 or None in switches:
            return None
        name, trains_when = switches.pop()
        param = next((p for p in function.params.params if p.name.value == name), None)
        return (param, trains_when) if param is not None else None

    def _switch_handed_on(self, call: cst.Call, callee: Function, function: Function) -> tuple[str, bool | tuple] | None:
        """A step function of the file called with ``function``'s own parameter for the one that
        switches the callee's training on (NeuroTalk's ``train(..., trainValid)`` calls
        ``train_G(..., trainValid)``, whose backward() sits under ``if trainValid:``): that
        parameter switches ``function`` too, the same way."""
        switch = self._switch(callee)
        if switch is None:
            return None
        value = self.argument_for(callee, switch[0], call)
        params = {p.name.value for p in function.params.params}
        return (value.value, switch[1]) if isinstance(value, cst.Name) and value.value in params else None

    def _switch_around(self, call: cst.Call, function: Function) -> tuple[str, bool] | None:
        """``(p, True)`` for a call under ``if p:``, ``(p, False)`` under ``if not p:``."""
        node, parent = call, self.scopes.parent(call)
        while parent is not None and parent is not function:
            if isinstance(parent, cst.If) and node is parent.body:
                test = parent.test
                if isinstance(test, cst.Name):
                    return test.value, True
                if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and isinstance(test.expression, cst.Name):
                    return test.expression.value, False
                compared = _compared_with_literal(test)
                if compared is not None:
                    return compared
            node, parent = parent, self.scopes.parent(parent)
        return None

    def expression_in_caller(
        self, function: Function, expr: cst.BaseExpression, call: cst.Call
    ) -> cst.BaseExpression | None:
        """How the caller names what `function` calls `expr`."""
        if isinstance(expr, cst.Name):
            for param in function.params.params:
                if param.name.value == expr.value:
                    argument = self.argument_for(function, param, call)
                    return argument if isinstance(argument, (cst.Name, cst.Attribute)) else None
            scope = self.scopes.get_metadata(ScopeProvider, expr, None)
            if scope is not None and not isinstance(scope, GlobalScope) and scope.assignments[expr.value]:
                return None  # the function's own variable: the caller cannot name it
            return expr  # a global: the same name works in the caller
        name = dotted(expr)
        if name and name.startswith("self.") and name.count(".") == 1 and isinstance(call.func, cst.Attribute):
            return cst.Attribute(value=call.func.value, attr=cst.Name(name.split(".", 1)[1]))
        return None


def _compared_with_literal(test: cst.BaseExpression) -> tuple[str, tuple[str, str]] | None:
    """``mode == 'train'`` -> ("mode", ("==", "train")); ``phase != 'val'`` likewise."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 or not isinstance(test.left, cst.Name):
        return None
    target = test.comparisons[0]
    literal = target.comparator
    if not isinstance(literal, cst.SimpleString) or not isinstance(literal.evaluated_value, str):
        return None
    if isinstance(target.operator, cst.Equal):
        return test.left.value, ("==", literal.evaluated_value)
    if isinstance(target.operator, cst.NotEqual):
        return test.left.value, ("!=", literal.evaluated_value)
    return None


def carried_names(call: cst.Call, handed: list[cst.BaseExpression], derived: set[str]) -> set[str]:
    """The names a call's arguments carry to it, but for a loader the function iterates that the
    drawn item only picks (``self.get_dataloader(key)``, ``self.loaders[key]``: chosen by the
    schedule's step); the item itself, or what is made of it, is still a batch (``train(batchs)``,
    ``train(self.prepare(batchs))``: a list of sub-batches the function iterates)."""
    pickers = {id(arg): arg.func if isinstance(arg, cst.Call) else arg.value for arg in handed if isinstance(arg, (cst.Call, cst.Subscript))}
    picked = [arg for arg in handed if id(arg) in pickers and "loader" in (dotted(pickers[id(arg)]) or "").lower()
              and not {n.value for n in walk(pickers[id(arg)]) if isinstance(n, cst.Name)} & derived]
    return {name.value for arg in call.args if not any(arg.value is other for other in picked) for name in walk(arg.value) if isinstance(name, cst.Name)}


# Calls a loop sees a data source through (``enumerate(tqdm(loader))``).
_PASS_THROUGH = {"enumerate", "zip", "iter", "tqdm", "trange", "islice", "cycle"}


def _drawn_names(iterated: cst.BaseExpression | None) -> set[str]:
    """The names a loop (or ``iter(...)``) draws from, seen through enumerate/zip/tqdm."""
    if isinstance(iterated, cst.Name):
        return {iterated.value}
    if isinstance(iterated, cst.Call) and (dotted(iterated.func) or "").rpartition(".")[2] in _PASS_THROUGH:
        return {name for arg in iterated.args if arg.keyword is None for name in _drawn_names(arg.value)}
    return set()


def _names(node: cst.CSTNode) -> list[str]:
    return [name.value for name in walk(node) if isinstance(name, cst.Name)]


def _root_of_parts(expr: cst.BaseExpression) -> str | None:
    """``data`` of ``data``, ``data['LQs']``, ``batch.frames``: the name a part is taken from."""
    while isinstance(expr, (cst.Subscript, cst.Attribute)):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else None
