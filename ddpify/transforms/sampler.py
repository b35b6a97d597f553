"""DDP3xx: training DataLoaders get a DistributedSampler, so each rank sees its own shard.

A training loader is one iterated by a loop that calls ``backward()`` or ``step()``, found
directly, through a function parameter (``train(train_loader, ...)``) or through a
``self.`` attribute. ``shuffle`` moves into the sampler (DataLoader refuses both);
``drop_last`` stays on the loader. Evaluation loaders stay unsharded: every rank evaluates
the whole set, so the metrics are exactly the original's.

DDP301  sampler added::

    loader = DataLoader(train_set, batch_size=64, shuffle=True)
    # becomes
    loader = DataLoader(train_set, batch_size=ddp_local_batch_size(64),
                        sampler=DistributedSampler(train_set, shuffle=True))

DDP302  (warning) the loader already has ``sampler=`` / ``batch_sampler=``: left alone;
shard it by hand.

DDP303  (error) the loader cannot be rewritten safely (its dataset is computed in the
call, or options are passed by position): the file is left untouched.

DDP304  (warning) the script trains (calls ``backward()``/``step()``) but no training
DataLoader was found: shard the data by hand.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import LoaderSite, first_positional
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform, append_arg, keyword, keyword_arg, positional_args, replace_arg

SAMPLER_IMPORT = ("torch.utils.data.distributed", "DistributedSampler", None)
# Dataset expressions that can be evaluated twice (in the loader and in the sampler).
REPEATABLE = (cst.Name, cst.Attribute, cst.Subscript)


class SamplerTransform(Transform):
    CODE_PREFIX = "DDP3"

    def check(self) -> None:
        for site in self.facts.training_loaders:
            if self._own_sampler(site.call):
                continue
            reason = self._unsupported(site.call)
            if reason:
                self.context.report(site.call, "DDP303", f"cannot shard this training DataLoader: {reason}", Severity.ERROR)
        if self.facts.wraps and self.facts.has_training_step and not self.facts.training_loaders:
            self.context.report(
                self.facts.wraps[0].call,
                "DDP304",
                "no training DataLoader found: every rank would train on all the data; shard it with DistributedSampler",
                Severity.WARNING,
            )

    def _own_sampler(self, call: cst.Call) -> cst.Arg | None:
        return keyword_arg(call, "sampler") or keyword_arg(call, "batch_sampler")

    def _unsupported(self, call: cst.Call) -> str | None:
        if any(arg.star for arg in call.args):
            return "arguments are unpacked with * or **"
        if len(positional_args(call)) > 2:
            return "pass shuffle/sampler options by keyword"
        dataset = first_positional(call, "dataset")
        if dataset is None:
            return "no dataset argument"
        if not isinstance(dataset, REPEATABLE):
            return "its dataset is built inside the call; assign the dataset to a variable first"
        return None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        site: LoaderSite | None = self.facts.loaders.get(original_node)
        if site is None or not site.training:
            return updated_node
        own = self._own_sampler(original_node)
        if own is not None:
            self.context.report(
                original_node,
                "DDP302",
                f"training DataLoader already has {own.keyword.value}=: left alone; make it shard per rank by hand",
                Severity.WARNING,
            )
            return updated_node
        self.context.sharded_loaders.add(original_node)
        self.context.add_import(*SAMPLER_IMPORT)
        shuffle = keyword_arg(updated_node, "shuffle")
        shuffle_value = shuffle.value if shuffle else cst.Name("False")
        sampler = cst.Call(
            func=cst.Name("DistributedSampler"),
            args=[
                cst.Arg(first_positional(updated_node, "dataset").deep_clone()),
                keyword("shuffle", shuffle_value),
            ],
        )
        self.context.report(
            original_node,
            "DDP301",
            f"DataLoader{' ' + repr(site.target) if site.target else ''} gets a DistributedSampler"
            f" (shuffle={self.context.code(shuffle_value)})",
        )
        if shuffle is not None:
            return replace_arg(updated_node, shuffle, keyword("sampler", sampler))
        return append_arg(updated_node, keyword("sampler", sampler))

