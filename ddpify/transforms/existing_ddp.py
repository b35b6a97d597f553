"""DDP006/DDP007: a script that already has a DDP path beside DataParallel takes that path.

Scripts of the HuggingFace and pytorch/examples era choose between DDP and DataParallel
at run time (``if args.local_rank != -1: DDP(...) elif n_gpu > 1: DataParallel(...)``).
Adding a second process-group set-up would run it twice; the DDP path is already written.
What is missing is the launch line that selects it, and torchrun support: torchrun passes
the local rank in the ``LOCAL_RANK`` environment variable (and newer launchers pass
``--local-rank``, with a dash), while such scripts read only ``--local_rank``.

DDP006  the ``--local_rank`` argument accepts both spellings and defaults to ``LOCAL_RANK``
(and a ``--world-size`` beside it to ``WORLD_SIZE``, MobileNetV3-pytorch), so that under
torchrun the DDP branch runs and the DataParallel branch is unreachable::

    parser.add_argument("--local_rank", type=int, default=-1)
    # becomes
    parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))

DDP007  the script selects its DDP path with a flag (``--multiprocessing-distributed`` of
pytorch/examples, ``--launcher pytorch``, a ``--distributed`` flag tested around the DDP
code) or with the ``WORLD_SIZE``/``LOCAL_RANK`` variables that torchrun sets: nothing is
rewritten; the launch line names the flag. Where the script also has ``--local_rank``, both
apply (``torchrun ... train.py --launcher pytorch``).

On that path, the script's prints, saves and file writes outside its own rank guards run on rank
0 (DDP601, with ``ddp_rank()``, which is 0 in a process with no group, so its DataParallel path
still writes): SSRGAN-PyTorch guarded its best checkpoints and not its ``*-last.pth``, its
TensorBoard logs or its sample images::

    torch.save(model.state_dict(), "last.pth")
    # becomes
    if ddp_rank() == 0:
        torch.save(model.state_dict(), "last.pth")

DDP008  (warning) DataParallel's batch size was global; the script's DDP path loads it per
process: pass it divided by the number of processes to train as before.

DDP009  (warning) the script's own DistributedSampler never gets ``set_epoch``, and the
loader that samples with it is not found. Where it is found, the training loader gets it at
the top of the epoch loop (DDP501), where the sampler is one (the DataParallel path keeps
its RandomSampler)::

    for _ in trange(int(args.num_train_epochs), desc="Epoch"):
    # becomes
    for _ in trange(int(args.num_train_epochs), desc="Epoch"):
        if hasattr(train_dataloader.sampler, "set_epoch"):
            train_dataloader.sampler.set_epoch(_)

DDP012  an evaluation loader of the script's own DDP path that samples with a
DistributedSampler (HF-era ``eval_sampler = SequentialSampler(d) if args.local_rank == -1
else DistributedSampler(d)``, then metrics on rank 0 only: albert_pytorch) reads the whole
set::

    else DistributedSampler(eval_dataset)  ->  else SequentialSampler(eval_dataset)

DDP011  (warning) the script's own DDP path needs CUDA (the NCCL backend, or
``torch.cuda.set_device`` of the local rank): it is launched on a machine with GPUs only; no
launch line on the CPU is printed.

DDP010  (warning) a ``--gpu`` argument with a number as default picks the device
(``torch.cuda.set_device(args.gpu)``): under torchrun every rank would use that GPU unless
the script sets it from the local rank.

DDP013  the script's own DDP path wraps with apex's DistributedDataParallel (the
pytorch-pretrained-BERT era: ERNIE, SemBERT, kg-bert), which apex no longer ships: under the
launch line every rank stopped at that import; its DataParallel branch needed no apex. The
import becomes torch's (apex's own keywords, ``delay_allreduce``, dropped)::

    from apex.parallel import DistributedDataParallel as DDP
    # becomes
    from torch.nn.parallel import DistributedDataParallel as DDP

(a warning where it is spelled otherwise: replace it by hand).

DDP005  (error) neither switch is found: a half-done hand conversion; finish it by hand.
Where a test around the DDP code reads a flag this file does not define (``from options import
args``, then ``if args.distributed:``), the message names that test: set it at launch and let its
local rank follow torchrun's ``LOCAL_RANK``, or remove the DDP path.
"""

from __future__ import annotations

import re

import libcst as cst

from ddpify.analysis import dotted, first_positional, walk
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Transform, append_arg, keyword_arg, option_declaration

LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
# An evaluation loader names its data so (eval_dataset, dev_sampler, test_data, valid_...).
EVALUATION_DATA = re.compile(r"\b(eval|dev|val|valid|test)\w*", re.IGNORECASE)
# A flag named so chooses how the script distributes (`--distributed`, `--launcher`, `--multi_gpu`);
# another one tested around the DDP code guards the training itself (`--do_train`).
DISTRIBUTED_WORDS = re.compile(r"dist|ddp|parallel|launcher|multi|rank|world|gpu|node", re.IGNORECASE)
# what a batch size divided by it is divided among: GPUs, processes, nodes
COUNT_OF_PROCESSES = re.compile(r"gpu|world|node|nproc|process|replica|device", re.IGNORECASE)



# Keywords apex's DistributedDataParallel takes and torch's does not.
APEX_ONLY = {
    "delay_allreduce", "message_size", "allreduce_trigger_params", "shared_param", "num_allreduce_streams",
    "allreduce_communicators", "gradient_average", "gradient_predivide_factor", "retain_allreduce_buffers",
    "allreduce_always_fp32",
}

class ExistingDdpTransform(Transform):
    CODE_PREFIX = "DDP0"

    def __init__(self, context) -> None:
        super().__init__(context)
        self.local_rank = self._argument(*LOCAL_RANK_FLAGS)
        # (MobileNetV3-pytorch: `--world-size` too, default -1, checked against the local rank)
        self.world_size = self._argument("--world-size", "--world_size") if self.local_rank is not None else None
        # `--local_rank` declared in another module (BERT-NER-Pytorch's get_argparse()): the
        # statement here that parses it, and the name it binds
        self.parsed_elsewhere = self._parsed_elsewhere() if self.local_rank is None else None

    def _parsed_elsewhere(self) -> tuple[cst.SimpleStatementLine, str] | None:
        code = self.context.module.code
        for node in walk(self.context.module):
            if not (isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 and isinstance(node.body[0], cst.Assign)):
                continue
            assign = node.body[0]
            value = assign.value
            if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "parse_args"):
                continue
            target = assign.targets[0].target
            if len(assign.targets) == 1 and isinstance(target, cst.Name) and f"{target.value}.local_rank" in code:
                return node, target.value
        return None

    def edit_block(self, owner: cst.CSTNode, block):
        if self.parsed_elsewhere is None or self.context.launch_command is None:
            return block
        if 'local_rank = int(os.environ.get("LOCAL_RANK"' in self.context.module.code:
            return block  # converted already
        statement, name = self.parsed_elsewhere
        result = []
        for original, updated in block:
            result.append((original, updated))
            if original is statement:
                self.context.add_import("os")
                self.context.report(
                    original,
                    "DDP006",
                    f"the script has its own DDP path, selected by --local_rank (declared in another module): "
                    f"{name}.local_rank now also reads torchrun's LOCAL_RANK, so under torchrun the DDP branch runs",
                )
                line = f'{name}.local_rank = int(os.environ.get("LOCAL_RANK", {name}.local_rank))\n'
                result.append((None, cst.parse_statement(line)))
        return result

    def _argument(self, *flags: str, dest: str | None = None) -> cst.Call | None:
        return option_declaration(self.facts.contexts, *flags, dest=dest)

    def check(self) -> None:
        self._choose_launch()
        if self.context.launch_command is None:
            return
        anchor = self.facts.distributed_uses[0]
        self._report_apex_ddp(anchor)
        # (qa-hard-em: the loaders come from a project function; the path still needs CUDA)
        self._report_cuda_only(anchor)
        if not self.facts.loaders:
            return
        if not self._divides_batch_size() and not self._batch_per_gpu():
            self._report_per_process_batch(anchor)
        self._plan_set_epoch(anchor)
        self._eval_samplers = self._evaluation_samplers()

    def _divides_batch_size(self) -> bool:
        """pytorch/examples imagenet: ``args.batch_size = int(args.batch_size / ngpus_per_node)``."""
        for node in walk(self.context.module):
            if isinstance(node, cst.Assign):
                targets, value = [t.target for t in node.targets], node.value
            elif isinstance(node, cst.AugAssign) and isinstance(node.operator, (cst.DivideAssign, cst.FloorDivideAssign)):
                targets, value = [node.target], None
            else:
                continue
            if not any((dotted(target) or "").endswith("batch_size") for target in targets):
                continue
            divisors = [node.right for node in walk(node) if isinstance(node, cst.BinaryOperation)
                        and isinstance(node.operator, (cst.Divide, cst.FloorDivide))]
            if isinstance(node, cst.AugAssign):
                divisors.append(node.value)
            # by the processes, not by gradient accumulation steps (BERT-NER)
            if any(COUNT_OF_PROCESSES.search(self.context.code(divisor)) for divisor in divisors):
                return True
        return False

    def _batch_per_gpu(self) -> bool:
        """HuggingFace's ``per_gpu_train_batch_size * max(1, args.n_gpu)``: DataParallel's batch
        was already per GPU times the GPUs, as the DDP path's is per process times the processes."""
        code = self.context.module.code
        return re.search(r"per_gpu\w*batch_size|batch_size\w*per_gpu", code) is not None

    def _report_per_process_batch(self, anchor: cst.CSTNode) -> None:
        self.context.report(
            anchor,
            "DDP008",
            "DataParallel's batch size was the global batch; the script's DDP path loads it per process (unless the "
            "script divides it itself), so with N processes pass the batch size divided by N to train as "
            "DataParallel did",
            Severity.WARNING,
        )

    def _plan_set_epoch(self, anchor: cst.CSTNode) -> None:
        """The training loaders that sample with the script's own DistributedSampler get
        set_epoch (SetEpochTransform places it, guarded: the DataParallel path's sampler has none)."""
        code = self.context.module.code
        if "DistributedSampler(" not in code or "set_epoch" in code:
            return
        own = [site.call for site in self.facts.training_loaders if self._samples_distributed(site.call)]
        self.context.sharded_loaders.update(own)
        if not own:
            self.context.report(
                anchor,
                "DDP009",
                "the script's DistributedSampler never gets set_epoch(epoch): every epoch replays the same order; "
                "call it at the top of the epoch loop",
                Severity.WARNING,
            )

    def _evaluation_samplers(self) -> set[cst.Call]:
        """``DistributedSampler(eval_dataset)`` of a loader no training loop draws from
        (albert_pytorch, HF run_* scripts): evaluation on a shard, its metrics from 1/N of the set."""
        found = set()
        for call, site in self.facts.loaders.items():
            if site.training or not EVALUATION_DATA.search(self.context.code(call)):
                continue  # (a training loader drawn with next(cycle(loader)) is not found training: CodeBERT)
            for value in self._sampler_values(call):
                found.update(n for n in walk(value) if isinstance(n, cst.Call) and dotted(n.func) in ("DistributedSampler", "torch.utils.data.distributed.DistributedSampler")
                             and n.args)
        return found

    def _samples_distributed(self, call: cst.Call) -> bool:
        """``sampler=DistributedSampler(...)``, or a name bound to an expression that makes one
        (``RandomSampler(d) if args.local_rank == -1 else DistributedSampler(d)``)."""
        return any("DistributedSampler(" in self.context.code(value) for value in self._sampler_values(call))

    def _sampler_values(self, call: cst.Call) -> list[cst.BaseExpression]:
        """The loader's ``sampler=`` expression, or what the name given there is bound to."""
        sampler = keyword_arg(call, "sampler")
        if sampler is None:
            return []
        if not isinstance(sampler.value, cst.Name):
            return [sampler.value]
        scopes = self.facts.analyzer.scopes
        values = [scopes.assigned_value(a.node)[0] for a in scopes.assignments_of(sampler.value) if getattr(a, "node", None) is not None]
        return [value for value in values if value is not None]

    def _report_cuda_only(self, anchor: cst.CSTNode) -> None:
        """The script's own DDP path hard-codes NCCL or the CUDA device: no CPU launch."""
        code = self.context.module.code
        if "gloo" in code:
            return
        if re.search(r"init_process_group\(\s*(backend\s*=\s*)?['\"]nccl['\"]", code) or "cuda.set_device(" in code:
            self.context.report(
                anchor,
                "DDP011",
                "the script's own DDP path needs CUDA (NCCL, torch.cuda.set_device): launch it on a machine with GPUs",
                Severity.WARNING,
            )

    def _report_apex_ddp(self, anchor: cst.CSTNode) -> None:
        """apex's DistributedDataParallel imported by name (`from apex.parallel import
        DistributedDataParallel as DDP`) becomes torch's; any other spelling is warned about."""
        self._apex_imports = [
            node for node in walk(self.context.module)
            if isinstance(node, cst.ImportFrom) and self.context.code(node.module) == "apex.parallel"
            and not isinstance(node.names, cst.ImportStar) and len(node.names) == 1
            and node.names[0].name.value == "DistributedDataParallel"
        ]
        self._apex_names = {
            (node.names[0].asname.name.value if node.names[0].asname else "DistributedDataParallel") for node in self._apex_imports
        }
        code = self.context.module.code
        if not self._apex_imports and re.search(r"from\s+apex\.parallel\s+import\s+[^\n]*DistributedDataParallel|apex\.parallel\.DistributedDataParallel", code):
            self.context.report(
                anchor,
                "DDP013",
                "the script's own DDP path wraps with apex's DistributedDataParallel, which apex no longer ships: "
                "every rank would stop at that import; replace it with torch.nn.parallel.DistributedDataParallel",
                Severity.WARNING,
            )

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        if original_node not in getattr(self, "_apex_imports", ()):
            return updated_node
        self.context.report(
            original_node,
            "DDP013",
            "the script's own DDP path imported apex's DistributedDataParallel, which apex no longer ships (every "
            "rank stopped at that import): torch's DistributedDataParallel takes its place",
        )
        return updated_node.with_changes(module=cst.parse_expression("torch.nn.parallel"))

    def _choose_launch(self) -> None:
        path = self.context.path
        self.constant_switches = self._constant_switches()
        if self.constant_switches:
            names = ", ".join(sorted({self.context.code(target) for target, _ in self.constant_switches}))
            self.context.report(
                self.facts.distributed_uses[0],
                "DDP007",
                f"the script has its own DDP path, selected by `{names}`, a constant in the script: it now reads the "
                'world size that torchrun sets (int(os.environ.get("WORLD_SIZE", "1")) > 1), so under torchrun the '
                "DDP branch runs and the DataParallel branch is unreachable",
            )
            self.context.launch_command = f"torchrun --standalone --nproc-per-node=gpu {path}"
            self._warn_fixed_gpu()
            return
        if self._argument("--multiprocessing-distributed") and self._argument("--dist-url"):
            self.context.launch_command = (
                f"python {path} --dist-url tcp://127.0.0.1:29500 --dist-backend nccl "
                "--multiprocessing-distributed --world-size 1 --rank 0"
            )
            self._report_flag("--multiprocessing-distributed (pytorch/examples: one process per GPU, spawned by the script)")
            return
        if self._spawns():
            switches = self._switches()
            self.context.launch_command = " ".join(["python", path, *switches])
            self.context.report(
                self.facts.distributed_uses[0],
                "DDP007",
                "the script starts its own processes (torch.multiprocessing.spawn)"
                + (f", selected by {', '.join(switches)}" if switches else "")
                + ": its DDP path is taken as it is; launch it with python, never under torchrun (that would start its processes "
                "once per torchrun process)",
            )
            return
        switches = self._switches()
        if self.local_rank is not None or self.parsed_elsewhere is not None or switches:
            around_wraps = self._flags_around_wraps()
            for switch in switches:
                name = switch.lstrip("-").replace("-", "_")
                if name in around_wraps or not DISTRIBUTED_WORDS.search(name):
                    # (ERNIE's, BERT4doc's --do_train: the DataParallel branch needs it too)
                    self.context.report(
                        self.facts.distributed_uses[0],
                        "DDP007",
                        f"{switch} is on the launch line: the script trains only with it (it guards the training, "
                        "not a choice of DDP); the DDP path is selected by the local rank torchrun sets",
                    )
                else:
                    self._report_flag(switch)
            self.context.launch_command = " ".join(["torchrun --standalone --nproc-per-node=gpu", path, *switches])
            self._warn_fixed_gpu()
            return
        unsettable = self._unsettable_switch()
        if unsettable is not None:
            self.context.report(
                self.facts.distributed_uses[0],
                "DDP005",
                f"the script's own DDP path is selected by `{unsettable}`, which no launch line can set: set it in "
                "the configuration, then launch with torchrun (or remove the DDP path and convert the DataParallel one)",
                Severity.ERROR,
            )
            return
        if self._reads_launcher_environment():
            self.context.launch_command = f"torchrun --standalone --nproc-per-node=gpu {path}"
            self._report_flag("the WORLD_SIZE/RANK/LOCAL_RANK variables that torchrun sets")
            self._warn_fixed_gpu()
            return
        tested = self._tests_around_ddp_code()
        if tested:
            # (cv_practise: `from options import args`, then `if args.distributed:`: the flag is another module's)
            self.context.report(
                self.facts.distributed_uses[0],
                "DDP005",
                f"the script's own DDP path is selected by `{tested}`, which this file does not define (a flag or "
                "setting of a module it imports, or a configuration): set it on the launch line or in that "
                "configuration, make its local rank come from the LOCAL_RANK variable torchrun sets, then launch with "
                "torchrun; or remove the DDP path and convert the DataParallel one",
                Severity.ERROR,
            )
            return
        self.context.report(
            self.facts.distributed_uses[0],
            "DDP005",
            "the file already uses torch.distributed next to DataParallel, and no switch to its DDP path "
            "(--local_rank, --multiprocessing-distributed, --launcher pytorch, a --distributed flag, WORLD_SIZE) "
            "was found; finish this conversion by hand",
            Severity.ERROR,
        )

    def _switches(self) -> list[str]:
        """What the launch line must pass to select the DDP path: ``--launcher pytorch``
        (BasicSR, mmcv), and ``store_true`` flags tested in an ``if`` around the DDP code
        (``if args.distributed:``)."""
        found = []
        launcher = self._argument("--launcher")
        if launcher is not None and "pytorch" in self.context.code(launcher):
            found.append("--launcher pytorch")
        for name in self._names_testing_ddp_code():
            flag = self._argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name)
            if flag is not None and "store_true" in self.context.code(flag) and name != "multiprocessing_distributed":
                spelled = next(arg.value.evaluated_value for arg in flag.args if arg.keyword is None)
                if spelled not in found:
                    found.append(spelled)
        return found

    def _tests_around(self, nodes) -> list[cst.BaseExpression]:
        """The tests of the ``if``s (and conditional expressions) whose selected branch holds each
        node, innermost first, node by node."""
        tests = []
        for start in nodes:
            child, node = start, self.context.parent(start)
            while node is not None:
                if isinstance(node, (cst.If, cst.IfExp)) and child is node.body:
                    tests.append(node.test)
                child, node = node, self.context.parent(node)
        return tests

    def _flags_around_wraps(self) -> set[str]:
        """Flags an ``if`` around a DataParallel wrap requires (``if args.do_train:``)."""
        return {part for test in self._tests_around(site.call for site in self.facts.wraps) for part in _flags_required(test)}

    def _names_testing_ddp_code(self) -> list[str]:
        """``distributed`` for ``if args.distributed:`` (or ``if distributed:``) around DDP code:
        only the branch the test selects (``... and ...`` too), the DDP code in its body."""
        parts = [part for test in self._tests_around(self.facts.distributed_uses) for part in _flags_required(test)]
        return list(dict.fromkeys(parts))

    def _tests_around_ddp_code(self) -> str | None:
        """The code of the first test whose branch holds DDP code (``args.distributed``), if any."""
        tests = [test for test in self._tests_around(self.facts.distributed_uses) if _flags_required(test)]
        return self.context.code(tests[0]) if tests else None

    def _constant_switches(self) -> list[tuple[cst.Name, cst.Assign]]:
        """``distributed = False`` (a variable only ever set to a literal) tested around the DDP
        code: no launch line selects it (bubbliiiing's yolov4-pytorch)."""
        found = []
        for name in self._names_testing_ddp_code():
            assigns = [
                node for node in walk(self.context.module)
                if isinstance(node, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
            ]
            if any(word in name.lower() for word in ("cuda", "gpu", "device")):
                continue  # `if Cuda and distributed:`: the device flag only gates CUDA (yolov4's `Cuda = True`)
            if assigns and all(isinstance(a.value, cst.Name) and a.value.value in ("True", "False") for a in assigns) and any(
                a.value.value == "False" for a in assigns
            ):  # a switch set only to True already selects the DDP path
                found += [(next(t.target for t in a.targets if isinstance(t.target, cst.Name)), a) for a in assigns]
        return found

    def _unsettable_switch(self) -> str | None:
        """A configuration entry tested around the DDP code (``if cfg["distributed"]:``,
        ``config.get("distributed")``): nothing on a launch line sets it."""
        for test in self._tests_around(self.facts.distributed_uses):
            if isinstance(test, cst.Subscript) or (
                isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute) and test.func.attr.value == "get"
            ):
                return self.context.code(test)
        return None

    def _spawns(self) -> bool:
        return any(
            isinstance(node, cst.Call) and self.context.qualified(node.func) & {"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"}
            for node in walk(self.context.module)
        )

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if not any(assign is original_node for _, assign in getattr(self, "constant_switches", [])):
            return updated_node
        self.context.add_import("os")
        return updated_node.with_changes(value=cst.parse_expression('int(os.environ.get("WORLD_SIZE", "1")) > 1'))

    def _reads_launcher_environment(self) -> bool:
        source = self.context.module.code
        return any(f'"{name}"' in source or f"'{name}'" in source for name in ("WORLD_SIZE", "LOCAL_RANK")) and (
            "os.environ" in source or "getenv" in source
        )

    def _warn_fixed_gpu(self) -> None:
        """``--gpu`` with a number as default, used to pick the device: every rank on that GPU."""
        gpu = self._argument("--gpu")
        default = keyword_arg(gpu, "default") if gpu is not None else None
        source = self.context.module.code
        if default is None or not isinstance(default.value, cst.Integer):
            return
        if "set_device(args.gpu)" in source or ".cuda(args.gpu)" in source or "cuda:{args.gpu}" in source:
            self.context.report(
                gpu,
                "DDP010",
                f"--gpu defaults to {default.value.value} and picks the device: under torchrun every rank would use "
                "that GPU; in the DDP path, set the device from the local rank (int(os.environ[\"LOCAL_RANK\"]))",
                Severity.WARNING,
            )

    def _report_flag(self, flag: str) -> None:
        self.context.report(
            self.facts.distributed_uses[0],
            "DDP007",
            f"the script has its own DDP path, selected by {flag}: its DDP path is taken as it is; launch it with that switch "
            "(the DataParallel branch is then unreachable)",
        )

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        """``SequentialSampler(d) if args.local_rank == -1 else SequentialSampler(d)``: one."""
        if any(n in getattr(self, "_eval_samplers", ()) for n in walk(original_node.orelse)) and (
            self.context.code(updated_node.body) == self.context.code(updated_node.orelse)
        ):
            return updated_node.body
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if dotted(original_node.func) in getattr(self, "_apex_names", ()) and any(
            arg.keyword is not None and arg.keyword.value in APEX_ONLY for arg in original_node.args
        ):
            # apex's own options (delay_allreduce=True) have no torch keyword
            kept = [arg for arg in updated_node.args if arg.keyword is None or arg.keyword.value not in APEX_ONLY]
            return updated_node.with_changes(args=kept)
        if original_node in getattr(self, "_eval_samplers", ()):
            self.context.add_import("torch.utils.data", "SequentialSampler")
            self.context.report(
                original_node,
                "DDP012",
                "an evaluation loader of the script's own DDP path sampled a shard (DistributedSampler): it reads the "
                "whole set in order (SequentialSampler), so its metrics are those of the whole set, as DataParallel's",
            )
            return updated_node.with_changes(func=cst.Name("SequentialSampler"), args=[updated_node.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
        if original_node is self.world_size and original_node is not None:
            return self._world_size_from_launcher(original_node, updated_node)
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
            updated = _with_default(updated, from_env)
        else:
            updated = append_arg(updated, cst.Arg(from_env, keyword=cst.Name("default"), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
        if self._switches():
            message = (
                "--local_rank now also reads torchrun's LOCAL_RANK and --local-rank (the DDP path itself is "
                "selected by the switch on the launch line)"
            )
        else:
            message = (
                "the script has its own DDP path, selected by --local_rank: it now also reads torchrun's LOCAL_RANK "
                "and --local-rank, so under torchrun the DDP branch runs (the DataParallel branch is then unreachable)"
            )
        self.context.report(original_node, "DDP006", message)
        return updated


    def _world_size_from_launcher(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        default = keyword_arg(updated, "default")
        if default is None or "WORLD_SIZE" in self.context.code(original):
            return updated
        self.context.add_import("os")
        from_env = cst.parse_expression(f'int(os.environ.get("WORLD_SIZE", {self.context.code(default.value)}))')
        self.context.report(original, "DDP006", "--world-size now also reads torchrun's WORLD_SIZE, as --local_rank reads LOCAL_RANK")
        return _with_default(updated, from_env)


def _with_default(call: cst.Call, value: cst.BaseExpression) -> cst.Call:
    """``add_argument(...)`` with its ``default=`` keyword set to ``value``."""
    return call.with_changes(args=[a.with_changes(value=value) if a.keyword and a.keyword.value == "default" else a for a in call.args])


def _flags_required(test: cst.BaseExpression) -> list[str]:
    """Flags a condition needs true: ``args.distributed`` -> [distributed]; ``a and b``,
    both; anything else (``or``, ``not``, comparisons), none."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return [*_flags_required(test.left), *_flags_required(test.right)]
    if isinstance(test, cst.Attribute):
        return [test.attr.value]
    if isinstance(test, cst.Name):
        return [test.value]
    return []
