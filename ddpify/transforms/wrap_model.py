"""DDP1xx: every DataParallel wrap becomes DistributedDataParallel on this process's device.

Forms are recognised by qualified name (``nn.DataParallel``, ``torch.nn.parallel.DataParallel``,
``from torch.nn import DataParallel as DP``, ``import torch as ch`` ...), never by text, so a
project's own class called ``DataParallel`` is left alone.

DDP101  DataParallel -> DistributedDataParallel::

    model = nn.DataParallel(model, device_ids=[0, 1]).to(device)
    # becomes
    model = DistributedDataParallel(model.to(device), device_ids=ddp_device_ids())

DDP102  a ``device_count() > 1`` guard around the wrap now asks for the world size, so that
every rank wraps (also CPU ranks, which see no GPU)::

    if torch.cuda.device_count() > 1:        ->   if dist.get_world_size() > 1:
    n_gpu = torch.cuda.device_count()         (kept; only the guard changes)
    if n_gpu > 1:                             ->   if dist.get_world_size() > 1:

A variable (or attribute such as ``args.n_gpu``) counts as the GPU count when every
assignment to it in the file is ``torch.cuda.device_count()``.

DDP103  (warning) the wrap sits under another condition: under DDP it must run on every
rank whenever the world is larger than one.

DDP104  another reference to the DataParallel class (``isinstance(m, nn.DataParallel)``)
now names DistributedDataParallel, which also has ``.module``.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import DEVICE_COUNT, WrapSite, calls_in, dotted, first_positional
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform, keyword

DDP_IMPORT = ("torch.nn.parallel", "DistributedDataParallel", None)


class WrapModelTransform(Transform):
    CODE_PREFIX = "DDP1"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.sites = {site.outer: site for site in self.facts.wraps}
        self.device_count_calls: set[cst.CSTNode] = set()  # calls, or names holding the count
        for site in self.facts.wraps:
            self._classify_guards(site)

    def _classify_guards(self, site: WrapSite) -> None:
        for guard in site.guards:
            calls = [
                node
                for node in calls_in(guard.test)
                if DEVICE_COUNT in self.context.qualified(node.func)
            ]
            names = self._gpu_count_references(guard.test)
            if calls or names:
                self.device_count_calls.update([*calls, *names])
                counted = ", ".join(self.context.code(node) for node in [*calls, *names])
                self.context.report(
                    guard.test,
                    "DDP102",
                    f"{counted} (the GPU count) in the guard around the wrap -> dist.get_world_size()",
                )
            else:
                self.context.report(
                    site.call,
                    "DDP103",
                    f"the wrap only runs when `{self.context.code(guard.test)}`; under DDP it must run "
                    "on every rank whenever the world size is above one",
                    Severity.WARNING,
                )

    def _gpu_count_references(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """Variables / attributes in `node` that hold torch.cuda.device_count()."""
        if isinstance(node, (cst.Name, cst.Attribute)) and dotted(node) in self.facts.gpu_count_names:
            return [node]
        if isinstance(node, cst.Attribute):  # `.attr` names a field, not a variable
            return self._gpu_count_references(node.value)
        return [found for child in node.children for found in self._gpu_count_references(child)]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.device_count_calls:
            return self._world_size()
        site = self.sites.get(original_node)
        if site is None:
            return updated_node
        return self._wrap(site, updated_node)

    def _wrap(self, site: WrapSite, updated: cst.Call) -> cst.BaseExpression:
        dp_call = updated.func.value if site.move is not None else updated
        module = first_positional(dp_call, "module")
        if site.move is not None:
            placed = updated.with_changes(func=updated.func.with_changes(value=_atom(module)))
        else:
            placed = cst.Call(
                func=cst.Attribute(value=_atom(module), attr=cst.Name("to")),
                args=[cst.Arg(cst.parse_expression("ddp_device()"))],
            )
        dropped = [arg.keyword.value if arg.keyword else f"argument {i + 1}" for i, arg in enumerate(dp_call.args)]
        dropped = [name for name in dropped if name not in ("module", "argument 1")]
        note = f" (dropped {', '.join(dropped)}: GPUs are chosen on the launch line)" if dropped else ""
        self.context.report(
            site.call, "DDP101", f"DataParallel -> DistributedDataParallel on this process's device{note}"
        )
        self.context.add_import(*DDP_IMPORT)
        return cst.Call(
            func=cst.Name("DistributedDataParallel"),
            args=[cst.Arg(placed), keyword("device_ids", cst.parse_expression("ddp_device_ids()"))],
        )

    def _reference(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:
        if original_node not in self.facts.dp_references:
            return updated_node
        self.context.report(original_node, "DDP104", "DataParallel class reference -> DistributedDataParallel")
        self.context.add_import(*DDP_IMPORT)
        return cst.Name("DistributedDataParallel")

    def _world_size(self) -> cst.BaseExpression:
        self.context.add_import("torch.distributed", None, "dist")
        return cst.parse_expression("dist.get_world_size()")

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.CSTNode:
        if original_node in self.device_count_calls:
            return self._world_size()
        return self._reference(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.CSTNode:
        if original_node in self.device_count_calls:
            return self._world_size()
        return self._reference(original_node, updated_node)


def _atom(expression: cst.BaseExpression) -> cst.BaseExpression:
    """Parenthesise an expression that cannot take `.to(...)` directly."""
    if isinstance(expression, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or expression.lpar:
        return expression
    return expression.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

