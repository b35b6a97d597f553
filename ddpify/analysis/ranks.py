"""Ranks, guards and collectives: what is the same on every rank, and what must never sit
under a rank-0 guard.

A converted DataParallel script has no rank-dependent code, so only data can make ranks
diverge. The functions here answer, for the transforms that guard side effects and move
decisions: is this condition the same on every rank, does every rank reach this statement,
is it already under a rank test. ``Collectives`` finds the functions that run a model's
forward/backward or a collective (directly or through other functions): a rank-0 guard
around a call of one would hang the other ranks.
"""

from __future__ import annotations

import re

import libcst as cst
from libcst.metadata import Assignment, BuiltinAssignment, ScopeProvider

from ddpify.analysis.facts import Function
from ddpify.analysis.scopes import Room, star_roots
from ddpify.analysis.tree import COLLECTIVE_METHODS, bound_names, calls_in, dotted, is_main_guard, names_in, root_name, walk
from ddpify.names import DATA_PARALLEL, RANK_WORDS

# Calls whose results are the same on every rank inside a condition (same_on_every_rank).
UNIFORM_CALLS = {"len", "range", "int", "min", "max", "bool", "float", "str", "abs", "round", "isinstance", "hasattr", "getattr"}
# (what the machine has, and the world: alike on every rank; TencentPretrain's test-phase
# reload under `if torch.cuda.device_count() > 1:` is reached by every rank)
UNIFORM_CALLS |= {"torch.cuda.device_count", "torch.cuda.is_available", "dist.get_world_size", "torch.distributed.get_world_size"}
# Methods of a library's models that only write them to files.
LIBRARY_WRITERS = {"save_pretrained", "save_vocabulary", "to_json_file"}
# Methods of settings whose answers are the same on every rank when the setting is.
UNIFORM_METHODS = {"find", "startswith", "endswith", "lower", "upper", "strip", "split", "get", "count", "isdigit", "index"}
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

# Calls whose results differ from process to process: the clock (ranks start milliseconds
# apart, and a second may turn between them), random ids, the process id.
BARE_TIMES = {f"datetime.datetime.{name}" for name in ("now", "today", "utcnow")}
PER_PROCESS_CALLS = {
    *BARE_TIMES,
    *(f"time.{name}" for name in ("time", "time_ns", "strftime", "localtime", "gmtime", "ctime", "asctime")),
    "uuid.uuid1", "uuid.uuid4", "os.getpid", "os.urandom", "secrets.token_hex", "secrets.token_urlsafe",
}
# Of those, the ones that are a name on their own (the others are numbers until formatted).
NAMING_CALLS = PER_PROCESS_CALLS - {"time.time", "time.time_ns", "time.localtime", "time.gmtime", "os.getpid", "os.urandom"}
# (these take a time they are given, or read the clock without one)
GIVEN_TIMES = {f"time.{name}" for name in ("strftime", "localtime", "gmtime", "ctime", "asctime")}
# Calls and methods that only format what they are given: rank 0 may make the name alone.
FORMATTING_CALLS = {
    *(f"builtins.{name}" for name in ("str", "int", "float", "round", "repr", "format", "hex", "len")),
    *(f"os.path.{name}" for name in ("join", "basename", "dirname", "abspath", "expanduser", "splitext", "normpath", "realpath")),
    "pathlib.Path",
}
FORMATTING_METHODS = {"strftime", "isoformat", "format", "join", "replace", "lower", "upper", "strip", "split", "timestamp"}


def same_on_every_rank(test: cst.BaseExpression, loop_names: set[str]) -> bool:
    """Is this condition the same on every rank of a converted DataParallel script?

    Loop counters, attributes (``args.log_interval``), CONSTANTS, literals and ``len()``
    are; a loss, an output or any other data-derived value may not be.
    """
    for call in calls_in(test):
        if dotted(call.func) in UNIFORM_CALLS or _uniform_method(call, loop_names):
            continue
        return False
    in_attributes = {id(part) for n in walk(test) if isinstance(n, cst.Attribute) for part in (n.value, n.attr)}
    for name in names_in(test):
        if id(name) in in_attributes or name.value in UNIFORM_CALLS or name.value in ("True", "False", "None"):
            continue
        if name.value not in loop_names and not name.value.isupper():
            return False
    return True


def _uniform_method(call: cst.Call, loop_names: set[str]) -> bool:
    """A string or mapping method of a setting (PReNet's ``opt.data_path.find('RainTrainH')``):
    what it is called on and given is the same on every rank, so is its answer."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in UNIFORM_METHODS and isinstance(func.value, cst.Attribute)):
        return False
    return same_on_every_rank(func.value, loop_names) and all(same_on_every_rank(arg.value, loop_names) for arg in call.args)


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


def loop_counters_around(node: cst.CSTNode, parent_of) -> set[str]:
    """The counters of the `for` loops around `node` (up to its function): every target of
    ``for i in range(n)``, the first of ``for i, batch in enumerate(loader)``; never what a loop
    draws from data."""
    names: set[str] = set()
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
        if isinstance(node, cst.For):
            names |= loop_counters(node)
        node = parent_of(node)
    return names


def loop_counters(loop: cst.For) -> set[str]:
    iterated = loop.iter
    if isinstance(iterated, cst.Call) and (dotted(iterated.func) or "").rpartition(".")[2] in ("range", "trange"):
        return {name.value for name in walk(loop.target) if isinstance(name, cst.Name)}
    if isinstance(iterated, cst.Call) and dotted(iterated.func) == "enumerate" and isinstance(loop.target, cst.Tuple) and loop.target.elements:
        first = loop.target.elements[0].value
        return {first.value} if isinstance(first, cst.Name) else set()
    return set()


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


def same_path_on_every_rank(node: cst.CSTNode, parent_of, decided=None) -> bool:
    """Does every rank surely reach this statement when rank 0 does?

    DataParallel scripts have no rank-dependent code, so only data can make ranks
    diverge: an ``if``/``while`` on a loss or output, or an exception handler.
    Conditions on loop counters, attributes (``args.log_interval``), constants and
    ``len()`` are the same on every rank.
    """
    loop_names = loop_names_around(node, parent_of)
    child, parent = node, parent_of(node)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.ExceptHandler):
            return False
        tested = isinstance(parent, (cst.If, cst.While)) and child is parent.test  # (the test itself: every rank)
        if isinstance(parent, (cst.If, cst.While)) and not tested and not same_on_every_rank(parent.test, loop_names):
            # (`if __name__ == "__main__":` runs on every rank; so does a branch whose test rank 0
            # decides for every rank, ``decided``: DDP622's existence checks)
            if not is_main_guard(parent) and not (decided is not None and decided(parent)):
                return False
        child, parent = parent, parent_of(parent)
    return True


def under_rank_guard(node: cst.CSTNode | None, parent_of, code_of) -> bool:
    """Is `node` inside an `if` whose test reads a rank (``if rank == 0:``, ``if is_main_process():``)?"""
    while node is not None and not isinstance(node, cst.Module):
        if isinstance(node, cst.If) and any(word in code_of(node.test) for word in RANK_WORDS) and not _distributed_switch(code_of(node.test)):
            return True
        node = parent_of(node)
    return False


def _distributed_switch(test: str) -> bool:
    """``if args.local_rank != -1:`` (the HF-era scripts' own DDP path): every rank of that path
    takes it; a switch between paths, not a rank-0 guard."""
    return re.fullmatch(r"[\w.\[\]'\"]+\s*(!=\s*-1|>\s*-1|>=\s*0|==\s*-1)", test.strip()) is not None


class Collectives(Room):
    """Functions that must never sit under a rank-0 guard: they (maybe) run a model's
    forward/backward or a collective, directly or through one another. Fills
    ``facts.unsafe_functions`` and ``facts.unsafe_method_names`` after the walk, and answers
    ``call_is_unsafe`` for the transforms."""

    def __init__(self, scopes) -> None:
        super().__init__(scopes)

    def find_unsafe_functions(self) -> None:
        by_function: dict[Function, list[cst.Call]] = {}
        for call, context in self.scopes.calls:
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
        root = root_name(func)
        if root is None:
            return False
        if root.value in self.facts.project_names:
            return True
        if root.value in star_roots(self.facts.reexports) and not self.scopes.assignments_of(root):
            return False  # (a library a star import passes on: photo2cartoon's `cv2` through `from utils import *`)
        if _a_builtin(self.scopes.assignments_of(root)):
            return False  # (a builtin's value: Wave-U-Net's `str(epoch).zfill(4)` in a checkpoint's name)
        definitions = (cst.Import, cst.ImportFrom, cst.FunctionDef, cst.ClassDef)
        bound_here = [
            a for a in self.scopes.assignments_of(root) if isinstance(a, Assignment) and not isinstance(a.node, definitions)
        ]
        if isinstance(func, cst.Name):
            return bool(bound_here)
        if isinstance(func, cst.Attribute) and func.attr.value in HARMLESS_METHODS:
            return False
        return not any(isinstance(getattr(a, "node", None), (cst.Import, cst.ImportFrom)) for a in self.scopes.assignments_of(root))

    def call_is_unsafe(self, call: cst.Call, local_params: set[str]) -> bool:
        """Does this call (maybe) run a model forward/backward or a collective?"""
        func = call.func
        qualified = self.scopes.qualified(func)
        if any(name.startswith("torch.distributed") for name in qualified):
            return True
        if qualified & DATA_PARALLEL:  # it becomes a DDP construction: a collective (ClariNet's averaged copy)
            return True
        if isinstance(func, cst.Attribute) and func.attr.value in LIBRARY_WRITERS:
            return False  # (Hugging Face's save_pretrained writes a folder and runs nothing: Roformer_Simlarity)
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
            scope = self.scopes.get_metadata(ScopeProvider, func, None)
            if scope is not None:
                for assignment in scope[func.value]:
                    if getattr(assignment, "node", None) in self.facts.unsafe_functions:
                        return True
        return False


def _a_builtin(assignments) -> bool:
    """A name only Python's builtins bind (``str``, ``len``, ``open``)."""
    assignments = list(assignments)
    return bool(assignments) and all(isinstance(a, BuiltinAssignment) for a in assignments)


class RunNames:
    """Names made of per-process values (``datetime.now().strftime(...)``, ``uuid.uuid4()``,
    ``f"run_{int(time.time())}"``) by formatting only: each process makes its own, so rank 0's
    must be sent to the others. Functions of the file that only return such a name
    (``def get_timestamp(): return datetime.now().strftime(...)``) count as their sources."""

    def __init__(self, module: cst.Module, qualified) -> None:
        self.qualified = qualified
        self.sources: set[str] = set()
        # names bound to the clock itself (vcdb_retrieval's `current = datetime.now(kst)`, then
        # `current.strftime('%H%M%S')` names the run folder)
        self.clocks = {
            dotted(target.target) for node in walk(module) if isinstance(node, cst.Assign)
            and isinstance(node.value, cst.Call) and qualified(node.value.func) & BARE_TIMES for target in node.targets
        } - {None}
        for statement in module.body:
            if isinstance(statement, cst.FunctionDef) and self._only_returns_a_name(statement):
                self.sources.add(statement.name.value)

    def is_name(self, value: cst.BaseExpression) -> bool:
        """Made of a per-process value, by formatting only, and a name (text, a path, an id)."""
        calls = calls_in(value)
        if not any(self._per_process(call) for call in calls) or not all(self._formats(call) for call in calls):
            return False
        if isinstance(value, cst.Call) and self.qualified(value.func) & BARE_TIMES:
            return False  # `start = datetime.now()`: a time taken for a duration, more often than for a name
        if any(
            isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract)
            and any(self._per_process(call) for call in calls_in(node))
            for node in walk(value)
        ):
            return False  # `(time.time() - start) / 60`: a duration in a message
        if any(" " in text for text in _texts(value)):
            return False  # `time.ctime() + ' ' + f'Epoch {epoch}'`: a message, not a name
        strings = (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)
        return any(isinstance(node, strings) for node in walk(value)) or any(
            self._names(call) or call.func is not None and self.qualified(call.func) & FORMATTING_CALLS for call in calls
        )

    def _per_process(self, call: cst.Call) -> bool:
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("strftime", "isoformat", "timestamp") \
                and dotted(call.func.value) in self.clocks:
            return True
        names = self.qualified(call.func)
        if names & GIVEN_TIMES:  # `time.gmtime(total)`, `time.strftime(fmt, t)`: a time it is given
            return len(call.args) <= (1 if "time.strftime" in names else 0)
        return bool(names & PER_PROCESS_CALLS) or dotted(call.func) in self.sources

    def _names(self, call: cst.Call) -> bool:
        if self.qualified(call.func) & NAMING_CALLS or dotted(call.func) in self.sources:
            return True
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in FORMATTING_METHODS

    def _formats(self, call: cst.Call) -> bool:
        if self._per_process(call) or self.qualified(call.func) & FORMATTING_CALLS:
            return True
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in FORMATTING_METHODS

    def _only_returns_a_name(self, function: cst.FunctionDef) -> bool:
        returned = False
        for line in function.body.body:
            if not isinstance(line, cst.SimpleStatementLine):
                return False
            for small in line.body:
                if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
                    continue
                if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None \
                        and all(self._formats(call) for call in calls_in(small.value)):
                    continue
                if isinstance(small, cst.Return) and small.value is not None and self.is_name(small.value):
                    returned = True
                    continue
                return False
        return returned


def _texts(value: cst.BaseExpression) -> list[str]:
    """The literal text in an expression (strings, f-strings' text parts)."""
    found = []
    for node in walk(value):
        if isinstance(node, cst.SimpleString):
            found.append(str(node.evaluated_value))
        elif isinstance(node, cst.FormattedStringText):
            found.append(node.value)
    return found


def in_data_loading(node: cst.CSTNode, parent_of) -> bool:
    """Inside a method of a Dataset or Sampler class other than its constructor (``__getitem__``
    and what it calls on ``self``): DataLoader workers may run it, in processes of their own
    with no process group and no CUDA (loqui's ``LRWDataset.__getitem__`` loads each sample with
    ``torch.load``): no collective there, and no device of the parent process."""
    function = node
    while function is not None and not isinstance(function, cst.FunctionDef):
        function = parent_of(function)
    if function is None or function.name.value == "__init__":
        return False
    owner = parent_of(parent_of(function))  # (the class body, then the class)
    if not isinstance(owner, cst.ClassDef):
        return False
    # (by its name or a base's: LRWDataset(LRWDatasetInterface), whose base subclasses Dataset)
    names = [owner.name.value, *((dotted(base.value) or "").rpartition(".")[2] for base in owner.bases)]
    if not any("Dataset" in name or name.endswith("Sampler") for name in names):
        return False
    # (a method only the constructor calls runs in the main process: DiffASD's preprocessing(),
    # which writes the features every rank's dataset reads)
    return function.name.value in _worker_methods(owner)


# What DataLoader workers call on a dataset or a sampler.
WORKER_ENTRIES = ("__getitem__", "__getitems__", "__iter__", "__next__", "__len__")


def _worker_methods(cls: cst.ClassDef) -> set[str]:
    """The methods a DataLoader worker may run: the entries, what they call on ``self``, and so
    on; a method of the class that none of them calls, nor any other method but the constructor,
    belongs to the main process (a base class's entries may call it: kept when the class has none)."""
    methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
    if not any(entry in methods for entry in WORKER_ENTRIES):
        return set(methods) - {"__init__"}
    called_by = {
        name: {
            node.func.attr.value for node in walk(method)
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and dotted(node.func.value) == "self"
        }
        for name, method in methods.items()
    }
    reached = {entry for entry in WORKER_ENTRIES if entry in methods}
    # (a method the constructor does not call may be the script's own: `dataset.prepare()`, or the base's)
    reached |= {name for name in methods if name != "__init__" and not any(name in called for caller, called in called_by.items() if caller != name)}
    pending = list(reached)
    while pending:
        for callee in called_by.get(pending.pop(), set()):
            if callee in methods and callee not in reached and callee != "__init__":
                reached.add(callee)
                pending.append(callee)
    return reached
