"""DDP4xx: keep DataParallel's global batch size.

DataParallel splits one batch across GPUs, so its ``batch_size`` is global; each DDP process
loads its own batch. By default each process gets ``batch_size // world_size`` and a size
that does not divide evenly stops the script at start-up with a clear message, so the
converted script trains the same model. ``--per-process-batch`` keeps the number per
process instead (the global batch grows with the world size).

DDP401  global batch preserved::

    DataLoader(train_set, batch_size=256)
    # becomes
    DataLoader(train_set, batch_size=ddp_local_batch_size(256), sampler=...)

A command-line option's integer default (``add_argument("--batch_size", default=5)``) that 1
or a world size of 2, 4 or 8 cannot divide is named in the report, before any run stops on it.

DDP402  per-process batch kept (``--per-process-batch``): the effective batch is now
``batch_size * world_size``; adjust the learning rate if needed.

DDP403  a batch scaled by the GPU count was DataParallel's way to give each GPU its share:
each process (one per GPU) loads that share::

    DataLoader(train_set, batch_size=args.batch_size * n_gpu)  ->  batch_size=args.batch_size

DDP404  likewise ``num_workers=workers * n_gpu`` -> ``num_workers=workers`` per process.

DDP406  each item the training loader yields is cut into the steps' batches (FastSpeech2's
collate_fn returns a list of sub-batches: ``for batchs in loader: for batch in batchs:``): the
loader's batch is not the step's batch, so it is not divided; every process draws the loader's
batches whole and alike and each step's batch is split between them where the inner loop draws
it (``for batch in DdpSplit(batchs):``, transforms/sampler.py), DataParallel's global batch.
(A warning where no such inner loop is in sight: every step's global batch is then the world
size times the step's batch.)

DDP407  a training batch compared with the loader's batch size (Person_reID skips a short
last batch: ``if now_batch_size < opt.batchsize: continue``) is compared with each
process's share, or every batch would be skipped::

    if now_batch_size < opt.batchsize:   ->   if now_batch_size < ddp_local_batch_size(opt.batchsize):

DDP408  (warning) ``batch_size=1`` (or none: one sample, or one pre-made batch per step)
cannot be divided: each process loads one item, and the global batch is the world size.

DDP409  a tensor made in the training loop with the loader's batch size as a dimension
(Tacotron's GO frame ``np.zeros([args.batch_size, hp.num_mels, 1])``, joined to each batch) is
made with each process's share::

    go = np.zeros([args.batch_size, n, 1])  ->  go = np.zeros([ddp_local_batch_size(args.batch_size), n, 1])

Also in a step function of this file the training loop calls, by a name bound only to the
loader's batch size (``bs = args.batch_size``), and by the size a per-step draw of the script's
own is given (tacotron-pytorch's ``ds.next_batch(hp.batch_size)``, DDP313, whose step makes
``np.zeros((hp.batch_size, ...))``).

DDP410  a training batch cut into the steps of a gradient accumulation (``xs = torch.split(x, 4)``,
then a backward per piece) is cut into pieces of each process's share, as many as before::

    xs = torch.split(x, 4)   ->   xs = torch.split(x, ddp_local_batch_size(4))

DDP411  a function called in the training loop given the loader's batch size (facenet's
``forward_pass(imgs, model, batch_size=batch_size)``, which cuts a joined batch back apart at
it) is given each process's share::

    forward_pass(imgs, model, batch_size=batch_size)
    # becomes
    forward_pass(imgs, model, batch_size=ddp_local_batch_size(batch_size))

DDP412  the wrapped model built for the loader's batch size (StructSeg19's ``VNet(classes=23,
batch_size=batch_size)``, whose output layer views ``(self.bs, classes, -1)``) is built for each
process's share, the batch it runs::

    model = VNet(classes=23, batch_size=batch_size)   ->   model = VNet(classes=23, batch_size=ddp_local_batch_size(batch_size))

DDP405  a sum over the training loader's batches divided by the dataset's length (the
pytorch/examples average ``train_loss / len(train_loader.dataset)``) now sums one shard:
it is divided by the shard's length, so the value (and its mean across ranks, for a print
or an early stop) is the average DataParallel computed::

    train_loss /= len(train_loader.dataset)   ->   train_loss /= len(train_loader.sampler)
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import DEVICE_COUNT, batch_length, dotted, enclosing_function, innermost_loop, is_training_call, walk
from ddpify.analysis.batch_values import with_aliases
from ddpify.analysis.statistics import names_holding
from ddpify.analysis.tree import without_moves
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform, append_arg, batch_size_arg, keyword, keyword_arg, option_declaration, positional_args


# Calls that make a tensor of a given shape, and tensor methods that take one.
TENSOR_MAKERS = {"zeros", "ones", "empty", "full", "randn", "rand", "arange", "randperm", "randint"}
SHAPE_METHODS = {"view", "reshape", "expand", "new_zeros", "new_ones", "new_empty", "new_full"}


class BatchSizeTransform(Transform):
    CODE_PREFIX = "DDP4"

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.context.sharded_loaders:
            return self._per_step_shape(original_node, updated_node)
        arg = batch_size_arg(updated_node)
        shown = self.context.code(arg.value) if arg else "1"
        if original_node in self.context.regrouped_loaders:
            return updated_node  # the step's batch is cut from it later (DDP406)
        if self.context.options.per_process_batch:
            self.context.report(
                original_node,
                "DDP402",
                f"--per-process-batch: each process loads batch_size={shown}, so the global batch is now "
                f"{shown} x world size; adjust the learning rate if needed",
            )
            return updated_node
        updated_node = self._workers_per_process(original_node, updated_node)
        original_batch = keyword_arg(original_node, "batch_size")
        per_gpu = self._without_gpu_factor(original_batch.value) if arg and original_batch else None
        if per_gpu is not None:
            self.context.report(
                original_node,
                "DDP403",
                f"batch_size={shown} scaled DataParallel's batch by the GPU count: each process loads "
                f"{self.context.code(per_gpu)}, one GPU's share, as before",
            )
            return updated_node.with_changes(
                args=[a.with_changes(value=per_gpu) if a.value is arg.value else a for a in updated_node.args]
            )
        if shown == "1":
            # one sample (or one pre-made batch, Conv-TasNet's AudioDataset) per step: nothing to divide
            self.context.report(
                original_node,
                "DDP408",
                "batch_size=1: one item per step cannot be divided, so each process loads one; the global batch is "
                "now world size items (adjust the learning rate if needed)",
                Severity.WARNING,
            )
            return updated_node
        self.context.report(
            original_node,
            "DDP401",
            f"batch_size={shown} was DataParallel's global batch: each process now loads {shown} // world size"
            + self._default_note(arg.value),
        )
        split = cst.Call(func=cst.Name("ddp_local_batch_size"), args=[cst.Arg(arg.value)])
        return updated_node.with_changes(
            args=[a.with_changes(value=split) if a is arg else a for a in updated_node.args]
        )

    def _default_note(self, value: cst.BaseExpression) -> str:
        """What the command line's default batch size will do, said now rather than at run time
        (AutoPath's default of 1, Semi-supervised-segmentation-cycleGAN's 5: batch 45)."""
        default = _parser_default(self.context.module, value)
        if default is None:
            return ""
        if default == 1:
            return (
                " (its default, 1, cannot be divided: each process loads one and the global batch becomes the number "
                "of processes; pass a larger one to keep it)"
            )
        uneven = [n for n in (2, 4, 8) if default % n]
        if uneven:
            counts = ", ".join(map(str, uneven))
            return f" (its default, {default}, does not divide among {counts} processes: such a run stops where the loader is made; pass one that does)"
        return ""

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation) -> cst.BinaryOperation:
        if isinstance(original_node.operator, cst.Divide) and self._is_dataset_length(original_node.right):
            if not self._world_scaled(original_node.left):
                return updated_node.with_changes(right=self._shard_length(original_node.right))
        return updated_node

    def leave_AugAssign(self, original_node: cst.AugAssign, updated_node: cst.AugAssign) -> cst.AugAssign:
        if isinstance(original_node.operator, cst.DivideAssign) and self._is_dataset_length(original_node.value):
            if not self._world_scaled(original_node.target):
                return updated_node.with_changes(value=self._shard_length(original_node.value))
        return updated_node

    def _world_scaled(self, numerator: cst.BaseExpression) -> bool:
        """A sum of a summed loss DDP116 scaled by the world size (``total += loss.item()``): each
        rank's total is the global batch's already, and the whole data set divides it."""
        if not hasattr(self, "_scaled_names"):
            self._scaled_names = names_holding(self.context.module, self.context.world_scaled)
        return any(name.value in self._scaled_names for name in walk(numerator) if isinstance(name, cst.Name))

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.Comparison:
        """``if now_batch_size < opt.batchsize: continue`` (Person_reID skips the last, short
        batch): the loader's batch size was DataParallel's global batch; each process now
        holds its share, so the batch is compared with the share."""
        if self.context.options.per_process_batch or len(original_node.comparisons) != 1:
            return updated_node
        sides = [original_node.left, original_node.comparisons[0].comparator]
        for counted, size in (sides, sides[::-1]):
            if self.context.code(size) in self._loader_batch_sizes and self._counts_batch(counted) and self._in_training_loop(original_node, innermost=True) and not self.context.in_a_scattered_loop(original_node):
                self.context.report(
                    size,
                    "DDP407",
                    f"a training batch is compared with `{self.context.code(size)}`, DataParallel's global batch: "
                    f"each process holds its share, `ddp_local_batch_size({self.context.code(size)})`",
                )
                local = cst.Call(func=cst.Name("ddp_local_batch_size"), args=[cst.Arg(size)])
                if size is original_node.left:
                    return updated_node.with_changes(left=local)
                return updated_node.with_changes(comparisons=[updated_node.comparisons[0].with_changes(comparator=local)])
        return updated_node

    def _split_into_steps(self, original: cst.Call, updated: cst.Call) -> cst.Call | None:
        """``torch.split(x, 4)`` of a batch the training loop draws, the pieces its accumulation
        steps (BigGAN's D steps over chunks of the loader's batch): each process holds its share
        of the batch, so it cuts it into pieces of the share, as many as before."""
        names = self.context.qualified(original.func)
        if "torch.split" in names and len(original.args) >= 2 and original.args[0].keyword is None:
            tensor, index = original.args[0].value, 1
        elif isinstance(original.func, cst.Attribute) and original.func.attr.value == "split" and original.args and not names & {"str.split"}:
            tensor, index = original.func.value, 0
        else:
            return None
        size = original.args[index]
        if size.keyword is not None or isinstance(size.value, (cst.List, cst.Tuple, cst.SimpleString)):
            return None
        if not isinstance(tensor, cst.Name) or tensor.value not in self._batch_names(original):
            return None
        self.context.report(
            original,
            "DDP410",
            f"each batch is cut into training steps of `{self.context.code(size.value)}`: each process holds its share "
            "of the batch, so it cuts it into steps of that share (ddp_local_batch_size), as many steps as before",
        )
        args = list(updated.args)
        args[index] = args[index].with_changes(value=self._local(args[index].value))
        return updated.with_changes(args=args)

    def _model_built_for_the_batch(self, original: cst.Call, updated: cst.Call) -> cst.Call | None:
        """The wrapped model's constructor given the training loader's batch size (StructSeg19's
        ``VNet(classes=23, batch_size=batch_size)``, whose output layer views ``(self.bs, classes,
        -1)``; an RNN's hidden state sized per batch): each process runs its share through its
        model, so the model is built for the share."""
        sizes = self._training_batch_sizes
        if not sizes or not any(self.context.code(arg.value) in sizes for arg in original.args):
            return None
        if original not in self._wrapped_constructors:
            return None
        args = [arg.with_changes(value=self._local(arg.value)) if self.context.code(arg.value) in sizes else arg for arg in updated.args]
        self.context.report(
            original,
            "DDP412",
            f"`{self.context.code(original.func)}(...)` builds the wrapped model for DataParallel's global batch: each "
            "process runs its share of the batch through its own model, so it is built for the share (ddp_local_batch_size); "
            "the same model run on whole batches (an evaluation of its module) sees the share's size",
        )
        return updated.with_changes(args=args)

    @property
    def _wrapped_constructors(self) -> set[cst.Call]:
        """The calls that build a model the file wraps: the wrap's argument, or the last call bound
        to the name it wraps before the wrap, in the same function (``model = VNet(...)``, then
        ``nn.DataParallel(model)``; not another function's ``model = Net(...)`` for evaluation)."""
        if not hasattr(self, "_constructors"):
            found = set()
            for site in self.facts.wraps:
                made = without_moves(site.module_arg) if site.module_arg is not None else None
                if isinstance(made, cst.Call):
                    found.add(made)
                elif made is not None and dotted(made) is not None:
                    found |= self._bound_before(dotted(made), site.call)
            self._constructors = found
        return self._constructors

    def _bound_before(self, name: str, wrap: cst.Call) -> set[cst.Call]:
        """The last call bound to ``name`` before ``wrap``, in the function (or module) around it."""
        scope = wrap
        while scope is not None and not isinstance(scope, (cst.FunctionDef, cst.Module)):
            scope = self.context.parent(scope)
        at = self.context.position(wrap)
        before = [
            node for node in walk(scope)
            if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets)
            and isinstance(without_moves(node.value), cst.Call) and self.context.position(node) < at
            and not any(inner is wrap for inner in walk(node.value))  # (not the wrap's own statement)
            and enclosing_function(node, self.context.parent) is (scope if isinstance(scope, cst.FunctionDef) else None)
        ]
        return {without_moves(before[-1].value)} if before else set()

    def _batch_size_handed_on(self, original: cst.Call, updated: cst.Call) -> cst.Call | None:
        """A function of the script called in the training loop with the loader's batch size
        (facenet's ``forward_pass(imgs, model, batch_size=batch_size)``, which cuts the anchors,
        positives and negatives back apart at it): each process holds its share, so the
        function is given the share."""
        if not self._hands_the_share(original):
            return None
        sizes = self._training_batch_sizes
        args = [
            arg.with_changes(value=self._local(arg.value)) if self.context.code(arg.value) in sizes else arg
            for arg in updated.args
        ]
        self.context.report(
            original,
            "DDP411",
            f"`{self.context.code(original.func)}(...)` is given DataParallel's global batch size: each process holds "
            "its share of the batch, so it is given the share (ddp_local_batch_size)",
        )
        return updated.with_changes(args=args)

    def _hands_the_share(self, call: cst.Call) -> bool:
        """Is this call given the share of the loader's batch size (DDP411)?"""
        if any(q.split(".")[0] in ("torch", "numpy", "builtins", "logging") for q in self.context.qualified(call.func)):
            return False
        sizes = self._training_batch_sizes
        if not sizes or not any(self.context.code(arg.value) in sizes for arg in call.args):
            return False
        if self._shapes_tensor(call) or not self._in_a_batch_loop(call):
            return False
        # (given the whole global batch: DataParallel's size is its size)
        if call in self.context.drawn_calls:
            return False  # (the draw itself makes the global batch, each rank taking its share)
        return call not in self.context.whole_batch_calls and not self.context.in_a_scattered_loop(call)

    def _given_the_share(self, node: cst.CSTNode, size: cst.BaseExpression) -> bool:
        """``size`` is a parameter of the function around ``node`` that its callers here hand the
        share already (StructSeg19's ``train(..., batch_size)``, then ``torch.reshape(target,
        (batch_size, 23, -1))`` inside): divided once, at the call, never again."""
        if not isinstance(size, cst.Name):
            return False
        function = node
        while function is not None and not (isinstance(function, cst.FunctionDef) and any(p.name.value == size.value for p in function.params.params)):
            function = self.context.parent(function)
        if function is None:
            return False
        graph = self.facts.analyzer.calls
        param = next(p for p in function.params.params if p.name.value == size.value)
        return any(
            self._hands_the_share(site) and self.context.code(given) in self._training_batch_sizes
            for site, _ in graph.call_sites(function)
            if (given := graph.argument_for(function, param, site)) is not None
        )

    def _in_a_batch_loop(self, node: cst.CSTNode) -> bool:
        """In the loop that draws the batches and trains on each (not an epoch loop around it,
        where a dataset may be given the batch size to make its batches: facenet's triplets)."""
        loop = innermost_loop(node, self.context.parent)
        training = set(self.facts.training_loops)
        if loop not in training:
            return False
        # (a loop that steps itself around an inner one that trains too: WassersteinGAN's
        # generator step after its critic's loop, the noise for it drawn there: batch 45)
        return not any(inner in training for inner in walk(loop.body)) or _steps_outside_inner_loops(loop.body)

    def _batch_names(self, node: cst.CSTNode) -> set[str]:
        """Names the training loops around ``node`` bind to what they draw (``for x, y in loader``)."""
        found, loops = set(), set(map(id, self.facts.training_loops))
        while node is not None:
            if id(node) in loops and isinstance(node, cst.For):
                found |= {n.value for n in walk(node.target) if isinstance(n, cst.Name)}
            node = self.context.parent(node)
        return found

    def _per_step_shape(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``np.zeros([args.batch_size, hp.num_mels, 1])`` in the training loop (Tacotron's GO
        frame, joined to each batch): DataParallel's global batch sized a tensor for the whole
        batch; each process now holds its share, so the tensor is sized by the share."""
        if self.context.options.per_process_batch:
            return updated
        split = self._split_into_steps(original, updated)
        if split is not None:
            return split
        built = self._model_built_for_the_batch(original, updated)
        if built is not None:
            return built
        handed = self._batch_size_handed_on(original, updated)
        if handed is not None:
            return handed
        if not self._shapes_tensor(original):
            return updated
        sizes = self._read_sizes
        changed = False
        args = []
        for arg in updated.args:
            value = arg.value
            shape = arg.keyword is None or arg.keyword.value == "size"
            if shape and self.context.code(value) in sizes and not self._given_the_share(original, value):
                value, changed = self._local(value), True
            elif shape and isinstance(value, (cst.List, cst.Tuple)):
                elements = [
                    e.with_changes(value=self._local(e.value))
                    if self.context.code(e.value) in sizes and not self._given_the_share(original, e.value) else e
                    for e in value.elements
                ]
                changed |= any(new is not old for new, old in zip(elements, value.elements))
                value = value.with_changes(elements=elements)
            args.append(arg.with_changes(value=value))
        if not changed or not self._in_the_step(original) or self.context.in_a_scattered_loop(original):
            return updated
        self.context.report(
            original,
            "DDP409",
            f"`{self.context.code(original)}` in the training step is sized by DataParallel's global batch: each "
            "process holds its share, so it is sized by the share (ddp_local_batch_size)",
        )
        return updated.with_changes(args=args)

    def _local(self, size: cst.BaseExpression) -> cst.Call:
        return cst.Call(func=cst.Name("ddp_local_batch_size"), args=[cst.Arg(size)])

    def _shapes_tensor(self, call: cst.Call) -> bool:
        names = self.context.qualified(call.func)
        if any(name.rpartition(".")[0] in ("torch", "numpy") and name.rpartition(".")[2] in TENSOR_MAKERS for name in names):
            return True
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in SHAPE_METHODS

    @property
    def _training_batch_sizes(self) -> set[str]:
        """The batch_size= (as code) of the training loaders each process now loads a share of."""
        if not hasattr(self, "_training_size_codes"):
            self._training_size_codes = training_batch_sizes(self.context)
        return self._training_size_codes

    @property
    def _read_sizes(self) -> frozenset[str]:
        """The training loaders' batch sizes and the names bound only to them (``bs = args.batch_size``,
        then ``torch.zeros(bs, 10)``): DDP413 makes a slice by ``bs`` the share, so a tensor it
        sizes must be the share too, or the two no longer fit."""
        if not hasattr(self, "_read_size_codes"):
            self._read_size_codes = read_batch_sizes(self.context)
        return self._read_size_codes

    @property
    def _loader_batch_sizes(self) -> set[str]:
        """The batch_size= of this file's DataLoader calls, as code."""
        if not hasattr(self, "_batch_size_codes"):
            self._batch_size_codes = _sizes_of(self.context, self.facts.loaders)
        return self._batch_size_codes

    def _counts_batch(self, node: cst.BaseExpression) -> bool:
        """``x.size(0)``, ``len(x)``, or a name bound to one (``now_batch_size, c, h, w = inputs.shape``)."""
        if batch_length(node):
            return True
        if not isinstance(node, cst.Name):
            return False
        scope = enclosing_function(node, self.context.parent) or self.context.module
        for assign in walk(scope):
            if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                continue
            target, value = assign.targets[0].target, assign.value
            if isinstance(target, cst.Name) and target.value == node.value and batch_length(value):
                return True
            if isinstance(target, (cst.Tuple, cst.List)) and target.elements and isinstance(target.elements[0].value, cst.Name):
                shape = isinstance(value, cst.Attribute) and value.attr.value == "shape" or (
                    isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "size" and not value.args
                )
                if shape and target.elements[0].value.value == node.value:
                    return True
        return False

    def _in_the_step(self, node: cst.CSTNode) -> bool:
        """In a training loop, or a step function of this file a training loop calls (tacotron's
        ``train_batch``, which makes its GO frame ``np.zeros((hp.batch_size, ...))``)."""
        if self._in_training_loop(node):
            return True
        steps = set(self.facts.step_functions)
        while node is not None and not (isinstance(node, cst.FunctionDef) and node in steps):
            node = self.context.parent(node)
        return node is not None

    def _in_training_loop(self, node: cst.CSTNode, innermost: bool = False) -> bool:
        """Inside a training loop; with ``innermost``, the loop nearest to it trains (not a
        validation loop in the epoch loop: LEDNet's `if imgs_batch != args.batch_size: break`
        over an unsharded validation loader)."""
        loops = set(map(id, self.facts.training_loops))
        while node is not None:
            if id(node) in loops:
                return True
            if innermost and isinstance(node, (cst.For, cst.While)):
                return False
            node = self.context.parent(node)
        return False

    def _is_dataset_length(self, node: cst.BaseExpression) -> bool:
        """``len(<a training loader of this function>.dataset)``."""
        if not (isinstance(node, cst.Call) and dotted(node.func) == "len" and len(node.args) == 1):
            return False
        value = node.args[0].value
        if not (isinstance(value, cst.Attribute) and value.attr.value == "dataset"):
            return False
        key = (enclosing_function(node, self.context.parent), self.context.code(value.value))
        return key in self.facts.training_loader_names or key in self.context.run_time_shards

    def _shard_length(self, length: cst.Call) -> cst.Call:
        self.context.shard_lengths.add(length)
        loader_node = length.args[0].value.value
        loader = self.context.code(loader_node)
        if (enclosing_function(length, self.context.parent), loader) in self.context.run_time_shards:
            loader = self.context.shard_call(loader)
            loader_node = cst.parse_expression(loader)
        self.context.report(
            length,
            "DDP405",
            f"`len({self.context.code(length.args[0].value.value)}.dataset)` divided a sum over the training "
            f"loader, which now covers one shard: divided by the shard's length, `len({loader}.sampler)`",
        )
        attribute = cst.Attribute(value=loader_node, attr=cst.Name("sampler"))
        return length.with_changes(args=[length.args[0].with_changes(value=attribute)])

    def _is_gpu_count(self, node: cst.BaseExpression) -> bool:
        """``torch.cuda.device_count()``, ``n_gpu`` / ``args.n_gpu``, ``max(1, n_gpu)``."""
        if isinstance(node, cst.Call):
            if DEVICE_COUNT in self.context.qualified(node.func):
                return True
            if dotted(node.func) in ("max", "min") and any(self._is_gpu_count(arg.value) for arg in node.args):
                return True
            return False
        return dotted(node) in self.facts.gpu_count_names if isinstance(node, (cst.Name, cst.Attribute)) else False

    def _without_gpu_factor(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """``per_gpu * n_gpu`` -> ``per_gpu`` (either order), else None."""
        if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Multiply)):
            return None
        if self._is_gpu_count(value.right):
            return value.left
        if self._is_gpu_count(value.left):
            return value.right
        return None

    def _workers_per_process(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``num_workers=workers * n_gpu`` loaded for all GPUs in one process: each process now
        loads for its own GPU."""
        workers = keyword_arg(original, "num_workers")  # original nodes: qualified names are known there
        per_gpu = self._without_gpu_factor(workers.value) if workers is not None else None
        if per_gpu is None:
            return updated
        self.context.report(
            original, "DDP404", f"num_workers={self.context.code(workers.value)} served every GPU: each process now uses {self.context.code(per_gpu)}"
        )
        return updated.with_changes(
            args=[a.with_changes(value=per_gpu) if a.keyword and a.keyword.value == "num_workers" else a for a in updated.args]
        )


def training_batch_sizes(context) -> set[str]:
    """The batch_size= (as code) of the training loaders each process now loads a share of."""
    divided = [
        call for call, site in context.facts.loaders.items()
        if (site.training or call in context.run_time_loaders) and call not in context.regrouped_loaders
    ]
    return _sizes_of(context, divided) | _drawn_sizes(context)


def read_batch_sizes(context) -> frozenset[str]:
    """The training batch sizes and the names bound only to them (``bs = args.batch_size``):
    what a read in the step says is DataParallel's global batch."""
    return with_aliases(context.module, training_batch_sizes(context))


def _drawn_sizes(context) -> set[str]:
    """The batch sizes (code) the script's own per-step draws are given (tacotron's
    ``ds.next_batch(hp.batch_size)``, whose step sizes its buffers by ``hp.batch_size``)."""
    return {
        context.code(arg.value) for call in context.drawn_calls for arg in call.args
        if arg.keyword is None and isinstance(arg.value, (cst.Name, cst.Attribute)) and "batch" in context.code(arg.value).lower()
    }


def _sizes_of(context, loaders) -> set[str]:
    """The batch sizes of these DataLoader calls that are not a literal, as code."""
    args = [batch_size_arg(call) for call in loaders]
    return {context.code(arg.value) for arg in args if arg is not None and not isinstance(arg.value, cst.Integer)}


def _steps_outside_inner_loops(node: cst.CSTNode) -> bool:
    """A backward() or an optimizer step among the statements of a loop's body that are not
    in a loop of their own."""
    for child in node.children:
        if isinstance(child, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(child, cst.Call) and is_training_call(child):
            return True
        if _steps_outside_inner_loops(child):
            return True
    return False


def _parser_default(module: cst.Module, value: cst.BaseExpression) -> int | None:
    """The integer default of the command-line option ``args.batch_size`` reads
    (``parser.add_argument("--batch_size", type=int, default=64)``, ``--batch-size`` or
    ``dest="batch_size"`` too); None where there is none."""
    if not isinstance(value, cst.Attribute):
        return None
    name = value.attr.value
    declared = option_declaration(walk(module), f"--{name}", f"--{name.replace('_', '-')}", dest=name)
    default = keyword_arg(declared, "default") if declared is not None else None
    return int(default.value.value) if default is not None and isinstance(default.value, cst.Integer) else None
