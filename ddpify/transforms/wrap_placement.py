"""DDP105/DDP106: DDP wraps the final model: changes made after the wrap move the wrap after them.

DistributedDataParallel broadcasts rank 0's weights and registers its gradient hooks when
it is built. DataParallel re-read the module on every forward, so scripts change the model
after wrapping it (``net.apply(weights_init)``, ``.half()``, replacing a layer, freezing
parameters). Under DDP those changes are made per rank after the broadcast, and a cast or
a replaced layer escapes the hooks: the ranks silently train different models. A model is
final when its optimizer is built, so the wrap moves to just before that statement.

DDP105  the wrap moved below the changes, just before the optimizer is built::

    netG = nn.DataParallel(netG)
    netG.apply(weights_init)
    optimizerG = optim.Adam(netG.parameters(), lr=2e-4)
    # becomes
    netG.apply(weights_init)
    netG = DistributedDataParallel(netG.to(ddp_device()), device_ids=ddp_device_ids())
    optimizerG = optim.Adam(netG.parameters(), lr=2e-4)

DDP106  (error; a warning with ``--allow-partial``) the model's dtype or layers change after
the wrap and the wrap cannot move: no optimizer is built from it below in the same block, or
a statement in between uses ``.module`` or loads a state dict whose keys depend on the wrap.

DDP128  the model's weights change in place after the wrap (a checkpoint loaded, an init
applied: vnet.pytorch's resume) and the wrap cannot move: rank 0's weights and buffers are
sent to every rank right after the last change, so every rank trains the same model::

    model = nn.DataParallel(model)
    if args.resume:
        model.load_state_dict(torch.load(args.resume)["state_dict"])
    # becomes
    model = ddp_wrap(model)
    if args.resume:
        model.load_state_dict(torch.load(args.resume, map_location=ddp_map_location)["state_dict"])
    ddp_broadcast_weights(model)
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import WrapSite, calls_in, dotted, walk
from ddpify.analysis.tree import ends_after
from ddpify.transforms.base import Block, Transform

# Methods that change a module's parameters, dtype or structure in place.
# (Freezing, `requires_grad_`, is followed by the wrap instead: see trainable.py.)
# What a function given to apply() may call and still leave the model as DDP saw it.
# Changes of the weights' values only, in place (a broadcast of rank 0's weights repairs them).
VALUE_METHODS = {"apply", "reset_parameters", "init_weights"}
MODE_METHODS = {"eval", "train", "find", "startswith", "endswith", "lower"}
CHANGING_METHODS = {"apply", "half", "float", "double", "bfloat16", "reset_parameters", "init_weights"}


class WrapPlacementTransform(Transform):
    CODE_PREFIX = "DDP1"

    def __init__(self, context) -> None:
        super().__init__(context)
        self._moves: dict[cst.BaseStatement, cst.BaseStatement] = {}  # wrap statement -> goes before this one
        # the last value-only change after a wrap that cannot move -> the wrapped model's name
        self._broadcast_after: dict[cst.BaseStatement, str] = {}
        self._split: set[cst.BaseStatement] = set()  # `net = DP(Net())`: build stays, wrap moves

    def _first_line(self, statement: cst.BaseStatement) -> str:
        return self.context.code(statement.with_changes(leading_lines=[])).strip().splitlines()[0]

    def _line_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        while node is not None and not isinstance(node, cst.SimpleStatementLine):
            node = self.context.parent(node)
        return node

    def check(self) -> None:
        for site in self.facts.wraps:
            self._place(site)

    def _place(self, site: WrapSite) -> None:
        statement, block = self._wrap_statement(site)
        if statement is None or not site.target:
            return
        after = list(block[block.index(statement) + 1 :])
        optimizer = next((s for s in after if self._builds_optimizer(s, site.target)), None)
        before_optimizer = after[: after.index(optimizer)] if optimizer is not None else after
        # The model changes through the wrap's name or through the module it wrapped
        # (`net = DP(ssd_net)` then `ssd_net.extras.apply(weights_init)`).
        names = {site.target, dotted(site.module_arg) if site.module_arg is not None else None} - {None}
        changes = [s for s in before_optimizer if any(self._changes(s, name) for name in names)]
        if not changes:
            return
        what = self._first_line(changes[0])
        blocked = [s for s in before_optimizer if self._needs_the_wrap(s, site.target)]
        if optimizer is None or blocked:
            reason = "no optimizer is built from it below" if optimizer is None else (
                f"`{self._first_line(blocked[0])}` needs the wrapped model"
            )
            if all(not self._changes(s, name, values_only=False) for s in changes for name in names):
                # weights loaded or initialised in place (vnet.pytorch's resume, a seeded init):
                # the same values reach every rank from rank 0, right after the last of them
                last = [s for s in before_optimizer if s in changes or s in blocked][-1]
                self._broadcast_after[last] = site.target
                self.context.use_helper("ddp_broadcast_weights")
                self.context.report(
                    site.call,
                    "DDP128",
                    f"the model's weights change after the wrap (`{what}`), which cannot move below it ({reason}): "
                    f"rank 0's weights and buffers are sent to every rank after `{self._first_line(last)}`",
                )
                return
            self.context.report_unsound(
                site.call,
                "DDP106",
                f"the model changes after the wrap (`{what}`), so the ranks would train different models, "
                f"and the wrap cannot move below it: {reason}",
            )
            return
        built_here = dotted(site.module_arg) is None  # `net = DP(Net())`: split it
        if built_here and statement is not self._line_of(site.call):
            self.context.report_unsound(
                site.call, "DDP106", f"the model changes after the wrap (`{what}`) and is built inside a guarded wrap"
            )
            return
        self._moves[statement] = optimizer
        if built_here:
            self._split.add(statement)
        self.context.report(
            site.call, "DDP105", f"wrap moved below `{what}` to just before the optimizer is built: DDP wraps the final model"
        )

    def _wrap_statement(self, site: WrapSite) -> tuple[cst.BaseStatement | None, list[cst.BaseStatement]]:
        """The statement holding the wrap (the guard `if` around it, which moves with it) and
        the statements of its block."""
        node: cst.CSTNode | None = site.call
        while node is not None and not isinstance(node, cst.SimpleStatementLine):
            node = self.context.parent(node)
        if node is None or len(node.body) != 1:
            return None, []
        guards = {guard.node for guard in site.guards}
        while True:
            block = self.context.parent(node)
            owner = self.context.parent(block) if isinstance(block, cst.IndentedBlock) else None
            if isinstance(owner, cst.If) and owner in guards and owner.orelse is None and not ends_after(node, block):
                node = owner
                continue
            break
        if isinstance(block, (cst.Module, cst.IndentedBlock)):
            return node, list(block.body)
        return None, []

    def _mentions(self, node: cst.CSTNode, target: str) -> bool:
        return any(
            isinstance(part, (cst.Name, cst.Attribute)) and dotted(part) == target for part in walk(node)
        )

    def _builds_optimizer(self, statement: cst.BaseStatement, target: str) -> bool:
        for call in calls_in(statement):
            names = self.context.qualified(call.func) | {dotted(call.func) or ""}
            if any(n.startswith("torch.optim.") or "optim" in n.lower() for n in names) and self._mentions(call, target):
                return True
        return False

    def _sets_modes_only(self, call: cst.Call) -> bool:
        """``apply(fn)`` with ``fn`` a function of this file that only switches modes (calls
        ``eval()``/``train()``, reads class names): no weight, dtype or layer changes, which DDP
        would need to see before it is built."""
        fn = self.facts.analyzer.scopes.module_functions.get(dotted(call.args[0].value) or "") if call.args else None
        if fn is None:
            return False
        for node in walk(fn.body):
            if isinstance(node, (cst.AugAssign, cst.AssignTarget)) and isinstance(getattr(node, "target", None), cst.Attribute):
                return False
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                name = node.func.attr.value
                if name not in MODE_METHODS:
                    return False
            elif isinstance(node, cst.Call) and dotted(node.func) not in ("isinstance", "getattr", "hasattr", "str", "type"):
                return False
        return True

    def _changes(self, statement: cst.BaseStatement, target: str, values_only: bool = True) -> bool:
        """Does this statement change the model's weights, dtype, structure or trainable set?
        (``values_only=False``: only its dtype or structure, what a broadcast of the weights
        cannot repair.)"""
        for node in walk(statement):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                owner = dotted(node.func.value) or ""
                changing = node.func.attr.value in CHANGING_METHODS or node.func.attr.value == "to" and _casts(node)
                if changing and (owner == target or owner.startswith(f"{target}.")):
                    if node.func.attr.value == "apply" and self._sets_modes_only(node):
                        continue  # Deep_Metric's `model.apply(set_bn_eval)`: eval() on BatchNorm layers
                    if values_only or node.func.attr.value not in VALUE_METHODS:
                        return True
            if values_only and isinstance(node, cst.Call) and "init" in (dotted(node.func) or "").lower():
                if any(self._mentions(arg.value, target) for arg in node.args):
                    return True
            if isinstance(node, (cst.AssignTarget, cst.AugAssign)):
                assigned = dotted(node.target) or ""
                if assigned.endswith(".requires_grad"):
                    continue  # followed by the wrap (ddp_wrap_every_parameter), not a change it must precede
                # `model.fc = nn.Linear(...)` replaces a layer; `model.ss_prob = p` sets a number.
                if assigned.startswith(f"{target}.") and calls_in(self.context.parent(node) or node):
                    return True
        return False

    def _needs_the_wrap(self, statement: cst.BaseStatement, target: str) -> bool:
        code = self.context.code(statement)
        return f"{target}.module" in code or ("load_state_dict" in code and self._mentions(statement, target))

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        block = self._broadcasts(block)
        moving = [pair for pair in block if pair[0] in self._moves]
        if not moving:
            return block
        result: Block = []
        for original, updated in block:
            if original in self._split:
                result.append(self._built(original, updated))
            elif original not in self._moves:
                result.append((original, updated))
        for original, updated in moving:
            destination = self._moves[original]
            at = next(i for i, (other, _) in enumerate(result) if other is destination)
            # The moved wrap sits right above the optimizer, without blank lines of its own.
            if original in self._split:
                result.insert(at, (None, self._wrap_of_built(updated)))
            else:
                result.insert(at, (original, updated.with_changes(leading_lines=[])))
        return result

    def _broadcasts(self, block: Block) -> Block:
        result: Block = []
        for original, updated in block:
            result.append((original, updated))
            if original in self._broadcast_after:
                result.append((None, cst.parse_statement(f"ddp_broadcast_weights({self._broadcast_after[original]})")))
        return result

    def _built(self, original, updated):
        """`net = DistributedDataParallel(Net().to(d), ...)` -> `net = Net().to(d)` (stays in place)."""
        assign = updated.body[0]
        return (original, updated.with_changes(body=[assign.with_changes(value=assign.value.args[0].value)]))

    def _wrap_of_built(self, updated):
        """`net = DistributedDataParallel(net, ...)`: the wrap alone, moved below the changes."""
        assign = updated.body[0]
        target = assign.targets[0].target
        first = assign.value.args[0].with_changes(value=target.deep_clone())
        wrap = assign.value.with_changes(args=[first, *assign.value.args[1:]])
        return updated.with_changes(body=[assign.with_changes(value=wrap)], leading_lines=[])


def _casts(call: cst.Call) -> bool:
    """``model.to(device, dtype)``, ``.to(dtype=...)``, ``.to(torch.half)``: a cast, which DDP
    built before it does not follow (MobileNetV2's `--type float16` after the wrap)."""
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    if any(arg.keyword is not None and arg.keyword.value == "dtype" for arg in call.args) or len(positional) >= 2:
        return True
    return bool(positional) and (dotted(positional[0].value) or "").replace("torch.", "") in TORCH_FLOATS


TORCH_FLOATS = {"half", "float16", "float", "float32", "double", "float64", "bfloat16"}
