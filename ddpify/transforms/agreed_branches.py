"""DDP809: a branch that every rank must take alike is decided on rank 0's value.

DataParallel ran one process, so every ``if`` was decided once. Under DDP each rank decides
its own, and where a test reads something that may differ between ranks (an evaluation that
samples in the model, WaveVAE's ``if test_loss > test_epoch_loss:``; a time; an object's
state), one rank may take a branch that holds a collective (a DDP construction, the model's
forward, an all-reduce) or leaves a loop that trains (``break``, ``return``) while another does
not: the others wait in a collective that never comes (a hang). Such a test, met by every rank
inside the training (an epoch loop, a training loop, a step function), is decided once: every
rank takes rank 0's truth of it (``ddp_agreed``, one broadcast).

DDP809  a test that may differ between ranks, met by every rank in the training, whose branch
holds a call that may run the model or a collective, or leaves a loop or function that trains:
every rank takes rank 0's decision::

    if val_loss < best:              ->   if ddp_agreed(val_loss < best):
        kept = averaged_copy(model)           kept = averaged_copy(model)

A test that is the same on every rank (counters, settings, constants) is left as it is, and so
is one that the DDP8xx decisions of transforms/decisions.py already made alike (on a mean,
``ddp_any``/``ddp_all``). A test that not every rank reaches (under an exception handler or a
rank guard) cannot be decided with a collective: DDP803 reports those; neither can one in an
imported module of a project, whose callers are out of sight.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import calls_in, dotted, enclosing_function, innermost_loop, is_main_guard, under_rank_guard, walk
from ddpify.analysis.settled import SettledNames
from ddpify.transforms.base import Transform

# Helpers that already give every rank the same answer (transforms/decisions.py's rewrites)
AGREEING_HELPERS = ("ddp_mean", "ddp_any", "ddp_all", "ddp_sum", "ddp_agreed", "ddp_from_rank_zero")
LEAVING = (cst.Break, cst.Continue, cst.Return)
STRUCTURAL_CALLS = ("hasattr", "isinstance", "callable", "len")


class AgreedBranchesTransform(Transform):
    CODE_PREFIX = "DDP8"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._agreed: dict[cst.CSTNode, str] = {}  # If/While -> why every rank must take it alike
        self._settled: SettledNames | None = None  # names alike on every rank

    def check(self) -> None:
        if self.context.is_library:
            return  # (its callers are out of sight: one may run it on rank 0 alone, where a collective hangs)
        training = self._training_scopes()
        if not training:
            return
        fed = self._fed_objects()
        self._settled = self.context.settled
        for node in walk(self.context.module):  # (outer tests first: an inner one is reached alike once they are)
            if not isinstance(node, (cst.If, cst.While)) or is_main_guard(node) or not self._inside(node, training):
                continue
            if self._uniform(node, fed) or not self._reached_alike(node, fed):
                continue
            why = self._needs_every_rank(node)
            if why:
                self._agreed[node] = why

    def _training_scopes(self) -> set[cst.CSTNode]:
        """The loops that train and the loops around them, and the step functions."""
        loops = set(self.facts.training_loops) | set(self.facts.epoch_hooks)
        for node in walk(self.context.module):
            if isinstance(node, (cst.For, cst.While)) and any(inner in loops for inner in walk(node.body)):
                loops.add(node)
        return loops | set(self.facts.step_functions)

    def _inside(self, node: cst.CSTNode, scopes: set[cst.CSTNode]) -> bool:
        """In the training, or an epoch loop's own test (``while time.time() - start < budget:``)."""
        if node in scopes:
            return True
        parent = self.context.parent(node)
        while parent is not None:
            if parent in scopes:
                return True
            if isinstance(parent, cst.FunctionDef):
                return False
            parent = self.context.parent(parent)
        return False

    def _fed_objects(self) -> set[str]:
        """Objects whose methods the file calls with values (``early_stopping(val_loss, model)``,
        ``tracker.update(acc)``): their attributes may hold what this rank computed."""
        fed = set()
        modules = _imported_modules(self.context.module)
        for call in calls_in(self.context.module):
            name = dotted(call.func)
            if not name or not call.args:
                continue
            fed.add(name)
            receiver = name.rpartition(".")[0]
            # (`torch.cuda.manual_seed_all(seed)` feeds a module, not an object that computes:
            # RoBERTa's `if torch.cuda.device_count() == 1:` is the same on every rank)
            if isinstance(call.func, cst.Attribute) and receiver.partition(".")[0] not in modules:
                fed.add(receiver)
        return fed

    def _uniform(self, node: cst.If | cst.While, fed: set[str]) -> bool:
        """The same on every rank: counters, settings and constants, and no attribute of an
        object the file feeds values to."""
        if not self._settled.uniform(node.test, node):
            return False
        # (what `hasattr`/`isinstance` ask is the object's make, not a value it computed)
        shaped = {id(n) for call in calls_in(node.test) if dotted(call.func) in STRUCTURAL_CALLS for n in walk(call)}
        attributes = [n for n in walk(node.test) if isinstance(n, cst.Attribute) and id(n) not in shaped]
        # (a setting the object was made with, set in its __init__ alone: MoleculeX's `self.config['loss']`)
        attributes = [n for n in attributes if not (dotted(n.value) == "self" and self._settled.reads_self_settings(n, node))]
        return not any((dotted(attribute.value) or "") in fed for attribute in attributes)

    def _reached_alike(self, node: cst.CSTNode, fed: set[str]) -> bool:
        """Does every rank meet this test, once the tests around it are decided alike?"""
        if under_rank_guard(node, self.context.parent, self.context.code) or self._rank_zero_alone(node):
            return False
        child, parent = node, self.context.parent(node)
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
            if isinstance(parent, cst.ExceptHandler) or isinstance(parent, cst.Try) and child is parent.orelse:
                return False
            if isinstance(parent, (cst.If, cst.While)) and child is not parent.test:
                if parent not in self._agreed and not self._uniform(parent, fed) and not is_main_guard(parent):
                    return False
            child, parent = parent, self.context.parent(parent)
        return True

    def _rank_zero_alone(self, node: cst.CSTNode) -> bool:
        """A statement that rank 0 runs alone once converted, or inside one (rank_zero's guards:
        a `with open(path, "a") as f:` block around the test; the whole `if not exists(d):
        mkdir(d)` of Jacqueline121/RetinaNet_pytorch, whose agreed test was a broadcast only
        rank 0 reached)."""
        alone = self.context.rank_zero_only
        return alone is not None and any(isinstance(up, cst.BaseStatement) and alone(up) for up in (node, *self._ancestors(node)))

    def _rank_zero_writes(self, branch: cst.CSTNode) -> bool:
        """A statement of the branch that rank 0 runs alone: a write, which other ranks wait for
        at a barrier after it."""
        alone = self.context.rank_zero_only
        return alone is not None and any(isinstance(statement, cst.BaseStatement) and alone(statement) for statement in walk(branch))

    def _needs_every_rank(self, node: cst.If | cst.While) -> str | None:
        """What in the branch every rank must do alike: a call that may run the model or a
        collective, or a way out of a loop or function that trains."""
        function = enclosing_function(node, self.context.parent)
        params = {p.name.value for p in function.params.params} if function is not None else set()
        branches = [node.body, *([node.orelse] if node.orelse is not None else [])]
        for branch in branches:
            for call in calls_in(branch):
                if self.facts.analyzer.call_is_unsafe(call, params):
                    return f"its branch holds `{self.context.code(call.func)}(...)`, which may run the model or a collective"
            if self._rank_zero_writes(branch):
                return "its branch holds a write rank 0 does alone while the others wait for it at a barrier"
            for leaving in walk(branch):
                if isinstance(leaving, LEAVING) and self._leaves_training(leaving, node, function):
                    word = type(leaving).__name__.lower()
                    return f"its `{word}` leaves code that every rank runs (the model, collectives)"
        return None

    def _leaves_training(self, leaving: cst.CSTNode, branch: cst.CSTNode, function: cst.FunctionDef | None) -> bool:
        if isinstance(leaving, cst.Return):
            return function is not None and function in self.facts.unsafe_functions
        loop = innermost_loop(leaving, self.context.parent)
        if loop is None or not any(outer is loop for outer in self._ancestors(branch)):
            return False  # (a loop inside the branch: the branch decides whether it runs at all)
        params = {p.name.value for p in function.params.params} if function is not None else set()
        return any(self.facts.analyzer.call_is_unsafe(call, params) for call in calls_in(loop.body))

    def _ancestors(self, node: cst.CSTNode):
        parent = self.context.parent(node)
        while parent is not None:
            yield parent
            parent = self.context.parent(parent)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        return self._agree(original_node, updated_node)

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        return self._agree(original_node, updated_node)

    def _agree(self, original, updated):
        why = self._agreed.get(original)
        if why is None or any(dotted(call.func) in AGREEING_HELPERS for call in calls_in(updated.test)):
            return updated
        keyword = "if" if isinstance(original, cst.If) else "while"
        self.context.use_helper("ddp_agreed")
        # (a hang DDP803 warned of here is gone: every rank takes the same branch)
        self.context.withdraw(original, "DDP803")
        self.context.report(
            original,
            "DDP809",
            f"`{keyword} {self.context.code(original.test)}:` may differ between ranks and {why}: "
            "every rank takes rank 0's decision (ddp_agreed), so none waits in a collective the others skip",
        )
        return updated.with_changes(test=cst.Call(func=cst.Name("ddp_agreed"), args=[cst.Arg(updated.test)]))


def _imported_modules(module: cst.Module) -> set[str]:
    """Names bound by ``import x`` / ``import x.y as z`` statements: modules, not objects."""
    found = set()
    for node in walk(module):
        if isinstance(node, cst.Import):
            for alias in node.names:
                found.add(alias.asname.name.value if alias.asname is not None else (dotted(alias.name) or "").partition(".")[0])
    return found
