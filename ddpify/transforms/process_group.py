"""DDP2xx: set up the process group before any work; it is destroyed at exit.

The set-up helpers (``ddpify/templates/ddp_setup.py``, tested on its own) are inlined after
the script's imports. ``ddp_setup()`` is called where the script starts doing work and
registers the process group's destruction with ``atexit`` (which also runs after an uncaught exception), so
no line of the user's code is re-indented:

- ``if __name__ == "__main__": main()`` or code inside the ``__main__`` block::

      if __name__ == "__main__":
          ddp_setup()
          main()

- a flat script: right before its first top-level statement that does work (a call).

In project mode (``ddpify convert DIR``) an imported module that wraps, trains, prints or
saves gets no set-up: its functions run after the entry script's ``ddp_setup()``. It gets
only the helpers its converted code calls (and those they call), with a one-line header.

DDP201  set-up added.
DDP202  (error) no entry point: the module only defines things, or its module-level code
        never trains (an imported helper module); convert the script that runs it.
DDP203  (error) a name the set-up needs is already bound to something else in the script.

DDP204  entry script of a project: set-up added here, for the training that runs in the
        modules it imports.
DDP206  (error) a project module whose module-level code wraps or trains runs at import
        time, before the entry script's set-up.
DDP207  a function's own variable ``dist`` (ReInfoSelect's ``dist = Categorical(probs)``) where
        the converted code needs torch.distributed: the converted code there names it in full,
        the function's own ``dist`` is left as it is::

            if dist.get_rank() == 0:   ->   if torch.distributed.get_rank() == 0:
"""

from __future__ import annotations

import functools
import re
from importlib import resources

import libcst as cst
from libcst.metadata import FunctionScope, Scope, ScopeProvider

from ddpify.analysis import is_training_call, walk
from ddpify.diagnostics import ENTRY, Severity
from ddpify.names import DATA_PARALLEL
from ddpify.transforms.base import HELPERS_PLACEHOLDER, Block, Pair, Transform, is_header, is_import

TEMPLATE_IMPORTS = (  # (atexit, logging and re are imported inside the helpers: a script may bind those names)
    ("os", None, None),
    ("torch", None, None),
    ("torch.distributed", None, "dist"),
)
# ddp_wrap's import is scheduled by the wrap transform (DDP_IMPORT), with the helper.
TEMPLATE_NAMES = (
    "ddp_setup",
    "ddp_exit",
    "ddp_share_random_state",
    "ddp_own_data_draws",
    "ddp_orders_alike",
    "ddp_atomic_saves",
    "ddp_from_rank_zero",
    "ddp_self_check",
    "ddp_after_step",
    "ddp_sampler",
    "ddp_next_epoch",
    "DdpNextEpochSampler",
    "ddp_shard",
    "ddp_own_collate",
    "ddp_iterates_a_shard",
    "ddp_rebuilt",
    "DdpEpochs",
    "DdpSplit",
    "ddp_alike",
    "ddp_batch_share",
    "ddp_cut",
    "ddp_drawn",
    "ddp_sample_lists",
    "ddp_scatter",
    "ddp_resampled",
    "ddp_rebuildable",
    "DdpShard",
    "ddp_part",
    "ddp_same_draw",
    "ddp_every_nth",
    "ddp_draw_by_draw",
    "DdpSameRandom",
    "ddp_seeds_from_the_stream",
    "ddp_first_slurm_host",
    "ddp_device",
    "ddp_map_location",
    "ddp_wrap",
    "ddp_plain_buffers",
    "DdpModel",
    "ddp_late_gradients",
    "ddp_average_gradients",
    "ddp_alone",
    "ddp_held",
    "ddp_broadcast_weights",
    "ddp_through",
    "ddp_wrap_every_parameter",
    "ddp_local_batch_size",
    "ddp_whole_batch",
    "DdpWholeBatchLoss",
    "ddp_gathered",
    "ddp_scattered",
    "ddp_leaves",
    "DdpGathered",
    "ddp_selected_mean",
    "ddp_class_weights",
    "ddp_mean",
    "ddp_sum",
    "ddp_a_meter",
    "ddp_meter",
    "ddp_entries",
    "ddp_any",
    "ddp_all",
    "ddp_agreed",
    "ddp_failures_agreed",
    "ddp_failed_here",
    "DdpStepFailures",
    "ddp_no_sync",
    "ddp_rank",
    "ddp_world_size",
    "ddp_quiet",
    "ddp_privately",
    "ddp_private_reads",
    "ddp_quiet_folders",
    "ddp_shared_values",
    "ddp_here",
    "DdpNoOp",
)
# ddp_setup's optional steps: a line marked `# ddpify:<name>` is kept only when <name> is
# asked for (ConversionContext.use_helper); a helper is copied only when the converted code
# (or a helper it keeps) calls it.
SETUP_STEPS = ("ddp_relaunch", "ddp_atomic_saves", "ddp_share_random_state", "ddp_self_check")
# In an imported module, the process may have set up no group (a project script that was
# not converted imports it too): rank and world size come from helpers that allow for that.
LIBRARY_CALLS = {"dist.get_rank()": "ddp_rank()", "dist.get_world_size()": "ddp_world_size()"}
STEP_MARK = re.compile(r"  # ddpify:(\w+)$")
HELPER_NAME = re.compile(r"\b(?:ddp_[a-z_]+|Ddp[A-Z][A-Za-z]*)\b")
# Names the emitted code uses, and the only thing each may already be bound to.
RESERVED = {
    **{name: None for name in TEMPLATE_NAMES},
    "sampler_epoch": None,
    "dist": "torch.distributed",
    # (the same class by another path: EEGround's `from torch.utils.data import DistributedSampler`)
    "DistributedDataParallel": ("torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"),
    "DistributedSampler": ("torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"),
    "os": "os",
    "torch": "torch",
}
BEGIN, END = "# ddpify:begin", "# ddpify:end"


@functools.lru_cache(maxsize=1)
def template_source() -> str:
    text = resources.files("ddpify.templates").joinpath("ddp_setup.py").read_text(encoding="utf-8")
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip("\n") + "\n"


def template_chunks() -> list[tuple[str | None, str]]:
    """The block's top-level pieces, (name or None for the header comment, text); they are
    separated by two blank lines in the template."""
    chunks = []
    for text in template_source().rstrip("\n").split("\n\n\n"):
        first = text.split("\n", 1)[0]
        name = first.split()[1].split("(")[0].rstrip(":") if first.startswith(("def ", "class ")) else None
        chunks.append((name, text))
    return chunks


def _without_unasked_steps(text: str, asked: frozenset[str]) -> str:
    """Drop the lines marked with a step that was not asked for; remove the marks."""
    kept = []
    for line in text.split("\n"):
        mark = STEP_MARK.search(line)
        if mark is None or mark.group(1) in asked:
            kept.append(line[: mark.start()] if mark else line)
    return "\n".join(kept)


def _helpers_called(code: str, chunks: dict[str, str]) -> set[str]:
    """The helpers ``code`` calls, and those they call in turn."""
    wanted, pending = set(), set(HELPER_NAME.findall(code)) & chunks.keys()
    while pending:
        name = pending.pop()
        wanted.add(name)
        pending |= (set(HELPER_NAME.findall(chunks[name])) & chunks.keys()) - wanted
    return wanted


def template_text(code: str, asked: frozenset[str] = frozenset(), newline: str = "\n") -> str:
    """The helper block for a script whose converted code is ``code``: its header comment,
    then the helpers that code calls (ddp_setup among them) and those they call, with
    ddp_setup's optional steps only if ``asked``. Lines end with ``newline``.

    Text, not parsed statements: the converter puts a placeholder statement where the
    block goes and swaps in this text after printing the tree (parsing the block cost a
    tenth of a one-file conversion)."""
    chunks = {name: _without_unasked_steps(text, asked) for name, text in template_chunks() if name is not None}
    wanted = _helpers_called(code, chunks)
    header = next(text for name, text in template_chunks() if name is None)
    if "ddp_relaunch" not in asked:
        header = header.replace(RELAUNCH_HEADER, NO_RELAUNCH_HEADER)
    text = "\n\n\n".join([header, *(chunks[name] for name in TEMPLATE_NAMES if name in wanted)])
    return text.replace("\n", newline) + newline


# The header's words on plain `python`, with and without the self-relaunch.
RELAUNCH_HEADER = "plain `python` uses every GPU."
NO_RELAUNCH_HEADER = "plain `python` runs as one process."


def helpers_placeholder(text: str, context) -> cst.BaseStatement:
    """A statement that stands for the helper block until the tree is printed (see
    ConversionContext.finish), two blank lines above it."""
    context.helper_block = text
    return cst.SimpleStatementLine(
        [cst.Expr(cst.Name(HELPERS_PLACEHOLDER))], leading_lines=[cst.EmptyLine(), cst.EmptyLine()]
    )


LIBRARY_HEADER = "# Distributed helpers added by ddpify; the entry script sets up the process group."
OWN_PATH_HEADER = "# Distributed helpers added by ddpify; the script's own DDP path sets up the process group."


def library_helper_text(code: str, newline: str = "\n", header: str = LIBRARY_HEADER) -> str:
    """The template helpers ``code`` calls, and those they call: definitions only, under a
    one-line header; empty if it calls none."""
    defined = {
        name: text if name in ("ddp_rank", "ddp_world_size") else _library_calls(text)
        for name, text in template_chunks()
        if name is not None and name != "ddp_setup"
    }
    wanted = _helpers_called(code, defined)
    chosen = [defined[name] for name in TEMPLATE_NAMES if name in wanted]
    if not chosen:
        return ""
    return newline.join("\n\n\n".join([header, *chosen]).split("\n")) + newline


def _library_calls(text: str) -> str:
    for call, tolerant in LIBRARY_CALLS.items():
        text = text.replace(call, tolerant)
    return text.replace(STRICT_SAMPLER, TOLERANT_SAMPLER)


# In a library, ddp_sampler also serves a project script that was left as it was (a world
# of one, a plain sampler): set_epoch does nothing there.
STRICT_SAMPLER = """    if not isinstance(loader.sampler, torch.utils.data.distributed.DistributedSampler):
        raise RuntimeError("""
TOLERANT_SAMPLER = """    if not isinstance(loader.sampler, torch.utils.data.distributed.DistributedSampler):
        if ddp_world_size() == 1:
            import types

            return types.SimpleNamespace(epoch=0, set_epoch=lambda epoch: None)
        raise RuntimeError("""


class ProcessGroupTransform(Transform):
    CODE_PREFIX = "DDP2"

    def __init__(self, context) -> None:
        super().__init__(context)
        # function -> {name: binding}: its own variables named like something the set-up needs
        self._local_bindings: dict[cst.FunctionDef, dict[str, cst.CSTNode]] = {}

    def check(self) -> None:
        if self.context.rank_read_at_run_time:
            if self.context.is_library and self._wraps_or_trains_at_import():
                self.context.report(
                    self.context.module,
                    "DDP206",
                    "imported module whose module-level code wraps or trains: it runs at import time, before "
                    "the entry script sets up the process group",
                    Severity.ERROR,
                )
            self._report_conflicts()
            return
        anchor = self.facts.setup_anchor
        # (project mode has already found an entry script's top-level loop: EDSR's main.py runs
        # `while not t.terminate(): t.train()` with a Trainer from another module)
        if anchor is not None and self.facts.main_guard is None and not self.facts.module_level_runs and self.context.role != ENTRY:
            # Module-level code that never trains (a logger, a constant table): this module is
            # imported by the script that trains; set-up at import time would be wrong.
            self.context.report(
                self.facts.wraps[0].call if self.facts.wraps else self.context.module,
                "DDP202",
                "imported module (no `__main__` block, and its module-level code never trains): "
                "convert the script that runs it, which sets up the process group",
                Severity.ERROR,
            )
        elif anchor is None:
            self.context.report(
                self.facts.wraps[0].call if self.facts.wraps else self.context.module,
                "DDP202",
                "no entry point (module-level code or an `if __name__ == \"__main__\":` block), and no script that "
                "imports this module was converted with it: import it from the script you launch and convert the "
                "folder that holds both (`ddpify convert DIR`)",
                Severity.ERROR,
            )
        self._report_conflicts()

    def _wraps_or_trains_at_import(self) -> bool:
        """Does the module-level code of this imported module wrap or train, itself or through
        a function or class of the module it calls? (FLAVR's config.py calls its own
        `add_argument_group(...)` at import time: that is configuration, not training.)"""
        for call in self.facts.import_time_calls:
            if self.context.qualified(call.func) & DATA_PARALLEL or is_training_call(call):
                return True
            definition = self._definition(call.func)
            if definition is None:
                return True  # not a function or class of this file: keep the refusal
            inside = walk(definition)
            wraps = {id(site.call) for site in self.facts.wraps}
            if any(id(inner) in wraps or isinstance(inner, cst.Call) and is_training_call(inner) for inner in inside):
                return True
        return False

    def _definition(self, func: cst.BaseExpression) -> cst.CSTNode | None:
        if not isinstance(func, cst.Name):
            return None
        scope = self.context.metadata.get_metadata(ScopeProvider, func, None)
        found = [a.node for a in scope[func.value] if isinstance(getattr(a, "node", None), (cst.FunctionDef, cst.ClassDef))] if scope else []
        return found[0] if len(found) == 1 else None

    def _report_conflicts(self) -> None:
        # A function's own variable of that name (open-reid's `dist = torch.cdist(...)`)
        # matters only if the converted code uses the name inside that function: decided
        # when the function has been rewritten (leave_FunctionDef).
        for scope, name, node in self._conflicts():
            if isinstance(scope, FunctionScope) and isinstance(scope.node, cst.FunctionDef):
                self._local_bindings.setdefault(scope.node, {}).setdefault(name, node)
            else:
                self._report_conflict(name, node)

    def _report_conflict(self, name: str, node: cst.CSTNode) -> None:
        self.context.report(
            node, "DDP203", f"`{name}` is already bound in this script; the DDP set-up needs that name", Severity.ERROR
        )

    def _conflicts(self) -> list[tuple[Scope, str, cst.CSTNode]]:
        scopes = {scope for scope in self.context.metadata.resolve(ScopeProvider).values() if scope is not None}
        found = []
        for scope in scopes:
            for assignment in scope.assignments:
                allowed = RESERVED.get(assignment.name, "absent")
                if allowed == "absent":
                    continue
                names = {q.name for q in scope.get_qualified_names_for(assignment.name)}
                if allowed is None or not names & ({allowed} if isinstance(allowed, str) else set(allowed)):
                    found.append((scope, assignment.name, getattr(assignment, "node", self.context.module)))
        return found

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        local = self._local_bindings.get(original_node, {})
        for name, node in local.items():
            # (the function's own `dist` names are marked: leave_Name; those left are the converted code's)
            added = _uses_of(updated_node, name) if name == "dist" else _uses_of(updated_node, name) - _uses_of(original_node, name)
            if added <= 0:
                continue
            if name == "dist" and not _binds(original_node, "torch"):
                # ReInfoSelect's `dist = Categorical(probs)`: the converted code there names
                # torch.distributed in full instead
                updated_node = _dist_in_full(updated_node)
                self.context.report(
                    node,
                    "DDP207",
                    f"`dist` is a variable of `{original_node.name.value}()`: the converted code there calls "
                    "torch.distributed by its full name",
                )
                continue
            self.context.report(
                node,
                "DDP203",
                f"`{name}` is a variable of `{original_node.name.value}()`, where the converted code needs the "
                f"name `{name}` itself (a rank guard, a collective); rename the variable",
                Severity.ERROR,
            )
        return _unmarked(updated_node) if "dist" in local else updated_node

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        """The function's own ``dist`` (a variable there), told apart from the converted code's
        until the function is left."""
        if original_node.value != "dist" or not self._local_bindings:
            return updated_node
        scope = self.context.metadata.get_metadata(ScopeProvider, original_node, None)
        if isinstance(scope, FunctionScope) and "dist" in self._local_bindings.get(scope.node, {}):
            return updated_node.with_changes(value=OWN_DIST)
        return updated_node

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        if self.context.rank_read_at_run_time:
            return self._library_helpers(block) if isinstance(owner, cst.Module) else block
        anchor = self.facts.setup_anchor
        if self.facts.setup_function is not None:
            if owner is self.facts.setup_function:  # `main()`, which the `__main__` block runs
                return self._wrap(block, _after_docstring(block))
        elif owner is anchor and anchor is self.facts.main_guard:  # everything in it runs inside try
            return self._wrap(block, 0)
        if not isinstance(owner, cst.Module):
            return block
        if anchor is not self.facts.main_guard:
            block = self._wrap(block, self._position_of(anchor, block))
        for module, name, alias in TEMPLATE_IMPORTS:
            self.context.add_import(module, name, alias)
        return self._insert_helpers(block)

    def _library_helpers(self, block: Block) -> Block:
        code = cst.Module(body=[statement for _, statement in block]).code
        header = OWN_PATH_HEADER if self.context.own_ddp_path else LIBRARY_HEADER
        helper_text = library_helper_text(code, self.context.module.default_newline, header)
        helpers = [helpers_placeholder(helper_text, self.context)] if helper_text else []
        text = code + helper_text
        if "dist." not in text and not helpers:
            return block
        # (what the code uses, not what an import names: `import torch.distributed as dist` binds no `torch`)
        used = cst.Module(body=[statement for _, statement in block if not is_import(statement)]).code + helper_text
        for module, name, alias in TEMPLATE_IMPORTS:
            bound = alias or name or module
            if re.search(rf"\b{re.escape(bound)}\.", used):
                self.context.add_import(module, name, alias)
        at = _after_imports(block)
        rest = block[at:]
        if rest and helpers:
            original, statement = rest[0]
            missing = max(0, 2 - sum(1 for line in statement.leading_lines if line.comment is None))
            rest = [(original, statement.with_changes(leading_lines=[*[cst.EmptyLine()] * missing, *statement.leading_lines])), *rest[1:]]
        return [*block[:at], *[(None, h) for h in helpers], *rest]

    def _position_of(self, anchor: cst.CSTNode, block: Block) -> int:
        """Index of the anchor in the block, or of what follows it if a transform removed it."""
        order = {statement: index for index, statement in enumerate(self.context.module.body)}
        return next(
            index
            for index, (original, _) in enumerate(block)
            if original is not None and order.get(original, -1) >= order[anchor]
        )

    def _wrap(self, block: Block, start: int) -> Block:
        """Call set-up right before block[start]; the comments above it stay with it."""
        first = block[start][1]
        blank = 0
        while blank < len(first.leading_lines) and first.leading_lines[blank].comment is None:
            blank += 1
        setup = cst.parse_statement("ddp_setup()").with_changes(leading_lines=first.leading_lines[:blank])
        self.context.report(
            block[start][0] or first,
            "DDP204" if self.context.role == ENTRY else "DDP201",
            "process group set up here (torchrun, Slurm, or a world of one); destroyed at exit"
            + (", for the training in the modules this script imports" if self.context.role == ENTRY else ""),
        )
        moved = (block[start][0], first.with_changes(leading_lines=first.leading_lines[blank:]))
        return [*block[:start], (None, setup), moved, *block[start + 1 :]]

    def _insert_helpers(self, block: Block) -> Block:
        at = _after_imports(block)
        if self.context.options.relaunch:
            self.context.use_helper("ddp_relaunch")
        if self.context.options.self_check:
            self.context.use_helper("ddp_self_check")
        # Unseeded draws before training (a random split, a file list a Dataset shuffles when
        # it is built, a seed drawn when none is given) would differ per rank: every rank
        # starts from rank 0's random state. A script that seeds may still draw unseeded
        # (numpy in an imported Dataset, RandLA-Net; `args.seed = randint(...)`, pointMLP).
        self.context.use_helper("ddp_share_random_state")
        code = cst.Module(body=[statement for _, statement in block]).code
        asked = frozenset(self.context.helpers_used)
        text = template_text(code, asked, self.context.module.default_newline)
        helpers: list[Pair] = [(None, helpers_placeholder(text, self.context))]
        rest = block[at:]
        if rest:
            original, statement = rest[0]
            missing = max(0, 2 - sum(1 for line in statement.leading_lines if line.comment is None))
            rest = [(original, statement.with_changes(leading_lines=[*[cst.EmptyLine()] * missing, *statement.leading_lines])), *rest[1:]]
        return [*block[:at], *helpers, *rest]


def _binds(function: cst.FunctionDef, name: str) -> bool:
    """Does the function bind ``name`` itself (a parameter, an assignment, a loop, an import)?"""
    targets: list[cst.CSTNode] = [param.name for param in walk(function.params) if isinstance(param, cst.Param)]
    for node in walk(function.body):
        if isinstance(node, cst.Assign):
            targets += [target.target for target in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
            targets.append(node.target)
        elif isinstance(node, (cst.AsName)):
            targets.append(node.name)
    return any(isinstance(n, cst.Name) and n.value == name for target in targets for n in walk(target))


OWN_DIST = "__ddpify_own_dist__"  # a function's own `dist`, while that function is rewritten


def _dist_in_full(function: cst.FunctionDef) -> cst.FunctionDef:
    """The ``dist`` names the converted code put into the function, as ``torch.distributed``
    (the function's own are marked OWN_DIST)."""

    class InFull(cst.CSTTransformer):
        def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
            value = updated_node.value
            if isinstance(value, cst.Name) and value.value == "dist":
                return updated_node.with_changes(value=cst.parse_expression("torch.distributed"))
            return updated_node

    return function.visit(InFull())


def _unmarked(function: cst.FunctionDef) -> cst.FunctionDef:
    class Unmarked(cst.CSTTransformer):
        def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
            return updated_node.with_changes(value="dist") if updated_node.value == OWN_DIST else updated_node

    return function.visit(Unmarked())


def _uses_of(node: cst.CSTNode, name: str) -> int:
    """How often ``name`` appears as a name in ``node``'s code."""
    return sum(1 for found in walk(node) if isinstance(found, cst.Name) and found.value == name)


def _after_docstring(block: Block) -> int:
    """Index of the first statement of a function body that is not its docstring."""
    first = block[0][1] if block else None
    if isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr):
        if isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            return 1 if len(block) > 1 else 0
    return 0


def _after_imports(block: Block) -> int:
    """Where the helper block goes: after the module's header and after its last top-level
    import (a script that puts a folder on sys.path imports torch after it: the helpers'
    class bases need torch bound)."""
    at = 0
    while at < len(block) and is_header(block[at][1]):
        at += 1
    # (never after a statement that already calls a helper: high-res-stereo wraps its model at
    # the top level, above a second block of imports)
    module = cst.Module([])
    first_use = next(
        (index for index, (_, statement) in enumerate(block) if not is_import(statement)
         and HELPER_USE.search(module.code_for_node(statement))),
        len(block),
    )
    imports = [index for index, (_, statement) in enumerate(block) if is_import(statement) and index < first_use]
    return max(at, imports[-1] + 1) if imports else at


HELPER_USE = re.compile(r"\bddp_\w+\(|\bDdp\w+\(|\bdist\.")
