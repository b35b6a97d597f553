"""DDP160: gradients no DDP averages are averaged right after backward() where the step reads them first.

A module the optimizer trains that DataParallel never wrapped (a captioning decoder beside the
wrapped encoder, bound in several places, so it gets no wrap of its own: DDP119) has its
gradients averaged across ranks by the wrapped model's optimizer hook, just before the step.
Code between backward() and the step that reads or changes gradients (a clip, AMP's
``unscale_``, a test of their norm) would then see each rank's own: the mean of clipped
gradients is not the clipped mean. Such a step averages them right after backward(), the
gradients DataParallel computed from the whole batch, and the step leaves them as they are.

DDP160  the gradients an optimizer that trains a module outside DDP applies are averaged
after backward() where the step reads them first::

    loss.backward()                          loss.backward()
    clip_gradient(decoder_optimizer, 5.)  -> ddp_late_gradients(decoder_optimizer)
    decoder_optimizer.step()                 clip_gradient(decoder_optimizer, 5.)
                                             decoder_optimizer.step()
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.tree import calls_in, dotted, is_backward, walk
from ddpify.transforms.base import Block, Transform, builds_torch_optimizer

# what reads or changes gradients between backward() and the step
GRADIENT_READERS = ("clip", "unscale_", "grad_norm")


class LateGradientsTransform(Transform):
    CODE_PREFIX = "DDP16"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._after: dict[cst.CSTNode, list[str]] = {}  # backward()'s statement -> optimizers averaged after it

    def check(self) -> None:
        if not self.facts.wraps:
            return
        outside = self._optimizers_outside()
        if not outside:
            return
        for step in self.facts.training_steps:
            for block in (node for node in walk(step) if isinstance(node, cst.IndentedBlock)):
                self._check_block(list(block.body), outside)

    def _check_block(self, statements: list[cst.BaseStatement], outside: dict[str, str]) -> None:
        for index, statement in enumerate(statements):
            if not isinstance(statement, cst.SimpleStatementLine) or not any(is_backward(c) for c in calls_in(statement)):
                continue
            read = False
            for later in statements[index + 1:]:
                stepped = [name for name in _stepped(later) if _last(name) in outside]
                if stepped and read and statement not in self._after:
                    self._after[statement] = stepped
                    trained = ", ".join(f"`{outside[_last(name)]}`" for name in stepped)
                    self.context.report(
                        statement,
                        "DDP160",
                        f"`{'`, `'.join(stepped)}` applies gradients of {trained}, which no DDP wraps, and "
                        "the step reads them first: they are averaged across ranks right after backward() "
                        "(ddp_late_gradients), so what reads them sees the whole batch's, as under DataParallel",
                    )
                if stepped or any(is_backward(c) for c in calls_in(later)):
                    break
                read = read or _reads_gradients(later)

    def _optimizers_outside(self) -> dict[str, str]:
        """Optimizers (by the last part of their name) that train a module no DDP wraps -> it."""
        wrapped = {_last(name) for name in self.facts.wrap_targets} | {
            _last(dotted(site.module_arg) or "") for site in self.facts.wraps if site.module_arg is not None
        }
        found = {}
        for node in walk(self.context.module):
            if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and builds_torch_optimizer(node.value, self.context.qualified)):
                continue
            trained = [
                dotted(call.func.value) for call in calls_in(node.value)
                if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("parameters", "named_parameters")
                and dotted(call.func.value)
            ]
            unwrapped = [name for name in trained if _last(name) not in wrapped]
            if unwrapped:
                found.update((_last(dotted(target.target) or ""), unwrapped[0]) for target in node.targets)
        found.pop("", None)
        return found

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        if not any(original in self._after for original, _ in block):
            return block
        self.context.use_helper("ddp_late_gradients")
        edited: Block = []
        for original, updated in block:
            edited.append((original, updated))
            if original in self._after:
                call = f"ddp_late_gradients({', '.join(self._after[original])})"
                edited.append((None, cst.parse_statement(call)))
        return edited


def _last(name: str) -> str:
    return name.rpartition(".")[2]


def _stepped(statement: cst.CSTNode) -> list[str]:
    """The optimizers a statement steps: ``opt.step()``, AMP's ``scaler.step(opt)``."""
    found = []
    for call in calls_in(statement):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "step":
            owner = dotted(call.func.value) or ""
            if "scaler" in _last(owner).lower() and call.args:
                found.append(dotted(call.args[0].value) or "")
            elif not call.args:
                found.append(owner)
    return [name for name in found if name]


def _reads_gradients(statement: cst.CSTNode) -> bool:
    """A clip, AMP's unscale_, a norm of the gradients, or any ``.grad`` read."""
    if any(isinstance(node, cst.Attribute) and node.attr.value == "grad" for node in walk(statement)):
        return True
    return any(any(word in _last(dotted(call.func) or "") for word in GRADIENT_READERS) for call in calls_in(statement))
