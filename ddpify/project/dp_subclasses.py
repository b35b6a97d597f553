"""A project's DataParallel subclass: can its wraps become DDP, and which argument is the model?

Two kinds convert (issue 21):

- **forwarding**: it only answers for the wrapped model's attributes (``__getattr__``) and
  passes its arguments on in ``__init__``: the class itself is rebased onto DDP where it is
  defined in the file converted (wraps.py), and its calls elsewhere become ``ddp_wrap(model)``,
  whose ``DdpModel`` answers for the model's attributes the same way;
- **scattering**: it only changes how one process splits each batch over its GPUs (CPM's
  ``BalancedDataParallel``: a smaller share for GPU 0, which held DataParallel's gathered
  outputs) by overriding ``scatter``/``replicate``/``parallel_apply``, or ``forward`` with
  nothing but those steps. Under DDP each process holds its own share of the batch and
  nothing is gathered: its calls become ``ddp_wrap(model)``, the class is left unused.

Anything else (its own ``gather``, a ``forward`` that computes, a method of its own) changes
what the wrapped model returns: refused with that reason.

Read with ``ast`` (the modules of the project are read that way, neighbours.py; a class of the
converted file is given as its code).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

FORWARDING = {"__getattr__", "__init__"}
# The model's own state, answered by the wrapped model (``return self.module.state_dict()``).
MODULE_STATE = {"state_dict", "load_state_dict"}
# How one process splits a batch over its GPUs: no meaning under DDP.
SCATTERING = {"scatter", "replicate", "parallel_apply"}
# What a scattering forward() may call besides those steps.
PLUMBING_CALLS = SCATTERING | {"gather", "module", "len", "range", "zip", "list", "tuple", "enumerate", "isinstance", "min", "max", "int", "sum"}
# The parameter DataParallel's own constructor takes the model as.
MODULE = "module"


@dataclass(frozen=True)
class SubclassPlan:
    """How a DataParallel subclass's calls convert."""

    forwarding: bool  # attribute forwarding only (else: scattering only)
    index: int  # the model's position among the call's arguments
    keyword: str  # and its keyword
    # its replicate() runs Synchronized-BatchNorm's callbacks (DataParallelWithCallback): DDP's
    # counterpart is torch's SyncBatchNorm, converted into the model inside the wrap
    sync_bn: bool = False
    # its state_dict() is the module's (HJL-re-id's TransparentDataParallel): the wrap keeps
    # the bare model's checkpoint keys (keys_unwrapped)
    own_keys: bool = False


def subclass_plan(cls: ast.ClassDef) -> SubclassPlan | str:
    """The plan for a class that subclasses DataParallel, or why it cannot convert."""
    methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    sync_bn = False
    for name, method in methods.items():
        if name == "replicate" and not _only_calls(method, {"super", "replicate"}):
            # (Synchronized-BatchNorm's DataParallelWithCallback: `execute_replication_callbacks(modules)`
            # syncs BatchNorm over the replicas; under DDP, torch's SyncBatchNorm does)
            if not _only_calls(method, {"super", "replicate", *_callbacks(method)}) or not _callbacks(method):
                return "does more than copy the model in replicate()"
            sync_bn = True
        if name in FORWARDING or name in SCATTERING:
            continue
        if name in MODULE_STATE and _hands_on_to_the_module(method, name):
            continue
        if name == "forward" and _only_plumbing(method):
            continue
        if name == "gather":
            return "gathers the replicas' outputs its own way (gather()): what the wrapped model returns changes"
        return f"overrides {name}()"
    slot = _module_slot(methods.get("__init__"))
    if slot is None:
        return "passes no model on to DataParallel's constructor that can be told"
    own_keys = "state_dict" in methods
    return SubclassPlan(set(methods) - MODULE_STATE <= FORWARDING, *slot, sync_bn=sync_bn, own_keys=own_keys)


def _hands_on_to_the_module(method: ast.FunctionDef, name: str) -> bool:
    """``return self.module.state_dict(*args, **kwargs)``: nothing but the same method of the
    wrapped model."""
    calls = [node for node in ast.walk(method) if isinstance(node, ast.Call)]
    return bool(calls) and all(
        isinstance(call.func, ast.Attribute) and call.func.attr == name and ast.unparse(call.func.value) == "self.module"
        for call in calls
    )


def _callbacks(method: ast.FunctionDef) -> set[str]:
    """The replication callbacks a replicate() runs (``execute_replication_callbacks``)."""
    return {name for node in ast.walk(method) if isinstance(node, ast.Call) and "callback" in (name := call_name(node) or "")}


def call_name(call: ast.Call) -> str | None:
    """The last name of what a call calls: ``f`` of ``f(...)`` and of ``a.b.f(...)``."""
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _only_calls(method: ast.FunctionDef, names: set[str]) -> bool:
    """Does ``method`` call nothing but ``names`` (by their last name)?"""
    return all(call_name(node) in names for node in ast.walk(method) if isinstance(node, ast.Call))


def _only_plumbing(forward: ast.FunctionDef) -> bool:
    """Does this forward() only scatter, replicate, run the replicas and gather (or call the
    module itself)?"""
    return all(
        call_name(node) in PLUMBING_CALLS or _is_super_forward(node.func) for node in ast.walk(forward) if isinstance(node, ast.Call)
    )


def _is_super_forward(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and func.attr == "forward" or isinstance(func, ast.Name) and func.id == "super"


def _module_slot(init: ast.FunctionDef | None) -> tuple[int, str] | None:
    """Where a call of the class passes the model: (position, keyword). Without a constructor
    of its own, DataParallel's: the first argument, ``module``."""
    if init is None:
        return 0, MODULE
    params = [a.arg for a in (*init.args.posonlyargs, *init.args.args)][1:]  # without self
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__":
            args = node.args[1:] if _names_base(node.func.value) else node.args  # DataParallel.__init__(self, ...)
            first = args[0] if args else next((k.value for k in node.keywords if k.arg == MODULE), None)
            if isinstance(first, ast.Name) and first.id in params:
                return params.index(first.id), first.id
            if isinstance(first, ast.Starred) and init.args.vararg is not None:
                return len(params), MODULE  # `*args` passed on: the model comes first among them
            return None
    return None


def _names_base(node: ast.expr) -> bool:
    """``DataParallel`` / ``nn.DataParallel`` (an explicit base), not ``super()``."""
    return not isinstance(node, ast.Call)


def plan_from_code(code: str) -> SubclassPlan | str:
    """The plan for a class given as its code (a class of the converted file)."""
    cls = next(node for node in ast.parse(code.strip()).body if isinstance(node, ast.ClassDef))
    return subclass_plan(cls)
