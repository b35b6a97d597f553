"""Training loops run by a library: a step function handed to a loop driver, and the data given to it.

Some scripts never write the loop over their data: they hand a training step function to a
library's engine and the loader to its run method (pytorch-ignite's ``Engine(_update).run(
train_loader, max_epochs=...)``, reid-strong-baseline's ``create_supervised_trainer`` that
returns ``Engine(_update)``). The engine iterates the loader once per epoch and calls the step
on each batch: the training draws from that loader, there. What is found here is sharded in
that argument at run time (``trainer.run(ddp_shard(train_loader), ...)``, transforms/sampler.py),
as Accelerate's ``prepare`` would, whatever built the loader.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.facts import Facts
from ddpify.analysis.tree import calls_bound, dotted, walk

DATA_LOADER = "torch.utils.data.DataLoader"


def driven_data(facts: Facts, module: cst.Module, parent, qualified) -> list[tuple[cst.Call, cst.BaseExpression, str]]:
    """(the driver's call, the data argument it is given, the step it drives) for each loader
    handed to an object built around a training step function of this file."""
    steps = {function.name.value for function in facts.step_functions}
    if not steps:
        return []
    makers = _driver_makers(module, steps)
    found: list[tuple[cst.Call, cst.BaseExpression, str]] = []
    for maker, step in makers:
        for call in _driver_calls(module, maker, parent):
            # (what the engine iterates: its run's first argument, or `data=`; not what a handler
            # is handed, `trainer.add_event_handler(Events.EPOCH_COMPLETED, evaluate, val_loader)`)
            positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
            given = [arg for arg in call.args if arg.keyword is not None and arg.keyword.value == "data"] or positional[:1]
            for arg in given:
                if _a_loader(arg.value, module, qualified) and all(arg.value is not seen for _, seen, _ in found):
                    found.append((call, arg.value, step))
    return found


def _driver_makers(module: cst.Module, steps: set[str]) -> list[tuple[cst.Call, str]]:
    """Calls given a step function itself (``Engine(_update)``), and calls of this file's
    functions that return one (``create_supervised_trainer(model, optimizer, loss_fn)``)."""
    makers = [
        (call, arg.value.value) for call in walk(module) if isinstance(call, cst.Call)
        for arg in call.args if isinstance(arg.value, cst.Name) and arg.value.value in steps
    ]
    made = {id(call): step for call, step in makers}
    returning = {
        function.name.value: made[id(node.value)]
        for function in walk(module) if isinstance(function, cst.FunctionDef)
        for node in walk(function.body) if isinstance(node, cst.Return) and node.value is not None and id(node.value) in made
    }
    makers += [
        (call, returning[call.func.value]) for call in walk(module)
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in returning
    ]
    return makers


def _driver_calls(module: cst.Module, maker: cst.Call, parent) -> list[cst.Call]:
    """The method calls of what ``maker`` made: on it directly (``Engine(step).run(...)``) or
    through the name it is bound to (``trainer = Engine(step)`` ... ``trainer.run(...)``)."""
    above = parent(maker)
    if isinstance(above, cst.Attribute):
        call = parent(above)
        return [call] if isinstance(call, cst.Call) and call.func is above else []
    if not isinstance(above, cst.Assign):
        return []
    names = {dotted(target.target) for target in above.targets} - {None}
    return [
        call for call in walk(module)
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and dotted(call.func.value) in names
    ]


def _a_loader(value: cst.BaseExpression, module: cst.Module, qualified) -> bool:
    """A DataLoader made here (in the call, or bound to the name given), or a name that says it
    is one (``train_loader``, a parameter of the function that runs the engine)."""
    if isinstance(value, cst.Call):
        return DATA_LOADER in qualified(value.func)
    name = dotted(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
    if name is None:
        return False
    if "loader" in name.rpartition(".")[2].lower():
        return True
    return any(DATA_LOADER in qualified(call.func) for call in calls_bound(module).get(name, []))
