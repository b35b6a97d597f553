"""What every transform shares: the conversion context, the Transform base, the pipeline.

The pipeline parses nothing and resolves metadata once. It runs one traversal in which
every transform's ``leave_<Node>(original_node, updated_node)`` hook is called in
pipeline order, each receiving the previous one's result. Statements are inserted or
removed only through ``edit_block(owner, block)``, where ``block`` is a list of
``(original, updated)`` statement pairs: that keeps later transforms able to recognise a
statement by its original node (``original`` is None for inserted statements).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata.base_provider import LazyValue
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider, ScopeProvider

from ddpify.analysis import Facts, star_imported_torch, star_roots
from ddpify.analysis.scopes import module_aliases, through_reexports
from ddpify.analysis.data_sites import data_sites
from ddpify.analysis.scatter_points import scattered_at_the_model, whole_data_steps
from ddpify.analysis.settled import SettledNames
from ddpify.analysis.tree import dotted, walk, without_moves
from ddpify.project.neighbours import Neighbours
from ddpify.diagnostics import LIBRARY, SCRIPT, ConvertOptions, Diagnostic, Severity

Pair = tuple[cst.BaseStatement | None, cst.BaseStatement]
Block = list[Pair]
METADATA = (QualifiedNameProvider, ScopeProvider, ParentNodeProvider, PositionProvider)
# The statement that stands for the inlined helper block until the tree is printed
# (process_group.helpers_placeholder puts it in; ConversionContext.finish swaps the text in).
HELPERS_PLACEHOLDER = "__ddpify_helper_block__"


class MetadataView:
    """Metadata resolved once for the original tree, readable before and during the traversal."""

    def __init__(self, wrapper: cst.MetadataWrapper) -> None:
        self._resolved = wrapper.resolve_many(METADATA)

    def resolve(self, provider: type) -> Any:
        return self._resolved[provider]

    def get_metadata(self, provider: type, node: cst.CSTNode, default: Any = KeyError) -> Any:
        value = self._resolved[provider].get(node, default)
        if value is KeyError:
            raise KeyError(node)
        return value() if isinstance(value, LazyValue) else value


@dataclass
class ConversionContext:
    """State shared by the transforms of one file's conversion."""

    module: cst.Module
    facts: Facts
    options: ConvertOptions
    metadata: MetadataView
    path: str = "<string>"
    diagnostics: list[Diagnostic] = field(default_factory=list)
    launch_command: str | None = None  # set by a transform that knows the script's own launch line
    imports_to_add: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    sharded_loaders: set[cst.Call] = field(default_factory=set)
    # loaders whose every batch is cut into the steps' batches: their batch stays per process
    regrouped_loaders: set[cst.Call] = field(default_factory=set)
    # (function or None, code) of what training loops draw from through ddp_shard(...)
    run_time_shards: set[tuple[cst.FunctionDef | None, str]] = field(default_factory=set)
    run_time_loaders: set[cst.Call] = field(default_factory=set)  # DataLoader calls ddp_shard rebuilds
    # `len(loader.dataset)` calls (original nodes) BatchSize made the shard's length (DDP405)
    shard_lengths: set[cst.Call] = field(default_factory=set)
    # summed losses SummedLosses scaled by the world size (original nodes, DDP116): what holds
    # them holds the global batch's value on every rank, not a share of it
    world_scaled: set[cst.CSTNode] = field(default_factory=set)
    # a counted loop's cuts of data held whole (`X[i * bs:(i + 1) * bs]`): each rank takes its part
    split_cuts: set[cst.Subscript] = field(default_factory=set)
    visible_devices: str | None = None  # a CUDA_VISIBLE_DEVICES value removed from the script
    helpers_used: set[str] = field(default_factory=set)  # optional template helpers to inline
    role: str = SCRIPT
    helper_block: str | None = None  # text that replaces the helper placeholder statement
    # Project mode: this file trains a model that another project module wraps (it shards
    # its loaders as if it wrapped); and some other project module has a training step.
    # A script that takes its own DDP path (DDP007): its writes outside its own rank guards are
    # guarded as an imported module's are (the rank read at run time: a world of one without a group)
    own_ddp_path: bool = False
    model_elsewhere: bool = False
    trains_elsewhere: bool = False
    # Single-file mode: what the project modules the script imports do (read, never rewritten)
    neighbours: Neighbours = field(default_factory=Neighbours)
    # Losses that compare a batch's samples, computed on the whole global batch: the calls
    # gathered (ddp_whole_batch) and the definitions they run (already the global batch's value)
    whole_batch_calls: set[cst.Call] = field(default_factory=set)
    whole_batch_definitions: set[cst.CSTNode] = field(default_factory=set)
    # The script's own per-step draws each rank takes its share of (ddp_drawn, DDP313): the batch
    # size one is given, read again in the step, is the global batch's size
    drawn_calls: set[cst.Call] = field(default_factory=set)
    # (function or module, name) of training statistics averaged where they are computed (DDP810):
    # a print of one shows it as it is
    averaged_statistics: set = field(default_factory=set)
    # values of device assignments wrap_model replaces with ddp_device() (DDP147): no other rewrite of them
    replaced_devices: set = field(default_factory=set)
    # Set by the rank-0 transform's check: does rank 0 alone run this statement once converted?
    rank_zero_only: Any = None
    # `if`/`while` tests rank_zero decides on rank 0 for every rank (DDP622): every rank takes the branch
    decided_by_rank_zero: Any = None
    _scattered: Any = field(default=None, init=False, repr=False)
    _coupled: Any = field(default=None, init=False, repr=False)
    _taken: Any = field(default=None, init=False, repr=False)
    _settled: Any = field(default=None, init=False, repr=False)

    def fresh_name(self, base: str) -> str:
        """``base``, or ``base_2``, ...: a name nothing in the module uses yet, nor another
        transform took for this file."""
        if self._taken is None:
            self._taken = set(self.facts.names)
        name, number = base, 2
        while name in self._taken:
            name, number = f"{base}_{number}", number + 1
        self._taken.add(name)
        return name

    @property
    def scattered_loops(self) -> dict[cst.CSTNode, tuple[cst.Call, ...]]:
        """Training loops whose batches every rank draws whole, the wrapped model's calls
        there taking their share as DataParallel's scatter did (scattered_at_the_model):
        loop -> those calls."""
        if self._scattered is None:
            sites = data_sites(self.facts) if self.facts.wraps else []
            coupled = frozenset(self.batch_coupled)
            self._scattered = {site.loop: calls for site in sites if (calls := scattered_at_the_model(site, self.facts, coupled))}
            if self.facts.wraps and not self.is_library:
                self._scattered.update(whole_data_steps(self.facts))
        return self._scattered

    @property
    def settled(self) -> SettledNames:
        """Which names hold the same value on every rank (analysis/settled.py), read once."""
        if self._settled is None:
            self._settled = SettledNames(self.module, self.parent, self.facts.analyzer.calls)
        return self._settled

    @property
    def batch_coupled(self) -> dict[str, str]:
        """The project's losses that count over the batch's content (neighbours), and the names
        bound here to one made (``criterion = MultiBoxLoss(...)``) -> what each is (read once)."""
        if self._coupled is None:
            counted = self.neighbours.count_normalized
            self._coupled = dict.fromkeys(counted, "")
            for node in walk(self.module) if counted else ():
                if isinstance(node, cst.Assign) and isinstance(value := without_moves(node.value), cst.Call) and dotted(value.func) in counted:
                    self._coupled.update((dotted(t.target), dotted(value.func)) for t in node.targets if dotted(t.target))
        return self._coupled

    @property
    def is_library(self) -> bool:
        """An imported module: its code runs after the entry script's set-up, its module
        level at import time (before it)."""
        return self.role == LIBRARY

    @property
    def rank_read_at_run_time(self) -> bool:
        """Emitted code reads the rank through ddp_rank() (a process with no group is rank 0) and
        waits at no barrier: an imported module, or a script on its own DDP path, whose other
        path (DataParallel, one process) has no process group."""
        return self.is_library or self.own_ddp_path

    @property
    def rank(self) -> str:
        """This process's rank, as emitted code (see process_group.LIBRARY_CALLS)."""
        return "ddp_rank()" if self.rank_read_at_run_time else "dist.get_rank()"

    @property
    def world_size(self) -> str:
        """The number of processes, as emitted code."""
        return "ddp_world_size()" if self.rank_read_at_run_time else "dist.get_world_size()"

    def at_module_level(self, node: cst.CSTNode) -> bool:
        """Not inside a function: in a library module, that runs at import time."""
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda)):
            node = self.parent(node)
        return node is None

    def finish(self, code: str) -> str:
        """The printed tree with the helper block in place of its placeholder line."""
        if self.helper_block is None:
            return code
        newline = self.module.default_newline
        return code.replace(HELPERS_PLACEHOLDER + newline, self.helper_block, 1)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        try:
            start = self.metadata.get_metadata(PositionProvider, node).start
        except KeyError:
            return (1, 1)
        return (start.line, start.column + 1)

    def report(self, node: cst.CSTNode, code: str, message: str, severity: Severity = Severity.CHANGE) -> None:
        line, col = self.position(node)
        self.diagnostics.append(Diagnostic(line, col, code, message, severity))

    def withdraw(self, node: cst.CSTNode, code: str) -> None:
        """Take back a finding reported at ``node`` that a later rewrite made untrue (DDP803's
        hang, once the ranks decide alike)."""
        at = self.position(node)
        self.diagnostics[:] = [d for d in self.diagnostics if not (d.code == code and (d.line, d.col) == at)]

    def report_unsound(self, node: cst.CSTNode, code: str, message: str) -> None:
        """A finding that means the result would train wrongly: the file is refused, unless
        the user asked for a partial conversion (then it is a warning)."""
        if self.options.allow_partial:
            self.report(node, code, f"{message} (converted anyway: --allow-partial)", Severity.WARNING)
        else:
            self.report(node, code, f"{message}; not converted", Severity.ERROR)

    def on_the_whole_batch(self, node: cst.CSTNode | None) -> bool:
        """Inside a loss call given the gathered global batch (DDP117), or its definition, or a
        loop whose batch every rank holds whole (the model's calls scattered): what it computes
        is DataParallel's already."""
        if self.in_a_scattered_loop(node):
            return True
        while node is not None:
            if node in self.whole_batch_calls or node in self.whole_batch_definitions:
                return True
            node = self.parent(node)
        return False

    def in_a_scattered_loop(self, node: cst.CSTNode | None) -> bool:
        """Inside a training loop whose batch every rank holds whole (scattered_loops)."""
        while node is not None and self.scattered_loops:
            if node in self.scattered_loops:
                return True
            node = self.parent(node)
        return False

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        try:
            return self.metadata.get_metadata(ParentNodeProvider, node)
        except KeyError:
            return None

    def qualified(self, node: cst.CSTNode, depth: int = 0) -> set[str]:
        reexports = self.facts.reexports
        names = {through_reexports(q.name, reexports) for q in self.metadata.get_metadata(QualifiedNameProvider, node, set())}
        alias = module_aliases(self.module).get(node.value) if isinstance(node, cst.Name) and depth < 3 else None
        if alias is not None and names <= {node.value}:
            # (TFPnP's `DataParallel = nn.DataParallel` at the top of the module, after a star import)
            return self.qualified(alias, depth + 1)
        if not names and isinstance(node, cst.Name) and node.value in self.facts.reexports:
            return {self.facts.reexports[node.value]}  # bound by a star import of a project module
        if names or not self.facts.star_imports:
            return names
        return star_imported_torch(node, lambda name: self.metadata.get_metadata(ScopeProvider, name, None), star_roots(reexports))

    def add_import(self, module: str, name: str | None = None, alias: str | None = None) -> None:
        if (module, name, alias) not in self.imports_to_add:
            self.imports_to_add.append((module, name, alias))

    def unwrapped(self, name: str, at: cst.CSTNode) -> str:
        """``getattr(model, "module", model)``: the module inside a wrap, or the model itself;
        quoted so that it also fits inside an f-string at ``at`` (Python before 3.12)."""
        quote = '"'
        node = self.parent(at)
        while node is not None and not isinstance(node, cst.BaseStatement):
            if isinstance(node, cst.FormattedString) and '"' in node.start:
                quote = "'"
            node = self.parent(node)
        return f"getattr({name}, {quote}module{quote}, {name})"

    def shard_call(self, loader: str, per_process: bool = False, whole_batches: bool = False, everywhere: bool = False) -> str:
        """``ddp_shard(loader)``: the training loader sharded at run time (emitted code);
        ``whole_batches``: every rank draws DataParallel's whole batches (the model's calls split them);
        ``everywhere``: rebuilt in a world of one too (a builder's loader whose callers set its epoch)."""
        if whole_batches:
            return f"ddp_shard({loader}, whole_batches=True)"
        batch = ", global_batch=False" if self.options.per_process_batch or per_process else ""
        return f"ddp_shard({loader}{batch}{', everywhere=True' if everywhere else ''})"

    def use_helper(self, name: str) -> None:
        self.helpers_used.add(name)

    @property
    def has_errors(self) -> bool:
        return any(d.severity is Severity.ERROR for d in self.diagnostics)


class Transform:
    """One rewrite. Subclasses set CODE_PREFIX and document their codes with examples.

    ``check()`` runs before anything is rewritten and reports ERROR diagnostics for what
    this transform cannot do safely; any error leaves the whole file untouched.
    """

    CODE_PREFIX = "DDP0"

    def __init__(self, context: ConversionContext) -> None:
        self.context = context
        self.facts = context.facts

    def check(self) -> None:
        """Report ERROR diagnostics for anything this transform cannot convert safely."""

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        """Insert, remove or wrap statements of the block whose parent is ``owner``."""
        return block


class Pipeline(cst.CSTTransformer):
    """Runs every transform's hooks in one traversal of the tree."""

    def __init__(self, context: ConversionContext, transforms: list[Transform]) -> None:
        super().__init__()
        self.context = context
        self.transforms = transforms

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        hook_name = f"leave_{type(original_node).__name__}"
        hooks = [getattr(transform, hook_name) for transform in self.transforms if hasattr(transform, hook_name)]
        result: Any = _spaced(updated_node) if hooks else updated_node
        for hook in hooks:
            # A transform that replaced the node with another kind ends the chain for it.
            if isinstance(result, type(original_node)):
                result = hook(original_node, result)
        result = _unspaced(result, updated_node) if hooks else result
        if isinstance(result, (cst.Module, cst.IndentedBlock)) and isinstance(result, type(original_node)):
            result = self._edit_block(original_node, result)
        if isinstance(result, cst.FormattedString) and result is not original_node:
            result = _quoted_apart(result)
        return result

    def _edit_block(self, original: cst.Module | cst.IndentedBlock, updated: Any) -> Any:
        owner = original if isinstance(original, cst.Module) else self.context.parent(original)
        block: Block = list(zip(original.body, updated.body, strict=True))
        for transform in self.transforms:
            block = transform.edit_block(owner, block)
        return updated.with_changes(body=[statement for _, statement in block])


# A keyword and the parenthesised part after it may touch (`if(parallel):`, `return(x)`): a hook
# that puts another expression there (`ddp_agreed(parallel)`) would need the space libcst
# insists on (ICNet's trainer: an internal error). Hooks see the space; it goes again wherever
# the part stays parenthesised, so the bytes of what no hook changed stay as they were.
KEYWORD_SPACES: dict[type, tuple[tuple[str, str], ...]] = {
    cst.If: (("whitespace_before_test", "test"),),
    cst.While: (("whitespace_after_while", "test"),),
    cst.Assert: (("whitespace_after_assert", "test"),),
    cst.Return: (("whitespace_after_return", "value"),),
    cst.Raise: (("whitespace_after_raise", "exc"),),
    cst.Del: (("whitespace_after_del", "target"),),
    cst.IfExp: (("whitespace_after_if", "test"), ("whitespace_before_if", "body"), ("whitespace_after_else", "orelse")),
}


def _spaced(node: cst.CSTNode) -> cst.CSTNode:
    fields = KEYWORD_SPACES.get(type(node), ())
    # (a bare `return` touches nothing: no part to space from)
    tight = {name: cst.SimpleWhitespace(" ") for name, part in fields if _touches(node, name) and getattr(node, part) is not None}
    return node.with_changes(**tight) if tight else node


def _unspaced(result: Any, before: cst.CSTNode) -> Any:
    if type(result) is not type(before):
        return result
    tight = {
        name: before_space for name, part in KEYWORD_SPACES.get(type(before), ())
        if _touches(before, name) and (before_space := getattr(before, name)) is not None
        and _opens_with_a_parenthesis(getattr(result, part)) and getattr(result, name) != before_space
    }
    return result.with_changes(**tight) if tight else result


def _opens_with_a_parenthesis(part: cst.CSTNode | None) -> bool:
    """``(x)``, and ``(not a) and b`` (VRP-DACT's `if(not opts.no_tb) and rank == 0:`), whose
    first operand holds the parenthesis: the keyword may touch it again."""
    while part is not None:
        if getattr(part, "lpar", None):
            return True
        if isinstance(part, (cst.BooleanOperation, cst.BinaryOperation, cst.Comparison)):
            part = part.left
        elif isinstance(part, (cst.Attribute, cst.Subscript)):
            part = part.value  # (`if(a).b:`)
        else:
            part = part.func if isinstance(part, cst.Call) else None
    return False


def _touches(node: cst.CSTNode, name: str) -> bool:
    space = getattr(node, name, None)
    return isinstance(space, cst.SimpleWhitespace) and space.value == ""


def _quoted_apart(string: cst.FormattedString) -> cst.FormattedString:
    """An f-string the transforms changed, its fields' string literals quoted with the quote
    the f-string does not use: before Python 3.12 (PEP 701) `f"{d.get("k")}"` does not parse,
    whatever inserted code put the literal there."""
    quote = string.start[-1]
    if string.start.endswith(quote * 3):
        return string  # (a triple-quoted f-string takes either quote inside)
    other = "'" if quote == '"' else '"'

    class Requote(cst.CSTTransformer):
        def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
            prefix = updated.prefix
            body = updated.value[len(prefix):]
            if body[:1] != quote or body[:3] == quote * 3 or other in body or "\\" in body:
                return updated
            return updated.with_changes(value=prefix + other + body[1:-1] + other)

    return string.with_changes(parts=[part.visit(Requote()) if isinstance(part, cst.FormattedStringExpression) else part for part in string.parts])


# -- small helpers for editing call arguments -------------------------------------------------


def builds_torch_optimizer(call: cst.Call, qualified) -> bool:
    """``torch.optim.Adam(...)`` (not a scheduler): ``qualified`` is ConversionContext.qualified."""
    return any(
        name.startswith("torch.optim.") and ".lr_scheduler." not in name and name.count(".") == 2
        for name in qualified(call.func)
    )


def keyword_arg(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def positional_args(call: cst.Call) -> list[cst.Arg]:
    return [arg for arg in call.args if arg.keyword is None and not arg.star]


def append_arg(call: cst.Call, new: cst.Arg) -> cst.Call:
    """Add an argument at the end, following the call's existing comma layout."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        # A trailing comma (often one argument per line): repeat the layout before it.
        between = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" ")
        )
        args[-1] = last.with_changes(comma=between)
        new = new.with_changes(comma=last.comma)
    return call.with_changes(args=[*args, new])


def replace_arg(call: cst.Call, old: cst.Arg, new: cst.Arg) -> cst.Call:
    """Swap one argument for another, keeping the old one's comma and spacing."""
    return call.with_changes(
        args=[new.with_changes(comma=old.comma) if arg is old else arg for arg in call.args]
    )


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def is_header(statement: cst.BaseStatement) -> bool:
    """Docstring and imports at the top of a module: new imports go right after them."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    return all(
        isinstance(small, (cst.Import, cst.ImportFrom))
        or (isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)))
        for small in statement.body
    )


def is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def above(new: cst.BaseStatement, statement: cst.BaseStatement) -> tuple[cst.BaseStatement, cst.BaseStatement]:
    """``new`` to go right above ``statement``, taking the comments and blank lines above it."""
    return new.with_changes(leading_lines=statement.leading_lines), statement.with_changes(leading_lines=[])


def option_declaration(nodes, *flags: str, dest: str | None = None) -> cst.Call | None:
    """The ``parser.add_argument(...)`` call among ``nodes`` that declares one of ``flags``, or
    (with ``dest``) stores into that name (retinanet's ``add_argument('--distributed_true',
    dest='distributed', action='store_true')``)."""
    for node in nodes:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
            names = {getattr(arg.value, "evaluated_value", None) for arg in node.args if arg.keyword is None}
            stored = keyword_arg(node, "dest")
            if names & set(flags) or dest is not None and stored is not None and getattr(stored.value, "evaluated_value", None) == dest:
                return node
    return None


def batch_size_arg(call: cst.Call) -> cst.Arg | None:
    """``batch_size=`` of a DataLoader call, by keyword or as its second positional argument."""
    arg = keyword_arg(call, "batch_size")
    positional = positional_args(call)
    return arg if arg is not None else positional[1] if len(positional) > 1 else None
