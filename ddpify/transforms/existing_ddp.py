"""DDP006/DDP007: a script that already has a DDP path beside DataParallel takes that path.

Scripts of the HuggingFace and pytorch/examples era choose between DDP and DataParallel
at run time (``if args.local_rank != -1: DDP(...) elif n_gpu > 1: DataParallel(...)``).
Adding a second process-group set-up would run it twice; the DDP path is already written.
What is missing is the launch line that selects it, and torchrun support: torchrun passes
the local rank in the ``LOCAL_RANK`` environment variable (and newer launchers pass
``--local-rank``, with a dash), while such scripts read only ``--local_rank``.

DDP006  the ``--local_rank`` argument accepts both spellings and defaults to ``LOCAL_RANK``,
so that under torchrun the DDP branch runs and the DataParallel branch is unreachable::

    parser.add_argument("--local_rank", type=int, default=-1)
    # becomes
    parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))

DDP007  the script selects its DDP path with a flag (``--multiprocessing-distributed`` of
pytorch/examples, ``--launcher pytorch``): nothing is rewritten; the launch line names it.

DDP008  (warning) DataParallel's batch size was global; the script's DDP path loads it per
process: pass it divided by the number of processes to train as before.

DDP009  (warning) the script's own DistributedSampler never gets ``set_epoch``.

DDP005  (error) neither switch is found: a half-done hand conversion; finish it by hand.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis import first_positional
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform, append_arg, keyword_arg

LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


class ExistingDdpTransform(Transform):
    CODE_PREFIX = "DDP0"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.local_rank = self._argument(*LOCAL_RANK_FLAGS)

    def _argument(self, *flags: str) -> cst.Call | None:
        """The ``parser.add_argument(...)`` call that declares one of `flags`."""
        for node in self.facts.contexts:
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument":
                names = {getattr(arg.value, "evaluated_value", None) for arg in node.args if arg.keyword is None}
                if names & set(flags):
                    return node
        return None

    def check(self) -> None:
        self._choose_launch()
        if self.context.launch_command is None:
            return
        anchor = self.facts.distributed_uses[0]
        self.context.report(
            anchor,
            "DDP008",
            "DataParallel's batch size was the global batch; the script's DDP path loads it per process (unless the "
            "script divides it itself), so with N processes pass the batch size divided by N to train as "
            "DataParallel did",
            Severity.WARNING,
        )
        if "set_epoch" not in self.context.module.code:
            self.context.report(
                anchor,
                "DDP009",
                "the script's DistributedSampler never gets set_epoch(epoch): every epoch replays the same order; "
                "call it at the top of the epoch loop",
                Severity.WARNING,
            )

    def _choose_launch(self) -> None:
        path = self.context.path
        if self.local_rank is not None:
            self.context.launch_command = f"torchrun --standalone --nproc-per-node=gpu {path}"
            return
        if self._argument("--multiprocessing-distributed") and self._argument("--dist-url"):
            self.context.launch_command = (
                f"python {path} --dist-url tcp://127.0.0.1:29500 --dist-backend nccl "
                "--multiprocessing-distributed --world-size 1 --rank 0"
            )
            self._report_flag("--multiprocessing-distributed (pytorch/examples: one process per GPU, spawned by the script)")
            return
        launcher = self._argument("--launcher")
        if launcher is not None and "pytorch" in self.context.code(launcher):
            self.context.launch_command = f"torchrun --standalone --nproc-per-node=gpu {path} --launcher pytorch"
            self._report_flag("--launcher pytorch")
            return
        self.context.report(
            self.facts.distributed_uses[0],
            "DDP005",
            "the file already uses torch.distributed next to DataParallel, and no switch to its DDP path "
            "(--local_rank, --multiprocessing-distributed, --launcher pytorch) was found; finish this conversion by hand",
            Severity.ERROR,
        )

    def _report_flag(self, flag: str) -> None:
        self.context.report(
            self.facts.distributed_uses[0],
            "DDP007",
            f"the script has its own DDP path, selected by {flag}: nothing rewritten; launch it with that switch "
            "(the DataParallel branch is then unreachable)",
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if original_node is not self.local_rank:
            return updated_node
        spellings = {getattr(arg.value, "evaluated_value", None) for arg in original_node.args if arg.keyword is None}
        default = keyword_arg(updated_node, "default")
        if "LOCAL_RANK" in self.context.code(original_node) and spellings >= set(LOCAL_RANK_FLAGS):
            return updated_node  # already torchrun-ready
        self.context.add_import("os")
        fallback = self.context.code(default.value) if default is not None else "-1"
        from_env = cst.parse_expression(f'int(os.environ.get("LOCAL_RANK", {fallback}))')
        args = list(updated_node.args)
        for missing in [flag for flag in LOCAL_RANK_FLAGS if flag not in spellings]:
            first = args[0]
            args.insert(1, cst.Arg(cst.SimpleString(f'"{missing}"'), comma=first.comma))
        updated = updated_node.with_changes(args=args)
        if default is not None:
            updated = updated.with_changes(
                args=[a.with_changes(value=from_env) if a.keyword and a.keyword.value == "default" else a for a in updated.args]
            )
        else:
            updated = append_arg(updated, cst.Arg(from_env, keyword=cst.Name("default"), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
        self.context.report(
            original_node,
            "DDP006",
            "the script has its own DDP path, selected by --local_rank: it now also reads torchrun's LOCAL_RANK "
            "and --local-rank, so under torchrun the DDP branch runs (the DataParallel branch is then unreachable)",
        )
        return updated
