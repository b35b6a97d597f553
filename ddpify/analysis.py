"""The analysis pass: facts about a script that the transforms act on.

One visitor walks the original tree once and records, keyed by original nodes:

- every DataParallel wrap site (with a chained ``.to(...)``/``.cuda()`` and any enclosing
  ``if``), other references to the DataParallel class, and forms that cannot be converted;
- every DataLoader, and which of them feed a training loop (a loop whose body calls
  ``backward()`` or ``step()``), traced through function parameters and ``self.`` attributes;
- the epoch loops around those training loops, with the expression that names the loader
  there (for ``set_epoch``);
- the names bound to wrapped models and the functions that call a model or a collective, so
  that rank-0 guards never wrap them (that would hang the other ranks);
- the ``if __name__ == "__main__":`` block and where the process-group set-up must go.

Transforms read these facts; they never re-derive them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import (
    Assignment,
    GlobalScope,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from ddpify.names import (
    DATA_LOADER,
    DATA_PARALLEL,
    DATA_PARALLEL_FUNCTION,
    DDP,
    METRIC_SCHEDULERS,
    RANK_WORDS,
    SAMPLER,
)

ALREADY_DISTRIBUTED = DDP | SAMPLER | {"torch.distributed.init_process_group"}
DEVICE_COUNT = "torch.cuda.device_count"
# Calls that only wrap an iterable: the loader is their first argument.
ITERABLE_WRAPPERS = {"builtins.enumerate", "builtins.iter", "builtins.zip"}
# Method names that run the model's forward or backward (a DDP collective).
COLLECTIVE_METHODS = {"backward", "forward"}
TRAINING_METHODS = {"backward", "step"}
# `scheduler.step()` steps a learning-rate schedule, not a model.
SCHEDULER_WORDS = ("sched", "warmup")

Loop = cst.For | cst.While
Function = cst.FunctionDef


@dataclass
class Guard:
    """An ``if`` (statement or expression) around a wrap, and on which side the wrap sits."""

    node: cst.If | cst.IfExp
    wraps_when_true: bool


@dataclass
class WrapSite:
    """One ``DataParallel(...)`` call and what surrounds it."""

    call: cst.Call
    outer: cst.BaseExpression  # the call, or the `.to(...)`/`.cuda()` call chained on it
    move: cst.Call | None  # that chained call
    module_arg: cst.BaseExpression | None
    target: str | None  # "model" / "self.model": what the wrapped model is bound to
    guards: list[Guard] = field(default_factory=list)  # enclosing `if`s that gate the wrap
    device_count: int | None = None  # number of GPUs named by a literal device_ids


@dataclass(frozen=True)
class ForeignLoader:
    """Project mode: a loader that a function of another project module returns
    (``train_loader, val_loader = build_loaders(args)``): sharded there, set_epoch here."""

    call: cst.Call  # the call of that function, in this file
    function: str  # its dotted name here: "build_loaders", "data.build_loaders"
    index: int | None  # which element of the returned tuple; None: the whole value


@dataclass
class LoaderSite:
    call: cst.Call  # a stand-in node for a foreign loader (never found in the tree)
    target: str | None
    training: bool = False
    foreign: ForeignLoader | None = None


@dataclass
class EpochHook:
    """An epoch loop and the loaders whose sampler needs ``set_epoch`` at its top."""

    loop: Loop
    # code of the loader expression as the loop sees it -> (that expression, DataLoader calls)
    loaders: dict[str, tuple[cst.BaseExpression, list[cst.Call]]] = field(default_factory=dict)
    # code -> where the loop uses it: the training loop over it, or the call it is passed to
    uses: dict[str, list[cst.CSTNode]] = field(default_factory=dict)


@dataclass
class Context:
    """Where a node sits: its function, class and the loops around it in that function."""

    function: Function | None
    cls: cst.ClassDef | None
    loops: tuple[Loop, ...]


@dataclass
class Problem:
    node: cst.CSTNode
    code: str
    message: str


@dataclass
class Facts:
    wraps: list[WrapSite] = field(default_factory=list)
    dp_references: list[cst.BaseExpression] = field(default_factory=list)
    loaders: dict[cst.Call, LoaderSite] = field(default_factory=dict)
    shared_loaders: set[cst.Call] = field(default_factory=set)  # built by a helper called more than once
    iterator_loaders: set[cst.Call] = field(default_factory=set)  # drawn from with next(iter(loader))
    epoch_hooks: dict[Loop, EpochHook] = field(default_factory=dict)
    pass_hooks: dict[Loop, EpochHook] = field(default_factory=dict)  # no epoch loop in sight: see SetEpoch
    parameter_stand_ins: set[cst.Call] = field(default_factory=set)  # see Analyzer._constructor_fed
    model_names: set[str] = field(default_factory=set)
    unsafe_functions: set[Function] = field(default_factory=set)
    unsafe_method_names: set[str] = field(default_factory=set)
    main_guard: cst.If | None = None
    setup_anchor: cst.CSTNode | None = None  # first top-level statement that does work
    problems: list[Problem] = field(default_factory=list)  # refuse the file
    distributed_uses: list[cst.CSTNode] = field(default_factory=list)  # DDP code already there
    contexts: dict[cst.CSTNode, Context] = field(default_factory=dict)
    has_training_step: bool = False
    training_loops: list[Loop] = field(default_factory=list)  # loops that call backward()/step()
    fed_loops: set[Loop] = field(default_factory=set)  # training loops that draw from a known DataLoader
    # (function or None for module level, code) of what training loops there iterate: sharded
    training_loader_names: set[tuple[Function | None, str]] = field(default_factory=set)
    existing_ddp: bool = False  # torch.distributed code next to DataParallel
    star_imports: bool = False
    dp_subclasses: dict[str, cst.ClassDef] = field(default_factory=dict)  # that only forward attributes  # `from models import *` may bind torch and nn
    # module-level code wraps, trains, or calls a function or class defined here (a script,
    # not an imported helper module)
    module_level_runs: bool = False
    import_time_runs: bool = False  # module_level_runs outside the `__main__` block
    metric_schedulers: set[str] = field(default_factory=set)  # `scheduler` = ReduceLROnPlateau(...)
    names: set[str] = field(default_factory=set)  # every name the module uses (fresh names avoid them)
    # `n_gpu` / `args.n_gpu`: bound only ever to torch.cuda.device_count()
    gpu_count_names: set[str] = field(default_factory=set)
    project_names: frozenset[str] = frozenset()  # bound from other project modules (project mode)
    # project mode: functions of this module whose returned DataLoaders (at these indices of
    # a returned tuple; None: the value itself) another module trains on
    loader_functions: dict[str, set[int | None]] = field(default_factory=dict)
    loader_functions_unresolved: list[str] = field(default_factory=list)  # none to shard there
    # project mode (None: one file on its own): calls of other modules' functions whose
    # training loop iterates a parameter, by call name -> [(positional index, parameter name)]
    parameter_loaders: dict[str, list[tuple[int, str]]] | None = None
    # project mode: this module's top-level functions whose training loop iterates a
    # parameter no caller here feeds (the callers in other modules shard what they pass)
    loader_parameters: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    # project mode: the call names of parameter_loaders whose loader was found here, and not
    sharded_parameter_calls: set[str] = field(default_factory=set)
    reexports: dict[str, str] = field(default_factory=dict)  # see ProjectLinks.reexports
    training_calls: frozenset[str] = frozenset()  # see ProjectLinks.training_calls
    # a training loader read once outside the training loop (class weights, mean/std): what
    # reads it, per loader call; that pass now sees this rank's shard only
    side_passes: dict[cst.Call, list[tuple[cst.CSTNode, str]]] = field(default_factory=dict)

    @property
    def foreign_training_loaders(self) -> list[ForeignLoader]:
        return [site.foreign for site in self.training_loaders if site.foreign is not None]
    analyzer: Analyzer | None = None  # answers "does this call reach the model?" for transforms

    @property
    def training_loaders(self) -> list[LoaderSite]:
        return [site for site in self.loaders.values() if site.training]


def dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def is_main_guard(node: cst.CSTNode) -> bool:
    """`if __name__ == "__main__":` (either order, either quotes)."""
    if not isinstance(node, cst.If) or not isinstance(node.test, cst.Comparison):
        return False
    test = node.test
    if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = {type(test.left), type(test.comparisons[0].comparator)}
    texts = {getattr(test.left, "value", None), getattr(test.comparisons[0].comparator, "value", None)}
    return sides == {cst.Name, cst.SimpleString} and "__name__" in texts and bool(
        texts & {'"__main__"', "'__main__'"}
    )


def calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call inside `node`, in source order (a cheap stand-in for matchers.findall)."""
    return [found for found in walk(node) if isinstance(found, cst.Call)]


# Module-level calls that only configure (safe before the process group exists).
CONFIGURATION_CALLS = (
    "logging.", "warnings.", "argparse.", "os.path.", "os.environ", "os.getenv", "random.seed",
    "numpy.random.seed", "torch.manual_seed", "torch.backends.", "torch.set_", "builtins.int", "builtins.float",
)
# Calls whose results are the same on every rank inside a condition (same_on_every_rank).
UNIFORM_CALLS = {"len", "range", "int", "min", "max"}


def same_on_every_rank(test: cst.BaseExpression, loop_names: set[str]) -> bool:
    """Is this condition the same on every rank of a converted DataParallel script?

    Loop counters, attributes (``args.log_interval``), CONSTANTS, literals and ``len()``
    are; a loss, an output or any other data-derived value may not be.
    """
    for call in calls_in(test):
        if dotted(call.func) not in UNIFORM_CALLS:
            return False
    in_attributes = {id(part) for n in walk(test) if isinstance(n, cst.Attribute) for part in (n.value, n.attr)}
    for name in names_in(test):
        if id(name) in in_attributes or name.value in UNIFORM_CALLS or name.value in ("True", "False", "None"):
            continue
        if name.value not in loop_names and not name.value.isupper():
            return False
    return True


def loop_names_around(node: cst.CSTNode, parent_of) -> set[str]:
    """Targets of the `for` loops around `node` (up to its function), and the function's
    step counters (`step = 0` ... `step += 1`): rank-uniform counters (every rank runs as
    many steps: a DistributedSampler gives each the same number of samples)."""
    names: set[str] = set()
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
        if isinstance(node, cst.For):
            names |= {name.value for name in names_in(node.target)}
        node = parent_of(node)
    return names | (_step_counters(node) if node is not None else set())


def _step_counters(scope: cst.CSTNode) -> set[str]:
    """Names only ever set to an integer literal or increased by one."""
    counted: dict[str, bool] = {}
    for found in walk(scope):
        if isinstance(found, cst.AugAssign) and isinstance(found.target, cst.Name):
            steady = isinstance(found.operator, cst.AddAssign) and isinstance(found.value, cst.Integer)
            counted[found.target.value] = counted.get(found.target.value, True) and steady
        elif isinstance(found, cst.Assign):
            for target in found.targets:
                for name in bound_names(target.target):
                    counted[name] = counted.get(name, True) and isinstance(found.value, cst.Integer)
        elif isinstance(found, (cst.For, cst.AnnAssign)):
            target = found.target
            for name in bound_names(target) if isinstance(found, cst.AnnAssign) else [n.value for n in names_in(target)]:
                counted[name] = False
    increased = {
        found.target.value for found in walk(scope) if isinstance(found, cst.AugAssign) and isinstance(found.target, cst.Name)
    }
    return {name for name, steady in counted.items() if steady and name in increased}


def same_path_on_every_rank(node: cst.CSTNode, parent_of) -> bool:
    """Does every rank surely reach this statement when rank 0 does?

    DataParallel scripts have no rank-dependent code, so only data can make ranks
    diverge: an ``if``/``while`` on a loss or output, or an exception handler.
    Conditions on loop counters, attributes (``args.log_interval``), constants and
    ``len()`` are the same on every rank.
    """
    loop_names = loop_names_around(node, parent_of)
    parent = parent_of(node)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.ExceptHandler):
            return False
        if isinstance(parent, (cst.If, cst.While)) and not same_on_every_rank(parent.test, loop_names):
            if not is_main_guard(parent):  # `if __name__ == "__main__":` runs on every rank
                return False
        parent = parent_of(parent)
    return True


def bound_names(target: cst.BaseExpression) -> list[str]:
    """`a`, `self.a` for an assignment target; each element of a tuple/list target."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in bound_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return bound_names(target.value)
    name = dotted(target)
    return [name] if name else []


class _Subtrees:
    """Every node of the tree being converted in source order, and where each node's subtree
    starts and ends in that list: ``walk`` of an original node is then a slice, not a new
    traversal (transforms ask for the calls inside statements many times)."""

    nodes: list[cst.CSTNode] = []
    spans: dict[cst.CSTNode, tuple[int, int]] = {}

    @classmethod
    def start(cls) -> None:
        cls.nodes, cls.spans, cls._starts = [], {}, {}

    @classmethod
    def enter(cls, node: cst.CSTNode) -> None:
        cls._starts[node] = len(cls.nodes)
        cls.nodes.append(node)

    @classmethod
    def leave(cls, node: cst.CSTNode) -> None:
        cls.spans[node] = (cls._starts.pop(node), len(cls.nodes))


def walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node` and everything below it, in source order."""
    span = _Subtrees.spans.get(node)
    if span is not None:
        return _Subtrees.nodes[span[0] : span[1]]
    found: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, visited: cst.CSTNode) -> bool:
            found.append(visited)
            return True

    node.visit(Collect())
    return found


def names_in(node: cst.CSTNode) -> list[cst.Name]:
    return [n for n in walk(node) if isinstance(n, cst.Name)]


def under_rank_guard(node: cst.CSTNode | None, parent_of, code_of) -> bool:
    """Is `node` inside an `if` whose test reads a rank (``if rank == 0:``, ``if is_main_process():``)?"""
    while node is not None and not isinstance(node, cst.Module):
        if isinstance(node, cst.If) and any(word in code_of(node.test) for word in RANK_WORDS):
            return True
        node = parent_of(node)
    return False


# Names a star import (``from models import *``) commonly brings in, and what they stand for.
STAR_IMPORTED_ROOTS = {"torch": "torch", "nn": "torch.nn"}


def star_imported_torch(node: cst.CSTNode, scope_of) -> set[str]:
    """``torch.nn.DataParallel`` / ``nn.DataParallel`` where ``torch`` / ``nn`` is bound by
    nothing but a star import: taken to be torch's (the spelled-out path says so)."""
    name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
    if not name or "." not in name:
        return set()
    root, rest = name.split(".", 1)
    base = node
    while isinstance(base, cst.Attribute):
        base = base.value
    scope = scope_of(base)
    if root not in STAR_IMPORTED_ROOTS or scope is None or list(scope[root]):
        return set()
    return {f"{STAR_IMPORTED_ROOTS[root]}.{rest}"}


# What a DataParallel subclass may define and still work on top of DDP unchanged.
FORWARDING_METHODS = {"__getattr__", "__init__"}
# DataParallel internals DDP does not have.
DATA_PARALLEL_INTERNALS = ("scatter", "gather", "replicate", "parallel_apply", "chunk_sizes", "output_device", "src_device_obj")


def _subclass_blocker(node: cst.ClassDef) -> str | None:
    """Why a DataParallel subclass cannot simply become a DDP subclass, or None."""
    for statement in node.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value not in FORWARDING_METHODS:
            return f"overrides {statement.name.value}()"
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
            calls = [c for c in calls_in(statement.body)]
            if len(calls) != 2 or not isinstance(calls[0].func, cst.Attribute) or calls[0].func.attr.value != "__init__":
                return "does more than call super().__init__() in __init__"
    code = cst.Module([]).code_for_node(node)
    used = [word for word in DATA_PARALLEL_INTERNALS if word in code]
    return f"uses DataParallel's {used[0]}" if used else None


def _imports(statement: cst.CSTNode) -> bool:
    """A top-level statement that imports (``import x``, ``from x import y``)."""
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _returns(function: Function) -> list[cst.BaseExpression]:
    """The values a function returns (not those of functions nested in it)."""
    found: list[cst.BaseExpression] = []

    class Returns(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            if node.value is not None:
                found.append(node.value)

    function.visit(Returns())
    return found


def first_positional(call: cst.Call, keyword: str | None = None) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is None and arg.star == "":
            return arg.value
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    return None


class Analyzer(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (
        QualifiedNameProvider,
        ScopeProvider,
        ParentNodeProvider,
        PositionProvider,
    )

    def __init__(self) -> None:
        super().__init__()
        self.facts = Facts()
        self._functions: list[Function] = []
        self._classes: list[cst.ClassDef | None] = [None]
        self._loops: list[list[Loop]] = [[]]  # one list of open loops per function level
        self._calls: list[tuple[cst.Call, Context]] = []
        self._training_loops: dict[Loop, Context] = {}
        self._attr_loaders: dict[str, list[cst.Call]] = {}  # "x" for self.x = DataLoader()
        self._attr_targets: dict[str, list[cst.Attribute]] = {}  # "x" for self.x (, ...) = f(...)
        self._attr_contexts: dict[cst.Attribute, Context] = {}  # where `self.x = name` is
        self._other_bindings: set[str] = set()  # names bound to anything but device_count()
        self._foreign: dict[tuple[cst.Call, int | None], cst.Call] = {}  # see _foreign_loader
        self._switches: dict[Function, tuple[cst.Param, bool] | None] = {}  # see _trains_at
        self._module_functions: dict[str, Function] = {}  # top-level functions, by name
        self._in_main_guard = False
        self._module: cst.Module | None = None

    def on_visit(self, node: cst.CSTNode) -> bool:
        _Subtrees.enter(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        _Subtrees.leave(original_node)

    # -- helpers -----------------------------------------------------------------------
    def qualified(self, node: cst.CSTNode) -> set[str]:
        names = {self.facts.reexports.get(q.name, q.name) for q in self.get_metadata(QualifiedNameProvider, node, set())}
        if names or not self.facts.star_imports:
            return names
        return star_imported_torch(node, lambda name: self.get_metadata(ScopeProvider, name, None))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            self.facts.star_imports = True

    def parent(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.get_metadata(ParentNodeProvider, node)

    def context(self) -> Context:
        return Context(
            self._functions[-1] if self._functions else None,
            self._classes[-1],
            tuple(self._loops[-1]),
        )

    def problem(self, node: cst.CSTNode, code: str, message: str) -> None:
        self.facts.problems.append(Problem(node, code, message))


    # -- scopes ------------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not self._functions and self._classes == [None]:
            self._module_functions[node.name.value] = node
        self._functions.append(node)
        self._classes.append(self._classes[-1] if self._is_method(node) else None)
        self._loops.append([])

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()
        self._classes.pop()
        self._loops.pop()

    def _is_method(self, node: cst.FunctionDef) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.IndentedBlock) and isinstance(self.parent(parent), cst.ClassDef)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            if self.qualified(base.value) & DATA_PARALLEL:
                reason = _subclass_blocker(node)
                if reason:
                    self.problem(node, "DDP004", f"class {node.name.value} subclasses DataParallel and {reason}; convert it by hand")
                else:
                    # Attribute forwarding only: the same class works on top of DDP.
                    self.facts.dp_subclasses[node.name.value] = node
                    self.facts.dp_references.append(base.value)
        self._classes.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()

    def visit_For(self, node: cst.For) -> None:
        self.facts.contexts[node] = self.context()
        self._loops[-1].append(node)
        self._other_bindings.update(bound_names(node.target))

    def leave_For(self, original_node: cst.For) -> None:
        self._loops[-1].pop()

    def visit_While(self, node: cst.While) -> None:
        self.facts.contexts[node] = self.context()
        self._loops[-1].append(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._loops[-1].pop()

    def visit_If(self, node: cst.If) -> None:
        if is_main_guard(node) and isinstance(self.parent(node), cst.Module):
            self.facts.main_guard = node
            self._in_main_guard = True

    def leave_If(self, original_node: cst.If) -> None:
        if original_node is self.facts.main_guard:
            self._in_main_guard = False

    # -- calls and references ------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified(node.func)
        context = self.context()
        self._calls.append((node, context))
        self.facts.contexts[node] = context
        if names & DATA_PARALLEL or self._subclass_called(node):
            self._record_wrap(node)
        elif names & DATA_PARALLEL_FUNCTION:
            self.problem(node, "DDP004", "functional data_parallel() has no DDP equivalent; convert it by hand")
        elif names & DATA_LOADER:
            self._record_loader(node)
        elif names & METRIC_SCHEDULERS and isinstance(assignment := self.parent(node), cst.Assign):
            self.facts.metric_schedulers.update(name for t in assignment.targets for name in bound_names(t.target))
        if context.function is None and context.cls is None and self._runs_here(node, names):
            self.facts.module_level_runs = True
            self.facts.import_time_runs |= not self._in_main_guard
        if _is_training_call(node) or dotted(node.func) in self.facts.training_calls:
            self.facts.has_training_step = True
            for loop in self._loops[-1]:
                self._training_loops.setdefault(loop, self.facts.contexts[loop])

    def _subclass_called(self, call: cst.Call) -> bool:
        """``MyDataParallel(model)`` for a DataParallel subclass of this file that converts."""
        if not isinstance(call.func, cst.Name) or call.func.value not in self.facts.dp_subclasses:
            return False
        scope = self.get_metadata(ScopeProvider, call.func, None)
        return scope is not None and any(
            getattr(a, "node", None) is self.facts.dp_subclasses[call.func.value] for a in scope[call.func.value]
        )

    def _runs_here(self, call: cst.Call, names: set[str]) -> bool:
        """Does this module-level call wrap, train, or run a function or class of this file?"""
        if names & DATA_PARALLEL:
            return True
        if isinstance(call.func, cst.Attribute):
            return _is_training_call(call)
        scope = self.get_metadata(ScopeProvider, call.func, None) if isinstance(call.func, cst.Name) else None
        return scope is not None and any(
            isinstance(getattr(assignment, "node", None), (cst.FunctionDef, cst.ClassDef))
            for assignment in scope[call.func.value]
        )

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check_reference(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.facts.names.add(node.value)
        self._check_reference(node)

    # -- bindings of the GPU count -----------------------------------------------------

    def visit_Assign(self, node: cst.Assign) -> None:
        counted = isinstance(node.value, cst.Call) and DEVICE_COUNT in self.qualified(node.value.func)
        for target in node.targets:
            (self.facts.gpu_count_names if counted else self._other_bindings).update(bound_names(target.target))
            # `self.train_loader, self.val_loader = make_data_loader(args)`: followed in _loaders_for
            elements = [e.value for e in target.target.elements] if isinstance(target.target, (cst.Tuple, cst.List)) else [target.target]
            for element in elements:
                name = dotted(element) if isinstance(element, cst.Attribute) else None
                if name and name.startswith("self.") and name.count(".") == 1 and isinstance(node.value, cst.Call):
                    self._attr_targets.setdefault(name[5:], []).append(element)
                elif name and name.startswith("self.") and name.count(".") == 1 and isinstance(node.value, cst.Name):
                    # `self.loader = loader` in __init__: followed to what the constructor's callers pass
                    self._attr_targets.setdefault(name[5:], []).append(element)
                    self._attr_contexts[element] = self.context()

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._other_bindings.update(bound_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._other_bindings.update(bound_names(node.target))

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._other_bindings.update(bound_names(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._other_bindings.update(bound_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
        self._other_bindings.update(bound_names(node.name))

    def _in_type_test(self, node: cst.CSTNode) -> bool:
        """An argument of ``isinstance``/``issubclass``, or compared with ``type(x) is``/``in``."""
        while not isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)) and node is not None:
            parent = self.parent(node)
            if isinstance(parent, cst.Call) and node is not parent.func:
                return isinstance(parent.func, cst.Name) and parent.func.value in ("isinstance", "issubclass")
            if isinstance(parent, cst.Comparison):
                return any(isinstance(t.operator, (cst.Is, cst.In, cst.IsNot, cst.NotIn, cst.Equal)) for t in parent.comparisons)
            node = parent
        return False

    def _check_reference(self, node: cst.Attribute | cst.Name) -> None:
        names = self.qualified(node)
        if names & ALREADY_DISTRIBUTED:
            if not self._in_type_test(node):  # `isinstance(m, (DataParallel, DDP))` is an unwrap
                self.facts.distributed_uses.append(node)
            return
        if not names & DATA_PARALLEL:
            return
        parent = self.parent(node)
        if isinstance(parent, (cst.ImportAlias, cst.Attribute)):
            return  # the import itself, or a part of a longer dotted name
        if isinstance(parent, cst.Call) and parent.func is node:
            return  # a wrap site, recorded by visit_Call
        if isinstance(parent, cst.Arg) and isinstance(self.parent(parent), cst.ClassDef):
            return  # a base class, reported by visit_ClassDef
        if self._inside_import(node):
            return
        self.facts.dp_references.append(node)

    def _inside_import(self, node: cst.CSTNode) -> bool:
        while not isinstance(node, (cst.Module, cst.BaseStatement)):
            if isinstance(node, (cst.Import, cst.ImportFrom)):
                return True
            node = self.parent(node)
        return False

    def _record_wrap(self, call: cst.Call) -> None:
        outer: cst.BaseExpression = call
        move = None
        parent = self.parent(call)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("to", "cuda"):
            grand = self.parent(parent)
            if isinstance(grand, cst.Call) and grand.func is parent:
                outer, move = grand, grand
        site = WrapSite(call, outer, move, first_positional(call, "module"), self._assigned_name(outer))
        site.device_count = self._literal_device_count(call)
        site.guards = self._enclosing_ifs(call)
        if site.module_arg is None:
            self.problem(call, "DDP004", "DataParallel(...) without a module argument; convert it by hand")
        if site.target:
            self.facts.model_names.add(site.target)
        self.facts.wraps.append(site)

    def _literal_device_count(self, call: cst.Call) -> int | None:
        for index, arg in enumerate(call.args):
            is_ids = (arg.keyword and arg.keyword.value == "device_ids") or (arg.keyword is None and index == 1)
            if is_ids and isinstance(arg.value, (cst.List, cst.Tuple)):
                return len(arg.value.elements)
        return None

    def _enclosing_ifs(self, node: cst.CSTNode) -> list[Guard]:
        """The ``if``s that decide whether the wrap runs, innermost first.

        An ``if`` whose every branch wraps (``DP(m).cuda() if cuda else DP(m)``) decides
        nothing, and neither does ``if True:``.
        """
        found = []
        while not isinstance(node, (cst.Module, cst.FunctionDef, cst.ClassDef)):
            child, node = node, self.parent(node)
            if isinstance(node, cst.If) and is_main_guard(node):
                continue
            if isinstance(node, (cst.If, cst.IfExp)) and child is not node.test:
                in_body = child is node.body
                other = node.orelse if in_body else node.body
                if isinstance(node.test, cst.Name) and node.test.value == "True" and in_body:
                    continue
                if not self._always_wraps(other):
                    found.append(Guard(node, in_body))
        return found

    def _always_wraps(self, branch: cst.CSTNode | None) -> bool:
        """Does every path through this branch wrap a model in DataParallel?"""
        if branch is None:
            return False
        if isinstance(branch, cst.If):  # elif
            return self._always_wraps(branch.body) and self._always_wraps(branch.orelse)
        return any(self.qualified(call.func) & DATA_PARALLEL for call in calls_in(branch))

    def _assigned_name(self, value: cst.BaseExpression) -> str | None:
        parent = self.parent(value)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return dotted(parent.targets[0].target)
        if isinstance(parent, cst.AnnAssign):
            return dotted(parent.target)
        return None

    def _record_loader(self, call: cst.Call) -> None:
        target = self._assigned_name(call)
        self.facts.loaders[call] = LoaderSite(call, target)
        if target and target.startswith("self."):
            self._attr_loaders.setdefault(target[5:], []).append(call)

    # -- after the walk ------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self._module = node

    def leave_Module(self, original_node: cst.Module) -> None:
        self.facts.gpu_count_names -= self._other_bindings
        # A DDP path beside DataParallel: take it (transforms/existing_ddp.py), set nothing up twice.
        self.facts.existing_ddp = bool(self.facts.distributed_uses and (self.facts.wraps or self.facts.dp_references))
        self.facts.setup_anchor = self._setup_anchor(original_node)
        self._resolve_training_loops()
        self._shard_passed_loaders()
        self._check_backward_per_forward()
        self._mark_loader_functions()
        self._find_unsafe_functions()
        self._find_side_passes()

    def _find_side_passes(self) -> None:
        """A sharded training loader that is also read once outside every loop: passed to a
        function that does not train (deeplab's calculate_weigths_labels(train_loader)), or
        iterated by a loop that trains nothing. Each rank now reads its shard only."""
        contexts = {call: context for call, context in self._calls}
        trainers = {context.function.name.value for context in self._training_loops.values() if context.function}
        trainers |= set(self.facts.parameter_loaders or ())
        for site in self.facts.training_loaders:
            target, home = self._where_bound(site, contexts)
            if target is None or home is None:
                continue
            for call, context in self._calls:
                if context.loops or not self._same_binding(target, home, context):
                    continue
                callee = dotted(call.func) or ""
                if any(dotted(arg.value) == target for arg in call.args) and _reads_data(callee, trainers):
                    self.facts.side_passes.setdefault(site.call, []).append((call, f"{callee}(...)"))
            for loop, context in self.facts.contexts.items():
                if not isinstance(loop, cst.For) or context.loops or loop in self._training_loops:
                    continue
                if not self._same_binding(target, home, context) or self._trains_inside(loop):
                    continue
                iterated = [self._through_progress_variable(expr) for expr in self._iterated(loop.iter)]
                if any(dotted(expr) == target for expr in iterated):
                    self.facts.side_passes.setdefault(site.call, []).append((loop, "a loop that trains nothing"))

    def _where_bound(self, site: LoaderSite, contexts: dict) -> tuple[str | None, Context | None]:
        """The name a training loader is bound to, and where: its DataLoader call's target, or
        for a loader another module builds, the target of the builder's call here
        (`self.train_loader, self.val_loader, ... = make_data_loader(args)`)."""
        if site.foreign is None:
            return site.target, contexts.get(site.call)
        call, index = site.foreign.call, site.foreign.index
        parent = self.parent(call)
        if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return None, None
        target = parent.targets[0].target
        if index is not None:
            if not isinstance(target, (cst.Tuple, cst.List)) or index >= len(target.elements):
                return None, None
            target = target.elements[index].value
        return dotted(target), contexts.get(call)

    @staticmethod
    def _same_binding(target: str, home: Context, context: Context) -> bool:
        """``self.x`` anywhere in the class; a plain name in the function that binds it."""
        if target.startswith("self."):
            return home.cls is not None and context.cls is home.cls
        return context.function is home.function

    def _trains_inside(self, loop: Loop) -> bool:
        return any(inner in self._training_loops for inner in walk(loop) if isinstance(inner, (cst.For, cst.While)))

    def _check_backward_per_forward(self) -> None:
        """More backward() calls than forward calls of the wrapped model in one training loop
        (pix2pixHD: one wrapped model returns the G and D losses, each gets its backward).
        DDP all-reduces once per forward: the second backward through it fails."""
        if not self.facts.wraps:
            return
        for loop in self._training_loops:
            calls = calls_in(loop.body)
            backwards = [c for c in calls if _is_backward(c)]
            forwards = [c for c in calls if dotted(c.func) in self.facts.model_names]
            per_pass = _backwards_per_pass(loop.body)
            if forwards and per_pass > len(forwards):
                model = dotted(forwards[0].func)
                self.problem(
                    backwards[1],
                    "DDP115",
                    f"{per_pass} backward() calls per {len(forwards)} call(s) of the wrapped `{model}` in this "
                    "training loop: DDP synchronises gradients once per forward, so a second backward through the "
                    "same forward fails; wrap the networks that each loss trains separately, by hand",
                )
                return

    def _mark_loader_functions(self) -> None:
        """Project mode: the loaders this module's builders return, that another module
        trains on, are training loaders here (sharded where they are built)."""
        for name, indices in self.facts.loader_functions.items():
            function = self._module_functions.get(name)
            for index in indices:
                calls = self._loaders_returned(function, index, 0) if function is not None else []
                if not calls:
                    self.facts.loader_functions_unresolved.append(name)
                for call in calls:
                    self.facts.loaders[call].training = True

    def _setup_anchor(self, module: cst.Module) -> cst.CSTNode | None:
        """The first top-level statement that does work: set-up must run before it.

        With a `__main__` block, configuration above it (logging, warnings, argparse,
        seeds) may run before set-up: set-up goes into the `__main__` block instead of
        moving the whole module into `try`.
        """
        configuration: set[str] = set()  # names bound to configuration objects (parsers, loggers)
        # Set-up needs torch: never before the last top-level import (scripts set
        # CUDA_VISIBLE_DEVICES or sys.path first and import torch after).
        imports = [i for i, statement in enumerate(module.body) if _imports(statement)]
        last_import = imports[-1] if imports else -1
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

    def _is_configuration(self, statement: cst.CSTNode, configuration: set[str]) -> bool:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        for call in calls_in(statement):
            names = {q.name for q in self.get_metadata(QualifiedNameProvider, call.func, set())}
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

    def _resolve_training_loops(self) -> None:
        self.facts.training_loops = list(self._training_loops)
        for loop, context in self._training_loops.items():
            if self._mark_iterator_loaders(loop, context):
                self.facts.fed_loops.add(loop)
            if not isinstance(loop, cst.For):
                continue
            for expr in self._iterated(loop.iter):
                expr = self._through_progress_variable(expr)
                calls = self._loaders_for(expr, context, depth=0) or self._constructor_fed(expr, context)
                code = cst.Module([]).code_for_node(expr)
                if not calls:
                    if self._fed_by_other_modules(expr, context):
                        self.facts.fed_loops.add(loop)
                        self.facts.training_loader_names.add((context.function, code))
                    continue
                self.facts.fed_loops.add(loop)
                self.facts.training_loader_names.add((context.function, code))
                for call in calls:
                    self.facts.loaders[call].training = True
                if (
                    not self._find_epoch_loops(loop, expr, context, calls, depth=0)
                    and context.function is not None
                    and not self._call_sites(context.function)
                ):
                    # One pass per call, the calls in another module (a trainer's train()
                    # that EDSR's main.py calls in its while loop): each pass moves the
                    # sampler to its next epoch.
                    self.facts.pass_hooks.setdefault(loop, EpochHook(loop)).loaders.setdefault(
                        code, (expr, [])
                    )[1].extend(calls)

    def _constructor_fed(self, expr: cst.BaseExpression, context: Context) -> list[cst.Call]:
        """Project mode: `self.loader` set from a constructor parameter (`self.loader = loader`
        in `Trainer.__init__`) of a top-level class that nothing in this module builds. The
        modules that build it shard what they pass (loader_parameters, keyed by the class
        name); here a stand-in loader call carries set_epoch (the caller's loader, checked at
        run time by ddp_sampler)."""
        name = dotted(expr)
        if self.facts.parameter_loaders is None or not name or not name.startswith("self.") or name.count(".") != 1:
            return []
        cls = context.cls
        if cls is None or self.parent(cls) is not self._module or any(
            dotted(call.func) and dotted(call.func).rpartition(".")[2] == cls.name.value for call, _ in self._calls
        ):
            return []
        for target in self._attr_targets.get(name[5:], []):
            value, _ = self._assigned_value(target)
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

    def _fed_by_other_modules(self, expr: cst.BaseExpression, context: Context) -> bool:
        """Project mode: `loader` is a parameter of a top-level function that no caller in this
        module feeds: recorded in loader_parameters, for the callers elsewhere to shard."""
        function = context.function
        if self.facts.parameter_loaders is None or not isinstance(expr, cst.Name) or function is None:
            return False
        if self._module_functions.get(function.name.value) is not function or self._call_sites(function):
            return False
        params = [p for p in function.params.params]
        for index, param in enumerate(params):
            if param.name.value == expr.value:
                self.facts.loader_parameters.setdefault(function.name.value, []).append((index, param.name.value))
                return True
        return False

    def _shard_passed_loaders(self) -> None:
        """Project mode: the loaders this module passes to another module's function that
        trains on its parameter are training loaders here; set_epoch goes in the loop around
        the call."""
        for call, context in list(self._calls):
            name = dotted(call.func)
            if not self.facts.parameter_loaders or name not in self.facts.parameter_loaders:
                continue
            for index, param in self.facts.parameter_loaders[name]:
                argument = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
                positional = [a for a in call.args if a.keyword is None and not a.star]
                if argument is None and index < len(positional):
                    argument = positional[index].value
                argument = self._through_progress_variable(argument) if argument is not None else None
                found = self._loaders_for(argument, context, depth=0) if argument is not None else []
                if not found:
                    self.problem(
                        call,
                        "DDP309",
                        f"`{name}()` trains on its `{param}` argument, and what this call passes could not be traced "
                        "to a DataLoader: every rank would train on all the data",
                    )
                    continue
                self.facts.sharded_parameter_calls.add(name)
                for loader in found:
                    self.facts.loaders[loader].training = True
                self._find_epoch_loops(call, argument, context, found, depth=0)

    def _through_progress_variable(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """`tbar` of `tbar = tqdm(self.train_loader)` (its only binding) -> `self.train_loader`:
        set_epoch must name the loader, not the progress bar."""
        if not isinstance(expr, cst.Name):
            return expr
        scope = self.get_metadata(ScopeProvider, expr, None)
        assignments = list(scope[expr.value]) if scope is not None else []
        wrapped_codes: dict[str, cst.BaseExpression] = {}
        for assignment in assignments:  # flownet2 makes it in two branches: tqdm(loader, desc=...)
            if getattr(assignment, "node", None) is None:
                return expr
            value, index = self._assigned_value(assignment.node)
            if not isinstance(value, cst.Call) or index is not None or value in self.facts.loaders:
                return expr
            wrapped = [e for e in self._iterated(value) if e is not value]
            if len(wrapped) != 1:
                return expr
            wrapped_codes.setdefault(cst.Module([]).code_for_node(wrapped[0]), wrapped[0])
        return next(iter(wrapped_codes.values())) if len(wrapped_codes) == 1 else expr

    def _mark_iterator_loaders(self, loop: Loop, context: Context) -> bool:
        """Loaders a training loop draws from with ``next(it)`` / ``next(iter(loader))``;
        True if there are any."""
        fed = False
        for call in calls_in(loop.body):
            if dotted(call.func) != "next" or not call.args:
                continue
            source = call.args[0].value
            for expr in self._iterator_sources(source):
                for found in self._loaders_for(expr, context, depth=0):
                    self.facts.loaders[found].training = True
                    self.facts.iterator_loaders.add(found)
                    fed = True
        return fed

    def _iterator_sources(self, source: cst.BaseExpression) -> list[cst.BaseExpression]:
        """`iter(loader)` -> loader; `it` -> the loaders of every `it = iter(loader)`."""
        if isinstance(source, cst.Call) and dotted(source.func) == "iter" and source.args:
            return self._iterated(source.args[0].value)
        if not isinstance(source, cst.Name):
            return []
        scope = self.get_metadata(ScopeProvider, source, None)
        found = []
        for assignment in scope[source.value] if scope is not None else ():
            value, _ = self._assigned_value(assignment.node) if getattr(assignment, "node", None) is not None else (None, None)
            if isinstance(value, cst.Call) and dotted(value.func) == "iter" and value.args:
                found += self._iterated(value.args[0].value)
        return found

    def _iterated(self, expr: cst.BaseExpression) -> list[cst.BaseExpression]:
        """The Name/Attribute expressions a loop iterates: `enumerate(tqdm(loader))` -> loader."""
        if isinstance(expr, (cst.Name, cst.Attribute)):
            return [expr]
        if isinstance(expr, cst.Call):
            names = self.qualified(expr.func) | {dotted(expr.func) or ""}
            positional = [a.value for a in expr.args if a.keyword is None and not a.star]
            if names & {"builtins.zip"}:
                return [e for value in positional for e in self._iterated(value)]
            is_tqdm = any(n.split(".")[-1] in ("tqdm", "trange") for n in names)
            if (names & ITERABLE_WRAPPERS or is_tqdm) and positional:
                return self._iterated(positional[0])
        return []

    def _loaders_for(self, expr: cst.BaseExpression, context: Context, depth: int) -> list[cst.Call]:
        """The DataLoader calls that `expr` (read where `context` is) may be bound to."""
        if depth > 4:
            return []
        if isinstance(expr, cst.Attribute) and dotted(expr) and dotted(expr).startswith("self."):
            attribute = dotted(expr)[5:]
            found = list(self._attr_loaders.get(attribute, []))
            for target in self._attr_targets.get(attribute, []):
                value, index = self._assigned_value(target)
                if isinstance(value, cst.Name) and target in self._attr_contexts:
                    loaders = self._loaders_for(value, self._attr_contexts[target], depth + 1)
                else:
                    loaders = self._loaders_in_value(value, index, depth + 1)
                found += [c for c in loaders if c not in found]
            return found
        if isinstance(expr, cst.Attribute):
            return list(self._attr_loaders.get(expr.attr.value, []))
        if not isinstance(expr, cst.Name):
            return []
        scope = self.get_metadata(ScopeProvider, expr, None)
        if scope is None:
            return []
        found: list[cst.Call] = []
        for assignment in scope[expr.value]:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.Param) and context.function is not None:
                found += self._loaders_via_parameter(context.function, node, depth)
                continue
            value, index = self._assigned_value(node) if node is not None else (None, None)
            if isinstance(value, cst.Call) and index is None and value not in self.facts.loaders:
                # `tbar = tqdm(self.train_loader)`, `batches = enumerate(loader)`: what it wraps
                wrapped = [e for e in self._iterated(value) if e is not value]
                if wrapped:
                    found += [c for e in wrapped for c in self._loaders_for(e, context, depth + 1)]
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
        function = self._local_function(value.func)
        if function is None and self._from_project(value.func):
            return [self._foreign_loader(value, index)]
        if function is None or depth > 4:
            return []
        return self._loaders_returned(function, index, depth)

    def _from_project(self, func: cst.BaseExpression) -> bool:
        root = _root_name(func)
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

    def _loaders_returned(self, function: Function, index: int | None, depth: int) -> list[cst.Call]:
        found = []
        shared = len(self._call_sites(function)) > 1  # the same DataLoader call builds other loaders too
        for returned in _returns(function):
            if isinstance(returned, (cst.Name, cst.Attribute)) and index is None:
                found += self._loaders_for(returned, self.facts.contexts.get(returned) or Context(function, None, ()), depth + 1)
            elif isinstance(returned, (cst.Tuple, cst.List)) and index is not None and index < len(returned.elements):
                element = returned.elements[index].value
                found += self._loaders_in_value(element, None, depth + 1) if isinstance(element, cst.Call) else (
                    self._loaders_for(element, Context(function, None, ()), depth + 1)
                )
            else:
                found += self._loaders_in_value(returned, index, depth + 1)
        if shared:
            self.facts.shared_loaders.update(found)
        return found

    def _local_function(self, func: cst.BaseExpression) -> Function | None:
        """The function of this module that a call's name refers to."""
        if not isinstance(func, cst.Name):
            return None
        scope = self.get_metadata(ScopeProvider, func, None)
        if scope is None:
            return None
        for assignment in scope[func.value]:
            if isinstance(getattr(assignment, "node", None), cst.FunctionDef):
                return assignment.node
        return None

    def _assigned_value(self, target: cst.CSTNode) -> tuple[cst.BaseExpression | None, int | None]:
        """The value assigned to a target name, and its index when it is unpacked from a tuple."""
        index = None
        parent = self.parent(target)
        if isinstance(parent, cst.Element):
            sequence = self.parent(parent)
            index = [element for element in sequence.elements].index(parent)
            if any(isinstance(element, cst.StarredElement) for element in sequence.elements):
                return None, None
            parent = self.parent(sequence)
        if isinstance(parent, cst.AssignTarget):
            parent = self.parent(parent)
        if isinstance(parent, (cst.Assign, cst.AnnAssign)):
            return parent.value, index
        return None, None

    def _loaders_via_parameter(self, function: Function, param: cst.Param, depth: int) -> list[cst.Call]:
        found = []
        for call, context in self._call_sites(function):
            if not self._trains_at(function, call):
                continue  # `iteration(epoch, val_loader, train=False)`: that loader is evaluated
            argument = self._argument_for(function, param, call)
            if argument is not None:
                found += self._loaders_for(argument, context, depth + 1)
        return found

    def _trains_at(self, function: Function, call: cst.Call) -> bool:
        """Does this call of ``function`` train? Not when every backward()/step() in it sits
        under ``if train:`` (or ``if not is_validate:``) on a parameter this call sets to the
        other literal (BERT-pytorch's ``iteration(..., train=False)``, flownet2's
        ``train(..., is_validate=True)``)."""
        if function not in self._switches:
            self._switches[function] = self._training_switch(function)
        switch = self._switches[function]
        if switch is None:
            return True
        param, trains_when = switch
        value = self._argument_for(function, param, call)
        if value is None and param.default is not None:
            value = param.default
        if not isinstance(value, cst.Name) or value.value not in ("True", "False"):
            return True
        return (value.value == "True") == trains_when

    def _training_switch(self, function: Function) -> tuple[cst.Param, bool] | None:
        """The parameter that switches every training call of ``function`` on, and the value
        that does; None if there is none."""
        switches = set()
        for call, context in self._calls:
            if context.function is not function or not _is_training_call(call):
                continue
            switches.add(self._switch_around(call, function))
        if len(switches) != 1 or None in switches:
            return None
        name, trains_when = switches.pop()
        param = next((p for p in function.params.params if p.name.value == name), None)
        return (param, trains_when) if param is not None else None

    def _switch_around(self, call: cst.Call, function: Function) -> tuple[str, bool] | None:
        """``(p, True)`` for a call under ``if p:``, ``(p, False)`` under ``if not p:``."""
        node, parent = call, self.parent(call)
        while parent is not None and parent is not function:
            if isinstance(parent, cst.If) and node is parent.body:
                test = parent.test
                if isinstance(test, cst.Name):
                    return test.value, True
                if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and isinstance(test.expression, cst.Name):
                    return test.expression.value, False
            node, parent = parent, self.parent(parent)
        return None

    def _call_sites(self, function: Function) -> list[tuple[cst.Call, Context]]:
        name = function.name.value
        owner = self._owner_class(function)
        if name == "__init__" and owner is not None:
            # `Trainer(model, loader, optimizer)` runs Trainer.__init__
            return [(call, context) for call, context in self._calls if dotted(call.func) and dotted(call.func).rpartition(".")[2] == owner.name.value]
        # This module calls its top-level `train` by name; `model.train()` is another method.
        top_level = self._module_functions.get(name) is function
        sites = []
        for call, context in self._calls:
            func = call.func
            if isinstance(func, cst.Name) and func.value == name:
                sites.append((call, context))
            elif isinstance(func, cst.Attribute) and func.attr.value == name and not top_level:
                if owner is None or self._instance_of(func.value, owner):
                    sites.append((call, context))
        return sites

    def _instance_of(self, receiver: cst.BaseExpression, cls: cst.ClassDef) -> bool:
        """Is ``receiver`` (of ``receiver.method()``) an instance of ``cls``: ``self`` in its
        methods, or a name bound to ``Cls(...)``? ``self.model.train()`` is the model's."""
        if isinstance(receiver, cst.Name) and receiver.value in ("self", "cls"):
            return True
        if not isinstance(receiver, cst.Name):
            return False
        scope = self.get_metadata(ScopeProvider, receiver, None)
        for assignment in scope[receiver.value] if scope is not None else []:
            node = getattr(assignment, "node", None)
            value, _ = self._assigned_value(node) if node is not None else (None, None)
            if isinstance(value, cst.Call) and (dotted(value.func) or "").rpartition(".")[2] == cls.name.value:
                return True
        return False

    def _owner_class(self, function: Function) -> cst.ClassDef | None:
        block = self.parent(function)
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else None
        return owner if isinstance(owner, cst.ClassDef) else None

    def _argument_for(self, function: Function, param: cst.Param, call: cst.Call) -> cst.BaseExpression | None:
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

    def _find_epoch_loops(
        self,
        loop: cst.BaseCompoundStatement,
        expr: cst.BaseExpression,
        context: Context,
        calls: list[cst.Call],
        depth: int,
    ) -> bool:
        """Attach set_epoch for `expr` to the loop around `loop`, looking through callers.
        False if no loop was found around it."""
        outer = [candidate for candidate in context.loops if candidate is not loop]
        if outer:
            hook = self.facts.epoch_hooks.setdefault(outer[-1], EpochHook(outer[-1]))
            code = cst.Module([]).code_for_node(expr)
            known = hook.loaders.setdefault(code, (expr, []))[1]
            known.extend(call for call in calls if call not in known)
            hook.uses.setdefault(code, []).append(loop)
            return True
        if context.function is None or depth > 4:
            return False
        function = context.function
        found = False
        for call_site, caller in self._call_sites(function):
            if not self._trains_at(function, call_site):
                continue
            mapped = self._expression_in_caller(function, expr, call_site)
            if mapped is not None:
                found |= self._find_epoch_loops(call_site, mapped, caller, calls, depth + 1)
        return found

    def _expression_in_caller(
        self, function: Function, expr: cst.BaseExpression, call: cst.Call
    ) -> cst.BaseExpression | None:
        """How the caller names what `function` calls `expr`."""
        if isinstance(expr, cst.Name):
            for param in function.params.params:
                if param.name.value == expr.value:
                    argument = self._argument_for(function, param, call)
                    return argument if isinstance(argument, (cst.Name, cst.Attribute)) else None
            scope = self.get_metadata(ScopeProvider, expr, None)
            if scope is not None and not isinstance(scope, GlobalScope) and scope.assignments[expr.value]:
                return None  # the function's own variable: the caller cannot name it
            return expr  # a global: the same name works in the caller
        name = dotted(expr)
        if name and name.startswith("self.") and name.count(".") == 1 and isinstance(call.func, cst.Attribute):
            return cst.Attribute(value=call.func.value, attr=cst.Name(name.split(".", 1)[1]))
        return None

    # -- functions that must never sit under a rank-0 guard --------------------------------
    def _find_unsafe_functions(self) -> None:
        by_function: dict[Function, list[cst.Call]] = {}
        for call, context in self._calls:
            if context.function is not None:
                by_function.setdefault(context.function, []).append(call)
        changed = True
        while changed:
            changed = False
            for function, calls in by_function.items():
                if function in self.facts.unsafe_functions:
                    continue
                params = {p.name.value for p in function.params.params}
                if any(self.call_is_unsafe(call, params) for call in calls):
                    self.facts.unsafe_functions.add(function)
                    self.facts.unsafe_method_names.add(function.name.value)
                    changed = True

    def _may_reach_project_code(self, func: cst.BaseExpression) -> bool:
        """Project mode: a function from another project module, a value bound in this file
        (a model built by a project factory), or a method of an object that is not an
        imported module (a trainer built from a project class)."""
        root = _root_name(func)
        if root is None:
            return False
        if root.value in self.facts.project_names:
            return True
        definitions = (cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef)
        bound_here = [
            a for a in self._assignments_of(root) if isinstance(a, Assignment) and not isinstance(a.node, definitions)
        ]
        if isinstance(func, cst.Name):
            return bool(bound_here)
        if isinstance(func, cst.Attribute) and func.attr.value in HARMLESS_METHODS:
            return False
        return not any(isinstance(getattr(a, "node", None), (cst.Import, cst.ImportFrom)) for a in self._assignments_of(root))

    def _assignments_of(self, name: cst.Name) -> list:
        scope = self.get_metadata(ScopeProvider, name, None)
        return list(scope[name.value]) if scope is not None else []

    def call_is_unsafe(self, call: cst.Call, local_params: set[str]) -> bool:
        """Does this call (maybe) run a model forward/backward or a collective?"""
        func = call.func
        if any(name.startswith("torch.distributed") for name in self.qualified(func)):
            return True
        name = dotted(func)
        if name in self.facts.model_names or (isinstance(func, cst.Name) and func.value in local_params):
            return True
        if self.facts.project_names and self._may_reach_project_code(func):
            return True
        if isinstance(func, cst.Attribute):
            if func.attr.value in COLLECTIVE_METHODS:
                return True
            if func.attr.value in self.facts.unsafe_method_names:
                return True
        if isinstance(func, cst.Name):
            scope = self.get_metadata(ScopeProvider, func, None)
            if scope is not None:
                for assignment in scope[func.value]:
                    if getattr(assignment, "node", None) in self.facts.unsafe_functions:
                        return True
        return False


# Methods of values that never run a model or a collective (strings, numbers, containers,
# tensors read out); project mode treats other method calls as possibly training.
HARMLESS_METHODS = {
    "format", "join", "split", "strip", "replace", "upper", "lower", "startswith", "endswith", "get",
    "items", "keys", "values", "append", "extend", "update", "copy", "item", "tolist", "cpu",
    "detach", "numpy", "mean", "sum", "max", "min", "size", "numel", "dim", "strftime", "isoformat",
    "info", "debug", "warning", "error", "add_scalar", "add_scalars", "write", "flush", "set_description",
    "set_postfix", "close", "state_dict", "load_state_dict", "parameters", "named_parameters", "buffers",
    "modules", "children", "train", "eval", "to", "cuda", "half", "float", "zero_grad", "param_groups",
}


def _root_name(node: cst.BaseExpression) -> cst.Name | None:
    while isinstance(node, (cst.Attribute, cst.Call, cst.Subscript)):
        node = node.value if not isinstance(node, cst.Call) else node.func
    return node if isinstance(node, cst.Name) else None


def analyze(
    wrapper: cst.MetadataWrapper,
    project_names: frozenset[str] = frozenset(),
    loader_functions: dict[str, set[int | None]] | None = None,
    parameter_loaders: dict[str, list[tuple[int, str]]] | None = None,
    reexports: dict[str, str] | None = None,
    training_calls: frozenset[str] = frozenset(),
) -> Facts:
    """Project mode: ``project_names``, the names the module binds from other modules of the
    project (a call through one may run a model or a collective there); ``loader_functions``,
    this module's functions whose returned loaders another module trains on."""
    _Subtrees.start()  # filled by the analyzer's walk
    analyzer = Analyzer()
    analyzer.facts.project_names = project_names
    analyzer.facts.loader_functions = dict(loader_functions or {})
    analyzer.facts.parameter_loaders = parameter_loaders
    analyzer.facts.reexports = dict(reexports or {})
    analyzer.facts.training_calls = training_calls
    wrapper.visit(analyzer)
    # Keep the (cached) metadata readable after the walk: transforms ask the analyzer
    # whether a call reaches the model.
    analyzer.metadata = wrapper.resolve_many(analyzer.get_inherited_dependencies())
    analyzer.facts.analyzer = analyzer
    return analyzer.facts


def batch_length(value: cst.BaseExpression) -> bool:
    """``x.shape[0]``, ``x.size(0)``, ``len(x)``: how many samples a batch holds."""
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Attribute) and value.value.attr.value == "shape":
        return True
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size":
        return True
    return isinstance(value, cst.Call) and dotted(value.func) == "len"


def _is_training_call(call: cst.Call) -> bool:
    """``loss.backward()``, ``optimizer.step()``; not ``scheduler.step()``."""
    if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in TRAINING_METHODS:
        return False
    if call.func.attr.value == "backward":
        return True
    receiver = (dotted(call.func.value) or "").lower()
    return not any(word in receiver for word in SCHEDULER_WORDS)


# Calls that take a loader without reading a pass over its data here.
NOT_A_PASS = {
    "len", "iter", "next", "enumerate", "zip", "tqdm", "trange", "isinstance", "getattr", "hasattr", "setattr",
    "print", "str", "repr", "type", "id", "ddp_sampler", "DistributedSampler", "dict", "list", "tuple",
}
TRAINING_WORDS = ("train", "fit", "epoch", "loop", "run", "learn", "step", "solve", "main")


def _reads_data(callee: str, trainers: set[str]) -> bool:
    """Does a call of ``callee`` with the training loader read a pass over its data that is
    not training? Names that train (here or by their name) and wrappers do not."""
    last = callee.rpartition(".")[2]
    if not last or last in NOT_A_PASS or callee in trainers or last in trainers:
        return False
    if last[0].isupper():  # a class: a trainer or a wrapper keeps the loader for later
        return False
    return not any(word in last.lower() for word in TRAINING_WORDS)


def _is_backward(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"


def _backwards_per_pass(node: cst.CSTNode) -> int:
    """backward() calls one pass through ``node`` makes: `if fp16: scaled.backward() else:
    loss.backward()` is one, not two."""
    if isinstance(node, cst.If) and node.orelse is not None:
        other = node.orelse.body if isinstance(node.orelse, cst.Else) else node.orelse
        return _count_backwards(node.test) + max(_backwards_per_pass(node.body), _backwards_per_pass(other))
    if isinstance(node, cst.Call):
        return int(_is_backward(node)) + sum(_backwards_per_pass(child) for child in node.children)
    return sum(_backwards_per_pass(child) for child in node.children)


def _count_backwards(node: cst.CSTNode) -> int:
    return sum(1 for found in walk(node) if isinstance(found, cst.Call) and _is_backward(found))
