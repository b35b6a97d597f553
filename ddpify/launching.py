"""The launch lines `ddpify convert` prints, made to run as printed on the machine at hand.

The converter records one canonical line per script (``torchrun --standalone
--nproc-per-node=gpu train.py``, the golden fixtures' ``launch:``); this module turns it into
what runs here:

- ``torchrun`` is named only where it is on ``PATH``; else the ``torchrun`` beside this
  Python (a virtual environment that is not activated), else ``<this python> -m
  torch.distributed.run`` where torch is installed for it, else ``python -m
  torch.distributed.run``;
- ``--nproc-per-node=gpu`` fails without CUDA (torchrun: "Cuda is not available"): where no
  GPU is found, the line for this machine starts two processes on the CPU (gloo), and the
  line for a machine with GPUs follows it;
- a GPU-count option of the script's own (``--ngpu``, ``--gpus``, ``--num_gpus``,
  ``--mGPUs``, a ``n_gpu`` set from ``torch.cuda.device_count()``) is named with what it
  means after the conversion.

Standard library only (``ast``, never libcst or torch): the CLI imports it to print.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

CPU_PROCESSES = 2  # processes on a machine without GPUs: enough to be distributed, cheap
CANONICAL = re.compile(r"^(?P<env>(?:[A-Z_][A-Z0-9_]*=\S*\s+)*)torchrun\s+(?P<rest>.*)$")
NPROC_GPU = re.compile(r"--nproc[-_]per[-_]node[= ]gpu\b")

# Option spellings, lower-cased without dashes or underscores.
COUNT_OPTIONS = {"ngpu", "ngpus", "numgpu", "numgpus", "gpunum", "gpucount", "nogpus", "gpus"}
SWITCH_OPTIONS = {"mgpus", "multigpu", "multigpus", "usemultigpu", "dataparallel"}
COUNT_VARIABLES = {"ngpu", "ngpus", "numgpus"}  # n_gpu = torch.cuda.device_count()


@dataclass(frozen=True)
class Machine:
    """What the launch line may assume about this machine."""

    gpus: int | None  # None: GPUs of a kind that cannot be counted without torch
    runner: str  # what starts torchrun here

    @property
    def has_gpus(self) -> bool:
        return self.gpus is None or self.gpus > 0


def this_machine() -> Machine:
    return Machine(gpu_count(), torchrun_command())


def gpu_count() -> int | None:
    """Visible NVIDIA GPUs, read from the driver (never by importing torch); None where a GPU
    stack is present that cannot be counted so (ROCm, or nvidia-smi without /proc)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    driver = Path("/proc/driver/nvidia/gpus")
    if driver.is_dir():
        count = sum(1 for _ in driver.iterdir())
        if visible:
            count = min(count, len([part for part in visible.split(",") if part.strip()]))
        return count
    if Path("/dev/kfd").exists() or shutil.which("nvidia-smi") or shutil.which("rocm-smi"):
        return None
    return 0


def torchrun_command() -> str:
    if shutil.which("torchrun"):
        return "torchrun"
    python = Path(sys.executable)  # not resolved: a virtual environment's python is a link
    beside = python.parent / "torchrun"
    if beside.is_file() and os.access(beside, os.X_OK):
        return _shown(beside)
    if importlib.util.find_spec("torch") is not None:
        return f"{_shown(python)} -m torch.distributed.run"
    return "python -m torch.distributed.run"  # torch lives in the training environment


def _shown(path: Path) -> str:
    """A path as short as it runs from here: relative under the working folder."""
    absolute = Path(os.path.abspath(path))
    try:
        text = absolute.relative_to(Path.cwd()).as_posix()
    except ValueError:
        text = absolute.as_posix()
    return shlex.quote(text)


@dataclass(frozen=True)
class LaunchLine:
    label: str  # "launch", "launch on a machine with GPUs"
    command: str


def launch_lines(canonical: str, machine: Machine | None = None, gpu_only: bool = False) -> list[LaunchLine]:
    """The canonical line as it runs here, and the GPU line beside it where it cannot
    (only the GPU line for a script whose own DDP path needs CUDA: DDP011)."""
    machine = machine or this_machine()
    match = CANONICAL.match(canonical)
    if match is None:  # `python train.py --multiprocessing-distributed ...`: the script's own launcher
        return [LaunchLine("launch", canonical)]
    command = f"{match.group('env')}{machine.runner} {match.group('rest')}"
    if machine.has_gpus or not NPROC_GPU.search(command):
        return [LaunchLine("launch", command)]
    if gpu_only:
        return [LaunchLine("launch on a machine with GPUs (no GPU found here; the script's DDP path needs CUDA)", command)]
    cpu = NPROC_GPU.sub(f"--nproc-per-node={CPU_PROCESSES}", command)
    return [
        LaunchLine(f"launch (no GPU found here, {CPU_PROCESSES} processes on the CPU)", cpu),
        LaunchLine("launch on a machine with GPUs", command),
    ]


# -- the script's own GPU count ----------------------------------------------------------------


@dataclass(frozen=True)
class GpuOption:
    name: str  # as the user writes it: "--ngpu", "n_gpu"
    line: int  # where it is declared or set
    kind: str  # "count", "switch", "variable"
    reads: tuple[int, ...] = ()  # lines of the converted script that still read it

    def meaning(self) -> str:
        still = ""
        if self.reads:
            shown = ", ".join(str(n) for n in self.reads[:6]) + (", ..." if len(self.reads) > 6 else "")
            still = f" (the converted script still reads its value: line{'s' if len(self.reads) > 1 else ''} {shown})"
        if self.kind == "variable":
            return (
                f"{self.name} (line {self.line}) still counts the GPUs each process can see, not the processes "
                f"training: that is the world size, one process per GPU{still}"
            )
        if self.kind == "switch":
            return (
                f"{self.name} (line {self.line}) no longer decides whether several GPUs train: every process "
                f"the launch line starts trains on its own GPU{still}"
            )
        return (
            f"{self.name} (line {self.line}) no longer sets how many GPUs train: each process trains on one GPU, "
            f"and --nproc-per-node on the launch line sets how many start{still}"
        )


def gpu_options(source: str, converted: str | None = None) -> list[GpuOption]:
    """The script's GPU-count options and variables, with the converted lines that read them."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: dict[str, tuple[str, int, str]] = {}  # as shown -> (attribute or variable name, line, kind)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            longs = [flag for flag in flags if flag.startswith("-")]
            kind = next((_option_kind(flag) for flag in longs if _option_kind(flag)), None)
            if kind is None or (kind == "count" and _is_id_list(node)):
                continue
            dest = next((k.value.value for k in node.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)), None)
            primary = max(longs, key=len)
            found.setdefault(primary, (dest or primary.lstrip("-").replace("-", "_"), node.lineno, kind))
        elif isinstance(node, ast.Assign) and _is_device_count(node.value):
            for target in node.targets:
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                if name and _normal(name) in COUNT_VARIABLES:
                    found.setdefault(ast.unparse(target), (name, node.lineno, "variable"))
    if not found:
        return []
    reads = _reads(converted, {name for name, _, _ in found.values()}) if converted else {}

    def read_lines(shown: str, name: str, kind: str) -> tuple[int, ...]:
        # options and attributes (args.n_gpu) are read as attributes; a variable by its name
        attribute = kind != "variable" or "." in shown
        return tuple(reads.get(("attribute" if attribute else "name", name), ()))

    return sorted(
        (GpuOption(shown, line, kind, read_lines(shown, name, kind)) for shown, (name, line, kind) in found.items()),
        key=lambda option: option.line,
    )


def _normal(name: str) -> str:
    return name.lstrip("-").replace("-", "").replace("_", "").lower()


def _option_kind(flag: str) -> str | None:
    name = _normal(flag)
    return "count" if name in COUNT_OPTIONS else "switch" if name in SWITCH_OPTIONS else None


def _is_id_list(call: ast.Call) -> bool:
    """`--gpus 0,1,3` (a string of ids, not a count): those are chosen on the launch line."""
    for keyword in call.keywords:
        if keyword.arg == "type" and isinstance(keyword.value, ast.Name) and keyword.value.id == "str":
            return True
        if keyword.arg == "default" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str):
            return True
        if keyword.arg == "nargs":
            return True
    return False


def _is_device_count(value: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "device_count"
        for node in ast.walk(value)
    )


def _reads(converted: str, names: set[str]) -> dict[tuple[str, str], list[int]]:
    """Lines of the converted script that load one of ``names``, as an attribute
    (``args.ngpu``) or as a variable (``n_gpu``)."""
    try:
        tree = ast.parse(converted)
    except (SyntaxError, ValueError):
        return {}
    lines: dict[tuple[str, str], set[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.ctx, ast.Load):
            lines.setdefault(("attribute", node.attr), set()).add(node.lineno)
        elif isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
            lines.setdefault(("name", node.id), set()).add(node.lineno)
    return {key: sorted(found) for key, found in lines.items()}
