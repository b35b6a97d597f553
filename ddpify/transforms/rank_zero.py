"""DDP6xx: side effects run once, on global rank 0.

Statements that only print or save are wrapped in ``if dist.get_rank() == 0:``; runs of
them share one guard. A guard never wraps a statement that calls the model, a
``torch.distributed`` collective, ``backward()``, or a function that does any of these:
only rank 0 would reach the collective and the others would hang. Such a statement is
left alone and reported.

DDP601  guarded::

    print(f"loss: {loss:>7f}")
    torch.save(model.state_dict(), "model.pt")
    # becomes
    if dist.get_rank() == 0:
        print(f"loss: {loss:>7f}")
        torch.save(model.state_dict(), "model.pt")

DDP602  (warning) not guarded: the statement also calls the model, a collective, or a
function that does; split it so that only the side effect is guarded.

DDP603  (warning) not guarded: the statement shares a line with others (``if x: print(y)``
or ``a = 1; print(a)``); put it on its own line.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import calls_in, under_rank_guard
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Block, Pair, Transform, move_leading_lines

SIDE_EFFECTS = {"builtins.print", "torch.save"}
GUARD = "dist.get_rank() == 0"


class RankZeroTransform(Transform):
    CODE_PREFIX = "DDP6"

    def _side_effect(self, statement: cst.CSTNode) -> cst.Call | None:
        if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
            if self.context.qualified(statement.value.func) & SIDE_EFFECTS:
                return statement.value
        return None

    def _guardable(self, original: cst.BaseStatement | None) -> bool:
        if not isinstance(original, cst.SimpleStatementLine) or self._under_rank_guard(original):
            return False
        calls = [self._side_effect(small) for small in original.body]
        if not any(calls):
            return False
        if len(original.body) > 1:
            self._report_inline(original, calls)
            return False
        unsafe = [call for call in calls_in(original) if self._reaches_model(call)]
        if unsafe:
            self.context.report(
                original,
                "DDP602",
                f"not limited to rank 0: it also calls `{self.context.code(unsafe[0].func)}`, which may run "
                "the model or a collective that every rank must reach",
                Severity.WARNING,
            )
            return False
        return True

    def _report_inline(self, node: cst.CSTNode, calls: list) -> None:
        name = self.context.code(next(call for call in calls if call).func)
        self.context.report(
            node, "DDP603", f"{name}() shares its line with other statements: put it on its own line", Severity.WARNING
        )

    def _reaches_model(self, call: cst.Call) -> bool:
        function = self.facts.contexts.get(call)
        params = set()
        if function is not None and function.function is not None:
            params = {p.name.value for p in function.function.params.params}
        return self.facts.analyzer.call_is_unsafe(call, params)

    def _under_rank_guard(self, node: cst.CSTNode) -> bool:
        return under_rank_guard(node, self.context.parent, self.context.code)

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        calls = [self._side_effect(small) for small in original_node.body]
        if any(calls):
            self._report_inline(original_node, calls)
        return updated_node

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        result: Block = []
        run: list[Pair] = []
        for pair in [*block, (None, None)]:
            if pair[1] is not None and self._guardable(pair[0]):
                run.append(pair)
                continue
            if run:
                result.append(self._guard(run))
                run = []
            if pair[1] is not None:
                result.append(pair)
        return result

    def _guard(self, run: list[Pair]) -> Pair:
        for original, _ in run:
            call = next(self._side_effect(small) for small in original.body if self._side_effect(small))
            self.context.report(original, "DDP601", f"{self.context.code(call.func)}() runs on rank 0 only")
        self.context.add_import("torch.distributed", None, "dist")
        first, rest = run[0][1], [statement for _, statement in run[1:]]
        guard = cst.If(test=cst.parse_expression(GUARD), body=cst.IndentedBlock(body=[first, *rest]))
        first, guard = move_leading_lines(first, guard)
        return (None, guard.with_changes(body=guard.body.with_changes(body=[first, *rest])))
