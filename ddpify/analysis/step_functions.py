"""Which functions of this file run a training step: the step functions a loop over batches
calls (PSMNet's ``loss = train(imgL, imgR, disp)``), found before the walk so that a loop that
calls one is a training loop; the switches that turn a shared function's training off at a call
(``train=False``) and the parameters a step function is handed through. After the walk: the
step functions and loss functions whose lines are a training step's (``Facts.training_steps``)."""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis.tree import calls_bound, calls_in, dotted, is_backward, is_training_call, loop_origins, reaching_backward, walk


# Methods every torch module and optimizer has: `model.train()` is not the file's own train().
MODULE_METHODS = frozenset({
    "train", "eval", "forward", "to", "cuda", "cpu", "zero_grad", "parameters", "state_dict",
    "load_state_dict", "apply", "half", "float", "step", "backward", "add_param_group",
})


def step_function_calls(module: cst.Module) -> frozenset[str]:
    """Calls (as written: ``train``, ``self.train_step``, ``solver.update``) of this file's
    functions and methods that run backward() or an optimizer step, directly or through
    other such functions of the file: a loop that calls one is a training loop (PSMNet's
    ``loss = train(imgL, imgR, disp)`` per batch)."""
    functions = [node for node in walk(module) if isinstance(node, cst.FunctionDef)]
    by_name: dict[str, list[cst.FunctionDef]] = {}
    for function in functions:
        by_name.setdefault(function.name.value, []).append(function)
    # (a function decorated to run without gradients never trains: PatchmatchNet's
    # `@make_nograd_func def test_sample(...)`, though it calls the shared process_sample)
    quiet = {function for function in functions if any(NO_GRAD_DECORATOR.search(dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "") for d in function.decorators)}
    calls_of = {function: calls_in(function.body) for function in functions}  # (walked once: a converted file has hundreds)
    own = _own_method_calls(module, calls_of)
    callees = lambda call: own.get(id(call)) or _callees(call, by_name)  # noqa: E731
    trains = {function for function in functions if function not in quiet and any(is_training_call(call) for call in calls_of[function])}
    switches = {function: _training_switch(function) for function in trains}
    grown = True
    while grown:
        grown = False
        for function in functions:
            if function not in trains and function not in quiet and any(
                callee in trains and _trains_at(callee, call, switches) for call in calls_of[function] for callee in callees(call)
            ):
                trains.add(function)
                grown = True
    named = {
        dotted(call.func)
        for call in calls_in(module)
        if dotted(call.func) and any(callee in trains and _trains_at(callee, call, switches) for callee in callees(call))
    }
    # (and the step functions' own names: PatchmatchNet hands `train_sample` on as a value)
    named |= {function.name.value for function in trains if function.name.value in by_name and len(by_name[function.name.value]) == 1}
    return frozenset(named | _step_parameters(functions, by_name, trains, calls_of))


def _own_method_calls(module: cst.Module, calls_of: dict) -> dict[int, list[cst.FunctionDef]]:
    """``self.step(x, y)`` in a method of a class that defines ``step`` -> that method: the
    class's own, whatever torch's modules and optimizers name alike (a trainer's ``def step(self,
    batch)`` that runs backward())."""
    found: dict[int, list[cst.FunctionDef]] = {}
    for cls in (node for node in walk(module) if isinstance(node, cst.ClassDef)):
        methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
        for method in methods.values():
            for call in calls_of.get(method, ()):
                func = call.func
                if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self" and func.attr.value in methods:
                    found[id(call)] = [methods[func.attr.value]]
    return found


def _step_parameters(functions: list[cst.FunctionDef], by_name: dict, trains: set, calls_of: dict) -> set[str]:
    """Parameters called as functions (PatchmatchNet's ``sample_function(model, sample, ...)``
    in process_samples) where a call passes a step function of the file for them
    (``process_samples(args, train_sample, ...)``): calling one is a training step there."""
    found = set()
    every_call = [call for other in functions for call in calls_of[other]]
    for function in functions:
        params = [p.name.value for p in function.params.params]
        called = {call.func.value for call in calls_of[function] if isinstance(call.func, cst.Name) and call.func.value in params}
        for call in every_call if called else ():
            if function not in _callees(call, by_name):
                continue
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            for name in called:
                index = params.index(name)
                value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)
                value = value if value is not None else positional[index] if index < len(positional) else None
                if isinstance(value, cst.Name) and any(f in trains for f in by_name.get(value.value, [])):
                    found.add(name)
    return found


NO_GRAD_DECORATOR = re.compile(r"no_?grad|inference_mode", re.IGNORECASE)


def _training_switch(function: cst.FunctionDef) -> tuple[int, str, bool] | None:
    """The parameter (position, name) under whose ``if p:`` (or ``if not p:``) every training
    call of ``function`` sits, and whether true trains: PatchmatchNet's process_sample steps
    only ``if is_training:``."""
    params = [p.name.value for p in function.params.params]
    found = set()
    for statement in walk(function.body):
        if not isinstance(statement, cst.If):
            continue
        test, trains_when = statement.test, True
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, trains_when = test.expression, False
        if isinstance(test, cst.Name) and test.value in params and any(is_training_call(c) for c in calls_in(statement.body)):
            found.add((params.index(test.value), test.value, trains_when))
    training = [c for c in calls_in(function.body) if is_training_call(c)]
    if len(found) != 1:
        return None
    switch = found.pop()
    guarded = {id(c) for s in walk(function.body) if isinstance(s, cst.If) and _names_switch(s.test, switch[1]) for c in calls_in(s.body)}
    return switch if all(id(c) in guarded for c in training) else None


def _names_switch(test: cst.BaseExpression, name: str) -> bool:
    inner = test.expression if isinstance(test, cst.UnaryOperation) else test
    return isinstance(inner, cst.Name) and inner.value == name


def _trains_at(function: cst.FunctionDef, call: cst.Call, switches: dict) -> bool:
    """Does this call of ``function`` train? Not when it sets the switch to the other literal."""
    switch = switches.get(function)
    if switch is None:
        return True
    index, name, trains_when = switch
    value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    if value is None and index < len(positional):
        value = positional[index]
    if not isinstance(value, cst.Name) or value.value not in ("True", "False"):
        return True
    return (value.value == "True") == trains_when


def _callees(call: cst.Call, by_name: dict[str, list[cst.FunctionDef]]) -> list[cst.FunctionDef]:
    """The file's functions a call may run, by name: ``f(...)``, or ``obj.m(...)`` for a
    method name no torch module or optimizer has."""
    func = call.func
    if isinstance(func, cst.Name):
        return by_name.get(func.value, [])
    if isinstance(func, cst.Attribute) and func.attr.value not in MODULE_METHODS:
        return by_name.get(func.attr.value, [])
    return []


def step_functions(calls) -> list[cst.FunctionDef]:
    """Functions whose backward() is outside any loop of theirs: one step per call, the step
    of the loop that calls them (a loss summed or averaged over a mask there is the training
    loss as much as one written in the loop). ``calls``: every call and its context."""
    found: list[cst.FunctionDef] = []
    for call, context in calls:
        function = context.function
        if function is not None and not context.loops and is_backward(call) and function not in found:
            if function.name.value not in ("forward", "__call__"):
                found.append(function)
    return found


def _wrapped_classes(facts, module: cst.Module) -> set[str]:
    """The classes of this file's models DataParallel wraps: made in the wrap's call
    (``DataParallel(HiSD(config))``), or bound to the name it wraps (``self.models = HiSD(config)``,
    then ``DataParallel(self.models)``)."""
    bound = calls_bound(module)
    made = [
        call for site in facts.wraps if site.module_arg is not None
        for call in ([site.module_arg] if isinstance(site.module_arg, cst.Call) else bound.get(dotted(site.module_arg) or "", []))
    ]
    return {(dotted(call.func) or "").rpartition(".")[2] for call in made}


def backward_in_forward(facts, calls, module: cst.Module | None = None) -> tuple[cst.Call, str, str] | None:
    """A backward() inside a module's own forward (HiSD: `HiSD.forward(x, mode)` computes the
    generator's or the discriminator's loss and calls `loss.backward()` before it returns), in
    a file that wraps: DDP averages the gradients of a backward that runs after its forward
    returned, so one inside it is never synchronised, and the next forward stops ("Expected to
    have finished reduction"). (call, code, message) of the refusal, named for what it is."""
    wrapped = _wrapped_classes(facts, module) if facts.wraps and module is not None else set()
    for call, context in calls:
        function = context.function
        if context.cls is None or function is None or function.name.value != "forward" or not is_backward(call):
            continue
        if context.cls.name.value not in wrapped:
            continue  # (a helper module that fits a code with its own optimizer in its forward: not DDP's)
        return (
            call,
            "DDP143",
            f"backward() runs inside `{context.cls.name.value}.forward`: DDP averages the gradients of a backward() "
            "that runs after the wrapped model's forward has returned, so this one is never synchronised and the next "
            "forward stops (\"Expected to have finished reduction\"); return the loss from forward() and call "
            "backward() on it after the call",
        )
    return None


def loss_functions(facts, graph) -> list[cst.FunctionDef]:
    """Functions of this file whose returned value reaches a training step's backward()
    (pytorch/examples' VAE ``loss = loss_function(recon, data, mu, logvar)``), and those
    theirs reaches: the loss is what they compute. ``graph``: the CallGraph."""
    found: list[cst.FunctionDef] = []
    pending = list(facts.training_loops) + list(facts.step_functions)
    while pending:
        step = pending.pop()
        for expr in reaching_backward(step, loop_origins(step)):
            for call in calls_in(expr) if not isinstance(expr, cst.Call) else [expr, *calls_in(expr)]:
                callee = graph.callee(call, facts.contexts.get(call))
                if callee is not None and callee not in found and callee not in facts.step_functions and _returns_a_value(callee):
                    found.append(callee)
                    pending.append(callee)
    return found


def _returns_a_value(function: cst.FunctionDef) -> bool:
    return function.name.value not in ("forward", "__call__", "__init__") and any(
        isinstance(node, cst.Return) and node.value is not None for node in walk(function.body)
    )
