"""Which parameters train: changes to the trainable set after the wrap (freezing, unfreezing).

DistributedDataParallel registers, when it is built, the parameters that require a
gradient, and expects a gradient for each of them at every backward. A script that freezes
parameters after the wrap (TSM's partial BatchNorm in the model's own ``train()``, 2s-AGCN's
``param.requires_grad = epoch > only_train_epoch``, a whole network frozen per epoch behind
a flag) stops DDP at the first step ("Expected to have finished reduction"); one that
unfreezes parameters frozen at the wrap would train them apart on every rank, silently. The
wrap then registers every parameter and lets DDP skip those without a gradient
(``ddp_wrap_every_parameter(model)``: find_unused_parameters=True).

Freezing inside a module's ``__init__``, or before the wrap in the function that wraps, is
part of the model the wrap sees: nothing to follow.
"""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis.facts import Facts
from ddpify.analysis.tree import bound_names, dotted, walk, without_moves


def trainable_set_changes(module: cst.Module, facts: Facts, position) -> list[cst.CSTNode]:
    """``x.requires_grad = ...`` and ``x.requires_grad_(...)`` that may run after a wrap."""
    wraps = [(facts.contexts[site.call].function, position(site.call)) for site in facts.wraps if site.call in facts.contexts]
    found = []
    for node in walk(module):
        if not _changes_trainable_set(node, facts):
            continue
        function = _function_of(node, facts)
        if function is not None and function.name.value == "__init__":
            continue  # a module built frozen: the wrap sees it
        if any(wrapped_in is function and position(node) < at for wrapped_in, at in wraps):
            continue  # before the wrap, in the function that wraps
        found.append(node)
    return found


# A model's own method named for freezing or unfreezing its layers (SiamMask's
# `model.features.unfix(ratio)`, a backbone's `freeze()`), not BatchNorm's running statistics.
FREEZING_METHOD = re.compile(r"^(un)?(fix|freeze)(_(?!bn|batchnorm)\w+)?$|^(unfreeze|freeze)_layers?$", re.IGNORECASE)


def _changes_trainable_set(node: cst.CSTNode, facts: Facts) -> bool:
    if isinstance(node, cst.AssignTarget) and (dotted(node.target) or "").endswith(".requires_grad"):
        return _may_be_parameters(node.target.value, facts)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "requires_grad_":
        return _may_be_parameters(node.func.value, facts)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and FREEZING_METHOD.match(node.func.attr.value):
        owner = (dotted(node.func.value) or "").split(".")[0]
        return owner in facts.model_names or owner in {site.target for site in facts.wraps} or bool(
            facts.wraps and owner and any(dotted(site.module_arg) == owner for site in facts.wraps if site.module_arg is not None)
        )
    return False


# What parameters come from: a model's parameters()/modules(), a weight or bias.
PARAMETER_SOURCES = re.compile(r"parameters|modules|children|\.weight|\.bias|\bparam")


def _may_be_parameters(owner: cst.BaseExpression, facts: Facts) -> bool:
    """Does ``owner.requires_grad_()`` change what a model trains? Not for a batch drawn from
    the data (WGAN-GP's ``real.requires_grad_(True)``, AlphaPose's input) or a tensor made
    here (``torch.randn(...).requires_grad_()``); yes for ``model.fc.weight``, a loop over
    ``model.parameters()``, or a name this file cannot trace."""
    code = cst.Module([]).code_for_node(owner)
    if isinstance(owner, cst.Attribute) or PARAMETER_SOURCES.search(code):
        return True
    if isinstance(owner, (cst.Call, cst.BinaryOperation, cst.UnaryOperation)):
        return False  # (computed here: WGAN-GP's `(eps * real + (1 - eps) * fake).requires_grad_(True)`)
    if not isinstance(owner, cst.Name):
        return True
    scopes = facts.analyzer.scopes
    bindings = [getattr(a, "node", None) for a in scopes.assignments_of(owner)]
    sources = []
    for node in bindings:
        value, _ = scopes.assigned_value(node) if node is not None else (None, None)
        loop = _loop_binding(node, scopes.parent) if node is not None and value is None else None
        source = value if value is not None else loop.iter if loop is not None else None
        if source is None:
            return True  # a parameter of a function, an import: cannot tell
        sources.append(cst.Module([]).code_for_node(source))
    return not sources or any(PARAMETER_SOURCES.search(source) for source in sources)


def _loop_binding(node: cst.CSTNode, parent_of) -> cst.For | None:
    """The for loop whose target binds ``node``."""
    while node is not None and not isinstance(node, (cst.For, cst.FunctionDef, cst.Module, cst.BaseStatement)):
        node = parent_of(node)
    return node if isinstance(node, cst.For) else None


def _function_of(node: cst.CSTNode, facts: Facts) -> cst.FunctionDef | None:
    parent = facts.analyzer.scopes.parent(node)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        parent = facts.analyzer.scopes.parent(parent)
    return parent if isinstance(parent, cst.FunctionDef) else None


OPTIMIZER = re.compile(r"(^|\.)(optim\.\w+|SGD|Adam\w*|RMSprop|Adagrad|Adadelta|LARS|LAMB|Lamb|Ranger|RAdam|NovoGrad|FusedAdam|FusedLAMB)$")


MODEL_MAKER = re.compile(r"^[A-Z]|net|vgg|model|encoder|decoder|(?i:net|vgg|model|encoder|decoder)")


def partly_trained(module: cst.Module, facts: Facts) -> dict[str, str]:
    """Wrapped models built from other models, of which the optimizers train some and not
    the others (overhaul-distillation's ``Distiller(t_net, s_net)``, the optimizer over
    ``s_net`` and the connectors): the teacher runs inside the wrap and gets no gradient, and
    DDP stops at the next step unless it looks for unused parameters. Wrapped name -> why."""
    built: dict[str, list[str]] = {}  # model name -> the names its constructor was given
    for node in walk(module):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call):
            name = dotted(node.targets[0].target)
            given = [dotted(arg.value) for arg in node.value.args if isinstance(arg.value, (cst.Name, cst.Attribute))]
            if name and len(given) >= 2:
                built.setdefault(name, []).extend(g for g in given if g)
    # names bound to what a model class or factory returns (`t_net = ResNet.resnet152(...)`)
    made = {
        name for node in walk(module)
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call)
        for name in [dotted(node.targets[0].target)]
        if name and MODEL_MAKER.search((dotted(node.value.func) or "").rpartition(".")[2])
    }
    trained = set()
    for node in walk(module):
        if isinstance(node, cst.Call) and OPTIMIZER.search(dotted(node.func) or "") and node.args:
            trained |= {
                dotted(call.func.value) for call in walk(node.args[0].value)
                if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in ("parameters", "named_parameters")
            }
    code = module.code
    frozen = set(re.findall(r"for \w+ in ([\w.]+)\.parameters\(\):\s*\n\s*\w+\.requires_grad\s*=\s*False", code))
    frozen |= set(re.findall(r"([\w.]+)\.requires_grad_\(False\)", code))
    found = {}
    for site in facts.wraps:
        inner = dotted(site.module_arg) if site.module_arg is not None else None
        if not site.target or not inner or inner not in built:
            continue
        whole = {site.target, inner, f"{site.target}.module", f"{inner}.module"}
        if trained & whole:
            continue
        parts = [name for name in dict.fromkeys(built[inner]) if name in facts.model_names or name in trained or name in made]
        taught = [name for name in parts if name in trained]
        idle = [name for name in parts if name not in trained and name not in frozen]
        if taught and idle:
            found[site.target] = f"its optimizer trains {', '.join(taught)} but not {', '.join(idle)}, which {site.target} runs"
    return found



HUB_PACKAGES = re.compile(r"^(transformers|pytorch_pretrained_bert|pytorch_transformers|peft|sentence_transformers)(\.|$)")


def hub_models(module: cst.Module, facts: Facts) -> dict[str, str]:
    """Wrapped models that are (or are built by) pretrained models of Hugging Face's libraries:
    ``model = BertForRelation.from_pretrained(...)`` of a project class on ``BertPreTrainedModel``
    (PURE), ``BertModel(config)``. Such a model holds parts the training often leaves idle (the
    pooler when only the sequence output is read, a head another task uses), and DDP stops at
    the next step unless it looks for them; Hugging Face's own Trainer runs DDP with
    find_unused_parameters=True by default for that reason. Wrapped name -> the call."""
    imported, packages = set(), set()  # names taken from those libraries; the libraries, as bound here
    for node in walk(module):
        if isinstance(node, cst.ImportFrom) and node.module is not None and HUB_PACKAGES.match(dotted(node.module) or ""):
            if not isinstance(node.names, cst.ImportStar):
                imported |= {alias.asname.name.value if alias.asname else dotted(alias.name) for alias in node.names}
        elif isinstance(node, cst.Import):
            # (`import transformers.modeling_bert` binds `transformers`)
            packages |= {alias.asname.name.value if alias.asname else dotted(alias.name).split(".")[0] for alias in node.names if HUB_PACKAGES.match(dotted(alias.name) or "")}
    if not imported and not packages:
        return {}
    found: dict[str, str] = {}
    for node in walk(module):
        if not isinstance(node, cst.Assign) or len(node.targets) != 1 or not isinstance(node.value, cst.Call):
            continue
        name, made = dotted(node.targets[0].target), dotted(node.value.func) or ""
        if name not in facts.model_names:
            continue
        if made.endswith(".from_pretrained") or made in imported or any(made.startswith(f"{package}.") for package in packages):
            found.setdefault(name, cst.Module([]).code_for_node(node.value.func) + "(...)")
    return found


def models_picked_at_run_time(module: cst.Module, facts: Facts) -> dict[str, str]:
    """Wrapped models built from a class picked at run time, whose parts ddpify cannot read:
    ST-TR's ``Model = import_class(arg.model); model = Model(**arg.model_args)``, mdistiller's
    ``distiller_dict[cfg.DISTILLER.TYPE](student, teacher, cfg)``. A part such a model never
    uses (a layer its forward leaves out, a teacher run under no_grad) stops DDP at the next
    step unless it looks for parameters without a gradient. Wrapped name -> the call."""
    built: dict[str, list[cst.BaseExpression]] = {}  # name -> the values assigned to it
    for node in walk(module):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            built.setdefault(dotted(node.targets[0].target) or "", []).append(node.value)
    found: dict[str, str] = {}
    for site in facts.wraps:
        for name in {site.target, dotted(without_moves(site.module_arg)) if site.module_arg is not None else None} - {None}:
            for value in built.get(name, []):
                made = without_moves(value)
                if isinstance(made, cst.Call) and _picked_at_run_time(made.func, built):
                    found.setdefault(site.target or name, cst.Module([]).code_for_node(made.func) + "(...)")
    return found


def _picked_at_run_time(func: cst.BaseExpression, built: dict[str, list[cst.BaseExpression]]) -> bool:
    """A class from a call or a lookup (``import_class(name)``, ``registry[name]``), directly
    or through a name bound to one."""
    if isinstance(func, (cst.Call, cst.Subscript)):
        return True
    values = built.get(dotted(func) or "", []) if isinstance(func, (cst.Name, cst.Attribute)) else []
    if any(isinstance(value, (cst.Call, cst.Subscript)) for value in values):
        return True
    # (a class of a module imported by a name given at run time: TENet's
    # `module = importlib.import_module("model." + args.model)`, then `module.Net(...)`)
    owners = built.get(dotted(func.value) or "", []) if isinstance(func, cst.Attribute) else []
    return any(
        isinstance(value, cst.Call) and (dotted(value.func) or "").rpartition(".")[2] in ("import_module", "__import__")
        for value in owners
    )


# Methods a DDP-wrapped model answers itself (nn.Module's and DDP's own).
MODULE_METHODS = {
    "forward", "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
    "modules", "named_modules", "state_dict", "load_state_dict", "train", "eval", "to", "cuda", "cpu", "half",
    "float", "double", "bfloat16", "type", "apply", "zero_grad", "requires_grad_", "register_buffer",
    "register_parameter", "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_backward_hook", "register_module", "add_module", "get_submodule", "get_parameter", "get_buffer",
    "extra_repr", "share_memory", "no_sync", "join", "register_comm_hook", "to_empty", "compile",
}


def own_method_call(call: cst.Call, facts: Facts) -> bool:
    """``model.reverse(...)`` on a wrapped model: a method of the user's class, not of
    nn.Module, which DDP does not forward (DataParallel scripts chose ``model`` or
    ``model.module`` by a flag that no longer tells whether the model is wrapped)."""
    func = call.func
    if not isinstance(func, cst.Attribute) or dotted(func.value) not in facts.model_names:
        return False
    # (`model.module(x)`: the module inside, called past the wrapper, ArtFlow's ActNorm start)
    if func.attr.value in MODULE_METHODS or func.attr.value.startswith("_") or func.attr.value == "module":
        return False
    return all(call is not site.outer for site in facts.wraps)


def forwards_around_ddp(facts: Facts, parent_of) -> dict[cst.Call, tuple[str, str]]:
    """Calls in a training loop of another method of a wrapped model, on the module inside
    (``model.module.meta_learner_1(...)``, or ``model.meta(...)``, which DDP does not forward),
    standing for its forward: they bind what a direct call of the model binds elsewhere in
    the loop (StyleSpeech: ``output = model(...)`` in warm-up, ``output =
    model.module.meta_learner_1(...)`` after it), or what they return reaches backward().
    Around DDP's forward their backward is never averaged. Call -> (model, method)."""
    found: dict[cst.Call, tuple[str, str]] = {}
    for loop in facts.training_loops:
        calls = [node for node in walk(loop.body) if isinstance(node, cst.Call)]
        direct = [call for call in calls if dotted(call.func) in facts.model_names]
        bound = set().union(*(_bound_from(call, parent_of) for call in direct)) if direct else set()
        for call in calls:
            func = call.func
            # (`model.module.forward(x)` itself is one to run through DDP)
            if not isinstance(func, cst.Attribute) or func.attr.value in MODULE_METHODS - {"forward"}:
                continue
            inner = func.value
            if isinstance(inner, cst.Attribute) and inner.attr.value == "module" and dotted(inner.value) in facts.model_names:
                owner = dotted(inner.value)
            elif own_method_call(call, facts):
                owner = dotted(inner)
            else:
                continue
            # (with no direct call, only a method whose value reaches backward(): easy-faster-rcnn's
            # `path = model.module.save(...)` beside `model.train().forward(...)` writes a checkpoint)
            if _bound_from(call, parent_of) & bound or _a_loss_of_its_own(call, loop, direct, parent_of):
                found[call] = (owner, func.attr.value)
    return found


def _a_loss_of_its_own(call: cst.Call, loop: cst.CSTNode, direct: list[cst.Call], parent_of) -> bool:
    """Does what the call returns reach a backward() without passing through a direct call
    of the model (StyleSpeech's discriminator step, ``meta_learner_2``), unlike a batch it
    prepares for the model (Tacotron2's ``x, y = model.module.parse_batch(batch)``)?"""
    reached = _bound_from(call, parent_of)
    assigns = [node for node in walk(loop) if isinstance(node, cst.Assign)]
    for _ in range(3):  # (a few hops: output -> losses -> total_loss)
        for assign in assigns:
            if {name.value for name in walk(assign.value) if isinstance(name, cst.Name)} & reached:
                reached |= {name for target in assign.targets for name in bound_names(target.target)}
    read = lambda node: {name.value for name in walk(node) if isinstance(name, cst.Name)}  # noqa: E731
    if any(read(model_call) & _bound_from(call, parent_of) for model_call in direct):
        return False
    return any(
        isinstance(node, cst.Call) and "backward" in (dotted(node.func) or "") and read(node) & reached
        for node in walk(loop)
    )


def _bound_from(call: cst.Call, parent_of) -> set[str]:
    """The names an assignment of this call's result binds."""
    parent = parent_of(call)
    if isinstance(parent, cst.Assign) and parent.value is call:
        return {name for target in parent.targets for name in bound_names(target.target)}
    return set()
