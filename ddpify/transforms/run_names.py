"""DDP62x: a run's name made of the clock or a random id, and a terminal's answer, are rank 0's on every rank.

DDP621  ``run_id = datetime.now().strftime("%m%d-%H%M%S")`` gives each process its own value: the
ranks start milliseconds apart and a second may turn between them (``uuid.uuid4()`` and the
process id always differ). Rank 0 saves into its run folder; a rank that reads the files
back (a resume, the best model, the next stage) looks into its own, and every rank that
makes folders makes its own. Rank 0 makes the name and sends it to every rank::

    run_id = datetime.now().strftime("%m%d-%H%M%S")
    # becomes
    run_id = ddp_from_rank_zero(datetime.now().strftime("%m%d-%H%M%S") if dist.get_rank() == 0 else None)

DDP624  ``input(...)`` reached by every rank (WoodScape's "Clean up the log directory?") asks on
rank 0 alone and sends its answer to every rank: the other processes share the terminal, and each
would wait for an answer of its own (a hang; with stdin piped, an EOFError)::

    answer = input("Clean up? (y/n) ")
    # becomes
    answer = ddp_from_rank_zero(input("Clean up? (y/n) ") if dist.get_rank() == 0 else None)

A time kept in a name first (vcdb_retrieval's ``current = datetime.now(kst)``, then
``current.strftime('%H%M%S')``) is the clock too: the names formatted from it are sent.

An argparse default of the same kind (``default=time.strftime(...)``) is sent the same way.
A name counts when it is made by formatting only (f-strings, ``strftime``, ``str()``,
``os.path.join``, a function of the file that only returns one); a value computed only for a
rank-0 write is left alone (only rank 0 reads it), and so is one that may run before the
set-up, or where not every rank goes (the sending is a collective).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import same_path_on_every_rank, under_rank_guard, walk
from ddpify.analysis.entry import callers_run_after_setup, runs_after_setup
from ddpify.analysis.ranks import RunNames
from ddpify.analysis.tree import statement_of
from ddpify.transforms.base import Transform

# Parser calls whose keyword values become the parsed arguments (`args.exp_name`).
DEFAULT_SETTERS = {"add_argument": {"default"}, "set_defaults": None}


class RunNamesTransform(Transform):
    CODE_PREFIX = "DDP6"

    def check(self) -> None:
        names = RunNames(self.context.module, self.context.qualified)
        self._shared: set[cst.CSTNode] = set()  # values rank 0 makes and sends
        self._asked: set[cst.CSTNode] = set()  # input() calls: rank 0 asks, every rank gets the answer
        self._callers_run_after = callers_run_after_setup(self.facts, self.context.parent, self._reached_by_every_rank)
        for node in walk(self.context.module):
            value = _candidate(node, self.context.parent)
            if value is not None and names.is_name(value) and self._every_rank_runs(statement_of(node, self.context.parent)):
                self._shared.add(value)
            elif isinstance(node, cst.Call) and "builtins.input" in self.context.qualified(node.func):
                if self._asked_on_every_rank(statement_of(node, self.context.parent)):
                    self._asked.add(node)
        # (an answer bound as a run's name is sent already: `response = input("Overwrite?")`, DDP621)
        shared = {id(inner) for value in self._shared for inner in walk(value)}
        self._asked = {call for call in self._asked if id(call) not in shared}

    # -- where the sending can go ------------------------------------------------------------

    def _every_rank_runs(self, statement: cst.CSTNode | None) -> bool:
        """After the set-up, on every rank alike (a collective), and not for rank 0 alone."""
        if statement is None or not self._reached_by_every_rank(statement):
            return False
        return runs_after_setup(statement, self.facts, self.context.parent, self._callers_run_after)

    def _asked_on_every_rank(self, statement: cst.CSTNode | None) -> bool:
        """Every rank reaches this question: its tests are alike, or decided by rank 0 for every
        rank (WoodScape's `if os.path.isdir(log_path):` around its "Clean up?", DDP622)."""
        if statement is None or self._rank_zero_only(statement) or (self.context.is_library and self.context.at_module_level(statement)):
            return False
        if not same_path_on_every_rank(statement, self.context.parent, self.context.decided_by_rank_zero):
            return False
        return runs_after_setup(statement, self.facts, self.context.parent, self._callers_run_after)

    def _reached_by_every_rank(self, statement: cst.CSTNode) -> bool:
        if self.context.is_library and self.context.at_module_level(statement):
            return False
        return same_path_on_every_rank(statement, self.context.parent) and not self._rank_zero_only(statement)

    def _rank_zero_only(self, statement: cst.CSTNode) -> bool:
        if under_rank_guard(statement, self.context.parent, self.context.code):
            return True
        guarded = self.context.rank_zero_only
        return guarded is not None and guarded(statement)

    # -- the rewrite ---------------------------------------------------------------------------

    def _sent(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
        if _sent_already(updated):
            return updated
        self.context.add_import("torch.distributed", None, "dist")
        self.context.use_helper("ddp_from_rank_zero")
        self.context.report(
            original,
            "DDP621",
            "a name made of the clock or a random id differs from process to process: rank 0 makes it and "
            "every rank gets rank 0's (one run folder, files found where rank 0 wrote them)",
        )
        if isinstance(updated, (cst.IfExp, cst.Lambda)):  # (binds looser than the `if` around it)
            updated = updated.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        sent = cst.parse_expression(f"ddp_from_rank_zero(_ if {self.context.rank} == 0 else None)")
        return sent.with_changes(args=[cst.Arg(sent.args[0].value.with_changes(body=updated))])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self._asked or _sent_already(updated_node):
            return updated_node
        self.context.add_import("torch.distributed", None, "dist")
        self.context.use_helper("ddp_from_rank_zero")
        self.context.report(
            original_node,
            "DDP624",
            "input() is asked on rank 0 alone and its answer sent to every rank (the other processes would each wait "
            "for an answer of their own)",
        )
        sent = cst.parse_expression(f"ddp_from_rank_zero(_ if {self.context.rank} == 0 else None)")
        return sent.with_changes(args=[cst.Arg(sent.args[0].value.with_changes(body=updated_node))])

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if original_node.value in self._shared:
            return updated_node.with_changes(value=self._sent(original_node.value, updated_node.value))
        return updated_node

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        if original_node.value is not None and original_node.value in self._shared:
            return updated_node.with_changes(value=self._sent(original_node.value, updated_node.value))
        return updated_node

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node.value in self._shared:
            return updated_node.with_changes(value=self._sent(original_node.value, updated_node.value))
        return updated_node


def _candidate(node: cst.CSTNode, parent_of) -> cst.BaseExpression | None:
    """The value of an assignment, or a parser default (`add_argument(..., default=...)`)."""
    if isinstance(node, (cst.Assign, cst.AnnAssign)):
        return node.value
    if not (isinstance(node, cst.Arg) and node.keyword is not None):
        return None
    call = parent_of(node)
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in DEFAULT_SETTERS):
        return None
    keywords = DEFAULT_SETTERS[call.func.attr.value]
    return node.value if keywords is None or node.keyword.value in keywords else None


def _sent_already(node: cst.BaseExpression) -> bool:
    """Rank 0's value sent already (the rank-0 transform's input(), DDP618): sent once, never
    a second broadcast inside the first one's rank-0 arm (a hang: BERT4Rec-VAE, batch 46)."""
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "ddp_from_rank_zero"
