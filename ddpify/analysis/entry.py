"""The entry point: is this file a script, and where must the process-group set-up go.

Fills ``facts.main_guard`` (through the walk), ``module_level_runs``, ``import_time_runs``
and ``setup_anchor``: the first top-level statement that does work.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import QualifiedNameProvider, ScopeProvider

from ddpify.analysis.scopes import Room
from ddpify.analysis.tree import calls_in, dotted, imports, is_training_call, statement_of, walk
from ddpify.names import DATA_PARALLEL

# Module-level calls that only configure (safe before the process group exists).
CONFIGURATION_CALLS = (
    "logging.", "warnings.", "argparse.", "os.path.", "os.environ", "os.getenv", "random.seed",
    "numpy.random.seed", "torch.manual_seed", "torch.backends.", "torch.set_", "builtins.int", "builtins.float",
)


class Entry(Room):
    def __init__(self, scopes) -> None:
        super().__init__(scopes)

    def runs_here(self, call: cst.Call, names: set[str]) -> bool:
        """Does this module-level call wrap, train, or run a function or class of this file?"""
        if names & DATA_PARALLEL:
            return True
        if isinstance(call.func, cst.Attribute):
            return is_training_call(call)
        scope = self.scopes.get_metadata(ScopeProvider, call.func, None) if isinstance(call.func, cst.Name) else None
        return scope is not None and any(
            isinstance(getattr(assignment, "node", None), (cst.FunctionDef, cst.ClassDef))
            for assignment in scope[call.func.value]
        )

    def setup_anchor(self, module: cst.Module) -> cst.CSTNode | None:
        """The first top-level statement that does work: set-up must run before it.

        With a `__main__` block, configuration above it (logging, warnings, argparse,
        seeds) may run before set-up: set-up goes into the `__main__` block instead of
        moving the whole module into `try`.
        """
        configuration: set[str] = set()  # names bound to configuration objects (parsers, loggers)
        # Set-up needs torch: never before the last top-level import (scripts set
        # CUDA_VISIBLE_DEVICES or sys.path first and import torch after).
        # (but before a wrap at the top level, with imports below it: high-res-stereo)
        wrapping = {id(site.call) for site in self.facts.wraps}
        first_wrap = next(
            (i for i, statement in enumerate(module.body)
             if not isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and any(id(n) in wrapping for n in walk(statement))),
            len(module.body),
        )
        found = [i for i, statement in enumerate(module.body) if imports(statement) and i < first_wrap]
        last_import = found[-1] if found else -1
        for index, statement in enumerate(module.body):
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or index < last_import:
                continue
            if statement is self.facts.main_guard:
                return statement
            if self._declares_only(statement):
                continue
            if self.facts.main_guard is not None and self._is_configuration(statement, configuration):
                continue
            return statement
        return None

    def setup_function(self, module: cst.Module) -> cst.FunctionDef | None:
        """The top-level function of this file that the `__main__` block runs first, after
        nothing but configuration (argument parsing, seeds, logging): ``main()``."""
        guard = self.facts.main_guard
        if guard is None or self.facts.setup_anchor is not guard or not isinstance(guard.body, cst.IndentedBlock):
            return None
        configuration: set[str] = set()
        for statement in guard.body.body:
            call = _sole_call(statement)
            function = self.scopes.module_functions.get(call.func.value) if call is not None and isinstance(call.func, cst.Name) else None
            if function is not None:
                return function
            if not (self._declares_only(statement) or self._is_configuration(statement, configuration)):
                return None
        return None

    def _is_configuration(self, statement: cst.CSTNode, configuration: set[str]) -> bool:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        for call in calls_in(statement):
            names = {q.name for q in self.scopes.get_metadata(QualifiedNameProvider, call.func, set())}
            base = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
            if not (any(n.startswith(CONFIGURATION_CALLS) for n in names) or base in configuration):
                return False
        for small in statement.body:
            if isinstance(small, cst.Assign):
                configuration.update(filter(None, (dotted(t.target) for t in small.targets)))
        return True

    def _declares_only(self, statement: cst.CSTNode) -> bool:
        """Declarations, also inside `if TYPE_CHECKING:` and `try: import x except ImportError:`."""
        if isinstance(statement, cst.SimpleStatementLine):
            return self._is_declaration(statement)
        if isinstance(statement, cst.If):
            parts = [statement.body, statement.orelse]
            if calls_in(statement.test):
                return False
        elif isinstance(statement, cst.Try):
            parts = [statement.body, *statement.handlers, statement.orelse, statement.finalbody]
        elif isinstance(statement, (cst.Else, cst.ExceptHandler, cst.Finally)):
            parts = [statement.body]
        elif isinstance(statement, cst.IndentedBlock):
            parts = list(statement.body)
        else:
            return False
        return all(part is None or self._declares_only(part) for part in parts)

    def _is_declaration(self, line: cst.SimpleStatementLine) -> bool:
        """Imports, docstrings and assignments without calls: safe before set-up."""
        for small in line.body:
            if isinstance(small, (cst.Import, cst.ImportFrom, cst.Pass)):
                continue
            if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
                continue
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and not calls_in(small):
                continue
            return False
        return True


def _sole_call(statement: cst.CSTNode) -> cst.Call | None:
    """``main()`` / ``main(args)`` / ``x = main(...)``: the call a statement line is."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
    return value if isinstance(value, cst.Call) else None


def runs_after_setup(statement: cst.CSTNode, facts, parent_of, callers_run_after=None) -> bool:
    """Is the process group surely set up when this statement runs? In the `__main__` block
    after the set-up, a flat script's statements from the set-up on, the function the set-up
    opens (``main()``), and functions that run the model or a collective (nothing trains
    before the set-up). ``callers_run_after(function)`` answers for the other functions."""
    node, top = statement, statement
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
        top, node = node, parent_of(node)
    if isinstance(node, cst.FunctionDef):
        if node is facts.setup_function or node in facts.unsafe_functions:
            return True
        return callers_run_after is not None and callers_run_after(node)
    anchor = facts.setup_anchor
    if facts.setup_function is not None:
        # (configuration above `main()` in the `__main__` block runs before it; what comes
        # after `args = get_args()`, the set-up opening get_args(), runs after)
        return _after_a_call_of(statement, facts.setup_function.name.value, parent_of)
    if anchor is None:
        return False
    if anchor is facts.main_guard:
        inside = statement
        while inside is not None and inside is not anchor:
            inside = parent_of(inside)
        return inside is anchor
    order = {id(line): index for index, line in enumerate(node.body)} if node is not None else {}
    return id(top) in order and id(anchor) in order and order[id(top)] >= order[id(anchor)]


def _after_a_call_of(statement: cst.CSTNode, function: str, parent_of) -> bool:
    """Is there a statement calling ``function`` before this one, in a block around it at
    module level (the `__main__` block, the module)?"""
    child, node = statement, parent_of(statement)
    while node is not None and not isinstance(node, cst.FunctionDef):
        body = node.body if isinstance(node, (cst.Module, cst.IndentedBlock)) else None
        if isinstance(body, (list, tuple)) and child in body:
            earlier = body[: body.index(child)]
            if any(isinstance(call.func, cst.Name) and call.func.value == function for line in earlier for call in calls_in(line)):
                return True
        child, node = node, parent_of(node)
    return False


def callers_run_after_setup(facts, parent_of, reaches):
    """``callers_run_after`` for ``runs_after_setup``: a function of the file whose every call
    is a statement that ``reaches(statement)`` (every rank goes there, say) and that runs
    after the set-up, its own function's callers followed in turn."""
    answers: dict[cst.FunctionDef, bool] = {}

    def check(function: cst.FunctionDef) -> bool:
        if function in answers:
            return answers[function]
        answers[function] = False  # (a function that calls itself)
        statements = [statement_of(call, parent_of) for call, _ in facts.analyzer.calls.call_sites(function)]
        answers[function] = bool(statements) and all(
            statement is not None and reaches(statement) and runs_after_setup(statement, facts, parent_of, check)
            for statement in statements
        )
        return answers[function]

    return check
