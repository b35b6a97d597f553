"""Whole blocks under a rank-0 guard, not statements: what joins a guarded write, and where a
rank-0-only object's value would leave its guard.

A write that runs on rank 0 only takes the values computed only for it along
(``state = {...}`` and ``save_path = os.path.join(writer.file_writer.get_logdir(), ...)``
right above ``torch.save(state, save_path)``): on the other ranks they were never needed, and
computing them there may touch what only rank 0 has (a writer made on rank 0 only). A folder
made after a check of its existence (``if os.path.exists(d): raise ...`` then
``os.makedirs(d)``) is one unit: done by rank 0 alone, then the others wait, or the rank
that comes second would find the folder rank 0 just made.

A stand-in (``DdpNoOp``) for a rank-0-only object is safe only where nothing is taken from
it: its method calls as statements (``writer.add_scalar(...)``), ``with writer:``, code that
runs on rank 0 only, and the same uses of a parameter it is passed to in this file. Any
other use (``os.path.join(writer.file_writer.get_logdir(), ...)``, ``x = writer.logdir``) is
an escape: the object is then made on every rank instead (a warning says so).
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import ParentNodeProvider, ScopeProvider

from ddpify.analysis.tree import bound_names, calls_in, dotted, names_bound_in, walk

# Calls that look at a path on disk: a check of a folder before it is made.
EXISTENCE_CHECKS = ("os.path.exists", "os.path.isdir", "os.path.isfile", "exists", "is_dir", "isdir")
FOLDER_MAKERS = ("os.makedirs", "os.mkdir", "mkdir")
REMOVERS = ("shutil.rmtree", "os.rmdir", "os.remove", "os.unlink", "rmtree")


class GuardUnits:
    """Statements that join a rank-0 guard, decided on the original tree before rewriting."""

    def __init__(
        self, module: cst.Module, metadata, guardable: Callable[[cst.CSTNode], bool], unsafe: Callable[[cst.Call], bool],
        unsafe_for_a_value: Callable[[cst.Call], bool] | None = None,
    ) -> None:
        self.metadata = metadata
        self.guardable = guardable
        self.unsafe = unsafe
        self.unsafe_for_a_value = unsafe_for_a_value or unsafe  # (stricter: a value need not move)
        self.joined: set[cst.CSTNode] = set()  # statements guarded with the write below them
        self.followers: set[cst.CSTNode] = set()  # statements guarded with the write above them (its file's close())
        self.folder_units: set[cst.CSTNode] = set()  # folder checks and the folder made after them
        self.remade: set[cst.CSTNode] = set()  # among them, a folder removed and made again
        for node in walk(module):
            if isinstance(node, (cst.Module, cst.IndentedBlock)):
                self._plan(list(node.body))

    def removes_then_makes(self, statement: cst.CSTNode) -> bool:
        return statement in self.remade

    def guarded(self, statement: cst.CSTNode) -> bool:
        return statement in self.joined or statement in self.folder_units or statement in self.followers

    def _plan(self, statements: list[cst.BaseStatement]) -> None:
        for index, statement in enumerate(statements):
            if index and self._checks_then_makes(statements[index - 1], statement):
                self.folder_units.update((statements[index - 1], statement))
            if index and self._removes_then_makes(statements[index - 1], statement):
                self.folder_units.update((statements[index - 1], statement))
                self.remade.update((statements[index - 1], statement))
            if self._checks_then_writes(statement):
                self.folder_units.add(statement)
            if not self.guardable(statement):
                continue
            unit = [statement]
            before = index - 1
            while before >= 0 and self._feeds_only(statements[before], unit):
                unit.append(statements[before])
                self.joined.add(statements[before])
                before -= 1
            bound = names_bound_in(statement)
            for after in statements[index + 1:]:
                if not self._uses_only(after, bound):
                    break
                self.followers.add(after)

    def _uses_only(self, statement: cst.BaseStatement, bound: set[str]) -> bool:
        """``the_file.close()`` right after the guarded ``with open(...) as the_file:``: calls of
        what the guarded statement bound, as statements (reid: on rank 1 the name was never bound)."""
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        return all(
            isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
            and isinstance(small.value.func, cst.Attribute) and dotted(small.value.func.value) in bound
            and not any(self.unsafe(call) for call in calls_in(small.value))
            for small in statement.body
        )

    def _feeds_only(self, statement: cst.BaseStatement, unit: list[cst.BaseStatement]) -> bool:
        """``name = value`` whose every later read is inside ``unit``, computed without the
        model or a collective."""
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return False
        assign = statement.body[0]
        if not isinstance(assign, cst.Assign) or any(self.unsafe_for_a_value(call) for call in calls_in(assign.value)):
            return False
        targets = [target.target for target in assign.targets]
        if not all(isinstance(target, cst.Name) for target in targets):
            return False
        inside = {id(node) for member in unit for node in walk(member)}
        for target in targets:
            references = self._references(target)
            if references is None or not references:
                return False
            if any(id(node) not in inside and not self._bound_again_before(node, statement, target.value) for node in references):
                return False
            if self._read_in_the_next_pass(target, statement, inside, references):
                return False
        return True

    def _read_in_the_next_pass(self, target: cst.Name, statement: cst.BaseStatement, inside: set[int], references) -> bool:
        """A read in the same loop above the binding (FCHarDNet's ``if score >= best_iou:``
        above ``best_iou = score``): the binding reaches it on the loop's next pass, which
        the scope's accesses (read before the binding, in text) do not say."""
        loop = self._parent(statement)
        while loop is not None and not isinstance(loop, (cst.For, cst.While, cst.FunctionDef, cst.Module)):
            loop = self._parent(loop)
        if not isinstance(loop, (cst.For, cst.While)):
            return False
        scope = self.metadata.get_metadata(ScopeProvider, target, None)
        known = {id(node) for node in references}
        in_loop = {id(node) for node in walk(loop)}
        return scope is not None and any(
            id(access.node) in in_loop and id(access.node) not in inside and id(access.node) not in known
            and not self._bound_before_in(access.node, loop, target.value)
            for access in scope.accesses[target.value]
        )

    def _bound_before_in(self, read: cst.CSTNode, loop: cst.CSTNode, name: str) -> bool:
        """Is ``name`` bound again above ``read`` in a block between it and ``loop`` (so each
        pass rebinds it before the read: FCHarDNet's ``state = {...}`` above each save)?"""
        node = read
        while node is not None and node is not loop:
            parent = self._parent(node)
            body = getattr(parent, "body", None)
            if isinstance(parent, cst.IndentedBlock) and isinstance(body, (list, tuple)):
                at = next((i for i, s in enumerate(body) if s is node), 0)
                if any(_binds(statement, name) for statement in body[:at]):
                    return True
            node = parent
        return False

    def _bound_again_before(self, read: cst.CSTNode, first: cst.BaseStatement, name: str) -> bool:
        """Is ``read`` reached only by a later ``name = ...`` (FCHarDNet's second
        ``save_path = os.path.join(...)`` for the best model), not by ``first``? A statement
        binding it again comes before the read in a block that holds the read and not
        ``first``, or, in the innermost block holding both, between them."""
        above_first = set()
        node = first
        while node is not None:
            above_first.add(id(node))
            node = self._parent(node)
        node = read
        while node is not None and not isinstance(node, cst.Module):
            parent = self._parent(node)
            body = getattr(parent, "body", None)
            if isinstance(parent, (cst.IndentedBlock, cst.Module)) and isinstance(body, (list, tuple)):
                at_read = next((i for i, s in enumerate(body) if s is node), 0)
                if id(parent) not in above_first:
                    if any(_binds(statement, name) for statement in body[:at_read]):
                        return True
                else:
                    at_first = next((i for i, s in enumerate(body) if id(s) in above_first), None)
                    return at_first is not None and any(_binds(statement, name) for statement in body[at_first + 1 : at_read])
            node = parent
        return False

    def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.metadata.get_metadata(ParentNodeProvider, node, None)

    def _references(self, name: cst.Name) -> list[cst.CSTNode] | None:
        scope = self.metadata.get_metadata(ScopeProvider, name, None)
        if scope is None:
            return None
        for assignment in scope.assignments[name.value]:
            if getattr(assignment, "node", None) is name:
                return [access.node for access in assignment.references]
        return None

    def _checks_then_makes(self, check: cst.BaseStatement, make: cst.BaseStatement) -> bool:
        """``if os.path.exists(d): ...`` right above ``os.makedirs(d)`` (the same path)."""
        if not isinstance(check, cst.If) or not isinstance(make, cst.SimpleStatementLine):
            return False
        if any(self.unsafe(call) for call in calls_in(check)):
            return False
        return _same_path(_calls_named(make, FOLDER_MAKERS), _calls_named(check.test, EXISTENCE_CHECKS))

    def _removes_then_makes(self, remove: cst.BaseStatement, make: cst.BaseStatement) -> bool:
        """``shutil.rmtree(d)`` right above ``os.makedirs(d, exist_ok=False)`` (the Two-Stage
        SELD's fresh submission folder): one unit, rank 0's alone; made on every rank after
        rank 0 made it, a maker that insists on a new folder would fail there."""
        if not isinstance(remove, cst.SimpleStatementLine) or not isinstance(make, cst.SimpleStatementLine):
            return False
        if any(self.unsafe(call) for call in [*calls_in(remove), *calls_in(make)]):
            return False
        return _same_path(_calls_named(make, FOLDER_MAKERS), _calls_named(remove, REMOVERS))

    def _checks_then_writes(self, statement: cst.BaseStatement) -> bool:
        """``if not os.path.exists(config_path): copyfile(example, config_path)`` (edge-connect):
        the check and the writes under it are one unit, done by rank 0 alone; the others wait,
        then read what it wrote."""
        if not isinstance(statement, cst.If) or statement.orelse is not None:
            return False
        if not any((dotted(call.func) or "").endswith(EXISTENCE_CHECKS) for call in calls_in(statement.test)):
            return False
        body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else ()
        return bool(body) and all(self.guardable(line) for line in body) and not any(self.unsafe(call) for call in calls_in(statement))


def _calls_named(node: cst.CSTNode, endings: tuple[str, ...]) -> list[cst.Call]:
    return [call for call in calls_in(node) if (dotted(call.func) or "").endswith(endings)]


def _same_path(made: list[cst.Call], other: list[cst.Call]) -> bool:
    """Does a folder maker make a path the other calls look at (or remove)?"""
    return bool(({path_code(call) for call in made} - {None}) & {path_code(call) for call in other})


def _binds(statement: cst.BaseStatement, name: str) -> bool:
    """``name = ...`` on its own line."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets)
        for small in statement.body
    )


def path_code(call: cst.Call) -> str | None:
    """The path a call looks at or makes: its first argument, or what ``path.exists()`` is
    called on."""
    module = cst.Module([])
    if call.args and call.args[0].keyword is None:
        return module.code_for_node(call.args[0].value)
    if isinstance(call.func, cst.Attribute):
        return module.code_for_node(call.func.value)
    return None


def stand_in_escapes(
    target: cst.BaseExpression, module: cst.Module, parent_of, guarded: Callable[[cst.CSTNode], bool], fetch=None
) -> cst.CSTNode | None:
    """The first use of a rank-0-only object bound to ``target`` (``writer``,
    ``self.writer``) that takes something from it outside a rank-0 guard, or None; a function
    of this file it is passed to is followed into (its parameter's uses, under that name)."""
    return _escape_from([(dotted(target), module)], target, module, parent_of, guarded, fetch)


def argument_escapes(made: cst.Call, module: cst.Module, parent_of, guarded: Callable[[cst.CSTNode], bool]) -> cst.CSTNode | None:
    """stand_in_escapes for an object made as an argument (``train(SummaryWriter(...))``): its
    uses under the parameter's name in the function of this file that receives it; the call
    itself when it goes to nothing this file defines (nothing can be followed)."""
    passed = _passed_to(made, parent_of, _functions(module))
    if not passed:
        return made
    return _escape_from(passed, made, module, parent_of, guarded)


def _functions(module: cst.Module) -> dict[str, list[cst.FunctionDef]]:
    functions: dict[str, list[cst.FunctionDef]] = {}
    for node in walk(module):
        if isinstance(node, cst.FunctionDef):
            functions.setdefault(node.name.value, []).append(node)
    return functions


def _escape_from(pending: list, target: cst.CSTNode, module: cst.Module, parent_of, guarded, fetch=None) -> cst.CSTNode | None:
    functions = _functions(module)
    seen = set()
    while pending:
        name, scope = pending.pop()
        if name is None or (name, id(scope)) in seen:
            continue
        seen.add((name, id(scope)))
        for node in walk(scope):
            if not isinstance(node, (cst.Name, cst.Attribute)) or dotted(node) != name or node is target:
                continue
            if isinstance(node, cst.Name) and isinstance(parent_of(node), cst.Attribute) and parent_of(node).attr is node:
                continue  # `x.writer`: another object's field
            alias = _alias(node, parent_of)
            if alias is not None:  # `args.writer = writer`: its uses under that name count too
                pending.append((alias, module))
                continue
            escape = _escape(node, parent_of, guarded)
            if escape is not None and not (fetch is not None and _fetched(escape, node, parent_of, fetch)):
                return escape
            pending += _passed_to(node, parent_of, functions)
    return None


def _fetched(escape: cst.CSTNode, use: cst.CSTNode, parent_of, fetch) -> bool:
    """``is_best = logger.save_best(...)`` (PENet's logger): a method's result bound whole, which
    rank 0 computes and sends to the others, when ``fetch`` (the call) allows it."""
    call = parent_of(escape)
    if not isinstance(call, cst.Call) or call.func is not escape or not isinstance(escape, cst.Attribute):
        return False
    assign = parent_of(call)
    if not isinstance(assign, cst.Assign) or assign.value is not call:
        return False
    return bool(fetch(call))


def _alias(use: cst.CSTNode, parent_of) -> str | None:
    """``args.writer = writer`` -> "args.writer": the object bound whole to another name."""
    assign = parent_of(use)
    if isinstance(assign, cst.Assign) and assign.value is use and len(assign.targets) == 1:
        return dotted(assign.targets[0].target)
    return None


def _passed_to(use: cst.CSTNode, parent_of, functions: dict[str, list[cst.FunctionDef]]) -> list[tuple[str, cst.CSTNode]]:
    """``train(model, writer)`` -> [("logger", <def train(model, logger)>)]: the parameter of a
    function of this file that receives the object."""
    arg = parent_of(use)
    call = parent_of(arg) if isinstance(arg, cst.Arg) else None
    if not isinstance(call, cst.Call) or arg.value is not use:
        return []
    name = call.func.value if isinstance(call.func, cst.Name) else call.func.attr.value if isinstance(call.func, cst.Attribute) else None
    found = []
    for function in functions.get(name, []):
        params = list(function.params.params)
        if isinstance(call.func, cst.Attribute) and params and params[0].name.value in ("self", "cls"):
            params = params[1:]
        if arg.keyword is not None:
            found += [(arg.keyword.value, function)] if any(p.name.value == arg.keyword.value for p in params) else []
            continue
        index = [a for a in call.args if a.keyword is None and not a.star].index(arg) if not arg.star else None
        if index is not None and index < len(params):
            found.append((params[index].name.value, function))
    return found


def _escape(use: cst.CSTNode, parent_of, guarded) -> cst.CSTNode | None:
    """Does this use take a value from the stand-in outside a guard?"""
    node = use
    while node is not None and not isinstance(node, cst.Module):
        if isinstance(node, cst.BaseStatement) and guarded(node):
            return None
        node = parent_of(node)
    child, parent = use, parent_of(use)
    while isinstance(parent, cst.Attribute) and parent.value is child:  # writer.file_writer.flush
        child, parent = parent, parent_of(parent)
    if isinstance(parent, cst.Call) and parent.func is child and isinstance(parent_of(parent), cst.Expr):
        return None  # `writer.add_scalar(...)` as a statement: its result is dropped
    if isinstance(parent, (cst.WithItem, cst.AssignTarget, cst.Param)):
        return None  # `with writer:`; a binding of the name
    if isinstance(parent, cst.Arg) and child is use:
        return None  # passed on: a callee of this file is followed (stand_in_escapes)
    if isinstance(parent, (cst.Return, cst.Element, cst.DictElement)) and child is use:
        return None  # handed on whole (`return writer`, `{"writer": writer}`): its holder calls its methods
    if isinstance(parent, (cst.If, cst.IfExp, cst.While)) and parent.test is child and child is use:
        return None  # `if writer:` (the stand-in is false)
    if isinstance(parent, cst.Comparison) and child is use:
        return None  # `if writer is not None:`
    # (a value read from it and tested, `if early_stopping.early_stop: break`, steers every
    # rank: a stand-in's answer would send the others another way)
    return child


def bound_target(assign: cst.Assign) -> cst.BaseExpression | None:
    if len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    return target if bound_names(target) and isinstance(target, (cst.Name, cst.Attribute)) else None
