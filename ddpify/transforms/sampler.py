"""DDP3xx: training DataLoaders get a DistributedSampler, so each rank sees its own shard.

A training loader is one iterated by a loop that calls ``backward()`` or ``step()``, found
directly, through a function parameter (``train(train_loader, ...)``) or through a
``self.`` attribute. ``shuffle`` moves into the sampler (DataLoader refuses both);
``drop_last`` stays on the loader. Evaluation loaders stay unsharded: every rank evaluates
the whole set, so the metrics are exactly the original's.

In project mode (``ddpify convert DIR``) a training loader that a function of another
project module returns (``train_loader, val_loader = build_loaders(args)``) is sharded
where that function builds it, and gets ``set_epoch`` where it is iterated. A loader passed
to another module's function that trains on its parameter (``train_one_epoch(model,
train_loader, ...)`` in ``engine.py``) is sharded where it is built, with ``set_epoch`` in
the loop around the call; DDP309 (error) if what the call passes cannot be traced.

DDP301  sampler added::

    loader = DataLoader(train_set, batch_size=64, shuffle=True)
    # becomes
    loader = DataLoader(train_set, batch_size=ddp_local_batch_size(64),
                        sampler=DistributedSampler(train_set, shuffle=True))

A loader that drops its last partial batch (``drop_last=True``) gives its sampler the same
``drop_last``: the tail is dropped instead of padded with repeated samples, and an epoch takes
as many steps as the original's.

DDP305  a dataset built inside the loader call moves to a variable just above it, so the
sampler shares it (evaluated once, as before)::

    train_loader = DataLoader(datasets.MNIST("data", download=True), batch_size=64)
    # becomes
    train_dataset = datasets.MNIST("data", download=True)
    train_loader = DataLoader(train_dataset, batch_size=ddp_local_batch_size(64),
                              sampler=DistributedSampler(train_dataset, shuffle=False))

DDP311  (warning) the training loader is also read once outside the training loop (passed to
a function that trains nothing, like deeplab's ``calculate_weigths_labels(train_loader)``, or
iterated by a loop without a training step): that pass now reads this rank's shard only.

DDP308  (error; a warning with ``--allow-partial``) project mode: another module trains on
what a function of this one returns, and no DataLoader built here could be traced to it.

DDP312  training data that is not sharded where it is built is sharded where the training
loop draws from it, at run time: a loader with its own ``sampler=`` (every rank draws the
same order, seeded by the epoch, and takes every world-size-th index) or ``batch_sampler=``
(each batch split between the ranks, as DataParallel split it), a DataLoader call that
cannot be rewritten, one from a builder that also makes evaluation loaders (those stay
whole), one drawn with ``next(iter(...))``, and data from outside this file's DataLoader
calls (a helper of another module, a dict of loaders, a parameter). ``ddp_shard`` rebuilds
the loader once with the same options, each process loading its share of DataParallel's
global batch, and moves to the next epoch on every pass; what it cannot rebuild (not a
DataLoader, an IterableDataset: torchtext's Multi30k, which takes no sampler) every rank draws
alike, taking its share of each batch::

    for x, y in train_loader:   ->   for x, y in ddp_shard(train_loader):
    for inputs, labels in dataloaders[phase]:
    # becomes (only the training pass is sharded)
    for inputs, labels in ddp_shard(dataloaders[phase]) if phase == 'train' else dataloaders[phase]:

In a converted project, a training DataLoader that a builder returns to another module's loop, its
call not rewritable (OKDDip's batch size inside ``**kwargs``), is sharded as the builder makes it::

    trainloader = torch.utils.data.DataLoader(trainset, shuffle=True, **kwargs)
    # becomes
    trainloader = ddp_shard(torch.utils.data.DataLoader(trainset, shuffle=True, **kwargs))

DDP313  a training loop that draws its batch by calling the script's own batch function each
step (``batch_x, batch_y = dataset.slide_seq2seq_batch(bs, L)``, the result fed to the wrapped
model): every rank draws alike and takes its share of the batch::

    x, y = data.get_batch(64)   ->   x, y = ddp_drawn(data.get_batch, 64)

DDP314  a loader with a batch sampler of the user's whose batches the loop cuts before the model
(few-shot episodes: ``split_shot_query(data, way, shot, query, episodes)``, a ``view`` by the
sampler's counts): DataParallel split the model's inputs after that cut, not the batch's
index list. Every rank draws the whole batch, alike, and each call of the wrapped model in
the loop takes its share of its inputs and gathers every rank's outputs (the gradient of each
share goes back to its rank), so the loop computes DataParallel's loss::

    for x, _ in loader:                       for x, _ in ddp_shard(loader, whole_batches=True):
        x_shot, x_query = split(x, ...)   ->      x_shot, x_query = split(x, ...)
        logits = model(x_shot, x_query)           logits = ddp_scattered(model, x_shot, x_query)

DDP304  (error; a warning with ``--allow-partial``) the script trains, but its training loop
draws from no DataLoader (a list of batches made here, tensors sliced by hand: nothing
``ddp_shard`` can split), or its training step is out of sight (no ``backward()``/``step()``
in the file, which builds an optimizer and hands its model to code from elsewhere, or imports
its project's modules): convert the folder (``ddpify convert DIR``) or shard by hand.
"""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
from libcst.metadata import ScopeProvider

from ddpify.analysis import TRAINING_WORDS, LoaderSite, bound_names, calls_in, dotted, enclosing_function, first_positional, innermost_loop, walk, without_gradients
from ddpify.analysis.tree import without_moves
from ddpify.project.neighbours import imported_project_modules
from ddpify.analysis.data_sites import (
    DataSite, counted_steps, data_expressions, data_sites, iterates_training_objects, part_of_a_model, surely_not_a_loader,
    training_condition,
)
from ddpify.analysis.counted_draws import drawn_by_torch, sliced_draws
from ddpify.analysis.scatter_points import bound_elsewhere_too, computes_with
from ddpify.analysis.step_drivers import driven_data
from ddpify.diagnostics import ENTRY, Severity
from ddpify.project.neighbours import search_folders
from ddpify.transforms.base import Block, Transform, append_arg, batch_size_arg, keyword, keyword_arg, positional_args, replace_arg

SAMPLER_IMPORT = ("torch.utils.data.distributed", "DistributedSampler", None)
# Dataset expressions that can be evaluated twice (in the loader and in the sampler).
REPEATABLE = (cst.Name, cst.Attribute, cst.Subscript)


class SamplerTransform(Transform):
    CODE_PREFIX = "DDP3"

    def __init__(self, context) -> None:
        super().__init__(context)
        # loader statement (original) -> (new variable, dataset expression) to put above it
        self._hoisted: dict[cst.SimpleStatementLine, tuple[str, cst.BaseExpression]] = {}
        # data expression of a training loop (original node) -> (its site, why): wrapped in
        # ddp_shard(...), sharded where the loop draws from it
        self._run_time: dict[cst.BaseExpression, tuple[DataSite, str]] = {}
        self._built_at_run_time: set[cst.Call] = set()  # of those, loaders another module's loops draw: sharded as made
        # the script's own batch function called by a training loop -> that loop (ddp_drawn)
        self._drawn: dict[cst.Call, cst.CSTNode] = {}
        # what the loop inside a regrouped loader's loop iterates (`batchs`) -> its site: split
        self._split_steps: dict[cst.Name, DataSite] = {}

    def check(self) -> None:
        self._cut_steps = self._counted_cuts()
        runtime: dict[cst.Call, str] = {}  # loader call -> why it is sharded where it is drawn from
        scattered, sites = self.context.scattered_loops, data_sites(self.facts)
        whole = {call for site in sites if site.loop in scattered for call in site.loaders}
        regrouped = {call for site in sites if site.regrouped and self._inner_loop(site) is not None for call in site.loaders}
        # (a name bound to a loader of this file and to one from elsewhere: HRank's ImageNet branch)
        mixed = {
            call: other for site in sites if site.loop not in scattered
            for other in [bound_elsewhere_too(site, self.facts)] if other for call in site.loaders
        }
        for site in self.facts.training_loaders:
            if site.call in whole:
                runtime[site.call] = "every rank draws its whole batches, the model's calls split them"
                continue
            if site.call in regrouped:
                runtime[site.call] = "every rank draws its whole batches alike, each step's batch is split"
                continue
            if site.call in mixed:
                runtime[site.call] = f"the loop's loader may also be `{mixed[site.call]}`, from elsewhere: sharded where the loop draws, whichever it is"
                continue
            if _items_are_batches(site.call):
                runtime[site.call] = (
                    "one item per step, made the step's batch by its own collate_fn: every rank draws the same item and "
                    "takes its share, as DataParallel split it"
                )
                continue
            if site.foreign is not None or site.call in self.facts.parameter_stand_ins:
                # Built by another module of the project, which shards it (or the project
                # is refused with it): here it only needs set_epoch.
                self.context.sharded_loaders.add(site.call)
                continue
            reason = self._not_sharded_where_built(site.call)
            if reason == "":
                continue  # already distributed
            gated = self._read_when(site.call, sites)
            if reason is None and gated is not None:
                reason = f"the passes that read it train only when `{gated}` (the others evaluate on all of it)"
            if reason:
                runtime[site.call] = reason
                continue
            # Known before the walk: an epoch loop above the loader's line (a train function
            # defined before main builds the loader) gets its set_epoch too.
            self.context.sharded_loaders.add(site.call)
        self._plan_run_time_shards(runtime)
        self._shard_driven_data()
        for call, readers in self.facts.side_passes.items():
            if call not in self.context.sharded_loaders:
                continue  # the loader itself stays whole: the pass reads all of it
            for reader, what in readers:
                self.context.report(
                    reader,
                    "DDP311",
                    f"the training loader is also read outside the training loop by {what}: that pass now sees "
                    "this rank's shard only (class weights, statistics and caches computed from it differ per "
                    "rank); compute it over the dataset, or all-reduce what it counts",
                    Severity.WARNING,
                )
        trains_ddp = bool(self.facts.wraps) or self.context.model_elsewhere
        if trains_ddp and (self.facts.training_loaders or self._run_time or self._drawn):
            for loop in self._unfed_training_loops():
                self.context.report_unsound(loop, "DDP304", self._no_loader(loop))
        out_of_sight = self._training_out_of_sight()
        if out_of_sight:
            self.context.report_unsound(self.facts.wraps[0].call, "DDP304", out_of_sight)
        for name in self.facts.loader_functions_unresolved:
            self.context.report_unsound(
                self.context.module,
                "DDP308",
                f"another module of the project trains on what `{name}()` returns, but no DataLoader built "
                "here could be traced to it: every rank would train on all the data",
            )
        # (a loop over a loader parameter is sharded by the callers in other modules; a library's
        # step outside any loop, like an optimizer wrapper's `self._optimizer.step()`, runs in
        # a loop of the module that calls it, which is checked there)
        # (nor are loops over the model's parts, a backward() each: Wave-U-Net's compute_loss)
        data_loops = [
            loop for loop in self.facts.training_loops
            if not (isinstance(loop, cst.For) and part_of_a_model(loop.iter, loop)) and not self._serves_another_loop(loop)
        ]
        library_step_only = self.context.is_library and not data_loops
        # (an entry script that hands only its settings to a project training function, hotpot's
        # `train(config)`: the loop over data is in that function's module, checked there)
        # (nor one whose loops train only through another module's trainer, EDSR's `while not
        # t.terminate(): t.train()`: the data loop is there)
        delegated = not any(_calls_backward(loop) for loop in self.facts.training_loops)
        library_step_only |= (self.context.role == ENTRY or self.context.trains_elsewhere) and delegated
        if (
            trains_ddp
            and self.facts.has_training_step
            and not library_step_only
            and not self.facts.training_loaders
            and not self.facts.loader_parameters
            and not self._run_time
            and not self._drawn
        ):
            unfed = self._unfed_training_loops()
            if (self._cut_steps or self.context.scattered_loops) and not unfed:
                return  # (every loop that trains cuts its batches out of data held whole, or splits it at the model)
            innermost = [loop for loop in unfed if not any(inner in unfed for inner in walk(loop.body))]
            iterated = [self.context.code(loop.iter) for loop in innermost if isinstance(loop, cst.For)]
            message = self._no_loader(innermost[0]) if innermost else (
                "no loop here draws batches and trains on them (backward()/step() run outside any loop over data, "
                "or in a function this file cannot follow): every rank would train on all the data; " + self._out_of_sight_remedy()
            )
            self.context.report_unsound(self.facts.wraps[0].call if self.facts.wraps else self.context.module, "DDP304", message)

    def _not_sharded_where_built(self, call: cst.Call) -> str | None:
        """Why this training DataLoader is sharded where the loop draws from it rather than
        where it is built (None: rewritten where it is built; "": already distributed)."""
        own = self._own_sampler(call)
        if own is not None:
            if "Distributed" in self.context.code(own.value):
                return ""
            if own.keyword.value == "batch_sampler":
                return "each batch of its own batch_sampler is split between the ranks, as DataParallel split it"
            return "its own sampler= draws the same order on every rank, and each rank takes its share"
        if call in self.facts.shared_loaders:
            return "the function that builds it also builds loaders that are not trained on, which stay whole"
        if call in self.facts.side_passes:
            readers = ", ".join(dict.fromkeys(what for _, what in self.facts.side_passes[call]))
            return f"it is also read outside the training loop (by {readers}), which still reads all of it"
        reason = self._unsupported(call)
        if reason:
            return f"the DataLoader call cannot be rewritten where it is built ({reason})"
        streamed = self._iterable_dataset(call)
        if streamed:
            return f"its dataset is iterable ({streamed}), which takes no sampler: each rank takes its share of the batches it yields"
        shuffle = _shuffle_by_keyword(call)[1]
        if call in self.facts.iterator_loaders and shuffle is not None and self.context.code(shuffle.value) != "False":
            return "it is drawn from with next(iter(...)): each new iter() is the next epoch, reshuffled"
        return None

    def _iterable_dataset(self, call: cst.Call) -> str | None:
        """What makes the loader's dataset an IterableDataset, as far as this file tells: a
        stream of a library that yields samples (torchtext's datasets, torchdata's pipes,
        webdataset, a streamed Hugging Face dataset), or a class of this file built on one. A
        DistributedSampler there stops the script (B's Multi30k translation)."""
        dataset = keyword_arg(call, "dataset") or next((arg for arg in call.args if arg.keyword is None), None)
        if dataset is None:
            return None
        values = [dataset.value]
        if isinstance(dataset.value, cst.Name):
            values = [
                without_moves(node.value) for node in walk(self.context.module)
                if isinstance(node, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == dataset.value.value for t in node.targets)
            ] or values
        for value in values:
            made = value.func if isinstance(value, cst.Call) else value
            for name in self.context.qualified(made):
                if name.startswith(STREAMING_LIBRARIES) or name in self._iterable_classes:
                    return f"`{self.context.code(made)}`"
                if name == "datasets.load_dataset" and isinstance(value, cst.Call) and any(
                    arg.keyword is not None and arg.keyword.value == "streaming" and self.context.code(arg.value) == "True" for arg in value.args
                ):
                    return "a streamed `load_dataset`"
        return None

    @property
    def _iterable_classes(self) -> set[str]:
        """This file's classes built on IterableDataset."""
        if not hasattr(self, "_streams"):
            self._streams = {
                node.name.value for node in walk(self.context.module)
                if isinstance(node, cst.ClassDef) and any("IterableDataset" in self.context.code(base.value) for base in node.bases)
            }
        return self._streams

    def _plan_run_time_shards(self, runtime: dict[cst.Call, str]) -> None:
        """Training data not sharded where it is built is wrapped where the loop draws it."""
        for site in data_sites(self.facts):
            if site.regrouped and self._inner_loop(site) is None:
                self._report_regrouped(site)
            elif site.regrouped:
                # (each loaded item cut into the steps' batches, FastSpeech2's collate: every
                # rank draws the loader's batches whole and alike, and splits each step's batch)
                self.context.regrouped_loaders.update(site.loaders)
                self._split_steps[self._inner_draw(site)[1]] = site
            if site.loaders and all(call in self.context.sharded_loaders for call in site.loaders):
                continue
            if not site.loaders and self._fed_where_built(site):
                continue
            reasons = [runtime[call] for call in site.loaders if call in runtime]
            unmarked = [call for call in site.loaders if not self.facts.loaders[call].training]
            if reasons:
                self._run_time[site.expr] = (site, reasons[0])
            elif unmarked:
                # built where it is drawn (Retinaface's iter(DataLoader(...)) each epoch), or
                # drawn through a step function (crnn's trainBatch() reads a global iterator):
                # no epoch loop is known for it, and ddp_shard moves its epoch itself
                why = "it is built where the loop draws from it" if isinstance(site.expr, cst.Call) else (
                    "the loop draws it through a step function or an iterator made elsewhere"
                )
                self._run_time[site.expr] = (site, why)
            elif not site.loaders and surely_not_a_loader(site, self.facts) is None:
                self._run_time[site.expr] = (site, "it is not traced to a DataLoader call of this file")
            elif not site.loaders:
                # a list of batches made here (SpanBERT): each batch split between the ranks
                self._run_time[site.expr] = (site, "it is a list of batches made here, not a DataLoader: each of its batches is split between the ranks, as DataParallel split it")
        self._split_drawn_batches()
        self._split_drawn_calls()
        self.context.drawn_calls |= set(self._drawn)
        self._shard_passed_at_run_time(runtime)
        # (a loop that holds each batch whole divides neither its batch size nor its sums)
        divided = {expr: site for expr, (site, _) in self._run_time.items() if site.loop not in self.context.scattered_loops}
        self.context.run_time_loaders.update(call for site in divided.values() if not site.regrouped for call in site.loaders)
        # (not a loop whose passes train or evaluate by a test, `if phase == 'train'`: a division by
        # its data set's length is the whole set's on an evaluating pass; its prints sum by that test)
        self.context.run_time_shards.update(
            (site.function, self.context.code(expr)) for expr, site in divided.items() if not isinstance(self._site_condition(site), tuple)
        )

    def _split_drawn_batches(self) -> None:
        """A training loop that draws its batches with ``next(it)`` from an iterator of its own
        (NER-BERT's ``next(data_iterator)``, a generator of the project): every rank draws
        alike and takes its share of each batch (ddp_shard splits what is not a DataLoader)."""
        fed = self.facts.fed_loops | {site.loop for site, _ in self._run_time.values()}
        for loop in self.facts.training_loops:
            if loop in fed or not self._steps_each_pass(loop):
                continue
            context = self.facts.contexts[loop]
            for call in calls_in(loop.body):
                if innermost_loop(call, self.context.parent) is not loop or without_gradients(call, self.context.parent, self.context.code):
                    continue  # a validation pass inside the epoch loop draws its own batches whole
                source = None
                if dotted(call.func) == "next" and call.args and isinstance(call.args[0].value, (cst.Name, cst.Attribute)):
                    source = call.args[0].value
                elif isinstance(call.func, cst.Attribute) and call.func.attr.value in ("next", "__next__") and not call.args:
                    source = call.func.value  # `args.train_dataprovider.next()` (ShuffleNet-Series)
                if source is not None and isinstance(source, (cst.Name, cst.Attribute)):
                    reason = "it is an iterator of the script's own, not a DataLoader: every rank draws its batches alike and takes its share of each, as DataParallel split it"
                    self._run_time.setdefault(source, (DataSite(loop, source, (), context.function), reason))

    def _split_drawn_calls(self) -> None:
        """A training loop that draws no loader but calls the script's own batch function each
        step (MusicTransformer's ``batch_x, batch_y = dataset.slide_seq2seq_batch(...)``, fed
        to the wrapped model): every rank makes the same draw and takes its share of the batch,
        as DataParallel's scatter split it (ddp_drawn). Not with a wrap that splits along
        another dimension than the first (``DataParallel(model, dim=1)``)."""
        if any(keyword_arg(site.call, "dim") is not None for site in self.facts.wraps):
            return
        fed = self.facts.fed_loops | {site.loop for site, _ in self._run_time.values()}
        for loop in self.facts.training_loops:
            if loop in fed and isinstance(loop, cst.For):
                self._split_joined_draws(loop)
            if loop in fed or any(other in fed for other in walk(loop.body)) or not self._steps_each_pass(loop):
                continue
            if any(outer in fed for outer in self.facts.contexts[loop].loops):
                continue  # (Tacotron2-Pytorch: cuts each item of a sharded loader into its steps' batches)
            fed_to_model = self._fed_to_the_model(loop)
            for node in walk(loop.body):
                if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Call):
                    continue
                if innermost_loop(node, self.context.parent) is not loop or without_gradients(node, self.context.parent, self.context.code):
                    continue
                if self._draws_a_batch(node.value) and {n for t in node.targets for n in bound_names(t.target)} & fed_to_model:
                    self._drawn[node.value] = loop

    def _steps_each_pass(self, loop: cst.CSTNode) -> bool:
        """The loop calls backward(), or a step function of this file (Tacotron's ``loss =
        train_batch(mels, mags, texts, encoder, ...)``, backward and step inside): one training
        step a pass either way."""
        if _calls_backward(loop):
            return True
        if not hasattr(self, "_step_calls"):
            graph = self.facts.analyzer.calls
            self._step_calls = {id(site) for function in self.facts.step_functions for site, _ in graph.call_sites(function)}
        return any(id(node) in self._step_calls for node in walk(loop))

    def _split_joined_draws(self, loop: cst.For) -> None:
        """A loader's batch joined with more samples the script draws each step (EEG-Conformer's
        ``aug_data, aug_label = self.interaug(...)``, then ``img = torch.cat((img, aug_data))``):
        each process holds its share of the loader's batch, and takes its share of the draw."""
        batch = {n.value for n in walk(loop.target) if isinstance(n, cst.Name)}
        drawn: dict[str, cst.Call] = {}
        for node in walk(loop.body):
            if not isinstance(node, cst.Assign) or innermost_loop(node, self.context.parent) is not loop:
                continue
            targets = {n for t in node.targets for n in bound_names(t.target)}
            reads = {n.value for n in walk(node.value) if isinstance(n, cst.Name)}
            if reads & batch:
                batch |= targets
            elif isinstance(node.value, cst.Call) and not self._library_call(node.value) and not without_gradients(node, self.context.parent, self.context.code):
                drawn.update((name, node.value) for name in targets)
        for call in calls_in(loop.body):
            if not ({"torch.cat", "numpy.concatenate", "torch.concat"} & self.context.qualified(call.func)) or not call.args:
                continue
            parts = {n.value for n in walk(call.args[0].value) if isinstance(n, cst.Name)}
            if parts & batch:
                for name in parts & drawn.keys():
                    self._drawn[drawn[name]] = loop

    def _library_call(self, call: cst.Call) -> bool:
        """torch's, numpy's, a builtin's, or a model's (``model.module.parse_batch``): not a draw
        of the script's own."""
        name = dotted(call.func) or ""
        owner = name.rpartition(".")[0].removesuffix(".module")
        if name in self.facts.model_names or owner in self.facts.model_names:
            return True
        return any(q.split(".")[0] in ("torch", "numpy", "builtins") for q in self.context.qualified(call.func))

    def _draws_a_batch(self, call: cst.Call) -> bool:
        """The script's own batch function: not torch's, numpy's or a model's, named for a batch."""
        return not self._library_call(call) and "batch" in (dotted(call.func) or "").rpartition(".")[2].lower()

    def _reads_nothing_made_here(self, call: cst.Call, made_here: set[str]) -> bool:
        """A call given neither the model nor anything the loop computes (a draw, as far as its
        arguments tell: AlignGAN's ``loaders.ir_train_iter.next_one()``), not torch's."""
        if self._library_call(call):
            return False
        read = {dotted(node) for node in walk(call) if isinstance(node, (cst.Name, cst.Attribute))} - {dotted(call.func)}
        given = {n.value for arg in call.args for n in walk(arg.value) if isinstance(n, cst.Name)}
        return not (read & self.facts.model_names) and not (given & made_here)

    def _fed_to_the_model(self, loop: cst.CSTNode) -> set[str]:
        """Names whose values reach a call of a wrapped model in ``loop`` (through the
        assignments of the loop that compute from them: ``x = torch.from_numpy(x).to(device)``),
        or a call of a function the model is handed to with them (a loss helper that runs it:
        info8010's GPT ``loss = lm_loss(lm, x, y)``)."""
        models = self.facts.model_names
        fed = {
            n.value for call in calls_in(loop.body)
            if (dotted(call.func) or "").removesuffix(".forward") in models
            or not self._library_call(call) and any(dotted(arg.value) in models for arg in call.args)
            for arg in call.args for n in walk(arg.value) if isinstance(n, cst.Name)
        }
        assigns = [node for node in walk(loop.body) if isinstance(node, cst.Assign)]
        for _ in range(3):  # a few steps back along the assignments
            for assign in assigns:
                if {n for t in assign.targets for n in bound_names(t.target)} & fed:
                    fed |= {n.value for n in walk(assign.value) if isinstance(n, cst.Name)}
        return fed

    def _shard_driven_data(self) -> None:
        """A loader handed to a library's engine built around this file's training step
        (ignite's ``Engine(_update).run(train_loader)``): sharded in that argument, at run time."""
        for call, data, step in driven_data(self.facts, self.context.module, self.context.parent, self.context.qualified):
            if data in self._run_time:
                continue
            context = self.facts.contexts.get(call)
            site = DataSite(call, data, (), context.function if context is not None else None)
            driver = self.context.code(call.func)
            self._run_time[data] = (site, f"`{driver}` runs the training step `{step}` on each of its batches")

    def _shard_passed_at_run_time(self, runtime: dict[cst.Call, str]) -> None:
        """A training loader that cannot be sharded where it is built and that no loop here
        draws from: handed to a training function out of sight (robot-surgery-segmentation's
        `utils.train(train_loader=make_loader(...))`, its builder shared with the validation
        loader). It is sharded in the call's argument; a loader that reaches training some
        other way is refused, never left whole."""
        covered = {call for site, _ in self._run_time.values() for call in site.loaders}
        for argument, (trainer, loaders, function) in self.facts.passed_loaders.items():
            if not loaders and argument not in self._run_time:
                self._run_time[argument] = (DataSite(trainer, argument, (), function), "it is not traced to a DataLoader call of this file")
        for call, reason in runtime.items():
            if call in covered:
                continue
            passed = [(arg, where) for arg, where in self.facts.passed_loaders.items() if call in where[1]]
            for argument, (trainer, loaders, function) in passed:
                if argument not in self._run_time:
                    self._run_time[argument] = (DataSite(trainer, argument, loaders, function), reason)
            if not passed and self._returned_for_training(call):
                # (OKDDip's `dataloader()` of models/data_loader.py, its batch size inside **kwargs,
                # returns the loader that train.py's loop draws: sharded as it is made, at run time)
                self._built_at_run_time.add(call)
                self._run_time[call] = (DataSite(call, call, (call,), enclosing_function(call, self.context.parent)), reason)
            elif not passed:
                self.context.report_unsound(
                    call,
                    "DDP304",
                    f"this training DataLoader cannot be sharded where it is built ({reason}), and no loop of this "
                    "file draws from it where it could be: every rank would train on all the data; shard it by hand",
                )

    def _returned_for_training(self, call: cst.Call) -> bool:
        """Is ``call`` in a function whose returned loaders the project's training loops draw
        (a builder another module calls, ``facts.loader_functions``)?"""
        function = enclosing_function(call, self.context.parent)
        return function is not None and function.name.value in self.facts.loader_functions

    def _inner_loop(self, site: DataSite) -> cst.For | None:
        """The loop inside a regrouped site's loop that iterates each loaded item (`for batch in
        batchs:`, `for j, batch in enumerate(batchs):`), where the steps' batches are drawn."""
        found = self._inner_draw(site)
        return found[0] if found is not None else None

    def _inner_draw(self, site: DataSite) -> tuple[cst.For, cst.Name] | None:
        """That loop, and the name of the loaded item it iterates, seen through enumerate, zip
        and progress bars (tacotron2's ``for j, db in enumerate(batchs):``)."""
        names = bound_names(site.loop.target) if isinstance(site.loop, cst.For) else set()
        for node in walk(site.loop.body):
            if not isinstance(node, cst.For):
                continue
            drawn = [e for e in data_expressions(node.iter, self.facts.analyzer) if isinstance(e, cst.Name) and e.value in names]
            if len(drawn) == 1:
                return node, drawn[0]
        return None

    def _split_step_batches(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        site = self._split_steps[original]
        self.context.use_helper("DdpSplit")
        self.context.report(
            original, "DDP406",
            f"each item of `{self.context.code(site.expr)}` is cut into the training steps' batches: every process draws "
            "the loader's batches whole and alike (ddp_shard(..., whole_batches=True)), and each step's batch "
            f"`{self.context.code(original)}` yields is split between the processes (DdpSplit), as DataParallel split it",
        )
        return cst.Call(func=cst.Name("DdpSplit"), args=[cst.Arg(updated)])

    def _report_regrouped(self, site: DataSite) -> None:
        """The loader's batch is cut into the steps' batches after it is loaded: dividing it
        by the world size would not divide the step's batch (and with more ranks than sub-batches
        no rank would step), so each process keeps the loader's batch."""
        self.context.regrouped_loaders.update(site.loaders)
        self.context.report(
            site.expr,
            "DDP406",
            f"each item of `{self.context.code(site.expr)}` is cut into the training steps' batches (the loop inside "
            "iterates it): the loader's batch is not the step's batch, so each process keeps the loader's batch size; "
            "every step's global batch is world size x the step's batch (adjust the learning rate if needed)",
            Severity.WARNING,
        )

    def _fed_where_built(self, site: DataSite) -> bool:
        """Project mode: a loader parameter or a constructor's loader that the modules which
        build it shard there (loader_parameters)."""
        key = (site.function, self.context.code(site.expr))
        return site.loop in self.facts.fed_loops and key in self.facts.training_loader_names

    def _shard_at_run_time(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
        site, reason = self._run_time[original]
        condition = self._site_condition(site)
        if condition is False:
            return updated  # (handed to a function this call does not train with: evaluation reads it whole)
        code = self.context.code(original)
        self.context.add_import(*SAMPLER_IMPORT)
        per_process = self.context.options.per_process_batch
        batch = "each process loads its own batch" if per_process or site.regrouped else "each process loads its share of each batch"
        whole = site.loop in self.context.scattered_loops or site.regrouped and self._inner_loop(site) is not None
        if whole and site.regrouped:
            pass  # (reported where each step's batch is split: DDP406)
        elif whole:
            self.context.report(original, "DDP314", f"`{code}`: {self._why_whole(site.loop)}: every process draws the "
                "whole batch (ddp_shard(..., whole_batches=True), alike on every rank), and the wrapped model's calls in "
                "the loop take their share of their inputs and gather every process's outputs (ddp_scattered), as "
                "DataParallel's scatter and gather did; the data loading is not divided between the processes")
        elif original in self._built_at_run_time:
            self.context.report(
                original,
                "DDP312",
                f"this training DataLoader is sharded as it is made (ddp_shard, at run time): {reason}; the training "
                f"loops of the modules that call `{site.function.name.value}()` draw from it; {batch}; each pass over it "
                "is the next epoch",
            )
        else:
            self.context.report(
                original,
                "DDP312",
                f"`{code}` is sharded where the training loop draws from it (ddp_shard, at run time): {reason}; "
                f"{batch}; each pass over it is the next epoch",
            )
        everywhere = original in self._built_at_run_time  # (the callers' set_epoch needs its sampler in a world of one too)
        shard = cst.parse_expression(self.context.shard_call("_", per_process=site.regrouped, whole_batches=whole, everywhere=everywhere))
        sharded = shard.with_changes(args=[shard.args[0].with_changes(value=updated), *shard.args[1:]])
        if condition is None:
            return sharded
        test, when = condition
        train, other = (sharded, updated) if when else (updated, sharded)
        return cst.IfExp(test=test.deep_clone(), body=train, orelse=other.deep_clone() if other is updated else other)

    def _read_when(self, call: cst.Call, sites: list[DataSite]) -> str | None:
        """The test that decides whether a pass reading this loader trains, where one does
        (echonet's ``run_epoch(model, dataloader, phase == "train", ...)`` in a loop over
        phases): a sampler where it is built would shard the evaluation passes too."""
        calls = self.facts.analyzer.calls
        for site in (site for site in sites if call in site.loaders):
            condition = self._site_condition(site)
            if not isinstance(condition, tuple):
                continue
            params = {p.name.value for p in site.function.params.params} if site.function is not None else set()
            if not {n.value for n in walk(condition[0]) if isinstance(n, cst.Name)} <= params or isinstance(site.loop, cst.Call):
                return self.context.code(condition[0])  # (the loop's own test: `if phase == "train":`)
            # a switch its callers set: only where one computes it (literals pick whole loaders)
            computed = [found for other, _ in calls.call_sites(site.function) for found in [calls.switch_passed(site.function, other)] if found]
            if computed:
                return self.context.code(computed[0][0])
        return None

    def _site_condition(self, site: DataSite) -> tuple[cst.BaseExpression, bool] | bool | None:
        """The test that decides whether a pass of the site's loop (or the call it is handed to) trains."""
        return self._handed_condition(site.loop) if isinstance(site.loop, cst.Call) else training_condition(site.loop, self.facts)

    def _handed_condition(self, call: cst.Call) -> tuple[cst.BaseExpression, bool] | bool | None:
        """A loader handed to a function of this file that trains only when a parameter says so:
        False when this call says it does not (``run_epoch(model, loader, False, ...)``), the
        caller's test when it computes one (``phase == "train"``); None when every call trains
        (a training function out of sight: every pass there trains)."""
        calls = self.facts.analyzer.calls
        function = calls.callee(call, self.facts.contexts.get(call))
        if function is None:
            return None
        if not calls.trains_at(function, call):
            return False
        return calls.switch_passed(function, call)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node in self._split_steps:
            return self._split_step_batches(original_node, updated_node)
        return self._shard_at_run_time(original_node, updated_node) if original_node in self._run_time else updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return self._shard_at_run_time(original_node, updated_node) if original_node in self._run_time else updated_node

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        return self._shard_at_run_time(original_node, updated_node) if original_node in self._run_time else updated_node

    def _why_whole(self, loop: cst.CSTNode) -> str:
        coupled = self.context.batch_coupled
        loss = next((call for call in calls_in(loop.body) if computes_with(call, frozenset(coupled))), None)
        if loss is not None:
            name = dotted(loss.func) if dotted(loss.func) in coupled else next(dotted(a.value) for a in loss.args if dotted(a.value) in coupled)
            made = coupled[name]
            what = f"`{name}` ({made}, a module of this project)" if made else f"`{name}` (a module of this project)"
            return (
                f"the loop's loss {what} divides by a count of the batch's content or keeps its hardest elements, "
                "which DataParallel counted and ranked over the whole batch"
            )
        return (
            "the loop cuts each batch of its own batch_sampler by the sampler's counts before the model (episodes, "
            "groups), so a share of the batch's indices would break that structure"
        )

    def _scattered(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        """``model(a, b)`` -> ``ddp_scattered(model, a, b)`` in a loop whose batch stays whole."""
        self.context.use_helper("ddp_scattered")
        model = updated_node.func
        if isinstance(model, cst.Attribute) and model.attr.value == "forward":
            model = model.value  # (through the wrap: DDP averages the gradients only then)
        return cst.Call(func=cst.Name("ddp_scattered"), args=[cst.Arg(model, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), *updated_node.args])

    def _out_of_sight_remedy(self) -> str:
        """Where the training may be when no loop here draws data: a module of the project the
        script imports (a Solver class's step_one_epoch) is converted with the folder."""
        modules = imported_project_modules(self.context.path, self.context.module.code)
        if not modules:
            return "shard it by hand"
        shown = ", ".join(f"`{name}`" for name in modules[:3])
        return f"the training may run in a module of this project it imports ({shown}): convert the folder (`ddpify convert DIR`)"

    def _counted_cuts(self) -> dict[cst.CSTNode, list[cst.Subscript]]:
        """Training loops that count their steps and cut each step's batch out of data held
        whole (analysis/counted_draws.py): each rank takes its part of every cut (DDP315)."""
        if self.context.options.per_process_batch or self.context.is_library:
            return {}
        if any(_gives_a_dim(site.call) for site in self.facts.wraps):
            return {}  # (DataParallel scattered another dimension: a language model's (time, batch) cuts)
        found = {
            loop: cuts for loop in self.facts.training_loops
            if loop not in self.facts.fed_loops and _calls_backward(loop) and (cuts := sliced_draws(loop))
        }
        training = set(self.facts.training_loops)
        torch_drawn = drawn_by_torch(self.context.module)
        found = {
            loop: cuts for loop, cuts in found.items()
            # (nested counted steps, an accumulation over the batch's pieces, cut by the global sizes:
            # split once, its pieces came out empty; a torch draw cut is each rank's own: both stay DDP304)
            if not any(inner in training for inner in walk(loop.body))
            and not any(outer is not loop and any(node is loop for node in walk(outer.body)) for outer in found)
            and not any(name.value in torch_drawn for cut in cuts for name in walk(cut.value) if isinstance(name, cst.Name))
        }
        self.context.split_cuts.update(cut for cuts in found.values() for cut in cuts)
        return found

    def _no_loader(self, loop: cst.CSTNode) -> str:
        """The true blocker of a training loop that draws from no DataLoader."""
        drawn = [call for call in calls_in(loop.body) if dotted(call.func) == "next" and call.args]
        if drawn:  # `for i in trange(steps): batch = next(data_iterator)` (NER-BERT's own generator)
            source = self.context.code(drawn[0].args[0].value)
            return (
                f"this training loop draws its batches with `next({source})`, and `{source}` does not come from a "
                "DataLoader (a generator or iterator of the project): its batches cannot be split between the ranks "
                "(every rank would train on all of them); make its data a Dataset in a DataLoader, or give each "
                "rank its share by hand"
            )
        what = f"`{self.context.code(loop.iter)}`" if isinstance(loop, cst.For) else "what its body reads"
        draw = self._unfollowed_draw(loop)
        if draw is not None:  # (AlignGAN: `loaders.ir_train_iter_ide.next_one()`, a project iterator around a loader)
            return (
                f"this training loop draws its batches with `{self.context.code(draw)}`, which ddpify does not follow to a "
                "DataLoader (a method or function of the project, or of a parameter): its batches cannot be split between "
                "the ranks here (every rank would train on all of them); iterate the DataLoader in the loop "
                "(`for batch in loader`), or give each rank its share by hand"
            )
        if isinstance(loop, cst.For) and counted_steps(loop.iter) and sliced_draws(loop):
            return (
                f"this training loop counts its steps ({what}) and cuts each step's batch out of data held whole, but "
                "out of a torch random draw (each rank's own after the first step) or in counted steps within counted "
                "steps (the pieces cut by the global sizes): its cuts cannot be split alike between the ranks; draw the "
                "order with numpy or Python's random (alike on every rank, DDP315), or make the data a Dataset in a "
                "DataLoader to shard it"
            )
        if isinstance(loop, cst.For) and counted_steps(loop.iter):
            return (
                f"this training loop counts its steps ({what}) and each step trains on data held whole here (a graph, "
                "tensors made before the loop), drawn from no DataLoader and cut at no place its counter says (a cut "
                "`X[i * bs:(i + 1) * bs]` would be split between the ranks, DDP315): every rank would take the same whole "
                "step; run it as one process, or make the data a Dataset in a DataLoader to shard it"
            )
        return (
            f"this training loop iterates {what}, not a DataLoader: its batches cannot be split between the "
            "ranks (every rank would train on all of them); make them a Dataset in a DataLoader, or give each "
            "rank its share by hand"
        )

    def _unfollowed_draw(self, loop: cst.CSTNode) -> cst.Call | None:
        """The first call of the loop that yields values it uses (``ir_images, ir_pids, _, _ =
        loaders.ir_train_iter_ide.next_one()``), reading nothing the loop computes: its draw."""
        made_here = {n for node in walk(loop.body) if isinstance(node, cst.Assign) for t in node.targets for n in bound_names(t.target)}
        for node in walk(loop.body):
            if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Call) or self._library_call(node.value):
                continue
            if not any(isinstance(t.target, (cst.Tuple, cst.List)) for t in node.targets):
                continue
            if {n for t in node.targets for n in bound_names(t.target)} - {"_"} and self._reads_nothing_made_here(node.value, made_here):
                return node.value
        return None

    def _training_out_of_sight(self) -> str | None:
        """The script wraps a model and builds an optimizer or hands its model on, but no
        backward()/step() is in it: the training step runs in code this file does not hold."""
        if not self.facts.wraps or self.facts.has_training_step or self.context.trains_elsewhere:
            return None
        modules = self._imports_project_modules()
        handed = self._model_handed_on()
        if not modules and handed is None:
            return None  # evaluation or export with a wrapped model: nothing trains
        where = f"`{handed}`" if handed else f"the modules it imports ({', '.join(modules)})"
        return (
            f"no backward()/step() in this file: the training step runs in {where}, out of sight, so what it "
            "draws from cannot be sharded here; convert the folder that holds both (`ddpify convert DIR`)"
        )

    def _model_handed_on(self) -> str | None:
        """A call of code from elsewhere given the wrapped model (``trainer.train(model, ...)``,
        ``Solver(data, model, optimizer).train()``), in a file that builds an optimizer."""
        names = self.facts.wrap_targets
        builds_optimizer = any(
            any(name.startswith("torch.optim.") for name in self.context.qualified(call.func))
            for call in walk(self.context.module)
            if isinstance(call, cst.Call)
        )
        if not builds_optimizer:
            return None
        defined = {node.name.value for node in walk(self.context.module) if isinstance(node, (cst.FunctionDef, cst.ClassDef))}
        handed = []
        for call in walk(self.context.module):
            if not isinstance(call, cst.Call) or not any(cst.Module([]).code_for_node(arg.value) in names for arg in call.args):
                continue
            func = self.context.code(call.func)
            if func.split(".")[0] in defined or any(n.startswith(("torch.", "builtins.")) for n in self.context.qualified(call.func)):
                continue
            handed.append(func)
        # the call that trains, where one says so (HRNet: `train(...)`, not `get_model_summary(...)`)
        training = [func for func in handed if any(word in func.rpartition(".")[2].lower() for word in TRAINING_WORDS)]
        return f"{(training or handed)[0]}(...)" if handed else None

    def _imports_project_modules(self) -> list[str]:
        """Modules this script imports from its own project (a relative import, or a module or
        package next to the script): where its training step may live."""
        folder = Path(self.context.path).parent
        found = []
        for statement in self.context.module.body:
            for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else []:
                if isinstance(small, cst.ImportFrom) and small.relative:
                    found.append(self.context.code(small.module) if small.module else ".")
                elif isinstance(small, cst.ImportFrom) and small.module is not None:
                    found.append(self.context.code(small.module))
                elif isinstance(small, cst.Import):
                    found += [self.context.code(alias.name) for alias in small.names]
        try:  # (and the project root above it, as the project reader finds them: mdistiller's tools/train.py)
            folders = search_folders(folder, ast.parse(self.context.module.code))
        except (SyntaxError, ValueError):
            folders = [folder]
        return list(dict.fromkeys(name for name in found if name == "." or any(_next_to(where, name.split(".")[0]) for where in folders)))

    def _unfed_training_loops(self) -> list[cst.CSTNode]:
        """Training loops that neither draw from a known loader nor sit inside or around one
        that does (an epoch loop around the loader loop, a chunk loop inside it)."""
        fed = self.facts.fed_loops | {site.loop for site, _ in self._run_time.values()} | set(self._drawn.values()) | set(self._cut_steps)
        fed |= set(self.context.scattered_loops)  # (a whole-data step split at the model: whole_data_steps)
        unfed = []
        for loop in self.facts.training_loops:
            if not _calls_backward(loop):
                continue  # an epoch loop that steps a scheduler: its data comes from inside the calls
            if isinstance(loop, cst.For) and (part_of_a_model(loop.iter, loop) or iterates_training_objects(loop)):
                continue  # a backward() per part of the model, or a step per optimizer, on data drawn around it
            if self._serves_another_loop(loop):
                continue
            if loop in fed or any(other in fed for other in walk(loop.body)) or self._inside(loop, fed):
                continue
            sites = self.facts.step_call_sites.get(loop, [])
            if sites and all(self._inside(site, fed) for site in sites) and not _draws_data(loop):
                continue  # a loop of a step function that only loops over batches call: it repeats that step
            if self._cuts_a_drawn_item(loop, fed):
                continue  # (each item of a sharded loader cut into the steps' batches: data_sites' regrouping)
            unfed.append(loop)
        return unfed

    def _cuts_a_drawn_item(self, loop: cst.CSTNode, fed: set[cst.CSTNode]) -> bool:
        """``for x, y in parts:`` in a function every call of which passes what a loop drawing
        data drew (``self.train_step(self.prepare(batchs))``)."""
        context = self.facts.contexts.get(loop)
        if not isinstance(loop, cst.For) or context is None or context.function is None:
            return False
        site = DataSite(loop, loop.iter, (), context.function)
        return self.facts.analyzer.calls.fed_by_a_drawing_loop(site, list(fed)) is not None

    def _serves_another_loop(self, loop: cst.CSTNode) -> bool:
        """A loop with a backward() that draws no data of its own for another loop's batch:
        VAT's power iteration in a decoder's forward (CCT), or, in a module the entry imports,
        micro-batches of the batch the entry's loop feeds it (SRFBN's solver)."""
        return self._in_a_forward(loop) or self.context.is_library and (_cuts_a_batch_in_hand(loop) or self._repeats_a_step(loop))

    def _repeats_a_step(self, loop: cst.CSTNode) -> bool:
        """In a module the entry imports, a counted loop that draws nothing (DeblurGAN's
        ``for iter_d in range(self.criticUpdates):`` around the critic's step, on the batch the
        entry's loop handed in with ``set_input``): it repeats a step on the batch in hand. (A
        project whose training then shards nothing is refused whole: DDP211.)"""
        return (
            isinstance(loop, cst.For) and counted_steps(loop.iter) and not _draws_data(loop)
            and self._unfollowed_draw(loop) is None
        )

    def _in_a_forward(self, node: cst.CSTNode, depth: int = 0) -> bool:
        """Inside a module's ``forward``, or a function only forwards call (a backward() there
        serves the forward pass: adversarial perturbations, CCT's VAT power iteration in
        get_r_adv()), not a loop over data."""
        while node is not None and not isinstance(node, cst.Module):
            if isinstance(node, cst.FunctionDef) and node.name.value == "forward":
                return isinstance(self.context.parent(self.context.parent(node)), cst.ClassDef)
            if isinstance(node, cst.FunctionDef):
                sites = self.facts.analyzer.calls.call_sites(node) if depth < 3 else []
                return bool(sites) and all(self._in_a_forward(call, depth + 1) for call, _ in sites)
            node = self.context.parent(node)
        return False

    def _inside(self, node: cst.CSTNode, loops: set[cst.CSTNode]) -> bool:
        parent = self.context.parent(node)
        while parent is not None and not isinstance(parent, cst.Module):
            if parent in loops:
                return True
            parent = self.context.parent(parent)
        return False

    def _own_sampler(self, call: cst.Call) -> cst.Arg | None:
        """The loader's own ``sampler=`` / ``batch_sampler=``; not a ``None`` placeholder."""
        own = keyword_arg(call, "sampler") or keyword_arg(call, "batch_sampler")
        return None if own is None or self._placeholder(own) else own

    def _placeholder(self, arg: cst.Arg) -> bool:
        """``sampler=None``, or ``sampler=train_sampler`` where that name is only ever None
        (``train_sampler = None`` kept for a distributed branch that was never written)."""
        value = arg.value
        if isinstance(value, cst.Name) and value.value == "None":
            return True
        if not isinstance(value, cst.Name):
            return False
        scope = self.context.metadata.get_metadata(ScopeProvider, value, None)
        assignments = list(scope[value.value]) if scope is not None else []
        values = [self._assigned(getattr(a, "node", None)) for a in assignments]
        return bool(values) and all(isinstance(v, cst.Name) and v.value == "None" for v in values)

    def _assigned(self, target: cst.CSTNode | None) -> cst.BaseExpression | None:
        parent = self.context.parent(target) if target is not None else None
        if isinstance(parent, cst.AssignTarget):
            parent = self.context.parent(parent)
        return parent.value if isinstance(parent, (cst.Assign, cst.AnnAssign)) else None

    def _unsupported(self, call: cst.Call) -> str | None:
        if any(arg.star == "*" for arg in call.args):
            return "arguments are unpacked with *"
        if any(arg.star == "**" for arg in call.args) and keyword_arg(call, "batch_size") is None and len(positional_args(call)) < 2:
            # `**kwargs` with the batch size inside: it could not be made per process. (A
            # shuffle or sampler inside it would stop the converted script with DataLoader's
            # own error, never train silently on the same data.)
            return "the batch size is passed inside **kwargs; pass batch_size= by keyword"
        if len(positional_args(call)) > 3:
            return "pass sampler options by keyword"
        dataset = first_positional(call, "dataset")
        if dataset is None:
            return "no dataset argument"
        if not isinstance(dataset, REPEATABLE) and self._assignment_statement(call) is None:
            return "its dataset is built inside the call, and the call is not a statement of its own"
        return None

    def _assignment_statement(self, call: cst.Call) -> cst.SimpleStatementLine | None:
        """The `target = DataLoader(...)` statement line (alone on it, in a block), else None."""
        assign = self.context.parent(call)
        line = self.context.parent(assign) if isinstance(assign, (cst.Assign, cst.AnnAssign)) else None
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1 or assign.value is not call:
            return None
        return line if isinstance(self.context.parent(line), (cst.Module, cst.IndentedBlock)) else None

    def _fresh_name(self, target: str | None) -> str:
        """`train_loader` -> `train_dataset`; a name nothing in the module uses yet."""
        last = (target or "dataset").split(".")[-1]
        return self.context.fresh_name(last.replace("loader", "dataset") if "loader" in last else f"{last}_dataset")

    def _hoist_dataset(self, original: cst.Call, updated: cst.Call, site: LoaderSite) -> tuple[cst.Call, cst.Name]:
        """Move a dataset built in the call to a new variable above the statement."""
        dataset_arg = next(arg for arg in updated.args if arg.value is first_positional(updated, "dataset"))
        name = self._fresh_name(site.target)
        statement = self._assignment_statement(original)
        value = self._realigned(first_positional(original, "dataset"), dataset_arg.value, statement, len(name) + 3)
        self._hoisted[statement] = (name, value)
        self.context.report(original, "DDP305", f"dataset built in the DataLoader call moved to `{name}` for the sampler")
        return replace_arg(updated, dataset_arg, dataset_arg.with_changes(value=cst.Name(name))), cst.Name(name)

    def _realigned(self, original, updated, statement, prefix: int) -> cst.BaseExpression:
        """Shift continuation lines by as many columns as the expression moves (`name = ` now
        precedes it), so arguments aligned under its opening bracket stay aligned."""
        code = self.context.code(updated)
        if "\n" not in code or any(
            isinstance(node, (cst.SimpleString, cst.FormattedString)) and "\n" in self.context.code(node)
            for node in walk(updated)
        ):
            return updated  # one line, or a multi-line string whose text must not change
        shift = self.context.position(statement)[1] + prefix - self.context.position(original)[1]
        lines = code.split("\n")
        moved = [lines[0]]
        for line in lines[1:]:
            spaces = len(line) - len(line.lstrip(" "))
            moved.append(" " * max(0, spaces + shift) + line[spaces:] if line.strip() else line)
        try:
            return cst.parse_expression("\n".join(moved))
        except cst.ParserSyntaxError:
            return updated

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        result: Block = []
        for original, updated in block:
            if original in self._hoisted:
                name, dataset = self._hoisted[original]
                assign = cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=dataset)
                # Paired with the loader's original statement: it is part of it (downloads, guards).
                result.append((original, cst.SimpleStatementLine([assign], leading_lines=updated.leading_lines)))
                updated = updated.with_changes(leading_lines=[])
            result.append((original, updated))
        return result

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self._run_time:
            return self._shard_at_run_time(original_node, updated_node)
        if any(original_node in calls for calls in self.context.scattered_loops.values()):
            return self._scattered(original_node, updated_node)
        if original_node in self._drawn:
            self.context.report(
                original_node,
                "DDP313",
                f"`{self.context.code(original_node.func)}(...)` draws training samples each step: every rank makes "
                "the same draw (Python's and numpy's generators are alike on every rank; where torch's draws differ, "
                "rank 0's batch is taken) and takes its share of it, as DataParallel split the batch (ddp_drawn)",
            )
            return updated_node.with_changes(func=cst.Name("ddp_drawn"), args=[cst.Arg(updated_node.func), *updated_node.args])
        site: LoaderSite | None = self.facts.loaders.get(original_node)
        if site is None or not site.training or original_node not in self.context.sharded_loaders:
            return updated_node
        updated_node = _without_placeholder(updated_node)
        self.context.sharded_loaders.add(original_node)
        self.context.add_import(*SAMPLER_IMPORT)
        dataset = first_positional(updated_node, "dataset")
        if not isinstance(dataset, REPEATABLE):
            updated_node, dataset = self._hoist_dataset(original_node, updated_node, site)
        updated_node, shuffle = _shuffle_by_keyword(updated_node)
        shuffle_value = shuffle.value if shuffle else cst.Name("False")
        placement = []
        if self.context.is_library:
            # A project script that was not converted may build this loader too: with the
            # rank and world size given, the sampler needs no process group.
            placement = [
                keyword("num_replicas", cst.parse_expression(self.context.world_size)),
                keyword("rank", cst.parse_expression(self.context.rank)),
            ]
        # single-file mode: its epoch loop runs in a project module (read, not rewritten)
        each_pass = original_node in self.facts.epochs_out_of_sight and bool(self.context.neighbours.trainers)
        # (the loader's drop_last drops the sampler's tail too, instead of padding it with repeated
        # samples: as many steps per epoch as the original's, Real_Time_Segmentation's 15 images)
        dropping = keyword_arg(original_node, "drop_last")
        dropped = [keyword("drop_last", dropping.value.deep_clone())] if dropping is not None and self.context.code(dropping.value) != "False" else []
        sampler = cst.Call(
            func=cst.Name("DdpNextEpochSampler" if each_pass else "DistributedSampler"),
            args=[cst.Arg(dataset.deep_clone()), *placement, keyword("shuffle", shuffle_value), *dropped],
        )
        self.context.report(
            original_node,
            "DDP301",
            f"DataLoader{' ' + repr(site.target) if site.target else ''} gets a DistributedSampler"
            f" (shuffle={self.context.code(shuffle_value)})"
            + ("; its epoch loop is in a project module, out of sight: each pass over it is the next epoch" if each_pass else ""),
        )
        if shuffle is not None:
            return replace_arg(updated_node, shuffle, keyword("sampler", sampler))
        return append_arg(updated_node, keyword("sampler", sampler))



def _shuffle_by_keyword(call: cst.Call) -> tuple[cst.Call, cst.Arg | None]:
    """``DataLoader(ds, 32, True)``: the third positional argument is ``shuffle``; make it a
    keyword so the sampler can take its place."""
    positional = positional_args(call)
    if len(positional) < 3:
        return call, keyword_arg(call, "shuffle")
    third = positional[2]
    shuffle = keyword("shuffle", third.value).with_changes(comma=third.comma)
    return call.with_changes(args=[shuffle if arg is third else arg for arg in call.args]), shuffle


def _without_placeholder(call: cst.Call) -> cst.Call:
    """Drop a ``sampler=None``-style placeholder: the DistributedSampler takes its place."""
    args = list(call.args)
    for index, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value in ("sampler", "batch_sampler"):
            if index == len(args) - 1 and index > 0:
                args[index - 1] = args[index - 1].with_changes(comma=arg.comma)
            return call.with_changes(args=args[:index] + args[index + 1 :])
    return call


# Libraries whose datasets are streams (IterableDataset): torchtext's since 0.12, torchdata's
# pipes, webdataset.
STREAMING_LIBRARIES = ("torchtext.datasets.", "torchdata.", "webdataset.")


def _gives_a_dim(dp_call: cst.Call) -> bool:
    """DataParallel told which dimension to scatter (``dim=``, or its fourth argument)."""
    return any(arg.keyword is not None and arg.keyword.value == "dim" for arg in dp_call.args) or len(positional_args(dp_call)) > 3


def _calls_backward(loop: cst.CSTNode) -> bool:
    return any(
        isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward"
        for node in walk(loop)
    )


def _next_to(folder: Path, name: str) -> bool:
    return (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file() or (folder / name).is_dir()


def _cuts_a_batch_in_hand(loop: cst.CSTNode) -> bool:
    """``for i in range(self.split_batch):`` cutting a batch bound outside the loop into pieces
    (``self.LR.narrow(0, i * sub, sub)``, ``x[i * n:(i + 1) * n]``): gradient accumulation over
    the batch in hand, which the loop that feeds it draws."""
    if not isinstance(loop, cst.For) or _draws_data(loop) or not isinstance(loop.target, cst.Name):
        return False
    index = loop.target.value
    for node in walk(loop.body):
        cut = None
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("narrow", "chunk", "split", "tensor_split"):
            cut = node.func.value if any(isinstance(n, cst.Name) and n.value == index for arg in node.args for n in walk(arg)) else None
        elif isinstance(node, cst.Subscript) and any(isinstance(n, cst.Name) and n.value == index for n in walk(node.slice[0] if node.slice else node)):
            cut = node.value
        if cut is not None and isinstance(cut, (cst.Name, cst.Attribute)):
            return True
    return False


def _draws_data(loop: cst.CSTNode) -> bool:
    """Does this loop draw batches itself: iterate anything but a ``range``, or call next()?"""
    if isinstance(loop, cst.For) and not (isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "range"):
        return True
    return any(isinstance(node, cst.Call) and dotted(node.func) == "next" for node in walk(loop))


def _items_are_batches(call: cst.Call) -> bool:
    """``DataLoader(minibatches, batch_size=1, collate_fn=...)``: each item is the step's batch
    (Conv-TasNet's collate takes `batch[0]`); sharded by item, the global batch would grow by
    the world size."""
    size = batch_size_arg(call)
    value = size.value if size is not None else None
    collate = keyword_arg(call, "collate_fn")
    return isinstance(value, cst.Integer) and value.value == "1" and collate is not None and not (
        isinstance(collate.value, cst.Name) and collate.value.value == "None"
    )
