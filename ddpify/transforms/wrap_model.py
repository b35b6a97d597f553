"""DDP1xx: every DataParallel wrap becomes DistributedDataParallel on this process's device.

Forms are recognised by qualified name (``nn.DataParallel``, ``torch.nn.parallel.DataParallel``,
``from torch.nn import DataParallel as DP``, ``import torch as ch`` ...), never by text, so a
project's own class called ``DataParallel`` is left alone.

DDP101  DataParallel -> DistributedDataParallel, through the emitted ``ddp_wrap`` helper
(DDP on this process's device; a module with nothing to train, such as a frozen loss
network, is only moved there, since DDP refuses it)::

    model = nn.DataParallel(model, device_ids=[0, 1]).to(device)
    # becomes
    model = ddp_wrap(model.to(device))

DDP102  a ``device_count() > 1`` guard around the wrap now asks for the world size, so that
every rank wraps (also CPU ranks, which see no GPU)::

    if torch.cuda.device_count() > 1:        ->   if dist.get_world_size() > 1:
    n_gpu = torch.cuda.device_count()         (kept; only the guard changes)
    if n_gpu > 1:                             ->   if dist.get_world_size() > 1:

A variable (or attribute such as ``args.n_gpu``) counts as the GPU count when every
assignment to it in the file is ``torch.cuda.device_count()``.

DDP103  the wrap sits under another condition (a multi-GPU flag, ``args.ngpu > 1`` with a
default of 1, ``device == "cuda"``): under DDP it must run on every rank whenever the world
is larger than one, so the world size now decides too::

    if args.multi_gpu:               ->   if dist.get_world_size() > 1 or args.multi_gpu:
        model = nn.DataParallel(model)        model = ddp_wrap(model, keys_unwrapped=not args.multi_gpu)
    model = DP(model) if args.cuda else model
                                     ->   model = DDP(...) if dist.get_world_size() > 1 or args.cuda else model

Where the flag did not wrap, checkpoints keep the bare model's keys, as the original's did
(``keys_unwrapped``): what reads the flag back from a checkpoint still finds keys that fit.
An ``if`` whose every branch wraps decides nothing and is left alone.

DDP147  a device chosen beside such a wrap (DBE's ``device = '{}:{}'.format(args.device,
device_ids[0])``, ``device = 'cuda:0'``, in the block of the wrap under ``if args.device ==
'cuda':``): where the wrap now runs, the model is on this process's device, and so must the
batches be (``-d cpu`` under torchrun had sent them to CUDA)::

    device = '{}:{}'.format(args.device, device_ids[0])   ->   device = ddp_device()

DDP136  DataParallel by function in a model class's forward (pytorch/examples' DCGAN:
``nn.parallel.data_parallel(self.main, input, range(self.ngpu))``): the part is called
directly, and each model built from the class (bound to a name outside any class) is wrapped
where it is built, as ``DataParallel(Generator(ngpu))`` would have been; its checkpoints keep
the bare model's keys, as the original's did::

    output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))   ->   output = self.main(input)
    netG = Generator(ngpu).to(device)   ->   netG = ddp_wrap(Generator(ngpu).to(device), keys_unwrapped=True)

The same for a trainer's part (Dual-Path-RNN's ``data_parallel(self.dualrnn, mix,
device_ids=self.gpuid)`` in ``Trainer.train``): the part is wrapped where the trainer's
constructor builds it (``self.dualrnn = ddp_wrap(Dual_RNN.to(self.device), keys_unwrapped=True)``)
and called directly.

DDP137  DataParallel by function where no gradient flows (under ``torch.no_grad()``):
the module is called directly, as one process computes it::

    with torch.no_grad():
        out = data_parallel(self.net, mix, device_ids=self.gpuid)   ->   out = self.net(mix)

DDP130  a guard that is not about GPUs or devices chooses a model (``if checkpoint is None:``
builds and wraps a new one, the ``else`` resumes a pickled one): the guard is left as it
is, and every other path that goes on with a model wraps it too, so that every rank wraps
whichever model the run chose (Deep-Image-Matting)::

    if checkpoint is None:                      if checkpoint is None:
        model = DIMModel()                          model = DIMModel()
        model = nn.DataParallel(model)   ->         model = ddp_wrap(model)
    else:                                       else:
        model = ckpt["model"].module                model = ckpt["model"].module
                                                    model = ddp_wrap(model)

Without an ``else``, one is added when the model was bound before the ``if``.

DDP131  the wrapped name is bound to another model after the wrap (Deep-Image-Matting
reloads its best checkpoint's pickled model mid-training, ``model = checkpoint['model']``):
under DataParallel that was the wrapper it pickled, now the checkpoint holds the module
inside (DDP614); it is wrapped again right there (``ddp_wrap`` unwraps a wrapper first)::

    model = checkpoint['model']   ->   model = checkpoint['model']
                                       model = ddp_wrap(model)

DDP132  ``checkpoint['model'].module`` of a ``torch.load`` result: the converted script's
checkpoints hold the module inside DDP (DDP614), older ones a pickled DataParallel, so it
reads ``getattr(checkpoint['model'], "module", checkpoint['model'])``: either resumes.

DDP134  ``DataParallel(model, dim=1)`` split each batch along dimension 1 (time-major
sequences, LakhNES's Transformer-XL): batches split where they are drawn (DdpSplit) are cut
along that dimension too::

    model = nn.DataParallel(model, dim=1)  ->  model = ddp_wrap(model, scatter_dim=1)

DDP133  a training loop computes its loss with another method of the wrapped model, on the
module inside (StyleSpeech: ``output = model(...)`` in warm-up, ``output =
model.module.meta_learner_1(...)`` after it; or a loop that calls the wrapped model nowhere
else): DDP averages only what goes through its forward, so the call runs through it, and
the wrap looks for parameters without a gradient (that method uses some parts only)::

    output = model.module.meta_learner_1(x)   ->   output = ddp_through(model, "meta_learner_1", x)

DDP108  (warning) such a guard where no other path goes on with a model (the model exists
only in the guarded branch): left as it is. Should it be a multi-GPU switch after all,
each rank trains a model of its own; ``ddpify verify`` or ``--self-check`` stops such a run.

DDP107  DataParallel-only synchronised BatchNorm (``patch_replication_callback(model)`` of
Synchronized-BatchNorm-PyTorch, whose layers subclass torch's BatchNorm) becomes
``torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`` inside the wrap when CUDA is there
(DataParallel's sync-BN only ran on GPUs; SyncBatchNorm fails on CPU modules); the callback
statement is removed (it asserts a DataParallel)::

    model = nn.DataParallel(model)       ->   model = ddp_wrap(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    patch_replication_callback(model)                          if torch.cuda.is_available() else model)

Under its own ``if args.sync_bn:`` after the wrap (beside other statements, in an ``elif``
branch, in nested ``if``s: RMI's ``if self.norm_layer is SynchronizedBatchNorm2d:``), the
conversion happens under that condition, on GPUs:
``convert_sync_batchnorm(model) if torch.cuda.is_available() and args.sync_bn else model``.

DDP109  the wrapped model is called with keyword arguments (``netD(x, step=step,
alpha=alpha)``, progressive GANs): such switches often leave parameters unused in a
forward, which DDP rejects unless told, so ``find_unused_parameters=True`` is passed.

DDP127  a model class of the file (or, in single-file mode, of the project modules it imports) that
has a part whose parameters get no gradient (a submodule made in ``__init__`` that no method
uses; a submodule's result that ``forward()`` computes and never reads, Background-Matting's
``multi_feat = self.model_enc_multi(multi)``; a part ``forward()`` picks by an argument,
Wave-U-Net's ``self.waveunets[inst]``) gets ``find_unused_parameters=True``, and so does a pretrained model
of Hugging Face's libraries (``BertForRelation.from_pretrained(...)``, PURE: its pooler idles when
only the sequence output is read), as Hugging Face's Trainer does. A model built from a class
picked at run time, whose parts cannot be read here (``import_class(name)``, a registry lookup,
a class of a module imported by a name given at run time: TENet's ``module =
importlib.import_module("model." + args.model)``, then ``module.Net(...)``), gets it too.
(An output of the model the script never reads is no such sign: the parameters that make it
may make another too, PCL's `feats128`. Where they idle, the wrap finds them after the first
backward and looks for them from then on, ddp_find_idle.)

DDP129  a DataParallel subclass of the file or of the project (project/dp_subclasses.py)
that only answers for the model's attributes, or only changes how one process splits each
batch over its GPUs (CPM's ``BalancedDataParallel``: a smaller share on GPU 0; CenterNet's
``chunk_sizes``): under DDP each process holds its own share and nothing is gathered, so the
wrap becomes DDP wherever the class takes the model; the class is left unused::

    model = BalancedDataParallel(args.gpu0_bsz, model, dim=0)   ->   model = ddp_wrap(model)

Synchronized-BatchNorm-PyTorch's ``DataParallelWithCallback`` (vendored by SPADE, TFPnP and many
GANs: its ``replicate()`` runs the callbacks that sync BatchNorm over the replicas) becomes DDP
with torch's SyncBatchNorm converted into the model on GPUs, as DDP107 does for
``patch_replication_callback``, also where a module-level alias names it (``DataParallel =
DataParallelWithCallback``) or its package's ``__init__`` re-exports it::

    net = DataParallelWithCallback(net)   ->   net = ddp_wrap(torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
                                                              if torch.cuda.is_available() else net)

A subclass with its own ``gather`` or a ``forward`` that computes is refused (DDP004/DDP122).

DDP125  parameters are frozen or unfrozen after the wrap (``param.requires_grad = epoch >
n`` in the training loop, a whole network frozen per epoch behind a flag, partial BatchNorm
in the model's own ``train()``): DDP registers the trainable parameters when it is built and
waits for a gradient of each at every backward, so it stops at the first step, or never
synchronises a parameter unfrozen later. The wrap registers every parameter and skips those
without a gradient::

    model = nn.DataParallel(model)   ->   model = ddp_wrap_every_parameter(model)

DDP126  a field the script sets on the wrapped model (``model.drop_path_prob = p`` each epoch,
darts): the model reads it from itself, but DDP keeps it on the wrapper, so it is set and
read on the module inside, whether or not the model was wrapped::

    model.drop_path_prob = p   ->   getattr(model, "module", model).drop_path_prob = p

DDP110  the wrapped name is also assigned a checkpoint's entry (``net = checkpoint["net"]``,
mixup-style resume): the checkpoint may hold a pickled DataParallel, so its ``module`` is
wrapped (``getattr(net, "module", net)``), never a wrapper inside a wrapper.

DDP111  (warning) a gradient penalty (``torch.autograd.grad(..., create_graph=True)``,
WGAN-GP) added to the loss of a backward() that also takes a model output directly:
converted. ``autograd.grad`` with respect to the inputs fills no parameter gradient, so DDP's
hooks do not fire there; the penalty's gradient reaches the parameters in that backward(),
where DDP averages it with the rest (each process's penalty is the mean over its share of the
batch, as the loss is). (refuses) a penalty with a backward() of its own (style-based-gan-
pytorch's ``grad_penalty.backward()``): through DDP it reaches the parameters only by the
double backward of a forward whose gradients are not reduced there, and DDP stops at the next
step ("Expected to have finished reduction").

DDP112  only a submodule is wrapped (``model.features = DP(model.features)``, the ImageNet
example's AlexNet/VGG recipe, which spared the classifier's large layers DataParallel's
copies): where the training calls the whole model (``model(images)``), the whole model is
wrapped instead, as that example's own DDP path does::

    model.features = torch.nn.DataParallel(model.features)   ->   model = ddp_wrap(model, keys_unwrapped="features")

Its checkpoints keep DataParallel's keys (``features.module.0.weight``), so old ones resume.

Where the training calls the submodules themselves (``model.classifier(model.features(x))``;
NetVlad's bare ``nn.Module()`` holding ``encoder`` and ``pool``, each wrapped), or inside an
``nn.Module`` (``self.features = DP(self.features)``), each wrapped part becomes a DDP of its
own, and the rest of the weights an optimizer steps are averaged before each step (the wrapped
model's optimizer hook), so every part trains synchronised::

    model.encoder = nn.DataParallel(model.encoder)   ->   model.encoder = ddp_wrap(model.encoder)

DDP113  a method of the user's model class called on the wrapped model
(``model.reverse(...)``, ``model.generate(...)``): DDP does not forward it, so it is called
on the module inside, whether or not the model was wrapped::

    model.reverse(z)   ->   getattr(model, "module", model).reverse(z)

DDP114  (refuses; a warning with ``--allow-partial``) the wrap's condition reads a
mixed-precision switch (``if len(opt.gpu_ids) and not opt.fp16:``, pix2pixHD): with it set,
the model is wrapped elsewhere, after ``amp.initialize``. Made to run on every rank, this
wrap would wrap the model twice; convert by hand.

DDP104  another reference to the DataParallel class (``isinstance(m, nn.DataParallel)``)
now names DistributedDataParallel, which also has ``.module``.
"""

from __future__ import annotations

import functools
import itertools
import re

import libcst as cst
from libcst.metadata import ScopeProvider

from ddpify.analysis import DEVICE_COUNT, Guard, WrapSite, argument_in_slot, batch_length, calls_in, dotted, names_in, root_name, walk, without_gradients
from ddpify.analysis.tree import names_bound_in
from ddpify.diagnostics import Severity
from ddpify.analysis.trainable import MODULE_METHODS, hub_models, models_picked_at_run_time, own_method_call, partly_trained, trainable_set_changes
from ddpify.project.neighbours import idle_parts
from ddpify.transforms.base import Transform, keyword, keyword_arg

DDP_IMPORT = ("torch.nn.parallel", "DistributedDataParallel", None)
SYNC_BN_CALLBACK = "patch_replication_callback"
# What a test may call and still read the same on a second reading: the machine's GPUs.
GPU_QUERIES = {"torch.cuda.device_count", "torch.cuda.is_available"}
DTYPES = {"float", "float16", "float32", "float64", "half", "double", "bfloat16", "int", "long", "bool", "uint8", "int8", "int16", "int32", "int64"}
# `opt.fp16`, `args.amp`, `use_apex`: a guard that reads one picks between wrap sites
MIXED_PRECISION = re.compile(r"(?<![A-Za-z0-9])(?:fp16|amp|apex|half|mixed_precision)(?![A-Za-z0-9])", re.IGNORECASE)


class WrapModelTransform(Transform):
    CODE_PREFIX = "DDP1"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.sites = {site.outer: site for site in self.facts.wraps}
        self.device_count_calls: set[cst.CSTNode] = set()  # calls, or names holding the count
        self.guard_rewrites: dict[cst.CSTNode, bool] = {}  # guard -> the wrap is in its true branch
        self.other_paths: dict[cst.If, tuple[WrapSite, Guard]] = {}  # model-choice guard -> its wrap
        self.converted: dict[cst.Call, cst.BaseExpression] = {}  # DataParallel call -> what it became
        self.rebinds = {line: site for site in self.facts.wraps for line in site.rebinds}
        for line, site in self.rebinds.items():
            self.context.report(
                line,
                "DDP131",
                f"`{site.target}` is bound to another model after the wrap (`{self.context.code(line.body[0].value)}`): "
                "DataParallel's script went on with it unwrapped, or with the wrapper it pickled; it is wrapped again",
            )
        # `patch_replication_callback(model)`: DataParallel-only synchronised BatchNorm
        self.sync_bn_calls = {
            line: dotted(call.args[0].value)
            for line, call in self._statement_calls(SYNC_BN_CALLBACK)
            if call.args
        }
        # Only where the callback always follows the wrap (same block): sync BN the user asked
        # for under a condition (`if config["BN_sync"]:`) is not forced on.
        self.sync_bn_targets = {
            target for line, target in self.sync_bn_calls.items() if self._beside_its_wrap(line, target)
        }
        # `if args.sync_bn: patch_replication_callback(model)` right beside the wrap: the
        # wrap converts under the same condition. guard (an If) -> (target, condition code)
        self.sync_bn_guards = {
            guard: (target, self.context.code(guard.test))
            for line, target in self.sync_bn_calls.items()
            if target not in self.sync_bn_targets and (guard := self._sole_body_of_if(line)) is not None
            and self._beside_its_wrap(guard, target) and self._repeatable(target)
            and not self._reads_what_follows_the_wrap(guard.test, guard, target)
        }
        self.conditional_sync_bn = dict(self.sync_bn_guards.values())
        # the callback deeper in the `if`s beside the wrap (RMI's `if self.norm_layer is
        # SynchronizedBatchNorm2d: patch_replication_callback(m); print(...)`, `elif ... is
        # syncbn.BatchNorm2d: parallel.patch_replication_callback(m)`): the same, under the
        # condition those `if`s give it. line -> condition code
        self.sync_bn_branches = self._callbacks_in_branches()
        for target, conditions in self._conditions_by_target().items():
            self.conditional_sync_bn[target] = _any_of(conditions)
        # `discriminator(x, step=step, alpha=alpha)`: forward may leave parameters unused
        self.switched_models = {
            dotted(node.func): self.context.code(node)
            for node in self.facts.contexts
            if isinstance(node, cst.Call)
            and dotted(node.func) in self.facts.model_names
            and any(arg.keyword is not None for arg in node.args)
            # ffjord's sampling `model(fixed_z, reverse=True)` under no_grad switches nothing DDP sees
            and not without_gradients(node, self.context.parent, self.context.code)
        }
        self.partly_trained = partly_trained(self.context.module, self.facts)
        self.hub_models = hub_models(self.context.module, self.facts)
        self.picked_models = models_picked_at_run_time(self.context.module, self.facts)
        self.through_forward = self.facts.forwards_around_ddp
        self.through_models = {owner: method for owner, method in self.through_forward.values()}
        self.idle_models = self._idle_models()
        for site in self.facts.wraps:
            self._classify_guards(site)
        if self.guard_rewrites:
            self.context.replaced_devices.update(
                node.value for node in walk(self.context.module) if isinstance(node, cst.Assign) and self._device_beside_a_widened_wrap(node)
            )

    def _idle_models(self) -> list[tuple[str, str]]:
        """Model classes of this file or its project (single-file mode) that this file builds
        and that have a part whose parameters get no gradient."""
        import ast

        try:
            idle = {**self.context.neighbours.idle_parts, **idle_parts(ast.parse(self.context.module.code))}
        except (SyntaxError, ValueError):
            return []
        built = {dotted(node.func) for node in walk(self.context.module) if isinstance(node, cst.Call)}
        return sorted((name, part) for name, part in idle.items() if name in built)

    def _freezing_models(self) -> list[str]:
        """Project model classes (read in single-file mode) this file builds that freeze or
        unfreeze parameters outside their constructor."""
        classes = self.context.neighbours.freezing_classes
        return sorted({dotted(node.func) for node in walk(self.context.module) if isinstance(node, cst.Call) and dotted(node.func) in classes})

    def _model_fields(self) -> set[str]:
        """Fields the script sets on a wrapped model (``model.drop_path_prob = p``, darts): the
        model reads them from itself, so they are set (and read) on the module inside; DDP
        keeps them on the wrapper."""
        fields = set()
        for node in walk(self.context.module):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target] if isinstance(node, cst.AugAssign) else []
            for target in targets:
                if not isinstance(target, cst.Attribute) or dotted(target.value) not in self.facts.model_names:
                    continue
                name = target.attr.value
                replaces_layer = isinstance(node.value, cst.Call) if isinstance(node, cst.Assign) else False
                if name not in MODULE_METHODS and name not in ("module", "training") and not name.startswith("_") and not replaces_layer:
                    fields.add(name)
        return fields

    def _module_of_a_loaded_model(self, node: cst.Attribute) -> bool:
        """``checkpoint['model'].module`` where ``checkpoint = torch.load(...)``."""
        if node.attr.value != "module" or not isinstance(node.value, cst.Subscript):
            return False
        root = root_name(node.value)
        return root is not None and any(self._loads(value) for value in self._assigned_values(root))

    def _maybe_loaded_wrapper(self, module: cst.BaseExpression | None) -> bool:
        """Is the wrapped name ever assigned a checkpoint's entry (``checkpoint["net"]``) or a
        ``torch.load`` result?"""
        if not isinstance(module, cst.Name):
            return False
        return any(isinstance(value, cst.Subscript) or self._loads(value) for value in self._assigned_values(module))

    def _assigned_values(self, name: cst.Name) -> list[cst.BaseExpression]:
        """The values assigned (``name = value``) to the variable this name refers to."""
        scope = self.context.metadata.get_metadata(ScopeProvider, name, None)
        values = []
        for assignment in scope[name.value] if scope is not None else ():
            parent = self.context.parent(getattr(assignment, "node", None)) if getattr(assignment, "node", None) else None
            parent = self.context.parent(parent) if isinstance(parent, cst.AssignTarget) else parent
            if isinstance(parent, cst.Assign):
                values.append(parent.value)
        return values

    def _loads(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and "torch.load" in self.context.qualified(value.func)

    def check(self) -> None:
        # requires_grad changed after the wrap: DDP registers every parameter (see trainable.py)
        self.trainable_changes = trainable_set_changes(self.context.module, self.facts, self.context.position)
        self.freezing_models = self._freezing_models()
        self.model_fields = self._model_fields()
        self.whole_model: dict[cst.Call, str] = {}  # submodule wraps made whole-model wraps -> the model
        self.linked_penalties: dict[cst.Call, str] = {}  # a penalty's own backward() -> the output it takes too
        self.linked_returns: dict[cst.Return, str] = {}  # a penalty helper's return -> the output it takes too
        for site in self.facts.wraps:
            self._check_submodule(site)
        for node in self.facts.contexts:
            if isinstance(node, cst.Call) and "torch.autograd.grad" in self.context.qualified(node.func):
                create_graph = keyword_arg(node, "create_graph")
                if create_graph is not None and self.context.code(create_graph.value) != "False":
                    self._report_penalty(node)

    def _report_penalty(self, node: cst.Call) -> None:
        """A gradient penalty converts where its loss goes into the same backward() as a model
        output used directly (WGAN-GP's ``(d_real + 10 * penalty).backward()``). A backward of
        the penalty alone (style-based-gan-pytorch's ``grad_penalty.backward()``) reaches the
        parameters only through the double backward of a forward DDP already counted: DDP stops
        at the next step ("Expected to have finished reduction")."""
        alone = self._penalty_backward_alone(node)
        output = self._penalty_output(node, alone) if alone is not None else None
        if output is not None:
            self.linked_penalties[alone] = output
            self.context.report(
                alone,
                "DDP111",
                f"a gradient penalty (torch.autograd.grad(..., create_graph=True)) has a backward() of its own: that "
                f"backward() also takes `0 * {output}.sum()`, the output of the forward the penalty differentiates, so "
                "DDP reduces the penalty's gradients in it and the next step finds the reduction finished",
            )
            return
        helper = self._helper_return(node) if alone is not None else None
        if helper is not None:
            returned, output = helper
            self.linked_returns[returned] = output
            self.context.report(
                returned,
                "DDP111",
                f"a gradient penalty (torch.autograd.grad(..., create_graph=True)) made in a helper has a backward() of "
                f"its own: the helper returns it with `0 * {output}.sum()`, the output of the forward it differentiates, "
                "so DDP reduces the penalty's gradients in that backward() and the next step finds the reduction finished",
            )
            return
        if alone is not None:
            self.context.report_unsound(
                alone,
                "DDP111",
                "a gradient penalty (torch.autograd.grad(..., create_graph=True)) has a backward() of its own: "
                "through DDP it reaches the parameters only by the double backward of a forward whose gradients "
                "DDP does not reduce there, and the next step stops (\"Expected to have finished reduction\"); "
                "add the penalty to the loss of a backward() that also takes a model output directly",
            )
            return
        self.context.report(
            node,
            "DDP111",
            "a gradient of a gradient (torch.autograd.grad(..., create_graph=True), a WGAN-GP penalty): the penalty's "
            "gradient reaches the parameters in the backward() that also takes a model output, where DDP averages "
            "it with the rest (each process's penalty is the mean over its share of the batch, as the loss is)",
            Severity.WARNING,
        )

    def _penalty_output(self, grad_call: cst.Call, backward: cst.Call) -> str | None:
        """The output a penalty differentiates (``outputs=d_interp``), where its own backward()
        can name it too: a name of the same function (rosinality's StyleGAN2 joins the two with
        ``(r1_loss + 0 * real_pred[0]).backward()``). None where the penalty comes from a helper."""
        value = _grad_outputs(grad_call)
        here, there = self.facts.contexts.get(grad_call), self.facts.contexts.get(backward)
        if value is None or here is None or there is None or here.function is not there.function:
            return None
        inner = value
        while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in ("sum", "mean") and not inner.args:
            inner = inner.func.value  # (`outputs=hat_predict.sum()`)
        root = inner
        while isinstance(root, cst.Subscript):
            root = root.value  # (`outputs=real_pred[0]`: the element itself, a tuple has no .sum())
        return self.context.code(inner) if isinstance(root, cst.Name) else None

    def _helper_return(self, grad_call: cst.Call) -> tuple[cst.Return, str] | None:
        """A penalty made in a helper (GANimation's ``_gradinet_penalty_D``, AlacGAN's
        ``calc_gradient_penalty``) whose one ``return`` hands it to a backward() of its own: that
        return, and the output the penalty differentiates, a name of the helper."""
        here = self.facts.contexts.get(grad_call)
        if here is None or here.function is None:
            return None
        returns = [node for node in walk(here.function.body) if isinstance(node, cst.Return) and node.value is not None]
        nested = [node for node in walk(here.function.body) if isinstance(node, (cst.FunctionDef, cst.Lambda))]
        if len(returns) != 1 or nested:
            return None
        value = _grad_outputs(grad_call)
        return (returns[0], value.value) if isinstance(value, cst.Name) else None

    def _penalty_backward_alone(self, grad_call: cst.Call) -> cst.CSTNode | None:
        """The backward() whose loss holds the penalty and no model output outside it."""
        body = self.context.module
        assigns = [n for n in walk(body) if isinstance(n, cst.Assign)]
        models = self.facts.model_names
        # a helper that returns the penalty (AlacGAN's calc_gradient_penalty()): its calls are penalties
        scope = self.facts.contexts.get(grad_call)
        helper = scope.function.name.value if scope is not None and scope.function is not None else None

        def outside_grad(expr: cst.CSTNode) -> list[cst.CSTNode]:
            if isinstance(expr, cst.Call) and "torch.autograd.grad" in self.context.qualified(expr.func):
                return []
            return [expr, *(n for child in expr.children for n in outside_grad(child))]

        def spread(seed) -> set[str]:
            names: set[str] = set()
            grown = True
            while grown:
                grown = False
                for assign in assigns:
                    if seed(assign.value, names):
                        for target in assign.targets:
                            for name in walk(target.target):
                                if isinstance(name, cst.Name) and name.value not in names:
                                    names.add(name.value)
                                    grown = True
            return names

        def has_penalty(expr, names) -> bool:
            return any(
                n is grad_call or isinstance(n, cst.Name) and n.value in names
                or isinstance(n, cst.Call) and helper is not None and dotted(n.func) == helper
                for n in walk(expr)
            )

        def has_output(expr, names) -> bool:
            return any(
                isinstance(n, cst.Call) and dotted(n.func) in models or isinstance(n, cst.Name) and n.value in names
                for n in outside_grad(expr)
            )

        penalty, outputs = spread(has_penalty), spread(has_output)
        values: dict[str, list[cst.BaseExpression]] = {}
        for assign in assigns:
            for target in assign.targets:
                if isinstance(target.target, cst.Name):
                    values.setdefault(target.target.value, []).append(assign.value)
        for call in walk(body):
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                loss = call.func.value
                # (a loss bound to a sum of both, AttGAN's `d_loss = df_loss + lambda_gp * df_gp`:
                # its terms are looked at)
                terms = values.get(loss.value, [loss]) if isinstance(loss, cst.Name) else [loss]
                if has_penalty(loss, penalty) and not any(has_output(term, outputs - penalty) for term in terms):
                    return call
        return None

    def _check_submodule(self, site: WrapSite) -> None:
        """``model.encoder = DP(model.encoder)``: the rest of ``model`` trains outside DDP."""
        target = site.target or ""
        if "." not in target or dotted(site.module_arg) != target:
            return
        owner = target.rsplit(".", 1)[0]
        context = self.facts.contexts.get(site.call)
        in_module_class = owner == "self" and context is not None and context.cls is not None and any(
            (dotted(base.value) or "").split(".")[-1] == "Module" for base in context.cls.bases
        )
        if owner == "self" and not in_module_class:
            return  # a trainer object's model attribute: the whole model
        if "." not in owner and owner != "self" and self._whole_model_trains(owner, target) and self._assigned_alone(site):
            self.whole_model[site.call] = owner
            return
        # (the part becomes a DDP of its own; the weights of the rest that an optimizer steps are
        # averaged before each step by the wrapped model's optimizer hook, DdpModel.late_parameters)
        self.context.report(
            site.call,
            "DDP112",
            f"only a submodule is wrapped (`{target}`) and the training calls it: it becomes a DDP of its own; the "
            f"other trainable parts of `{owner}` that an optimizer steps start as rank 0's and have their gradients "
            "averaged before each step (their buffers, such as BatchNorm statistics, stay each rank's own)",
        )

    def _whole_model_trains(self, owner: str, target: str) -> bool:
        """Does a training loop call ``owner(...)`` itself, and never the wrapped part alone?"""
        calls = [dotted(call.func) for loop in self.facts.training_loops for call in calls_in(loop.body)]
        return owner in calls and target not in calls

    def _assigned_alone(self, site: WrapSite) -> bool:
        """``model.features = DP(model.features)`` as a statement of its own."""
        assign = self.context.parent(site.outer)
        return isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(self.context.parent(assign), cst.SimpleStatementLine)

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if self._device_beside_a_widened_wrap(original_node):
            self.context.use_helper("ddp_device")
            self.context.report(
                original_node,
                "DDP147",
                f"`{self.context.code(original_node.targets[0].target)}` is chosen beside a wrap that now also runs "
                "whenever the world size is above one: the data goes where the wrapped model is, ddp_device()",
            )
            return updated_node.with_changes(value=cst.parse_expression("ddp_device()"))
        site = next((site for site in self.facts.wraps if site.outer is original_node.value and site.call in self.whole_model), None)
        if site is None:
            return updated_node
        owner = self.whole_model[site.call]
        self.context.report(
            site.call,
            "DDP112",
            f"only a submodule was wrapped (`{site.target}`), and the training calls the whole `{owner}`: the whole "
            "model is wrapped in DDP (every part the optimizer trains synchronised)",
        )
        self.context.use_helper("ddp_wrap")
        self.context.add_import(*DDP_IMPORT)
        # (its checkpoints keep DataParallel's keys: `features.module.0.weight`)
        part = site.target[len(owner) + 1 :] if site.target and site.target.startswith(owner + ".") else None
        keys = f', keys_unwrapped="{part}"' if part else ""
        return updated_node.with_changes(
            targets=[cst.AssignTarget(cst.Name(owner))], value=cst.parse_expression(f"ddp_wrap({owner}{keys})")
        )

    def _device_beside_a_widened_wrap(self, assign: cst.Assign) -> bool:
        """``device = '{}:{}'.format(args.device, device_ids[0])`` or ``device = 'cuda:0'`` in the
        block of a wrap whose guard now lets every rank through (DBE's ``if args.device ==
        'cuda':``, run with ``-d cpu`` under torchrun): the wrap puts the model on this process's
        device, and the device the batches and targets go to must be that one; left as it was, it
        names GPU 0, another GPU, or CUDA on a machine without it."""
        if len(assign.targets) != 1 or dotted(assign.targets[0].target) not in self._data_devices:
            return False
        line = self.context.parent(assign)
        if not isinstance(line, cst.SimpleStatementLine) or not self.guard_rewrites:
            return False
        block = self.context.parent(line)
        above = set()
        node = block
        while node is not None:
            above.add(id(node))
            node = self.context.parent(node)
        for site in self.facts.wraps:
            widened = [g.node for g in site.guards if isinstance(g.node, cst.If) and self.guard_rewrites.get(g.node) and id(g.node) in above]
            if not widened:
                continue
            if any(self.context.parent(block) is guard and self._split_apart(guard) for guard in widened):
                continue  # (a statement beside the wraps keeps the test it had: decision-transformer's)
            statement = site.call
            while statement is not None and not isinstance(statement, cst.SimpleStatementLine):
                statement = self.context.parent(statement)
            if statement is not None and statement is not line and self.context.parent(statement) is block:
                return True
        return False

    def _split_apart(self, original: cst.If) -> bool:
        """Does _split_widened_guard give the statements beside the wraps their old test?"""
        originals = [statement for statement in original.body.body if not self._removed_sync_bn(statement)]
        wraps = [any(site.outer in walk(statement) or site.call in walk(statement) for site in self.facts.wraps) for statement in originals]
        if len(originals) < 2 or all(wraps) or not any(wraps) or original.orelse is not None and wraps[0]:
            return False
        # (read as converted: the wrap's device list and its move's device are gone from it)
        dropped = {
            id(node) for site in self.facts.wraps
            for arg in [*(site.move.args if site.move is not None else ()), *(a for a in site.call.args if a.value is not site.module_arg)]
            for node in walk(arg)
        }
        bound = {dotted(t.target) for statement, is_wrap in zip(originals, wraps) if not is_wrap
                 for node in walk(statement) if isinstance(node, cst.Assign) for t in node.targets} - {None}
        read = {dotted(n) for statement, is_wrap in zip(originals, wraps) if is_wrap
                for n in walk(statement) if isinstance(n, (cst.Name, cst.Attribute)) and id(n) not in dropped}
        return not bound & read

    @functools.cached_property
    def _data_devices(self) -> frozenset[str]:
        """Names the file moves tensors or modules to (``x.to(device)``, ``device=device``)."""
        found = set()
        for call in calls_in(self.context.module):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "cuda") and call.args and call.args[0].keyword is None:
                found.add(dotted(call.args[0].value))
            found.update(dotted(arg.value) for arg in call.args if arg.keyword is not None and arg.keyword.value == "device")
        return frozenset(found - {None})

    def _statement_calls(self, name: str) -> list[tuple[cst.SimpleStatementLine, cst.Call]]:
        """Statements that are just a call of a function called `name`."""
        found = []
        for node, context in self.facts.contexts.items():
            if isinstance(node, cst.Call) and (dotted(node.func) or "").split(".")[-1] == name:
                expr = self.context.parent(node)
                line = self.context.parent(expr) if isinstance(expr, cst.Expr) else None
                if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                    found.append((line, node))
        return found

    def _callbacks_in_branches(self) -> dict[cst.SimpleStatementLine, tuple[tuple[bool, str], ...]]:
        """The callbacks under ``if``s (any shape: several statements, ``elif``, nested) whose
        outermost ``if`` sits beside the wrap -> the condition under which each runs."""
        found = {}
        for line, target in self.sync_bn_calls.items():
            if target in self.sync_bn_targets or self._sole_body_of_if(line) in self.sync_bn_guards or not self._repeatable(target):
                continue
            condition = self._branch_condition(line, target)
            if condition is not None:
                found[line] = condition
        return found

    def _conditions_by_target(self) -> dict[str, list[tuple[tuple[bool, str], ...]]]:
        by_target: dict[str, list[tuple[tuple[bool, str], ...]]] = {}
        for line, condition in self.sync_bn_branches.items():
            by_target.setdefault(self.sync_bn_calls[line], []).append(condition)
        return by_target

    def _branch_condition(self, line: cst.CSTNode, target: str | None) -> tuple[tuple[bool, str], ...] | None:
        """The tests of the ``if``s between ``line`` and the wrap's block, each (whether it is
        negated, its code): an ``elif`` or ``else`` branch holds where the earlier tests were
        false. None where the line is not under such ``if``s, or a test reads the wrapped model
        (not there before the wrap)."""
        tests: list[tuple[bool, str]] = []
        tested: list[cst.BaseExpression] = []
        node = line
        for _ in range(4):
            block = self.context.parent(node)
            owner = self.context.parent(block) if isinstance(block, cst.IndentedBlock) else None
            if isinstance(owner, cst.Else):
                owner = self.context.parent(owner)
                tests.append((True, _operand(owner.test, self.context.code)))
            elif isinstance(owner, cst.If):
                tests.append((False, _operand(owner.test, self.context.code)))
            else:
                return None
            while isinstance(self.context.parent(owner), cst.If) and self.context.parent(owner).orelse is owner:
                owner = self.context.parent(owner)  # (an `elif`: the tests before it were false)
                tests.append((True, _operand(owner.test, self.context.code)))
            if target in {dotted(n) for n in walk(owner.test) if isinstance(n, (cst.Name, cst.Attribute))}:
                return None
            tested.append(owner.test)
            if self._beside_its_wrap(owner, target):
                if any(self._reads_what_follows_the_wrap(test, owner, target) for test in tested):
                    return None
                return tuple(reversed(tests))
            node = owner
        return None

    def _reads_what_follows_the_wrap(self, test: cst.BaseExpression, statement: cst.CSTNode, target: str | None) -> bool:
        """Does ``test`` read a name that a statement between the wrap and ``statement`` (in their
        block) binds (``use_sync = norm_layer is SynchronizedBatchNorm2d`` after the wrap)? Moved
        to the wrap, the test would read it before it is bound."""
        block = self.context.parent(statement)
        body = list(getattr(block, "body", ()))
        if statement not in body:
            return True
        wrapping = [i for i, line in enumerate(body) if any(site.target == target and any(n is site.call for n in walk(line)) for site in self.facts.wraps)]
        if not wrapping:
            return True
        between = body[wrapping[-1] + 1 : body.index(statement)]
        bound = {name for line in between for name in names_bound_in(line)}
        read = {dotted(n) for n in walk(test) if isinstance(n, (cst.Name, cst.Attribute))}
        return bool(bound & read)

    def _repeatable(self, target: str | None) -> bool:
        """The wrapped module is a plain name or attribute (it appears twice in the result)."""
        site = next((site for site in self.facts.wraps if site.target == target), None)
        module = site.module_arg if site is not None else None
        return isinstance(module, (cst.Name, cst.Attribute))

    def _split_widened_guard(self, original: cst.If, updated: cst.If) -> list:
        """``if args.cuda: model = DP(model); model = model.cuda()``: only the wraps must run
        whenever the world size is above one; the statements beside them keep the condition
        they had (`.cuda()` on a CPU-only machine, a flag's own settings: NLP_Project's
        ``DEVICE_IDs = range(NGPU)`` beside two wraps read a None flag on every rank). Each run
        of wraps gets the widened test, each run of other statements the old one, in order. An
        ``else`` goes with the statements before the first wrap (PointPWC's ``if
        args.multi_gpu is not None: device_ids = args.multi_gpu.split(','); ...``). Left whole
        when a wrap reads a name the statements beside it bind."""
        # The sync-BN callbacks edit_block removed from the body are not in `updated`.
        originals = [statement for statement in original.body.body if not self._removed_sync_bn(statement)]
        updates = updated.body.body
        wraps = [any(site.outer in walk(statement) or site.call in walk(statement) for site in self.facts.wraps) for statement in originals]
        if len(originals) != len(updates) or len(originals) < 2 or all(wraps) or not any(wraps):
            return [(original, updated)]
        if original.orelse is not None and wraps[0] or self._wraps_read_what_beside_binds(updates, wraps):
            return [(original, updated)]
        pieces, index = [], 0
        for is_wrap, run in itertools.groupby(wraps):
            count = len(list(run))
            body = updated.body.with_changes(body=updates[index : index + count])
            test = updated.test if is_wrap else original.test
            orelse = updated.orelse if not pieces and not is_wrap else None
            pieces.append(updated.with_changes(test=test, body=body, orelse=orelse, leading_lines=[] if pieces else updated.leading_lines))
            index += count
        return [(original if index == 0 else None, piece) for index, piece in enumerate(pieces)]

    def _wraps_read_what_beside_binds(self, statements: list[cst.CSTNode], wraps: list[bool]) -> bool:
        """Does a converted wrap read a name a statement beside it binds, other than by updating
        it (``model = model.cuda()`` rebinds a model bound before the ``if``)? (``device_ids=``
        is gone from the wrap: a device list bound beside it is not read.)"""
        bound = set()
        for statement, is_wrap in zip(statements, wraps):
            if is_wrap:
                continue
            for node in walk(statement):
                if isinstance(node, cst.Assign) and not isinstance(node.value, cst.Lambda):
                    read = {dotted(n) for n in walk(node.value) if isinstance(n, (cst.Name, cst.Attribute))}
                    bound |= {dotted(t.target) for t in node.targets if dotted(t.target) not in read}
        read_by_wraps = {dotted(n) for statement, is_wrap in zip(statements, wraps) if is_wrap for n in walk(statement) if isinstance(n, (cst.Name, cst.Attribute))}
        return bool((bound - {None}) & read_by_wraps)

    def _removed_sync_bn(self, statement: cst.CSTNode) -> bool:
        return (
            statement in self.sync_bn_calls and self.sync_bn_calls[statement] in self.sync_bn_targets
        ) or statement in self.sync_bn_guards or statement in self.sync_bn_branches

    def _sole_body_of_if(self, line: cst.CSTNode) -> cst.If | None:
        """The ``if`` (no ``else``) whose whole body is this statement."""
        block = self.context.parent(line)
        guard = self.context.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(guard, cst.If) and guard.orelse is None and len(block.body) == 1:
            return guard
        return None

    def _beside_its_wrap(self, line: cst.CSTNode, target: str | None) -> bool:
        wraps = [site.call for site in self.facts.wraps if site.target == target]
        block = self.context.parent(line)
        for call in wraps:
            node = call
            while node is not None and not isinstance(node, cst.SimpleStatementLine):
                node = self.context.parent(node)
            if node is not None and self.context.parent(node) is block:
                return True
        return False

    def edit_block(self, owner: cst.CSTNode, block):
        kept = []
        for original, updated in block:
            if isinstance(original, cst.If) and self.guard_rewrites.get(original) and isinstance(updated, cst.If):
                kept.extend(self._split_widened_guard(original, updated))
                continue
            if original in self.sync_bn_calls and self.sync_bn_calls[original] in self.sync_bn_targets:
                self.context.report(
                    original,
                    "DDP107",
                    f"DataParallel's synchronised BatchNorm ({SYNC_BN_CALLBACK}) -> "
                    "torch.nn.SyncBatchNorm.convert_sync_batchnorm before the wrap",
                )
                continue
            if original in self.sync_bn_guards:
                target, condition = self.sync_bn_guards[original]
                self.context.report(
                    original,
                    "DDP107",
                    f"DataParallel's synchronised BatchNorm under `{condition}` -> "
                    "torch.nn.SyncBatchNorm.convert_sync_batchnorm before the wrap, under the same condition",
                )
                continue
            if original in self.sync_bn_branches:
                self.context.report(
                    original,
                    "DDP107",
                    f"DataParallel's synchronised BatchNorm under `{_any_of([self.sync_bn_branches[original]])}` -> "
                    "torch.nn.SyncBatchNorm.convert_sync_batchnorm before the wrap, under the same condition",
                )
                continue
            if original in self.sync_bn_calls and self._sole_body_of_if(original) in self.sync_bn_guards:
                kept.append((original, updated))  # its `if` goes whole (above)
                continue
            if original in self.sync_bn_calls and self.sync_bn_calls[original] in self.facts.model_names:
                self.context.report(
                    original,
                    "DDP107",
                    f"{SYNC_BN_CALLBACK} under its own condition removed (it only accepts a DataParallel): "
                    "BatchNorm statistics stay per process; for synchronised BatchNorm apply "
                    "torch.nn.SyncBatchNorm.convert_sync_batchnorm before the wrap by hand",
                    Severity.WARNING,
                )
                continue
            kept.append((original, updated))
            if original in self.rebinds:
                kept.append((None, self._rewrap(self.rebinds[original])))
        if not kept:
            kept.append((None, cst.SimpleStatementLine([cst.Pass()])))
        return kept

    def _a_part_of_another_wrap(self, site: WrapSite) -> bool:
        """Is the wrapped name handed to the constructor of a model wrapped elsewhere
        (``model = Net(encoder=pretrainedEnc); model = DataParallel(model)``)? Then it is a
        part of that model, not a model the run goes on with: wrapping it on other paths would
        nest one DDP inside another."""
        for other in self.facts.wraps:
            if other is site or other.module_arg is None or not site.target:
                continue
            values = [other.module_arg]
            if isinstance(other.module_arg, cst.Name):
                values += self._assigned_values(other.module_arg)
            for value in values:
                if isinstance(value, cst.Call) and any(dotted(arg.value) == site.target for arg in value.args):
                    return True
        return False

    def _wrapped_on_the_other_branch(self, site: WrapSite, test: cst.BaseExpression) -> bool:
        """Another wrap of the same model under the opposite test (`if args.apex:` against
        `if not args.apex:`): each run takes one of them, so converted in place they wrap once."""
        shown = self.context.code(test).strip()
        opposite = shown[4:].strip() if shown.startswith("not ") else f"not {shown}"
        return any(
            other is not site and other.target == site.target
            and any(self.context.code(guard.node.test).strip() == opposite for guard in other.guards)
            for other in self.facts.wraps
        )

    def _classify_guards(self, site: WrapSite) -> None:
        for guard in site.guards:
            test = guard.node.test
            if MIXED_PRECISION.search(self.context.code(test)) and self._wrapped_on_the_other_branch(site, test):
                continue  # proxynca_pp: `if not args.apex:` wraps here, `if args.apex:` there; one wrap either way
            if MIXED_PRECISION.search(self.context.code(test)):
                self.context.report_unsound(
                    test,
                    "DDP114",
                    f"the wrap depends on `{self.context.code(test)}`, a mixed-precision switch: with it set the "
                    "model is wrapped elsewhere (after amp.initialize), and a wrap made to run on every rank would "
                    "wrap it twice; convert this wrap by hand",
                )
                continue
            if all(_tests_for_a_wrap(part, self.context) for part in _conjuncts(test)):
                # `if not isinstance(model, nn.DataParallel):` (ssast) only keeps from wrapping twice;
                # it names DDP once converted, and must stay as it is (widened, it wraps DDP in DDP)
                continue
            counts = [node for node in calls_in(test) if DEVICE_COUNT in self.context.qualified(node.func)]
            counts += self._gpu_count_references(test)
            if counts and self._reads_only(test, counts):
                self.device_count_calls.update(counts)
                counted = ", ".join(self.context.code(node) for node in counts)
                self.context.report(
                    test, "DDP102", f"{counted} (the GPU count) in the guard around the wrap -> dist.get_world_size()"
                )
                continue
            if not about_devices(self.context.code(test)) and self._a_part_of_another_wrap(site):
                continue  # LEDNet: the encoder either path makes is handed to the decoder model wrapped next
            if not about_devices(self.context.code(test)) and (guard.unwrapped_branches or guard.falls_through_unwrapped):
                # A model choice whose other paths go on with a model of their own: wrapped there too.
                self.other_paths[guard.node] = (site, guard)
                self.context.report(
                    test,
                    "DDP130",
                    f"the wrap ran only when `{self.context.code(test)}` was {guard.wraps_when_true} (a model choice, "
                    "left as it is): the model the run goes on with otherwise is wrapped too (every rank must wrap)",
                )
                continue
            if not about_devices(self.context.code(test)):
                # A model choice (`if args.pretrained:`), not a multi-GPU switch: left as it is.
                self.context.report(
                    test,
                    "DDP108",
                    f"the wrap also depends on `{self.context.code(test)}`, left as it is (not a GPU switch); "
                    + (
                        "if it switches multi-GPU training off, the run stops at the first step with a clear error"
                        if self.context.options.self_check
                        else "if it switches multi-GPU training off, each rank trains a model of its own "
                        "(`ddpify verify` or `--self-check` stops such a run)"
                    ),
                    Severity.WARNING,
                )
                continue
            self.guard_rewrites[guard.node] = guard.wraps_when_true
            self.context.add_import("torch.distributed", None, "dist")
            self.context.report(
                test,
                "DDP103",
                f"the wrap only ran when `{self.context.code(test)}` was {guard.wraps_when_true}: it now also runs "
                "whenever the world size is above one (every rank must wrap)",
            )

    def _cuda_move_ungated(self, site: WrapSite, updated: cst.Call) -> bool:
        """The wrap's `.cuda()` (or `.to(device)`, `.cuda(device)`: decision-transformer's
        ``.to(self.device)`` of ``self.device = torch.cuda.current_device()`` beside it) ran under
        a guard that tested for CUDA (a GPU count above one among them), and that guard now lets
        every rank through: the device it names may exist only where CUDA does."""
        if not self._a_device_move(updated):
            return False
        return any(
            guard.node in self.guard_rewrites and re.search(r"cuda|gpu|device", self.context.code(guard.node.test), re.IGNORECASE)
            or any(node in self.device_count_calls for node in walk(guard.node.test))
            for guard in site.guards
        )

    def _moved_in_a_widened_guard(self, site: WrapSite, module: cst.Call) -> bool:
        """The wrapped model moved to a GPU in the wrap's own argument (``model.cuda()``,
        ``model.to(device)``), under a guard that now lets every rank through."""
        return self._a_device_move(module) and any(guard.node in self.guard_rewrites for guard in site.guards)

    def _a_device_move(self, call: cst.Call) -> bool:
        """``x.cuda()``, ``x.cuda(device)``, ``x.to(device)``: a move, not a cast."""
        if not isinstance(call.func, cst.Attribute) or call.func.attr.value not in ("cuda", "to"):
            return False
        if call.func.attr.value == "cuda":
            return len(call.args) <= 1
        named = [arg for arg in call.args if arg.keyword is None or arg.keyword.value == "device"]
        return len(call.args) == 1 and len(named) == 1 and not self._a_dtype(named[0].value)

    def _a_dtype(self, value: cst.BaseExpression) -> bool:
        """``torch.float16``, ``torch.half``: a cast, not a move."""
        return any(name.startswith("torch.") and name[6:] in DTYPES for name in self.context.qualified(value))

    def _reads_only(self, test: cst.BaseExpression, counts: list[cst.CSTNode]) -> bool:
        """Is `test` about the GPU count alone (``n_gpu > 1``, ``device_count() > 1 and True``)?"""
        inside = {id(node) for count in counts for node in walk(count)}
        return all(
            id(name) in inside or name.value in ("True", "False", "None") for name in names_in(test)
        )

    def _gpu_count_references(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """Variables / attributes in `node` that hold torch.cuda.device_count()."""
        if isinstance(node, (cst.Name, cst.Attribute)) and dotted(node) in self.facts.gpu_count_names:
            return [node]
        if isinstance(node, cst.Attribute):  # `.attr` names a field, not a variable
            return self._gpu_count_references(node.value)
        return [found for child in node.children for found in self._gpu_count_references(child)]

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> cst.Return:
        if original_node not in getattr(self, "linked_returns", {}) or updated_node.value is None:
            return updated_node
        # `return (penalty) + 0 * prob.sum()`
        linked = cst.parse_expression(f"0 * {self.linked_returns[original_node]}.sum()")
        penalty = _atom(updated_node.value)
        return updated_node.with_changes(value=cst.BinaryOperation(left=penalty, operator=cst.Add(), right=linked))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.linked_penalties:
            # `(grad_penalty + 0 * hat_predict.sum()).backward()`
            penalty = _atom(updated_node.func.value)
            linked = cst.parse_expression(f"0 * {self.linked_penalties[original_node]}.sum()")
            joined = cst.BinaryOperation(left=penalty, operator=cst.Add(), right=linked, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated_node.with_changes(func=updated_node.func.with_changes(value=joined))
        if original_node in self.device_count_calls:
            return self._world_size()
        if original_node in self.facts.functional_calls:
            return self._called_directly(original_node, updated_node)
        if original_node in self.through_forward:
            owner, method = self.through_forward[original_node]
            self.context.report(
                original_node,
                "DDP133",
                f"`{self.context.code(original_node.func)}(...)` computes a training loss with another method of the "
                f"wrapped `{owner}`, around DDP's forward (its gradients would not be averaged): it runs through "
                "DDP's forward (ddp_through)",
            )
            self.context.use_helper("ddp_through")
            args = [cst.Arg(cst.parse_expression(owner)), cst.Arg(cst.SimpleString(f'"{method}"')), *updated_node.args]
            return cst.Call(func=cst.Name("ddp_through"), args=args)
        if own_method_call(original_node, self.facts):
            name = dotted(original_node.func.value)
            self.context.report(
                original_node,
                "DDP113",
                f"`{name}.{original_node.func.attr.value}()` is the model's own method, which DDP does not forward: "
                "called on the module inside",
            )
            inner = cst.parse_expression(self.context.unwrapped(name, original_node))
            return updated_node.with_changes(func=updated_node.func.with_changes(value=inner))
        site = self.sites.get(original_node)
        if site is None:
            return updated_node
        self.converted[site.call] = self._wrap(site, updated_node)
        return self.converted[site.call]

    def _called_directly(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``nn.parallel.data_parallel(self.main, input, range(self.ngpu))`` -> ``self.main(input)``
        (a tuple of inputs, unpacked): the model built from the class is wrapped instead."""
        positional = [arg for arg in updated.args if arg.keyword is None and not arg.star]
        module, inputs = positional[0].value, positional[1].value
        owner = self.facts.functional_calls[original]
        if owner.endswith("()"):
            self.context.report(
                original, "DDP136",
                f"DataParallel by function in {owner}: the part is called directly "
                f"(`{self.context.code(original.args[0].value)}(...)`), wrapped where the constructor builds it",
            )
        elif owner:
            self.context.report(
                original, "DDP136",
                f"DataParallel by function in {owner}.forward(): the part is called "
                f"directly (`{self.context.code(original.args[0].value)}(...)`), the model built from the class is wrapped",
            )
        else:
            self.context.report(
                original, "DDP137",
                f"DataParallel by function where no gradient flows: `{self.context.code(original.args[0].value)}(...)` "
                "is called directly, each process evaluating its batch whole",
            )
        if isinstance(inputs, cst.Tuple):
            args = [cst.Arg(element.value) for element in inputs.elements]
        else:
            args = [cst.Arg(inputs)]
        return cst.Call(func=module, args=args)

    def _wrap(self, site: WrapSite, updated: cst.Call) -> cst.BaseExpression:
        dp_call = updated.func.value if site.move is not None else updated
        module = dp_call if site.constructed else argument_in_slot(dp_call, site.module_slot)
        if self._maybe_loaded_wrapper(site.module_arg):
            # `net = checkpoint["net"]` may be a pickled DataParallel / DDP: wrap what is inside.
            name = self.context.code(module)
            self.context.report(
                site.call, "DDP110", f"`{name}` may come from a checkpoint that pickled a wrapped model: its module is wrapped"
            )
            module = cst.parse_expression(f'getattr({name}, "module", {name})')
        if isinstance(module, cst.Call) and self._moved_in_a_widened_guard(site, module):
            # `if args.use_dataParallel: model = nn.DataParallel(model.cuda())` (xuanzebi's NER): the
            # wrap now also runs on CPU-only ranks; ddp_wrap moves the model to this process's device
            module = module.func.value
        if site.target in self.sync_bn_targets or site.sync_bn:
            # DataParallel's sync-BN only ever ran on GPUs; SyncBatchNorm fails on CPU modules.
            shown = self.context.code(module)
            module = cst.parse_expression(
                f"torch.nn.SyncBatchNorm.convert_sync_batchnorm({shown}) if torch.cuda.is_available() else {shown}"
            )
        elif site.target in self.conditional_sync_bn:
            shown = self.context.code(module)
            condition = self.conditional_sync_bn[site.target]
            condition = condition if isinstance(cst.parse_expression(condition), (cst.Name, cst.Attribute, cst.Comparison, cst.Call, cst.Subscript)) else f"({condition})"
            # (on GPUs only, as DataParallel's sync-BN ran: SyncBatchNorm fails on CPU modules)
            module = cst.parse_expression(
                f"torch.nn.SyncBatchNorm.convert_sync_batchnorm({shown}) if torch.cuda.is_available() and {condition} else {shown}"
            )
        # `DP(m).cuda()` keeps its move on the module; ddp_wrap puts it on this process's device.
        placed = updated.with_changes(func=updated.func.with_changes(value=_atom(module))) if site.move is not None else module
        if site.move is not None and self._cuda_move_ungated(site, updated):
            # `if cuda: model = DP(model).cuda()` (ffjord): the wrap now also runs where the
            # guard's CUDA test was false; this process's device is the CPU there
            placed = cst.Call(func=cst.Attribute(value=_atom(module), attr=cst.Name("to")), args=[cst.Arg(cst.parse_expression("ddp_device()"))])
            self.context.use_helper("ddp_device")
        index, module_keyword = site.module_slot
        scatter_dim = _scatter_dim(dp_call)
        dropped = [arg.keyword.value if arg.keyword else f"argument {i + 1}" for i, arg in enumerate(dp_call.args)]
        dropped = [name for name in dropped if name not in (module_keyword, f"argument {index + 1}")]
        if scatter_dim is not None:
            dropped = [name for name in dropped if name not in ("dim", f"argument {index + 4}")]
        note = f" (dropped {', '.join(dropped)}: GPUs are chosen on the launch line)" if dropped else ""
        if site.functional_in:
            self.context.report(
                site.call, "DDP136",
                f"{site.functional_in} ran this part DataParallel by function: the part built here is wrapped in "
                "DistributedDataParallel instead, on this process's device, its checkpoints keeping the bare part's keys",
            )
        elif site.constructed:
            self.context.report(
                site.call, "DDP136",
                f"`{self.context.code(site.call.func)}` ran DataParallel by function in its forward: the model built "
                "here is wrapped in DistributedDataParallel instead, on this process's device, its checkpoints keeping "
                "the bare model's keys",
            )
        else:
            self.context.report(
                site.call, "DDP101", f"DataParallel -> DistributedDataParallel on this process's device{note}"
            )
        self.context.add_import(*DDP_IMPORT)
        self._report_planned_subclass(site)
        subclass = site.call.func.value if isinstance(site.call.func, cst.Name) and site.call.func.value in self.facts.dp_subclasses else None
        if subclass:
            # The project's subclass now builds on DDP (its base is rewritten): keep using it.
            placed = placed if site.move is not None else cst.parse_expression("_.to(ddp_device())").with_changes(
                func=cst.Attribute(value=_atom(module), attr=cst.Name("to"))
            )
            ids = cst.parse_expression("[torch.cuda.current_device()] if torch.cuda.is_available() else None")
            args = [cst.Arg(placed), keyword("device_ids", ids)]
            return cst.Call(func=cst.Name(subclass), args=args)
        self.context.use_helper("ddp_wrap")
        args = [cst.Arg(placed)]
        if scatter_dim is not None:
            # (LakhNES: `DataParallel(model, dim=1)` over time-major [T x B] batches: batches split
            # where they are drawn are cut along that dimension too, as DataParallel's scatter cut them)
            self.context.report(
                site.call, "DDP134",
                f"DataParallel split each batch along dimension {scatter_dim}: batches split at run time (DdpSplit) "
                "are cut along it too",
            )
            args.append(keyword("scatter_dim", cst.Integer(str(scatter_dim))))
        if self.trainable_changes:
            change = self.trainable_changes[0]
            line = self.context.position(change)[0]
            shown = f"{self.context.code(change.target)} = ..." if isinstance(change, cst.AssignTarget) else self.context.code(change)
            self.context.report(
                site.call,
                "DDP125",
                f"parameters are frozen or unfrozen after the wrap (line {line}: `{shown}`): DDP registers every "
                "parameter and skips those without a gradient (find_unused_parameters)",
            )
            return cst.Call(func=cst.Name("ddp_wrap_every_parameter"), args=self._with_keys(site, args))
        if self.freezing_models:
            self.context.report(
                site.call,
                "DDP125",
                f"{self.freezing_models[0]}, a model class of the project, changes which parameters train outside its "
                "constructor (its own train() or a method): DDP registers every parameter and skips those without a "
                "gradient (find_unused_parameters)",
            )
            return cst.Call(func=cst.Name("ddp_wrap_every_parameter"), args=self._with_keys(site, args))
        if site.target in self.switched_models:
            self.context.report(
                site.call,
                "DDP109",
                f"{site.target} is called with keyword arguments that can switch layers on and off "
                f"(`{self.switched_models[site.target]}`): find_unused_parameters=True",
            )
            args.append(keyword("find_unused_parameters", cst.Name("True")))
        elif self.idle_models:
            made, part = self.idle_models[0]
            self.context.report(
                site.call,
                "DDP127",
                f"{made}, a model class built here, has a part whose parameters get no gradient ({part}): DDP "
                "looks for them at each step (find_unused_parameters=True)",
            )
            args.append(keyword("find_unused_parameters", cst.Name("True")))
        elif site.target in self.partly_trained:
            self.context.report(
                site.call,
                "DDP127",
                f"{site.target} is built from several models and {self.partly_trained[site.target]}: those parameters "
                "get no gradient, so DDP looks for them at each step (find_unused_parameters=True)",
            )
            args.append(keyword("find_unused_parameters", cst.Name("True")))
        elif site.target in self.hub_models:
            self.context.report(
                site.call,
                "DDP127",
                f"{site.target} is a Hugging Face pretrained model (`{self.hub_models[site.target]}`): parts the training "
                "leaves idle (a pooler when only the sequence output is read) get no gradient, so DDP looks for them at "
                "each step (find_unused_parameters=True), as Hugging Face's Trainer does",
            )
            args.append(keyword("find_unused_parameters", cst.Name("True")))
        elif site.target in self.through_models:
            self.context.report(
                site.call,
                "DDP127",
                f"{site.target} also trains through another method (`{self.through_models[site.target]}`), which uses "
                "only some of its parts: DDP looks for parameters without a gradient at each step "
                "(find_unused_parameters=True)",
            )
            args.append(keyword("find_unused_parameters", cst.Name("True")))
        elif site.target in self.picked_models:
            self.context.report(
                site.call,
                "DDP127",
                f"{site.target} is built from a class picked at run time (`{self.picked_models[site.target]}`), whose "
                "parts cannot be read here: DDP looks for parameters without a gradient at each step "
                "(find_unused_parameters=True; a part the forward leaves out would stop the run at the next step)",
            )
            args.append(keyword("find_unused_parameters", cst.Name("True")))
        return cst.Call(func=cst.Name("ddp_wrap"), args=self._with_keys(site, args))

    def _with_keys(self, site: WrapSite, args: list[cst.Arg]) -> list[cst.Arg]:
        """The wrap's arguments, with ``keys_unwrapped`` where checkpoints keep the bare model's keys."""
        plan = self.facts.analyzer.wraps.planned_subclass(site.call)
        own_keys = site.constructed or plan is not None and plan.own_keys  # (a subclass whose state_dict() is the module's)
        unwrapped_keys = cst.Name("True") if own_keys else self._keys_as_the_flag_had_them(site)
        return [*args, keyword("keys_unwrapped", unwrapped_keys)] if unwrapped_keys is not None else args

    def _keys_as_the_flag_had_them(self, site: WrapSite) -> cst.BaseExpression | None:
        """A wrap that a flag gated (DDP103) now also runs where the flag said not to wrap: the
        checkpoints keep the bare model's keys there, as the original's did, so what reads the
        flag back from a checkpoint to decide how to load it still finds keys that fit
        (fastMRI's `run_unet.py` wraps only when the saved `args.data_parallel` says so)::

            if args.data_parallel:           if dist.get_world_size() > 1 or args.data_parallel:
                model = DP(model)     ->          model = ddp_wrap(model, keys_unwrapped=not args.data_parallel)

        Only for a flag (names and attributes compared, and the machine's own GPU queries,
        WGAN-VGG's ``if self.multi_gpu and torch.cuda.device_count() > 1:``; no other calls:
        what the test reads again here is what it read there)."""
        widened = [guard for guard in site.guards if guard.node in self.guard_rewrites]
        if len(widened) != 1 or any(not self.context.qualified(call.func) & GPU_QUERIES for call in calls_in(widened[0].node.test)):
            return None
        guard = widened[0]
        test = guard.node.test.with_changes(lpar=[], rpar=[])
        self.context.report(
            site.call, "DDP103",
            f"where `{self.context.code(guard.node.test)}` did not wrap, checkpoints keep the bare model's keys, as the "
            "original's did (keys_unwrapped)",
        )
        if not guard.wraps_when_true:  # (a flag of any type: `keys_unwrapped` reads a string as a part's name)
            return cst.Call(func=cst.Name("bool"), args=[cst.Arg(test)])
        return cst.UnaryOperation(operator=cst.Not(), expression=_atom(test))

    def _report_planned_subclass(self, site: WrapSite) -> None:
        name = dotted(site.call.func) or ""
        plan = self.facts.analyzer.wraps.planned_subclass(site.call)
        if plan is None:
            return
        name = next((known for known, found in self.facts.dp_classes.items() if found is plan), name)
        what = (
            "only answers for the wrapped model's attributes, as the DDP wrapper does"
            if plan.forwarding
            else "synchronises BatchNorm over its replicas (replication callbacks): under DDP torch's SyncBatchNorm "
            "does, converted into the model on GPUs (DataParallel's ran on GPUs only)"
            if plan.sync_bn
            else "only changes how one process splits each batch over its GPUs (scatter): under DDP each process holds "
            "its own share and nothing is gathered"
        )
        self.context.report(site.call, "DDP129", f"`{name}`, a DataParallel subclass, {what}: the wrap becomes DDP")

    def _reference(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:
        if original_node not in self.facts.dp_references:
            return updated_node
        self.context.report(original_node, "DDP104", "DataParallel class reference -> DistributedDataParallel")
        self.context.add_import(*DDP_IMPORT)
        return cst.Name("DistributedDataParallel")

    def _world_size(self) -> cst.BaseExpression:
        self.context.add_import("torch.distributed", None, "dist")
        return cst.parse_expression(self.context.world_size)

    def _follows_a_guard(self, node: cst.If | cst.IfExp) -> bool | None:
        """Whether the wrap ran in the true branch of the guard whose test ``node`` repeats, if
        ``node`` picks `.module` or a `module.` key in a branch."""
        if not hasattr(self, "_guard_codes"):
            self._guard_codes = {self.context.code(guard.test): when for guard, when in self.guard_rewrites.items()}
        code = self.context.code(node.test)
        if code not in self._guard_codes or any(node is guard for guard in self.guard_rewrites):
            return None
        branches = self.context.code(node.body) + (self.context.code(node.orelse) if node.orelse is not None else "")
        return self._guard_codes[code] if re.search(r"\.module\b|['\"]module\.", branches) else None

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        updated_node = self._world_size_decides(original_node, updated_node)
        if original_node not in self.other_paths:
            return updated_node
        site, guard = self.other_paths.pop(original_node)
        return self._wrapped_on_other_paths(original_node, updated_node, guard, self._rewrap(site))

    def _rewrap(self, site: WrapSite) -> cst.SimpleStatementLine:
        """``model = ddp_wrap(model)``, with the options the converted wrap got."""
        converted = self.converted.get(site.call)
        helper, options = cst.Name("ddp_wrap"), []
        if isinstance(converted, cst.Call) and dotted(converted.func) in WRAP_HELPERS:
            helper, options = converted.func, [arg for arg in converted.args if arg.keyword is not None]
        self.context.use_helper(dotted(helper))
        target = cst.parse_expression(site.target)
        call = cst.Call(func=helper, args=[cst.Arg(target), *options])
        return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], call)])

    def _wrapped_on_other_paths(self, original: cst.If, updated: cst.If, guard: Guard, statement) -> cst.If:
        """The wrap appended to each branch that goes on with an unwrapped model; an ``else``
        made for the run that takes no branch, when the model was bound before the ``if``."""

        def appended(block: cst.BaseSuite) -> cst.BaseSuite:
            if isinstance(block, cst.SimpleStatementSuite):  # `else: model = m` on one line
                return cst.IndentedBlock([cst.SimpleStatementLine(list(block.body)), statement])
            return block.with_changes(body=[*block.body, statement])

        if not guard.wraps_when_true:
            return updated.with_changes(body=appended(updated.body)) if original in guard.unwrapped_branches else updated

        def chain(old, new):
            if old is None:
                return cst.Else(cst.IndentedBlock([statement])) if guard.falls_through_unwrapped else None
            body = appended(new.body) if old in guard.unwrapped_branches else new.body
            if isinstance(old, cst.If):
                return new.with_changes(body=body, orelse=chain(old.orelse, new.orelse))
            return new.with_changes(body=body)

        return updated.with_changes(orelse=chain(original.orelse, updated.orelse))

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.IfExp:
        return self._world_size_decides(original_node, updated_node)

    def _world_size_decides(self, original_node, updated_node):
        """``if flag:`` around the wrap -> ``if dist.get_world_size() > 1 or flag:`` (the wrap in
        the else branch: ``if dist.get_world_size() == 1 and flag:``). The same test elsewhere,
        choosing between the wrapped model's ``.module`` and the model (PatchDrop's
        ``agent.module.state_dict() if args.parallel else agent.state_dict()``, CTR-GCN's
        ``module.`` prefix on reload), asks whether the model is wrapped: it follows the wrap."""
        wraps_when_true = self.guard_rewrites.get(original_node)
        if wraps_when_true is None:
            wraps_when_true = self._follows_a_guard(original_node)
            if wraps_when_true is None:
                return updated_node
            self.context.report(
                original_node.test,
                "DDP103",
                f"`{self.context.code(original_node.test)}` chose between the wrapped model's `.module` and the model "
                "like the wrap's guard: it follows the wrap now (the world size decides too)",
            )
        test = updated_node.test
        loose = (cst.IfExp, cst.Lambda, cst.NamedExpr)
        parts = _conjuncts(test)
        kept = [part for part in parts if _tests_for_a_wrap(part, self.context)]
        if wraps_when_true and kept and len(kept) < len(parts):
            # glow's `len(self.devices) > 1 and not hasattr(self.graph, "module")`, in its training
            # loop: the world size widens the device test only; the not-yet-wrapped test stays
            widened = " and ".join(self.context.code(part) for part in parts if part not in kept)
            alone = " and ".join(self.context.code(part) for part in kept)
            code = f"({self.context.world_size} > 1 or {widened}) and {alone}"
            return updated_node.with_changes(test=cst.parse_expression(code))
        if wraps_when_true:
            needs_parens = isinstance(test, loose)
            template = self.context.world_size + " > 1 or {}"
        else:
            needs_parens = isinstance(test, loose) or (
                isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or)
            )
            template = self.context.world_size + " == 1 and {}"
        code = self.context.code(test.with_changes(lpar=[], rpar=[])) if test.lpar else self.context.code(test)
        operand = f"({code})" if needs_parens and not test.lpar else self.context.code(test)
        return updated_node.with_changes(test=cst.parse_expression(template.format(operand)))

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.CSTNode:
        if original_node in self.device_count_calls:
            return self._world_size()
        if original_node in self.facts.functional_calls:
            return self._called_directly(original_node, updated_node)
        if self._module_of_a_loaded_model(original_node):
            shown = self.context.code(updated_node.value)
            self.context.report(
                original_node,
                "DDP132",
                f"`{self.context.code(original_node)}` unwraps a model pickled in a checkpoint: checkpoints now hold the "
                "module inside DDP (DDP614), old ones a DataParallel: either loads",
            )
            return cst.parse_expression(f'getattr({shown}, "module", {shown})')
        if original_node.attr.value in self.model_fields and dotted(original_node.value) in self.facts.model_names:
            name = dotted(original_node.value)
            self.context.report(
                original_node,
                "DDP126",
                f"`{name}.{original_node.attr.value}` is a field of the model, which DDP does not forward: set and "
                "read on the module inside",
            )
            return updated_node.with_changes(value=cst.parse_expression(self.context.unwrapped(name, original_node)))
        return self._reference(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.CSTNode:
        if original_node in self.device_count_calls:
            return self._world_size()
        if original_node in self.facts.functional_calls:
            return self._called_directly(original_node, updated_node)
        return self._reference(original_node, updated_node)


def _grad_outputs(grad_call: cst.Call) -> cst.BaseExpression | None:
    """What ``torch.autograd.grad`` differentiates: its ``outputs`` (the one element of a list)."""
    given = keyword_arg(grad_call, "outputs")
    value = given.value if given is not None else (grad_call.args[0].value if grad_call.args and grad_call.args[0].keyword is None else None)
    if isinstance(value, (cst.List, cst.Tuple)) and len(value.elements) == 1:
        value = value.elements[0].value
    return value


def _any_of(conditions: list[tuple[tuple[bool, str], ...]]) -> str:
    """``a or b`` of the conditions (each a conjunction of tests, some negated). ``a or (not a
    and b)`` is ``a or b``: an ``elif``'s negated tests go where the earlier branch is there too."""
    whole = {condition[0][1] for condition in conditions if len(condition) == 1 and not condition[0][0]}
    kept = [[test for test in condition if not (test[0] and test[1] in whole)] or list(condition) for condition in conditions]
    shown = [" and ".join(f"not {code}" if negated else code for negated, code in condition) for condition in kept]
    if len(shown) == 1:
        return shown[0]
    return " or ".join(f"({text})" if len(condition) > 1 else text for text, condition in zip(shown, kept))


def _operand(test: cst.BaseExpression, code) -> str:
    """A test's code, in parentheses where ``not`` or ``and`` would bind into it."""
    text = code(test)
    return f"({text})" if isinstance(test, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)) and not test.lpar else text


def _atom(expression: cst.BaseExpression) -> cst.BaseExpression:
    """Parenthesise an expression that cannot take `.to(...)` directly."""
    if isinstance(expression, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or expression.lpar:
        return expression
    return expression.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])



WRAP_HELPERS = ("ddp_wrap", "ddp_wrap_every_parameter")
# Words of conditions that switch DataParallel on: GPU counts and lists, CUDA and device
# checks, multi-GPU and parallel flags (`args.ngpu > 1`, `use_cuda`, `args.mGPUs`).
DEVICE_WORDS = ("gpu", "cuda", "cpu", "device", "parallel", "multi", "distributed", "world", "nproc")


def _tests_for_a_wrap(test: cst.BaseExpression, context) -> bool:
    """An ``isinstance(x, DataParallel)`` or ``hasattr(x, "module")`` test: is the model
    wrapped already?"""
    return any(
        dotted(call.func) == "isinstance" and len(call.args) == 2 and "DataParallel" in context.code(call.args[1].value)
        or dotted(call.func) == "hasattr" and len(call.args) == 2 and context.code(call.args[1].value).strip("'\"") == "module"
        for call in calls_in(test)
    )


def _conjuncts(test: cst.BaseExpression) -> list[cst.BaseExpression]:
    """``a and b and c`` -> [a, b, c] (unparenthesised ands only); anything else -> [test]."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And) and not test.lpar:
        return _conjuncts(test.left) + _conjuncts(test.right)
    return [test]


def about_devices(test_code: str) -> bool:
    words = {word for word in re.split(r"[^a-z0-9]+", test_code.lower()) if word}
    return any(marker in word for word in words for marker in DEVICE_WORDS) or bool(words & {"dp", "ddp"})




def _scatter_dim(dp_call: cst.Call) -> int | None:
    """DataParallel's ``dim`` (keyword, or its fourth argument) when it is a literal other than 0."""
    positional = [arg for arg in dp_call.args if arg.keyword is None and not arg.star]
    given = next((arg for arg in dp_call.args if arg.keyword is not None and arg.keyword.value == "dim"), None)
    given = given or (positional[3] if len(positional) > 3 else None)
    if given is None or not isinstance(given.value, cst.Integer):
        return None
    value = int(given.value.value)
    return value or None
