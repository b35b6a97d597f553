"""What the analysis found, keyed by original nodes: the records every room of the analysis
fills in and every transform reads (``Facts``), and the small records inside it."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from ddpify.project.dp_subclasses import SubclassPlan
    from ddpify.analysis.visitor import Analyzer

Loop = cst.For | cst.While
Function = cst.FunctionDef


@dataclass
class Guard:
    """An ``if`` (statement or expression) around a wrap, and on which side the wrap sits."""

    node: cst.If | cst.IfExp
    wraps_when_true: bool
    # The branches of this `if` (an If for its body, an Else) that reach past it with the
    # model chosen there and not wrapped (a resumed checkpoint's model), and whether the run
    # also goes past without any branch (no else) with the model bound before the `if`.
    unwrapped_branches: tuple[cst.CSTNode, ...] = ()
    falls_through_unwrapped: bool = False


@dataclass
class WrapSite:
    """One ``DataParallel(...)`` call and what surrounds it."""

    call: cst.Call
    outer: cst.BaseExpression  # the call, or the `.to(...)`/`.cuda()` call chained on it
    move: cst.Call | None  # that chained call
    module_arg: cst.BaseExpression | None
    target: str | None  # "model" / "self.model": what the wrapped model is bound to
    guards: list[Guard] = field(default_factory=list)  # enclosing `if`s that gate the wrap
    device_count: int | None = None  # number of GPUs named by a literal device_ids
    # where the call passes the model: (position, keyword); a project's DataParallel subclass
    # may take it later (CPM's `BalancedDataParallel(gpu0_bsz, model)`)
    module_slot: tuple[int, str] = (0, "module")
    # statements after the wrap that bind the wrapped name to another model (a checkpoint's
    # pickled model reloaded mid-training): wrapped again there
    rebinds: list[cst.SimpleStatementLine] = field(default_factory=list)
    # a model built here whose class's forward ran DataParallel by function (DCGAN's Generator):
    # the module is the construction itself, and its checkpoints keep the bare model's keys
    constructed: bool = False
    # where that call ran, when not in the forward of the model's class: the method of a trainer
    # whose part it ran (Dual-Path-RNN's `data_parallel(self.dualrnn, mix, ...)` in Trainer.train)
    functional_in: str = ""
    # a DataParallel subclass whose replicas synchronised BatchNorm (DataParallelWithCallback)
    sync_bn: bool = False


@dataclass(frozen=True)
class ForeignLoader:
    """Project mode: a loader that a function of another project module returns
    (``train_loader, val_loader = build_loaders(args)``): sharded there, set_epoch here."""

    call: cst.Call  # the call of that function, in this file
    function: str  # its dotted name here: "build_loaders", "data.build_loaders"
    index: int | None  # which element of the returned tuple; None: the whole value


@dataclass
class LoaderSite:
    call: cst.Call  # a stand-in node for a foreign loader (never found in the tree)
    target: str | None
    training: bool = False
    foreign: ForeignLoader | None = None


@dataclass
class EpochHook:
    """An epoch loop and the loaders whose sampler needs ``set_epoch`` at its top."""

    loop: Loop
    # code of the loader expression as the loop sees it -> (that expression, DataLoader calls)
    loaders: dict[str, tuple[cst.BaseExpression, list[cst.Call]]] = field(default_factory=dict)
    # code -> where the loop uses it: the training loop over it, or the call it is passed to
    uses: dict[str, list[cst.CSTNode]] = field(default_factory=dict)


@dataclass
class Context:
    """Where a node sits: its function, class and the loops around it in that function."""

    function: Function | None
    cls: cst.ClassDef | None
    loops: tuple[Loop, ...]


@dataclass
class Problem:
    node: cst.CSTNode
    code: str
    message: str


@dataclass
class Facts:
    wraps: list[WrapSite] = field(default_factory=list)
    dp_references: list[cst.BaseExpression] = field(default_factory=list)
    loaders: dict[cst.Call, LoaderSite] = field(default_factory=dict)
    shared_loaders: set[cst.Call] = field(default_factory=set)  # built by a helper called more than once
    iterator_loaders: set[cst.Call] = field(default_factory=set)  # drawn from with next(iter(loader))
    epoch_hooks: dict[Loop, EpochHook] = field(default_factory=dict)
    pass_hooks: dict[Loop, EpochHook] = field(default_factory=dict)  # no epoch loop in sight: see SetEpoch
    parameter_stand_ins: set[cst.Call] = field(default_factory=set)  # see Loaders.constructor_fed
    model_names: set[str] = field(default_factory=set)
    unsafe_functions: set[Function] = field(default_factory=set)
    unsafe_method_names: set[str] = field(default_factory=set)
    main_guard: cst.If | None = None
    setup_anchor: cst.CSTNode | None = None  # first top-level statement that does work
    # the function the `__main__` block runs (`if __name__ == "__main__": main()`): set-up goes
    # at its top, so that another script calling it (edge-connect's train.py: main(mode=1)) gets it
    setup_function: cst.FunctionDef | None = None
    problems: list[Problem] = field(default_factory=list)  # refuse the file
    # `nn.parallel.data_parallel(self.main, input, ...)` in a model's forward -> its class's name
    # (analysis/functional_wraps.py): called directly, the class's instances wrapped instead
    functional_calls: dict = field(default_factory=dict)
    distributed_uses: list[cst.CSTNode] = field(default_factory=list)  # DDP code already there
    contexts: dict[cst.CSTNode, Context] = field(default_factory=dict)
    has_training_step: bool = False
    training_loops: list[Loop] = field(default_factory=list)  # loops that call backward()/step()
    # functions of this file whose backward() runs once per call, outside any loop of theirs
    # (PSMNet's `def train(imgL, imgR, disp_L)` that the loop over batches calls)
    step_functions: list[Function] = field(default_factory=list)
    # functions of this file whose returned value reaches a step's backward() (a loss function)
    loss_functions: list[Function] = field(default_factory=list)
    # a training loop inside a function -> the calls of that function in this file
    step_call_sites: dict[Loop, list[cst.Call]] = field(default_factory=dict)
    # a call of another method of a wrapped model standing for its forward in a training loop
    # (StyleSpeech's `model.module.meta_learner_1(...)`) -> (model, method): run through DDP
    forwards_around_ddp: dict[cst.Call, tuple[str, str]] = field(default_factory=dict)
    fed_loops: set[Loop] = field(default_factory=set)  # training loops that draw from a known DataLoader
    # (function or None for module level, code) of what training loops there iterate: sharded
    training_loader_names: set[tuple[Function | None, str]] = field(default_factory=set)
    existing_ddp: bool = False  # torch.distributed code next to DataParallel
    star_imports: bool = False
    dp_subclasses: dict[str, cst.ClassDef] = field(default_factory=dict)  # that only forward attributes: rebased onto DDP
    # DataParallel subclasses whose wraps become ddp_wrap (project/dp_subclasses.py), as
    # called here: the project's (read from disk), this file's that only scatter
    dp_classes: dict[str, SubclassPlan] = field(default_factory=dict)
    # module-level code wraps, trains, or calls a function or class defined here (a script,
    # not an imported helper module)
    module_level_runs: bool = False
    import_time_runs: bool = False  # module_level_runs outside the `__main__` block
    import_time_calls: list[cst.Call] = field(default_factory=list)  # the calls that make it so
    # functions whose loop trains at some calls and evaluates at others (PatchmatchNet's
    # process_samples, handed train_sample or test_sample): what they print is not a shard's
    training_and_evaluating: set = field(default_factory=set)
    metric_schedulers: set[str] = field(default_factory=set)  # `scheduler` = ReduceLROnPlateau(...)
    names: set[str] = field(default_factory=set)  # every name the module uses (fresh names avoid them)
    # `n_gpu` / `args.n_gpu`: bound only ever to torch.cuda.device_count()
    gpu_count_names: set[str] = field(default_factory=set)
    project_names: frozenset[str] = frozenset()  # bound from other project modules (project mode)
    # project mode: functions of this module whose returned DataLoaders (at these indices of
    # a returned tuple; None: the value itself) another module trains on
    loader_functions: dict[str, set[int | None]] = field(default_factory=dict)
    loader_functions_unresolved: list[str] = field(default_factory=list)  # none to shard there
    # project mode (None: one file on its own): calls of other modules' functions whose
    # training loop iterates a parameter, by call name -> [(positional index, parameter name)]
    parameter_loaders: dict[str, list[tuple[int, str]]] | None = None
    # project mode: this module's trainers no caller in sight feeds (ProjectLinks.unfed): their
    # loops shard what they draw, as a single file's would
    unfed: frozenset[str] = frozenset()
    # project mode: project functions called here that the project calls elsewhere too
    # (ProjectLinks.shared_builders): their loaders are sharded where training draws them
    shared_builders: frozenset[str] = frozenset()
    # project mode: this module's top-level functions whose training loop iterates a
    # parameter no caller here feeds (the callers in other modules shard what they pass)
    loader_parameters: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    # project mode: the call names of parameter_loaders whose loader was found here, and not
    sharded_parameter_calls: set[str] = field(default_factory=set)
    # loaders handed to a training function that runs its epochs out of sight (PointRCNN's
    # trainer.train(..., train_loader, ...)): their sampler moves to the next epoch itself
    epochs_out_of_sight: set = field(default_factory=set)
    # what a call of such a training function passes as its loader (the argument's node) ->
    # (the call, the DataLoader calls it may be bound to, the function the call is in): where
    # a loader that cannot be rewritten where it is built is sharded at run time
    passed_loaders: dict = field(default_factory=dict)
    reexports: dict[str, str] = field(default_factory=dict)  # see ProjectLinks.reexports
    training_calls: frozenset[str] = frozenset()  # see ProjectLinks.training_calls
    # forms of DataParallel convert cannot rewrite, as `ddpify check` codes them: a variant
    # from another module called on a model (DDP122), a fork of DataParallel defined here
    # (DDP121); see engine.variant_refusal
    variants: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    # a training loader read once outside the training loop (class weights, mean/std): what
    # reads it, per loader call; that pass now sees this rank's shard only
    side_passes: dict[cst.Call, list[tuple[cst.CSTNode, str]]] = field(default_factory=dict)

    @property
    def foreign_training_loaders(self) -> list[ForeignLoader]:
        return [site.foreign for site in self.training_loaders if site.foreign is not None]
    analyzer: Analyzer | None = None  # answers "does this call reach the model?" for transforms

    @property
    def training_steps(self) -> list[Loop | Function]:
        """Where a training step's code is written: the training loops' bodies, the step
        functions they call and the loss functions whose value reaches backward(). The rules
        about what backward() takes read all of them."""
        return [*self.training_loops, *self.step_functions, *self.loss_functions]

    @property
    def training_loaders(self) -> list[LoaderSite]:
        return [site for site in self.loaders.values() if site.training]

    @property
    def wrap_targets(self) -> set[str]:
        """What the wrapped models are bound to (``model``, ``self.net``)."""
        return {site.target for site in self.wraps if site.target}

    def copy(self) -> Facts:
        """What the walk found, for one more resolution to decide on: its own containers and
        loader sites (a resolution marks loaders training and adds to most collections)."""
        fresh = copy.copy(self)
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, (list, dict, set)):
                setattr(fresh, item.name, copy.copy(value))
        fresh.loaders = {call: replace(site) for call, site in self.loaders.items()}
        return fresh
