"""DDP15x: two backward() passes through one forward of a wrapped model.

DDP averages the gradients of a forward's parameters during the first backward() that runs
through it; a second backward() through the same forward (the first kept its graph with
``retain_graph=True``) adds gradients that DDP never averages: each rank keeps its own, and
the replicas drift apart. DataParallel had one copy of the weights and summed both. A GAN's
generator step that backpropagates its adversarial loss and then a perceptual loss through
one ``fake = G(x)`` (ADASR's WGAN-GP trainer) is the usual shape.

DDP150  the two passes in one block, nothing between them that steps, zeroes or reads a
gradient: they become one backward() of their sum (a gradient argument ``g`` given to the
first becomes ``(loss * g).sum()``, what backward(g) computes), which DDP averages once::

    g_loss.backward(mone, retain_graph=True)        # (removed)
    vgg_loss = 0.1 * mse(vgg(fake), vgg(real))  ->  vgg_loss = 0.1 * mse(vgg(fake), vgg(real))
    vgg_loss.backward()                             ((g_loss * mone).sum() + vgg_loss).backward()

DDP151  (error; a warning with ``--allow-partial``) the same, where the passes cannot be
joined (in different blocks, or a step or a gradient read between them): add the losses and
call backward() once, by hand.

Which passes run through which forward: analysis/backward_pairs.py (DDP115 counts a joinable
pair as one pass).
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.backward_pairs import backward_pairs, wrapped_in_tuples
from ddpify.transforms.base import Transform


class MergedBackwardsTransform(Transform):
    CODE_PREFIX = "DDP15"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._merged: dict[cst.Call, cst.Call] = {}  # second backward -> first backward
        self._first_terms: dict[cst.Call, cst.BaseExpression] = {}  # first backward -> its term, rewritten

    def check(self) -> None:
        if not self.facts.wraps:
            return
        models = self.facts.model_names | wrapped_in_tuples(self.context.module, [site.call for site in self.facts.wraps])
        refused = any(problem.code == "DDP115" for problem in self.facts.problems)  # (names the same blocker)
        for step in self.facts.training_steps:
            for pair in backward_pairs(step, models, self.context.parent):
                first, second, shared = (self.context.code(node) for node in (pair.first, pair.second, pair.shared))
                if pair.joinable:
                    self._merged[pair.second] = pair.first
                    self.context.report(
                        pair.second, "DDP150",
                        f"`{first}` and `{second}` both run backward through `{shared}`: DDP averages one backward "
                        "per forward, so they become one backward() of their sum (the gradients DataParallel summed)",
                    )
                elif not refused:
                    self.context.report_unsound(
                        pair.second, "DDP151",
                        f"`{second}` runs backward a second time through `{shared}` (after `{first}`): DDP averages "
                        "only the first backward of a forward, the second's gradients would stay each rank's own; "
                        "add the losses and call backward() once",
                    )

    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr):
        line = self.context.parent(original_node)
        if original_node.value in self._merged.values() and len(line.body) > 1:
            return cst.RemovalSentinel.REMOVE
        return updated_node

    def edit_block(self, owner: cst.CSTNode, block):
        """A line that held the first pass alone goes."""
        firsts = set(self._merged.values())
        return [
            (original, updated) for original, updated in block
            if not (isinstance(original, cst.SimpleStatementLine) and len(original.body) == 1
                    and isinstance(original.body[0], cst.Expr) and original.body[0].value in firsts)
        ]

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine):
        """The line that held the removed pass beside other statements ends with the one before it."""
        if not any(isinstance(small, cst.Expr) and small.value in self._merged.values() for small in original_node.body):
            return updated_node
        if not updated_node.body:
            return updated_node
        last = updated_node.body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=[*updated_node.body[:-1], last])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._merged.values():
            self._first_terms[original_node] = _term(updated_node)
        first = self._merged.get(original_node)
        if first is None or first not in self._first_terms or not isinstance(updated_node.func, cst.Attribute):
            return updated_node
        second = _term(updated_node)
        total = cst.BinaryOperation(self._first_terms[first], cst.Add(), second, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        # (the second's own retain_graph stays: a later pass may still need the graph)
        kept = [arg for arg in updated_node.args if arg.keyword is not None and arg.keyword.value != "gradient"]
        return updated_node.with_changes(func=updated_node.func.with_changes(value=total), args=kept)


def _gradient(call: cst.Call) -> cst.BaseExpression | None:
    """The gradient a backward() call is given (first positional, or ``gradient=``)."""
    given = [arg for arg in call.args if arg.keyword is None or arg.keyword.value == "gradient"]
    return given[0].value if given else None


def _term(backward: cst.Call) -> cst.BaseExpression:
    """What a backward() call adds to the sum: its loss, or ``(loss * gradient).sum()``."""
    loss = backward.func.value
    gradient = _gradient(backward)
    if gradient is None:
        return loss.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]) if isinstance(loss, cst.BinaryOperation) and not loss.lpar else loss
    product = cst.BinaryOperation(loss, cst.Multiply(), gradient, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(product, cst.Name("sum")))
