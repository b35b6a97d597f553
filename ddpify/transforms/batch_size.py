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

DDP402  per-process batch kept (``--per-process-batch``): the effective batch is now
``batch_size * world_size``; adjust the learning rate if needed.
"""

from __future__ import annotations

import libcst as cst

from ddpify.transforms.base import Transform, append_arg, keyword, keyword_arg, positional_args


class BatchSizeTransform(Transform):
    CODE_PREFIX = "DDP4"

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node not in self.context.sharded_loaders:
            return updated_node
        arg = keyword_arg(updated_node, "batch_size")
        positional = positional_args(updated_node)
        if arg is None and len(positional) > 1:
            arg = positional[1]
        shown = self.context.code(arg.value) if arg else "1"
        if self.context.options.per_process_batch:
            self.context.report(
                original_node,
                "DDP402",
                f"--per-process-batch: each process loads batch_size={shown}, so the global batch is now "
                f"{shown} x world size; adjust the learning rate if needed",
            )
            return updated_node
        self.context.report(
            original_node,
            "DDP401",
            f"batch_size={shown} was DataParallel's global batch: each process now loads {shown} // world size",
        )
        if arg is None:
            return append_arg(updated_node, keyword("batch_size", cst.parse_expression("ddp_local_batch_size(1)")))
        split = cst.Call(func=cst.Name("ddp_local_batch_size"), args=[cst.Arg(arg.value)])
        return updated_node.with_changes(
            args=[a.with_changes(value=split) if a is arg else a for a in updated_node.args]
        )
