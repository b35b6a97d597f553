"""Names that hold the same value on every rank, by scope.

A converted DataParallel script has no rank-dependent code: a name differs between ranks only
when a binding of it reads data (a loss, an output, a time), or counts under a test that may
differ between ranks. ``SettledNames`` finds the others: constants and settings
(``warmup = 4``, ``step, warmup = 1, 4``), counters every rank counts alike (``step += 1`` in
the training loop), and a function's parameters that every call in the file passes such a
value for (``run_epoch(loader, train=True)``). Names are looked up as Python does: in the
function that binds them, else at module level.

It is a greatest fixed point: every name starts settled, and a name leaves the set when one
of its bindings reads a name that is not, until nothing changes.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.ranks import UNIFORM_METHODS, loop_counters_around, same_on_every_rank
from ddpify.analysis.tree import dotted, is_main_guard, names_in, walk

Scope = cst.FunctionDef | cst.Module
Key = tuple[int, str]  # (id of the scope, name)
# (value, where it is bound: the statement, or the call that passes it; its scope; passed by a call)
Binding = tuple[cst.BaseExpression | None, cst.CSTNode, Scope, bool]
UNBOUND_FORMS = (cst.For, cst.CompFor, cst.WithItem, cst.ExceptHandler, cst.NamedExpr, cst.Global, cst.Nonlocal, cst.AsName)


class SettledNames:
    def __init__(self, module: cst.Module, parent_of, calls=None) -> None:
        self.module, self.parent_of, self.calls = module, parent_of, calls
        self._bindings: dict[Key, list[Binding]] = {}
        self._init_only: dict[int, frozenset[str]] = {}  # class id -> its settings (see _set_in_init_only)
        self._unbound: set[Key] = set()
        for node in walk(module):
            self._record(node)
        # (a module's names: `from hyperparameters import num_epochs`, the same on every rank,
        # unless the file binds them again)
        self._imported = {
            (alias.asname.name if alias.asname is not None else alias.name).value
            for node in walk(module) if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar)
            for alias in node.names
            if isinstance(alias.asname.name if alias.asname is not None else alias.name, cst.Name)
        }
        self._settled = set(self._bindings) - self._unbound
        self._settle()

    def names_alike(self, expr: cst.BaseExpression, at: cst.CSTNode, besides: set[str] = frozenset()) -> bool:
        """Does every variable ``expr`` reads (not a function it calls, nor an attribute's
        name), ``besides`` aside, hold the same value on every rank at ``at``?"""
        called = {id(n) for call in walk(expr) if isinstance(call, cst.Call) for n in walk(call.func)}
        parts = {id(n.attr) for n in walk(expr) if isinstance(n, cst.Attribute)}
        alike = self._names_alike(expr, at) | set(besides)
        return all(
            name.value in alike or name.value in ("True", "False", "None")
            for name in walk(expr) if isinstance(name, cst.Name) and id(name) not in called and id(name) not in parts
        )

    def uniform(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Is ``expr``, evaluated at ``at``, the same on every rank?"""
        return same_on_every_rank(expr, self._names_alike(expr, at))

    def reached_alike(self, at: cst.CSTNode) -> bool:
        """Is every test around ``at`` (in its function) the same on every rank, and no
        exception handler around it?"""
        child, parent = at, self.parent_of(at)
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
            if isinstance(parent, cst.ExceptHandler):
                return False
            if isinstance(parent, (cst.If, cst.While)) and child is not parent.test and not is_main_guard(parent) and not self.uniform(parent.test, parent):
                return False
            child, parent = parent, self.parent_of(parent)
        return True

    # -- what binds each name ----------------------------------------------------------------

    def _record(self, node: cst.CSTNode) -> None:
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            scope = self._scope_of(node)
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                for name, value in _pairs(target, node.value):
                    if isinstance(name, cst.Name) and value is not None:
                        self._bindings.setdefault((id(scope), name.value), []).append((value, node, scope, False))
                    elif not isinstance(name, (cst.Attribute, cst.Subscript)):
                        self._unbind(name, scope)
        elif isinstance(node, cst.FunctionDef):
            for param in node.params.params:
                self._bind_parameter(node, param)
            for param in (*node.params.kwonly_params, *node.params.posonly_params):
                self._unbound.add((id(node), param.name.value))
            for star in (node.params.star_arg, node.params.star_kwarg):
                if isinstance(star, cst.Param):
                    self._unbound.add((id(node), star.name.value))
        elif isinstance(node, UNBOUND_FORMS):
            target = getattr(node, "target", None) or getattr(node, "asname", None) or getattr(node, "name", None)
            if isinstance(target, cst.AsName):
                target = target.name
            if isinstance(node, (cst.Global, cst.Nonlocal)):
                for item in node.names:  # (the module's name, set where the function decides)
                    self._unbind(item.name, self._scope_of(node))
                    self._unbind(item.name, self.module)
            elif isinstance(target, cst.CSTNode):
                self._unbind(target, self._scope_of(node))

    def _bind_parameter(self, function: cst.FunctionDef, param: cst.Param) -> None:
        """What every call of the function in this file passes for the parameter (its default
        where a call passes nothing); none found: not settled."""
        key = (id(function), param.name.value)
        sites = list(self.calls.call_sites(function)) if self.calls is not None else []
        if not sites or any(arg.star for call, _ in sites for arg in call.args):
            self._unbound.add(key)
            return
        for call, _ in sites:
            value = self.calls.argument_for(function, param, call)
            if value is None and param.default is None and param.name.value in ("self", "cls"):
                continue
            given = value if value is not None else param.default
            if given is None:
                self._unbound.add(key)
                return
            self._bindings.setdefault(key, []).append((given, call, self._scope_of(call), True))
        self._bindings.setdefault(key, [])

    def _unbind(self, target: cst.CSTNode, scope: Scope) -> None:
        for name in walk(target):
            if isinstance(name, cst.Name):
                self._unbound.add((id(scope), name.value))

    def _scope_of(self, node: cst.CSTNode) -> Scope:
        parent = self.parent_of(node)
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
            parent = self.parent_of(parent)
        return parent if parent is not None else self.module

    # -- the fixed point ---------------------------------------------------------------------

    def _settle(self) -> None:
        changed = True
        while changed:
            changed = False
            for key in list(self._settled):
                if not all(self._alike(binding) for binding in self._bindings[key]):
                    self._settled.discard(key)
                    changed = True

    def _alike(self, binding: Binding) -> bool:
        value, where, scope, passed = binding
        if not self.uniform(value, where):
            return False
        # (a count kept, a flag set, under a test that may differ between ranks differs too;
        # a value a call passes is what it is wherever the call is)
        return passed or self.reached_alike(where)

    def _settled_loop_targets(self, at: cst.CSTNode) -> set[str]:
        """Targets of the loops around ``at`` over a literal of constants or a settled name
        (``for phase in ["train", "val"]:``): alike on every rank, step by step."""
        names: set[str] = set()
        node = self.parent_of(at)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            if isinstance(node, cst.For) and self._alike_iterable(node.iter, node):
                names |= {name.value for name in walk(node.target) if isinstance(name, cst.Name)}
            node = self.parent_of(node)
        return names

    def _alike_iterable(self, iterated: cst.BaseExpression, loop: cst.For) -> bool:
        if isinstance(iterated, (cst.List, cst.Tuple)):
            return all(isinstance(e.value, (cst.SimpleString, cst.Integer, cst.Float)) for e in iterated.elements)
        if isinstance(iterated, cst.Name):
            key = (id(self._scope_of(loop)), iterated.value)
            key = key if key in self._bindings or key in self._unbound else (id(self.module), iterated.value)
            return key in self._settled
        return False

    def _a_selection(self, length: cst.Call, scope) -> bool:
        """``len(input)`` of ``input = input[idx_seen]`` (NeuroTalk's seen words of this rank's
        share): the length of what a rank picked from its data differs between ranks."""
        measured = length.args[0].value if length.args else None
        if not isinstance(measured, cst.Name):
            return _selects(measured)
        return any(_selects(binding[0]) for binding in self._bindings.get((id(scope), measured.value), []))

    def _names_alike(self, expr: cst.BaseExpression, at: cst.CSTNode) -> set[str]:
        scope = self._scope_of(at)
        alike = loop_counters_around(at, self.parent_of)  # (never what a loop draws, nor a count it keeps: bindings say)
        alike |= self._settled_loop_targets(at)
        # (a length: loaders are as long on every rank, a DistributedSampler pads its shares)
        measured = {
            id(n) for call in walk(expr) if isinstance(call, cst.Call) and dotted(call.func) == "len" and not self._a_selection(call, scope)
            for n in walk(call)
        }
        for name in names_in(expr):
            if id(name) in measured:
                alike.add(name.value)
                continue
            key = (id(scope), name.value)
            if key not in self._bindings and key not in self._unbound:
                key = (id(self.module), name.value)
            if key in self._settled or name.value in self._imported and key not in self._bindings:
                alike.add(name.value)
        if "self" not in alike and self._settings_of_self(expr, scope):
            alike.add("self")
        return alike

    def reads_self_settings(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Does ``expr`` read ``self`` only through settings of its class (see _settings_of_self)?"""
        return self._settings_of_self(expr, self._scope_of(at))

    def _settings_of_self(self, expr: cst.BaseExpression, scope: Scope) -> bool:
        """Does ``expr`` read ``self`` only through attributes its class sets in ``__init__`` alone
        (MoleculeX's ``self.config['loss']``): settings the object was made with, alike on every rank
        (never bound again in another method, nor changed in place by an item or attribute set)?"""
        uses = [node for node in walk(expr) if isinstance(node, cst.Attribute) and dotted(node.value) == "self"]
        bare = [n for n in walk(expr) if isinstance(n, cst.Name) and n.value == "self"]
        if not uses or len(uses) != len(bare) or not isinstance(scope, cst.FunctionDef):
            return False
        owner = self.parent_of(self.parent_of(scope))
        if not isinstance(owner, cst.ClassDef):
            return False
        settings = self._init_only.get(id(owner))
        if settings is None:
            settings = self._init_only[id(owner)] = _set_in_init_only(owner)
        return all(use.attr.value in settings for use in uses)


# Methods that only read what they are called on (a settings dict's `get`, its views and copies).
READING_METHODS = frozenset(UNIFORM_METHODS | {"keys", "items", "values", "copy", "format"})


def _set_in_init_only(cls: cst.ClassDef) -> frozenset[str]:
    """Attributes a class assigns in ``__init__`` and nowhere else, and never changes in place
    (``self.config[k] = ...``, ``self.config.x = ...``, ``self.history.append(...)``)."""
    assigned: dict[str, set[str]] = {}
    changed: set[str] = set()
    for method in (f for f in cls.body.body if isinstance(f, cst.FunctionDef)):
        for node in walk(method):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target] if isinstance(node, (cst.AugAssign, cst.AnnAssign)) else []
            for target in targets:
                for part in walk(target):
                    if isinstance(part, cst.Attribute) and dotted(part.value) == "self":
                        (assigned.setdefault(part.attr.value, set()).add(method.name.value) if part is target else changed.add(part.attr.value))
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Attribute) \
                    and dotted(node.func.value.value) == "self" and node.func.attr.value not in READING_METHODS:
                changed.add(node.func.value.attr.value)  # (a method of it called: it may change itself)
    return frozenset(name for name, methods in assigned.items() if methods == {"__init__"} and name not in changed)


def _selects(value: cst.BaseExpression | None) -> bool:
    """``x[idx_seen]``, ``x[mask]``: the elements an index or mask picks (not a slice or a
    number), or a list comprehension that filters (``[j for j in ... if ...]``)."""
    if isinstance(value, cst.ListComp):
        clause = value.for_in
        while clause is not None:
            if clause.ifs:
                return True
            clause = clause.inner_for_in
        return False
    if not isinstance(value, cst.Subscript):
        return False
    return any(
        isinstance(element.slice, cst.Index) and not isinstance(element.slice.value, (cst.Integer, cst.SimpleString, cst.UnaryOperation))
        for element in value.slice
    )


def _pairs(target: cst.BaseExpression, value: cst.BaseExpression | None) -> list[tuple[cst.BaseExpression, cst.BaseExpression | None]]:
    """(target, value) pairs of an assignment: ``step, warmup = 1, 4`` pairs them up; an
    unpacking of anything else binds its names to nothing that can be read here."""
    if isinstance(target, (cst.Tuple, cst.List)):
        parts = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
        if parts is None or len(parts) != len(target.elements) or any(isinstance(e, cst.StarredElement) for e in (*parts, *target.elements)):
            return [(element.value, None) for element in target.elements]
        return [pair for element, part in zip(target.elements, parts) for pair in _pairs(element.value, part.value)]
    return [(target, value)]
