"""Loops and training steps: which loops train, which loaders they draw from (sharded), the
epoch loops around them (``set_epoch``), and passes over a training loader that do not train.

A training loop is a loop whose body calls ``backward()`` or ``step()`` (or, in project
mode, another module's function that does). After the walk, ``TrainingLoops.resolve``
follows what each one iterates back to DataLoader calls (through ``Loaders``) and marks
them training, attaches ``set_epoch`` to the loop around it (looking through callers), and
in project mode shards the loaders this module passes to or builds for other modules.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.backward_pairs import backward_pairs, wrapped_in_tuples
from ddpify.analysis.facts import Context, EpochHook, Loop
from ddpify.analysis.scopes import Room
from ddpify.analysis.step_functions import backward_in_forward, loss_functions, step_functions
from ddpify.analysis.tree import backwards_per_pass, calls_in, dotted, is_backward, walk
from ddpify.analysis.trainable import forwards_around_ddp

# Calls that take a loader without reading a pass over its data here.
NOT_A_PASS = {
    "len", "iter", "next", "enumerate", "zip", "tqdm", "trange", "isinstance", "getattr", "hasattr", "setattr",
    "print", "str", "repr", "type", "id", "ddp_sampler", "DistributedSampler", "dict", "list", "tuple",
}
TRAINING_WORDS = ("train", "fit", "epoch", "loop", "run", "learn", "step", "solve", "main")


def reads_data(callee: str, trainers: set[str]) -> bool:
    """Does a call of ``callee`` with the training loader read a pass over its data that is
    not training? Names that train (here or by their name) and wrappers do not."""
    last = callee.rpartition(".")[2]
    if not last or last in NOT_A_PASS or callee in trainers or last in trainers:
        return False
    if last[0].isupper():  # a class: a trainer or a wrapper keeps the loader for later
        return False
    return not any(word in last.lower() for word in TRAINING_WORDS)


class TrainingLoops(Room):
    def __init__(self, scopes, calls, loaders) -> None:
        super().__init__(scopes)
        self.calls = calls  # the CallGraph
        self.loaders = loaders  # the Loaders
        self._training_loops: dict[Loop, Context] = {}

    # -- during the walk -----------------------------------------------------------------
    def training_step(self) -> None:
        """A backward()/step() (or a call that runs one) here: the loops around it train."""
        self.facts.has_training_step = True
        for loop in self.scopes.loops[-1]:
            self._training_loops.setdefault(loop, self.facts.contexts[loop])

    # -- after the walk ------------------------------------------------------------------
    def resolve(self) -> None:
        self.facts.training_loops = list(self._training_loops)
        self.facts.step_functions = step_functions(self.scopes.calls)
        self.facts.loss_functions = loss_functions(self.facts, self.calls)
        for loop, context in self._training_loops.items():
            # (TencentPretrain's PGD attack, `for t in range(K)` inside the step function the
            # loop over batches calls: it repeats the step on that batch, drawing nothing)
            if context.function is not None:
                self.facts.step_call_sites[loop] = [call for call, _ in self.calls.call_sites(context.function)]
        self.facts.forwards_around_ddp = forwards_around_ddp(self.facts, self.scopes.parent)
        loaders = self.loaders
        for loop, context in self._training_loops.items():
            if self._mark_iterator_loaders(loop, context):
                self.facts.fed_loops.add(loop)
            if not isinstance(loop, cst.For):
                continue
            for expr in loaders.iterated(loop.iter):
                expr = loaders.through_progress_variable(expr)
                code = cst.Module([]).code_for_node(expr)
                # (a loader handed in that this module also evaluates, pytorchic-bert's Trainer
                # iterating self.data_iter in train() and in eval(): the callers leave it whole
                # and the training loop shards it where it draws, at run time)
                evaluated = self._also_evaluated(code, context)
                calls = loaders.loaders_for(expr, context, depth=0) or (
                    [] if evaluated else loaders.constructor_fed(expr, context)
                )
                if not calls:
                    if not evaluated and loaders.fed_by_other_modules(expr, context):
                        self.facts.fed_loops.add(loop)
                        self.facts.training_loader_names.add((context.function, code))
                    continue
                self.facts.fed_loops.add(loop)
                self.facts.training_loader_names.add((context.function, code))
                for call in calls:
                    self.facts.loaders[call].training = True
                if (
                    not self._find_epoch_loops(loop, expr, context, calls, depth=0)
                    and context.function is not None
                    and not self.calls.call_sites(context.function)
                ):
                    # One pass per call, the calls in another module (a trainer's train()
                    # that EDSR's main.py calls in its while loop): each pass moves the
                    # sampler to its next epoch.
                    self.facts.pass_hooks.setdefault(loop, EpochHook(loop)).loaders.setdefault(
                        code, (expr, [])
                    )[1].extend(calls)

    def _also_evaluated(self, code: str, context: Context) -> bool:
        """Is the data a training loop iterates (`self.data_iter`, a parameter) also iterated
        by a loop that trains nothing, in the same class (an attribute) or function (a name)?"""
        for loop, other in self.facts.contexts.items():
            if not isinstance(loop, cst.For) or loop in self._training_loops or self._trains_inside(loop):
                continue
            same = (other.cls is context.cls and context.cls is not None) if code.startswith("self.") else (
                other.function is context.function
            )
            if not same:
                continue
            iterated = [self.loaders.through_progress_variable(expr) for expr in self.loaders.iterated(loop.iter)]
            if any(cst.Module([]).code_for_node(expr) == code for expr in iterated):
                return True
        return False

    def _mark_iterator_loaders(self, loop: Loop, context: Context) -> bool:
        """Loaders a training loop draws from with ``next(it)`` / ``next(iter(loader))``;
        True if there are any."""
        fed = False
        for call in calls_in(loop.body):
            if dotted(call.func) != "next" or not call.args:
                continue
            source = call.args[0].value
            for expr in self.loaders.iterator_sources(source):
                for found in self.loaders.loaders_for(expr, context, depth=0):
                    self.facts.loaders[found].training = True
                    self.facts.iterator_loaders.add(found)
                    fed = True
        return fed

    def _find_epoch_loops(
        self,
        loop: cst.BaseCompoundStatement,
        expr: cst.BaseExpression,
        context: Context,
        calls: list[cst.Call],
        depth: int,
    ) -> bool:
        """Attach set_epoch for `expr` to the loop around `loop`, looking through callers.
        False if no loop was found around it."""
        outer = [candidate for candidate in context.loops if candidate is not loop]
        if outer:
            hook = self.facts.epoch_hooks.setdefault(outer[-1], EpochHook(outer[-1]))
            code = cst.Module([]).code_for_node(expr)
            known = hook.loaders.setdefault(code, (expr, []))[1]
            known.extend(call for call in calls if call not in known)
            hook.uses.setdefault(code, []).append(loop)
            return True
        if context.function is None or depth > 4:
            return False
        function = context.function
        found = False
        for call_site, caller in self.calls.call_sites(function):
            if not self.calls.trains_at(function, call_site):
                continue
            mapped = self.calls.expression_in_caller(function, expr, call_site)
            if mapped is not None:
                found |= self._find_epoch_loops(call_site, mapped, caller, calls, depth + 1)
        return found

    def shard_passed_loaders(self) -> None:
        """Project mode: the loaders this module passes to another module's function that
        trains on its parameter are training loaders here; set_epoch goes in the loop around
        the call."""
        for call, context in list(self.scopes.calls):
            name = dotted(call.func)
            if not self.facts.parameter_loaders or name not in self.facts.parameter_loaders:
                continue
            for index, param in self.facts.parameter_loaders[name]:
                argument = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
                positional = [a for a in call.args if a.keyword is None and not a.star]
                if argument is None and index < len(positional):
                    argument = positional[index].value
                argument = self.loaders.through_progress_variable(argument) if argument is not None else None
                found = self.loaders.loaders_for(argument, context, depth=0) if argument is not None else []
                raw = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
                if raw is None and index < len(positional):
                    raw = positional[index].value
                if not found and isinstance(raw, (cst.Name, cst.Attribute, cst.Subscript)):
                    # a loader from a builder of another module (SCAN's get_train_dataloader()):
                    # sharded in the call's argument at run time, or stopped there with a clear error
                    self.facts.sharded_parameter_calls.add(name)
                    self.facts.passed_loaders[raw] = (call, (), context.function)
                    continue
                if not found:
                    self.scopes.problem(
                        call,
                        "DDP309",
                        f"`{name}()` trains on its `{param}` argument, and what this call passes could not be traced "
                        "to a DataLoader: every rank would train on all the data",
                    )
                    continue
                self.facts.sharded_parameter_calls.add(name)
                self.facts.passed_loaders[raw] = (call, tuple(found), context.function)
                for loader in found:
                    self.facts.loaders[loader].training = True
                if not self._find_epoch_loops(call, argument, context, found, depth=0):
                    self.facts.epochs_out_of_sight.update(found)

    def check_backward_in_forward(self) -> None:
        found = backward_in_forward(self.facts, self.scopes.calls, self.scopes.module)
        if found is not None:
            self.scopes.problem(*found)

    def check_backward_per_forward(self) -> None:
        """More backward() calls than forward calls of the wrapped model in one training loop
        (pix2pixHD: one wrapped model returns the G and D losses, each gets its backward).
        DDP all-reduces once per forward: the second backward through it fails."""
        if not self.facts.wraps:
            return
        # (StyleSpeech's `model.module.meta_learner_1(...)` runs through DDP's forward once converted)
        through = self.facts.forwards_around_ddp
        models = self.facts.model_names | wrapped_in_tuples(self.scopes.module, [site.call for site in self.facts.wraps])
        for loop in self._training_loops:
            calls = calls_in(loop.body)
            backwards = [c for c in calls if is_backward(c)]
            forwards = [c for c in calls if dotted(c.func) in self.facts.model_names or c in through]
            # (two passes through one forward that become one: transforms/merged_backwards.py)
            per_pass = backwards_per_pass(loop.body) - sum(pair.joinable for pair in backward_pairs(loop, models, self.scopes.parent))
            if forwards and per_pass > len(forwards):
                model = dotted(forwards[0].func)
                self.scopes.problem(
                    backwards[1],
                    "DDP115",
                    f"{per_pass} backward() calls per {len(forwards)} call(s) of the wrapped `{model}` in this "
                    "training loop: DDP synchronises gradients once per forward, so a second backward through the "
                    "same forward fails; wrap the networks that each loss trains separately, by hand",
                )
                return

    def mark_loader_functions(self) -> None:
        """Project mode: the loaders this module's builders return, that another module
        trains on, are training loaders here (sharded where they are built)."""
        for name, indices in self.facts.loader_functions.items():
            function = self.scopes.module_functions.get(name)
            for index in indices:
                calls = self.loaders.loaders_returned(function, index, 0) if function is not None else []
                if not calls:
                    self.facts.loader_functions_unresolved.append(name)
                for call in calls:
                    self.facts.loaders[call].training = True

    # -- passes over a training loader that do not train -----------------------------------
    def find_side_passes(self) -> None:
        """A sharded training loader that is also read once outside every loop: passed to a
        function that does not train (deeplab's calculate_weigths_labels(train_loader)), or
        iterated by a loop that trains nothing. Each rank now reads its shard only."""
        contexts = {call: context for call, context in self.scopes.calls}
        trainers = {context.function.name.value for context in self._training_loops.values() if context.function}
        trainers |= set(self.facts.parameter_loaders or ())
        for site in self.facts.training_loaders:
            target, home = self._where_bound(site, contexts)
            if target is None and site.foreign is None:
                target, home = site.call, None  # (built where it is handed on)
            elif target is None or home is None:
                continue
            for target, home in self._handed_on(target, home):
                self._find_side_passes(site, target, home, trainers)

    def _find_side_passes(self, site, target: str, home: Context, trainers: set[str]) -> None:
        """Within one binding of the loader (where it is built, or a parameter it is handed to)."""
        for call, context in self.scopes.calls:
            if any(self._draws(loop, target) for loop in context.loops) or not self._same_binding(target, home, context):
                continue  # (an epoch loop's validation of the training loader is a side pass: gopt)
            callee = dotted(call.func) or ""
            if any(dotted(arg.value) == target for arg in call.args) and reads_data(callee, trainers):
                self.facts.side_passes.setdefault(site.call, []).append((call, f"{callee}(...)"))
        for loop, context in self.facts.contexts.items():
            if not isinstance(loop, cst.For) or loop in self._training_loops:
                continue
            if any(self._draws(outer, target) for outer in context.loops):
                continue
            if not self._same_binding(target, home, context) or self._trains_inside(loop):
                continue
            if self._draws(loop, target):
                self.facts.side_passes.setdefault(site.call, []).append((loop, "a loop that trains nothing"))

    def _draws(self, loop: Loop, target: str) -> bool:
        """Does this loop iterate the loader bound to `target`?"""
        if not isinstance(loop, cst.For):
            return False
        iterated = [self.loaders.through_progress_variable(expr) for expr in self.loaders.iterated(loop.iter)]
        return any(dotted(expr) == target for expr in iterated)

    def _handed_on(self, target: str | cst.Call, home: Context | None) -> list[tuple[str, Context]]:
        """The loader's binding, and the parameters of this file's functions it is handed to
        (`train(model, tr_dataloader, ...)` -> `train_loader` in `def train(model, train_loader, ...)`);
        a DataLoader call handed on where it is built (`Trainer(net, DataLoader(...))`) has only those."""
        bindings = [(target, home)] if isinstance(target, str) else []
        for function in [*self.scopes.module_functions.values(), *self.calls.constructors()]:
            if home is not None and function is home.function:
                continue
            for call, context in self.calls.call_sites(function):
                if isinstance(target, str) and not self._same_binding(target, home, context):
                    continue
                for param in function.params.params:
                    argument = self.calls.argument_for(function, param, call)
                    if argument is target or isinstance(target, str) and dotted(argument) == target:
                        bindings.append((param.name.value, Context(function, None, ())))
                        bindings += self.calls.kept_on_self(function, param.name.value)
        return bindings


    def _where_bound(self, site, contexts: dict) -> tuple[str | None, Context | None]:
        """The name a training loader is bound to, and where: its DataLoader call's target, or
        for a loader another module builds, the target of the builder's call here
        (`self.train_loader, self.val_loader, ... = make_data_loader(args)`)."""
        if site.foreign is None:
            return site.target, contexts.get(site.call)
        call, index = site.foreign.call, site.foreign.index
        parent = self.scopes.parent(call)
        if not isinstance(parent, cst.Assign) or len(parent.targets) != 1:
            return None, None
        target = parent.targets[0].target
        if index is not None:
            if not isinstance(target, (cst.Tuple, cst.List)) or index >= len(target.elements):
                return None, None
            target = target.elements[index].value
        return dotted(target), contexts.get(call)

    @staticmethod
    def _same_binding(target: str, home: Context, context: Context) -> bool:
        """``self.x`` anywhere in the class; a plain name in the function that binds it."""
        if target.startswith("self."):
            return home.cls is not None and context.cls is home.cls
        return context.function is home.function

    def _trains_inside(self, loop: Loop) -> bool:
        return any(inner in self._training_loops for inner in walk(loop) if isinstance(inner, (cst.For, cst.While)))

