"""Wraps and models: every ``DataParallel(...)`` wrap and what gates it, other references to
the class, DataParallel subclasses, DDP code already in the file, and the names bound to
the GPU count.

Fills ``facts.wraps``, ``model_names``, ``dp_references``, ``dp_subclasses``,
``distributed_uses``, ``existing_ddp`` and ``gpu_count_names``; forms that cannot be
converted are problems (DDP004), and DataParallel variants (another package's
``DataParallelModel``, a fork defined here) are ``facts.variants``, found as ``ddpify
check`` finds them (DDP121, DDP122).
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import QualifiedNameProvider, QualifiedNameSource, ScopeProvider

from ddpify.project.dp_subclasses import SubclassPlan, plan_from_code
from ddpify.analysis.facts import Guard, WrapSite
from ddpify.analysis.tree import DEVICE_COUNT, argument_in_slot, assigned_in, bound_names, calls_in, dotted, is_main_guard, ended_block, own_nodes, walk
from ddpify.analysis.scopes import Room, module_aliases, star_imported_torch, star_roots
from ddpify.names import DATA_PARALLEL, DATA_PARALLEL_METHODS, DDP, SAMPLER, variant_name

ALREADY_DISTRIBUTED = DDP | SAMPLER | {"torch.distributed.init_process_group"}
# What a DataParallel subclass may define and still work on top of DDP unchanged.
FORWARDING_METHODS = {"__getattr__", "__init__"}
# DataParallel internals DDP does not have.
DATA_PARALLEL_INTERNALS = ("scatter", "gather", "replicate", "parallel_apply", "chunk_sizes", "output_device", "src_device_obj")


def subclass_blocker(node: cst.ClassDef) -> str | None:
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


class Wraps(Room):
    def __init__(self, scopes) -> None:
        super().__init__(scopes)
        self._other_bindings: set[str] = set()  # names bound to anything but device_count()
        self._local_variants: set[str] = set()  # classes and functions defined here named *DataParallel*
        self._variant_calls: list[tuple[cst.Call, str]] = []  # `BalancedDataParallel(0, model)`, unless defined here

    # -- during the walk -----------------------------------------------------------------
    def class_bases(self, node: cst.ClassDef) -> None:
        """A DataParallel subclass: one that only forwards attributes works on top of DDP."""
        for base in node.bases:
            if self.scopes.qualified(base.value) & DATA_PARALLEL or dotted(base.value) in self.facts.dp_classes:
                reason = subclass_blocker(node)
                plan = plan_from_code(self.scopes.module.code_for_node(node)) if reason else None
                if isinstance(plan, SubclassPlan):
                    # Only scatters (or forwards, with a constructor of its own): its calls
                    # become ddp_wrap(model); the class is left, unused.
                    self.facts.dp_classes[node.name.value] = plan
                elif reason:
                    self.scopes.problem(node, "DDP004", f"class {node.name.value} subclasses DataParallel and {plan}; convert it by hand")
                else:
                    # Attribute forwarding only: the same class works on top of DDP.
                    self.facts.dp_subclasses[node.name.value] = node
                    self.facts.dp_references.append(base.value)

    def subclass_called(self, call: cst.Call) -> bool:
        """``MyDataParallel(model)`` for a DataParallel subclass of this file that converts."""
        if not isinstance(call.func, cst.Name) or call.func.value not in self.facts.dp_subclasses:
            return False
        scope = self.scopes.get_metadata(ScopeProvider, call.func, None)
        return scope is not None and any(
            getattr(a, "node", None) is self.facts.dp_subclasses[call.func.value] for a in scope[call.func.value]
        )

    def bind(self, names: list[str]) -> None:
        """Names bound to something other than the GPU count."""
        self._other_bindings.update(names)

    def assign(self, node: cst.Assign) -> None:
        """`n_gpu = torch.cuda.device_count()`: a name for the GPU count (unless bound otherwise)."""
        counted = isinstance(node.value, cst.Call) and DEVICE_COUNT in self.scopes.qualified(node.value.func)
        for target in node.targets:
            (self.facts.gpu_count_names if counted else self._other_bindings).update(bound_names(target.target))

    def reference(self, node: cst.Attribute | cst.Name) -> None:
        names = self.scopes.qualified(node)
        if names & ALREADY_DISTRIBUTED:
            if not self._in_type_test(node):  # `isinstance(m, (DataParallel, DDP))` is an unwrap
                self.facts.distributed_uses.append(node)
            return
        if not names & DATA_PARALLEL:
            return
        parent = self.scopes.parent(node)
        if isinstance(parent, (cst.ImportAlias, cst.Attribute)):
            return  # the import itself, or a part of a longer dotted name
        if isinstance(parent, cst.Call) and parent.func is node:
            return  # a wrap site, recorded by visit_Call
        if isinstance(parent, cst.Arg) and isinstance(self.scopes.parent(parent), cst.ClassDef):
            return  # a base class, reported by visit_ClassDef
        if self._inside_import(node):
            return
        self.facts.dp_references.append(node)

    def _in_type_test(self, node: cst.CSTNode) -> bool:
        """An argument of ``isinstance``/``issubclass``, or compared with ``type(x) is``/``in``."""
        while not isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)) and node is not None:
            parent = self.scopes.parent(node)
            if isinstance(parent, cst.Call) and node is not parent.func:
                return isinstance(parent.func, cst.Name) and parent.func.value in ("isinstance", "issubclass")
            if isinstance(parent, cst.Comparison):
                return any(isinstance(t.operator, (cst.Is, cst.In, cst.IsNot, cst.NotIn, cst.Equal)) for t in parent.comparisons)
            if isinstance(parent, cst.CompFor) and node is parent.iter:
                # (UDAStrongBaseline's `any(isinstance(model, x) for x in [DataParallel, DistributedDataParallel])`)
                comprehension = self.scopes.parent(parent)
                tested = getattr(comprehension, "elt", None)
                return tested is not None and any(
                    isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in ("isinstance", "issubclass")
                    for n in walk(tested)
                )
            node = parent
        return False

    def _inside_import(self, node: cst.CSTNode) -> bool:
        while not isinstance(node, (cst.Module, cst.BaseStatement)):
            if isinstance(node, (cst.Import, cst.ImportFrom)):
                return True
            node = self.scopes.parent(node)
        return False

    def planned_subclass(self, call: cst.Call) -> SubclassPlan | None:
        """``BalancedDataParallel(gpu0_bsz, model)``: a DataParallel subclass whose wraps
        convert (this file's that only scatter, or a project module's)."""
        name = dotted(call.func) or ""
        alias = module_aliases(self.scopes.module).get(name) if self.scopes.module is not None else None
        return self.facts.dp_classes.get(name) or (self.facts.dp_classes.get(dotted(alias) or "") if alias is not None else None)

    def record_wrap(self, call: cst.Call, slot: tuple[int, str] = (0, "module"), constructed: bool = False, functional_in: str = "", sync_bn: bool = False) -> None:
        outer: cst.BaseExpression = call
        move = None
        parent = self.scopes.parent(call)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("to", "cuda"):
            grand = self.scopes.parent(parent)
            if isinstance(grand, cst.Call) and grand.func is parent:
                outer, move = grand, grand
        module = call if constructed else argument_in_slot(call, slot)
        named = dict(module_slot=slot, constructed=constructed, functional_in=functional_in, sync_bn=sync_bn)
        site = WrapSite(call, outer, move, module, self.scopes.assigned_name(outer), **named)
        site.device_count = self._literal_device_count(call)
        site.guards = self._enclosing_ifs(call)
        for guard in site.guards:
            self._paths_past(guard, site.target)
        if site.module_arg is None:
            self.scopes.problem(call, "DDP004", "DataParallel(...) without a module argument; convert it by hand")
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
            child, node = node, self.scopes.parent(node)
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

    def _paths_past(self, guard: Guard, target: str | None) -> None:
        """The other branches of a statement ``if`` around the wrap that bind the model (or
        find it bound before the ``if``) and go on past it unwrapped: Deep-Image-Matting wraps
        a new model under ``if checkpoint is None:`` and resumes ``checkpoint['model'].module``
        in the else, and under DDP every path must wrap."""
        node = guard.node
        if not isinstance(node, cst.If) or not target:
            return
        before = self._bound_before(node, target)
        owners, branch = [], node.orelse
        if guard.wraps_when_true:
            while isinstance(branch, cst.If):  # elif
                owners.append(branch)
                branch = branch.orelse
            owners += [branch] if branch is not None else []
            guard.falls_through_unwrapped = branch is None and before
        else:
            owners = [node]
        guard.unwrapped_branches = tuple(owner for owner in owners if self._goes_past_unwrapped(owner, target, before))

    def _goes_past_unwrapped(self, owner: cst.If | cst.Else, target: str, before: bool) -> bool:
        statements = list(owner.body.body)
        if any(self.scopes.qualified(call.func) & DATA_PARALLEL for call in calls_in(owner.body)) or not statements:
            return False
        last = statements[-1]
        if isinstance(last, cst.SimpleStatementLine) and _ends_the_path(last.body[-1]):
            return False
        binds = any(
            isinstance(statement, cst.SimpleStatementLine) and target in assigned_in(statement) for statement in statements
        )
        return binds or before

    def _bound_before(self, node: cst.CSTNode, target: str) -> bool:
        """Is ``target`` assigned before this statement in its function (or module), or a
        parameter of the function?"""
        while not isinstance(node, cst.Module):
            block = self.scopes.parent(node)
            if isinstance(block, (cst.IndentedBlock, cst.Module)) and node in block.body:
                earlier = block.body[: block.body.index(node)]
                earlier = [statement for statement in earlier if not isinstance(statement, (cst.FunctionDef, cst.ClassDef))]
                if any(_surely_binds(statement, target) for statement in earlier):
                    return True
            if isinstance(node, cst.FunctionDef):
                return target in {param.name.value for param in node.params.params + node.params.kwonly_params}
            node = block
        return False

    def _always_wraps(self, branch: cst.CSTNode | None) -> bool:
        """Does every path through this branch wrap a model in DataParallel?"""
        if branch is None:
            return False
        if isinstance(branch, cst.If):  # elif
            return self._always_wraps(branch.body) and self._always_wraps(branch.orelse)
        return any(self.scopes.qualified(call.func) & DATA_PARALLEL for call in calls_in(branch))

    # -- DataParallel variants (check's DDP121, DDP122) -------------------------------------
    def definition(self, node: cst.FunctionDef | cst.ClassDef) -> None:
        """A class or function named *DataParallel* (its calls are not a foreign variant), or
        a fork of DataParallel: a class so named with its own scatter/gather (DDP121)."""
        name = node.name.value
        if not variant_name(name):
            return
        self._local_variants.add(name)
        if not isinstance(node, cst.ClassDef):
            return
        methods = {s.name.value for s in node.body.body if isinstance(s, cst.FunctionDef)}
        if methods & DATA_PARALLEL_METHODS and not any(self._imported_names(b.value) & DATA_PARALLEL for b in node.bases):
            self.facts.variants.append((node, "DDP121"))

    def variant_call(self, call: cst.Call) -> None:
        """``DataParallelModel(net)``: a DataParallel variant (not torch's) called on a model."""
        if not any(a.keyword is None and a.star != "**" for a in call.args):
            return
        for name in sorted(self._imported_names(call.func)) or [None]:
            last = (name or _loose_dotted(call.func) or "").rsplit(".", 1)[-1]
            if variant_name(last) and name not in DATA_PARALLEL and not (name or "").startswith("torch."):
                self._variant_calls.append((call, last))
                return

    def _imported_names(self, node: cst.BaseExpression) -> set[str]:
        """What an expression names through the file's imports (as ``ddpify check`` reads
        them: a star import may bring ``torch`` and ``nn``)."""
        names = {
            q.name
            for q in self.scopes.get_metadata(QualifiedNameProvider, node, set())
            if q.source is QualifiedNameSource.IMPORT
        }
        if names or not self.facts.star_imports:
            return names
        return star_imported_torch(node, self.scopes.scope_of, star_roots(self.facts.reexports))

    # -- after the walk ------------------------------------------------------------------
    def finish(self) -> None:
        self.facts.variants += [(call, "DDP122") for call, last in self._variant_calls if last not in self._local_variants]
        self.facts.gpu_count_names -= self._other_bindings
        # A DDP path beside DataParallel: take it (transforms/existing_ddp.py), set nothing up twice.
        self.facts.existing_ddp = bool(self.facts.distributed_uses and (self.facts.wraps or self.facts.dp_references))
        for site in self.facts.wraps:
            site.rebinds = self._rebound_after(site)

    def _rebound_after(self, site: WrapSite) -> list[cst.SimpleStatementLine]:
        """Statements after the wrap, in its function (or module), that bind the wrapped name
        to another model: Deep-Image-Matting reloads its best checkpoint's pickled model
        mid-training (``model = checkpoint['model']``); under DataParallel that was a wrapped
        model again, under DDP it must be wrapped again. Other branches of the wrap's own
        guards are not after it (their paths are _paths_past's)."""
        statement = site.call  # its line, or the compound statement of a one-line suite
        while not isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Module)):
            statement = self.scopes.parent(statement)
        if not site.target or isinstance(statement, cst.Module):
            return []
        context = self.facts.contexts.get(site.call)
        scope = context.function if context is not None and context.function is not None else self.scopes.module
        elsewhere = set()
        for guard in site.guards:
            branch = (guard.node.orelse if guard.wraps_when_true else guard.node.body) if isinstance(guard.node, cst.If) else None
            elsewhere.update(walk(branch) if branch is not None else ())
        nodes = own_nodes(scope)
        after = nodes[nodes.index(statement) + 1 :] if statement in nodes else []
        ended = ended_block(statement, scope, self.scopes.parent)  # (a branch that returns: nothing below runs after it)
        after = [node for node in after if id(node) in {id(n) for n in walk(ended)}] if ended is not None else after
        return [
            line for index, line in enumerate(after)
            if isinstance(line, cst.SimpleStatementLine) and line not in elsewhere and self._binds_another_model(line, site.target)
            and not self._wrapped_before_use(after[index + 1 :], site.target)
        ]

    def _wrapped_before_use(self, later: list[cst.CSTNode], target: str) -> bool:
        """Is the first later statement that reads the name a wrap of it (LEDNet's
        ``model = Net(encoder=enc)`` then ``model = DataParallel(model)``)? Then the script wraps
        the new model itself."""
        for line in later:
            if not isinstance(line, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                continue
            if target not in {dotted(node) for node in walk(line) if isinstance(node, (cst.Name, cst.Attribute))}:
                continue
            body = line.body if isinstance(line, cst.SimpleStatementLine) else []
            assign = body[0] if len(body) == 1 and isinstance(body[0], cst.Assign) else None
            return assign is not None and any(self.scopes.qualified(call.func) & DATA_PARALLEL for call in calls_in(assign.value))
        return False

    def _binds_another_model(self, line: cst.SimpleStatementLine, target: str) -> bool:
        """``target = <a value that does not read target>``: a model loaded or built anew
        (not ``model = model.to(device)``, not a constant, not a wrap of its own)."""
        if len(line.body) != 1 or not isinstance(line.body[0], cst.Assign) or len(line.body[0].targets) != 1:
            return False
        assign = line.body[0]
        value = assign.value
        if dotted(assign.targets[0].target) != target or isinstance(value, (cst.BaseNumber, cst.BaseString)):
            return False
        if isinstance(value, cst.Name) and value.value in ("None", "True", "False"):
            return False
        read = {dotted(node) for node in walk(value) if isinstance(node, (cst.Name, cst.Attribute))}
        root = target.split(".")[0] if not target.startswith("self.") else target
        wraps_again = any(self.scopes.qualified(call.func) & DATA_PARALLEL for call in calls_in(value))
        return target not in read and root not in read and not wraps_again


def _ends_the_path(statement: cst.BaseSmallStatement) -> bool:
    """return / raise / continue / break, or an exit call: nothing runs after it."""
    if isinstance(statement, (cst.Return, cst.Raise, cst.Continue, cst.Break)):
        return True
    return isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call) and dotted(statement.value.func) in (
        "sys.exit", "exit", "quit", "os._exit"
    )


def _loose_dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c``; for an attribute of something else, its own name (``f().DataParallel``)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _loose_dotted(node.value)
        return f"{base}.{node.attr.value}" if base else node.attr.value
    return None


def _surely_binds(statement: cst.CSTNode, target: str) -> bool:
    """Does running this statement surely bind ``target``? (AudioClassfication's teacher,
    bound only under ``if args.kd_model:``, is not bound when that flag is off.)"""
    if isinstance(statement, cst.SimpleStatementLine):
        return target in assigned_in(statement)
    if isinstance(statement, (cst.With, cst.Try)):
        return _block_binds(statement.body, target)
    if isinstance(statement, cst.If):
        other = statement.orelse
        if other is None:
            return False
        return _block_binds(statement.body, target) and (
            _surely_binds(other, target) if isinstance(other, cst.If) else _block_binds(other.body, target)
        )
    return False


def _block_binds(block: cst.BaseSuite, target: str) -> bool:
    statements = block.body if isinstance(block, cst.IndentedBlock) else [block]
    return any(_surely_binds(inner, target) for inner in statements)
