"""DataParallel by function inside a model's forward: the model built from that class is wrapped.

pytorch/examples' DCGAN (and the GAN code written after it) splits each batch in the model's
own forward::

    class Generator(nn.Module):
        def forward(self, input):
            if input.is_cuda and self.ngpu > 1:
                output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
            else:
                output = self.main(input)
            return output

    netG = Generator(ngpu).to(device)

``data_parallel(module, inputs, ...)`` computes ``module(inputs)`` on one device's worth of work
per GPU. Under DDP the call is the part's own (``self.main(input)``) and the model built from the
class gets the wrap, as ``netG = DataParallel(Generator(ngpu)).to(device)`` would have: every
such construction becomes a wrap site (``WrapSite.constructed``: the module is the construction
itself) and the calls go to ``facts.functional_calls``. That holds only where each call sits in
the ``forward`` of a class of this file, on a part of ``self``, and every instance of the class is
bound to a plain name outside any class (a part of a bigger model would be a DDP inside a
DDP); otherwise the call stays refused (DDP004) with the reason. ``replicate`` and
``parallel_apply`` written by hand are refused as before.

A trainer (a class that is not a model) that runs a part of its own so in one of its methods
(Dual-Path-RNN's ``data_parallel(self.dualrnn, mix, device_ids=self.gpuid)`` in
``Trainer.train``), the part built once by its constructor (``self.dualrnn =
Dual_RNN.to(self.device)``), gets the wrap there (``WrapSite.functional_in``), and the call
becomes the part's own.

Where no gradient flows (``with torch.no_grad():``, a function decorated so), the call is
the module's own whatever the module is (Dual-Path-RNN's validation
``data_parallel(self.convtasnet, mix, device_ids=self.gpuid)``): ``facts.functional_calls``
holds it with no class, and each rank evaluates its batch whole, as the one process did.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.scopes import Room
from ddpify.analysis.tree import dotted, walk, without_gradients

FUNCTIONAL = {"torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel"}


class FunctionalWraps(Room):
    def __init__(self, scopes, wraps) -> None:
        super().__init__(scopes)
        self.wraps = wraps
        self._calls: list[cst.Call] = []

    def record(self, call: cst.Call) -> None:
        self._calls.append(call)

    def finish(self) -> None:
        """Decide, after the walk: wrap sites for the constructions, or DDP004 for each call."""
        classes: dict[cst.Call, cst.ClassDef] = {}
        parts: dict[cst.Call, str] = {}  # a trainer's part, as its constructor builds it -> where it ran
        for call in self._calls:
            context = self.facts.contexts.get(call)
            if context is not None and context.cls is not None and context.cls.name.value in self.facts.dp_classes:
                continue  # (a scattering DataParallel subclass's own steps: its wraps become DDP, the class unused)
            if self._evaluates(call):
                self.facts.functional_calls[call] = ""  # (no class: the module is called directly)
                continue
            owner, reason = self._owner(call)
            built = self._trainer_part(call) if owner is None else None
            if built is not None:
                where = f"{self.facts.contexts[call].cls.name.value}.{self.facts.contexts[call].function.name.value}()"
                self.facts.functional_calls[call] = where
                parts.setdefault(built, where)
            elif owner is None:
                self._refuse(call, reason)
            else:
                classes[call] = owner
        constructions: dict[str, list[cst.Call]] = {}
        for name in {owner.name.value for owner in classes.values()}:
            made, reason = self._constructions(name)
            if reason:
                for call, owner in list(classes.items()):
                    if owner.name.value == name:
                        self._refuse(call, reason)
                        del classes[call]
            else:
                constructions[name] = made
        for call, owner in classes.items():
            self.facts.functional_calls[call] = owner.name.value
        for made in constructions.values():
            for construction in made:
                self.wraps.record_wrap(construction, constructed=True)
        for construction, where in parts.items():
            self.wraps.record_wrap(construction, constructed=True, functional_in=where)

    def _refuse(self, call: cst.Call, reason: str) -> None:
        shown = (dotted(call.func) or "data_parallel").rpartition(".")[2]
        self.scopes.problem(
            call, "DDP004",
            f"DataParallel by function ({shown}()) has no DDP equivalent here: {reason}; wrap the model in DDP once "
            "where it is built and call it directly (by hand)",
        )

    def _evaluates(self, call: cst.Call) -> bool:
        """``data_parallel(module, inputs, device_ids)`` where no gradient flows (under
        ``torch.no_grad()``, Dual-Path-RNN's validation): on one process it is ``module(inputs)``,
        and each rank evaluates its batch whole, as DataParallel's one process did."""
        if not self.scopes.qualified(call.func) & FUNCTIONAL or not without_gradients(call, self.scopes.parent, cst.Module([]).code_for_node):
            return False
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        return len(positional) >= 2 and not _keywords_of_its_own(call) and not any(arg.star for arg in call.args)

    def _trainer_part(self, call: cst.Call) -> cst.Call | None:
        """``data_parallel(self.dualrnn, mix, device_ids=self.gpuid)`` in a method of a class
        that is not a model (Dual-Path-RNN's Trainer.train), on a part its constructor builds
        once (``self.dualrnn = Dual_RNN.to(self.device)``): that construction is where the
        wrap goes, and the call becomes the part's own."""
        context = self.facts.contexts.get(call)
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        module = dotted(positional[0].value) if positional else None
        if context is None or context.cls is None or context.function is None or len(positional) < 2 or not module:
            return None
        if any("Module" in (dotted(base.value) or "") for base in context.cls.bases) or not module.startswith("self.") or module.count(".") != 1:
            return None  # (a DDP inside a model: refused)
        if _keywords_of_its_own(call):
            return None
        bound = [
            node for node in walk(context.cls) if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign))
            and any(dotted(target) == module for target in _targets(node))
        ]
        if len(bound) != 1 or not isinstance(bound[0], cst.Assign) or not isinstance(bound[0].value, cst.Call) or len(bound[0].targets) != 1:
            return None
        function = self.scopes.parent(bound[0])
        while function is not None and not isinstance(function, (cst.FunctionDef, cst.ClassDef)):
            function = self.scopes.parent(function)
        return bound[0].value if isinstance(function, cst.FunctionDef) and function.name.value == "__init__" else None

    def _owner(self, call: cst.Call) -> tuple[cst.ClassDef | None, str]:
        """The class whose ``forward`` makes this call on a part of ``self``."""
        if not self.scopes.qualified(call.func) & FUNCTIONAL:
            return None, "it is DataParallel written by hand from its parts (replicate, parallel_apply)"
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        module = positional[0].value if positional else None
        if module is None or not (dotted(module) or "").startswith("self.") or len(positional) < 2:
            return None, "it is not called on a part of the model (`self.main`) with its inputs"
        context = self.facts.contexts.get(call)
        function = context.function if context is not None else None
        owner = context.cls if context is not None else None
        if function is None or owner is None or function.name.value != "forward":
            return None, "it is not in the forward() of a model class of this file"
        if _keywords_of_its_own(call):
            return None, "it passes the part keyword arguments of its own"
        return owner, ""

    def _constructions(self, name: str) -> tuple[list[cst.Call], str]:
        """Every call of the class, each bound to a plain name outside any class
        (``netG = Generator(ngpu).to(device)``)."""
        made = [call for call, _ in self.scopes.calls if dotted(call.func) == name]
        if not made:
            return [], f"no {name}(...) is built in this file"
        for call, context in self.scopes.calls:
            if dotted(call.func) != name:
                continue
            if context.cls is not None:
                return [], f"a {name} is built inside another class (a DDP inside a DDP)"
            statement = self.scopes.parent(_outer(call, self.scopes.parent))
            if not (isinstance(statement, cst.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0].target, cst.Name)):
                return [], f"a {name}(...) is not bound to a name of its own"
        subclassed = [
            node for node in walk(self.scopes.module)
            if isinstance(node, cst.ClassDef) and any(dotted(base.value) == name for base in node.bases)
        ]
        if subclassed:
            return [], f"{subclassed[0].name.value} subclasses {name}"
        return made, ""


def _outer(call: cst.Call, parent_of) -> cst.BaseExpression:
    """The construction, or the `.to(...)`/`.cuda()` chained on it."""
    parent = parent_of(call)
    if isinstance(parent, cst.Attribute) and parent.attr.value in ("to", "cuda"):
        grand = parent_of(parent)
        if isinstance(grand, cst.Call) and grand.func is parent:
            return grand
    return call

def _keywords_of_its_own(call: cst.Call) -> bool:
    """Keywords ``data_parallel()`` hands the part (``module_kwargs``), beside its own device
    arguments: the part's call could not be written from them alone."""
    return any(arg.keyword is not None and arg.keyword.value not in ("device_ids", "output_device", "dim") for arg in call.args)


def _targets(node: cst.CSTNode) -> list[cst.BaseExpression]:
    if isinstance(node, cst.Assign):
        return [
            part for target in node.targets
            for part in ([element.value for element in target.target.elements] if isinstance(target.target, (cst.Tuple, cst.List)) else [target.target])
        ]
    return [node.target]
