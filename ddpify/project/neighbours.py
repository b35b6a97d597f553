"""A script's own project modules, read (never rewritten) when the script is converted alone.

`ddpify convert train.py` converts one file, but what that file calls decides what the
conversion must do: a helper that writes a log file or the experiment folder
(`io = IOStream(path)`, `save_args(args)`, `create_exp_dir(path)`) must run on rank 0 only;
a star import (`from network import *`) may bind torch under another name (`t.save`); a
model wrapped in DataParallel inside an imported module leaves nothing to convert here,
and the folder is what must be converted. The modules the script imports are found as
Python would find them next to it (the script's folder, a package there, relative imports,
folders a literal `sys.path.append`/`insert` adds), parsed with `ast` (fast, no libcst),
and summarised:

- **writers**: names the script binds to functions or classes of those modules whose code
  writes files (open for writing, torch.save, json/pickle/numpy dumps, figures, folders,
  log files, trackers) and never runs a model step or a collective;
- **torch aliases**: names a star-imported module binds to torch modules (`t` for
  ``import torch as t``), as qualified names;
- **wrapping modules**: imported modules that wrap a model in DataParallel.
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path

from ddpify.project.selected_losses import selecting_parameter
from ddpify.project.dp_subclasses import SubclassPlan, call_name, subclass_plan
from ddpify.diagnostics import Diagnostic, FileResult, Severity
from ddpify.names import FILE_WRITERS, MATRIX_PRODUCTS

# Calls (by their last name) that write files or folders, and those that do only when called
# on a module of the standard library (`os.remove`, not `items.remove`).
WRITING_CALLS = {
    "save", "savez", "savez_compressed", "savetxt", "dump", "savefig", "imwrite", "imsave", "save_image",
    "makedirs", "mkdir", "FileHandler", "SummaryWriter", "write_text", "write_bytes", "to_csv",
}
WRITING_MODULE_CALLS = {
    "shutil": {"copy", "copy2", "copyfile", "copytree", "rmtree", "move"},
    "os": {"remove", "unlink", "rename", "replace", "rmdir"},
}
# Words that say a function trains or synchronises: it must run on every rank.
# (a function that runs a model may reach DDP's buffer broadcast: never rank 0 alone)
EVERY_RANK_WORDS = re.compile(
    r"backward\(|\.step\(|all_reduce|barrier|broadcast|torch\.distributed|\bdist\.|no_grad|\.eval\(\)|forward\("
    r"|(?<!\w)(model|net|network)\("
)
TRAINING_OR_COLLECTIVE = re.compile(r"backward\(|\.step\(|all_reduce|all_gather|barrier|broadcast|torch\.distributed|\bdist\.")
WRITE_MODES = ("w", "a", "x", "+")
# Experiment trackers driven through their module: each call records into the run's store.
TRACKER_ROOTS = {"mlflow", "wandb"}


@dataclass(frozen=True)
class Neighbours:
    """What the script's own project modules tell its single-file conversion."""

    writers: frozenset[str] = frozenset()  # callables bound in the script that only write files
    writer_classes: frozenset[str] = frozenset()  # classes among them: their objects keep files open
    reexports: dict[str, str] = field(default_factory=dict)  # name bound by a star import -> torch path
    wrapping_modules: tuple[str, ...] = ()  # imported modules that wrap a model in DataParallel
    # model classes that change which parameters train outside __init__ (TSM's partial
    # BatchNorm freezing in its own train()): DDP must register every parameter
    freezing_classes: frozenset[str] = frozenset()
    wrapping_files: tuple[Path, ...] = ()  # the files of wrapping_modules
    # imported modules that name DataParallel without wrapping (`isinstance(model,
    # nn.DataParallel)` before saving, PointRCNN's train_utils): converted alone, the script's
    # DDP model would take their other branch
    naming_modules: tuple[str, ...] = ()
    # classes and functions that compare the samples of a batch with each other (batch-hard
    # triplet mining, contrastive losses): DataParallel ran them on the whole global batch
    pairwise: frozenset[str] = frozenset()
    # functions of those modules that run a training step (backward()/step()), as bound
    # here, with the parameters they iterate as training data (HRNet's core/function.py
    # `train(config, train_loader, model, ...)`): the loop around the call trains, and the
    # loader passed there is sharded where it is built
    trainers: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    # trainer classes whose constructor takes a loader a training method draws from (CamStyle's
    # `CamStyleTrainer(model, criterion, camstyle_loader)`, drawn with next() in train()), as
    # bound here -> those parameters: the loader passed there is training data
    constructor_loaders: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    # model classes with parts whose parameters get no gradient (a submodule never called, a
    # result forward() computes and drops: Background-Matting's model_enc_multi), as bound
    # here -> the part
    idle_parts: dict[str, str] = field(default_factory=dict)
    # trainers (as bound here) that also write files in their module (robot-surgery-
    # segmentation's utils.train saves the model and appends to a log): read, not rewritten,
    # so every rank writes them
    writing_trainers: frozenset[str] = frozenset()
    # classes that keep a buffer they update in place while training (lemniscate's
    # LinearAverage memory bank, SpCL's HybridMemory), as bound here
    memory_banks: frozenset[str] = frozenset()
    # DataParallel subclasses of those modules whose wraps convert (attribute forwarding,
    # scattering only: project/dp_subclasses.py), as bound here -> where the model is passed
    dp_classes: dict[str, SubclassPlan] = field(default_factory=dict)
    # functions and classes of those modules that wrap a model in DataParallel (directly or
    # through another function of their module: kospeech's build_model -> build_las), as bound
    # here -> the methods that wrap (empty: calling it wraps)
    wrapping_calls: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # classes and functions of those modules that divide by a count of the batch's content
    # (DSFD's MultiBoxLoss: `loss_l /= num_pos.data.sum()`; cc's `valid.nelement() / valid.sum()`)
    # or keep its hardest elements (OhemCELoss), as bound here: DataParallel counted and ranked
    # over the whole batch, each DDP process would over its share
    count_normalized: frozenset[str] = frozenset()
    # functions of those modules that return a sum of everything (StyleGAN's R1Penalty:
    # `torch.sum(grads * grads)` over the batch), as bound here: a training loss that adds
    # one is scaled by the world size, as a sum written in the script is (DDP116)
    summing: frozenset[str] = frozenset()
    # functions of those modules that return a tuple holding such a sum (attention-is-all-you-
    # need's cal_performance: `loss, n_correct`, the loss `F.cross_entropy(..., reduction='sum')`),
    # as bound here -> the sum's place in the tuple
    summing_parts: dict[str, int] = field(default_factory=dict)
    # modules imported here whose own top-level code downloads a dataset (ML-begin's data.py:
    # `CIFAR10(root, download=True)` at import), as the import names them: every rank runs it
    # at once, before the set-up (DDP607 warns at the import)
    downloading_imports: frozenset[str] = frozenset()
    # functions and classes of those modules that fetch or unpack data on disk when called
    # (pointMLP's ModelNet40, whose constructor reaches data.py's download(): `os.system('wget
    # ...; unzip ...')`), as bound here: rank 0 builds first, the others after it (DDP607)
    downloaders: frozenset[str] = frozenset()
    # the script's own top-level functions that fetch data by themselves (_own_fetchers): run
    # by rank 0 first, whole, where they are called; the others after it (DDP607)
    own_fetchers: frozenset[str] = frozenset()
    # loss classes and functions of those modules that average over what a mask selects inside
    # (FastSpeech2's model/loss.py: `masked_select` of the padding masks), as bound here: read
    # only, each rank would average over its own share's selection (folder mode weights them)
    masked_losses: frozenset[str] = frozenset()
    # functions of those modules that return a mean over what one of their parameters selects
    # (GwcNet's model_loss(disp_ests, disp_gt, mask)), as bound here -> that parameter's position:
    # a training loss that calls one is weighted by its selection's share, as a masked mean
    # written in the script is (DDP135)
    selecting: dict[str, int] = field(default_factory=dict)
    # functions of those modules that pick this process's GPU (squad's get_available_devices:
    # `torch.cuda.set_device(cuda:0)`), as bound here: converted alone, every rank would use it
    device_pickers: frozenset[str] = frozenset()
    # project mode: the writer functions among them, for the values they return alone (DDP617:
    # SimSiam's get_args makes its log folder; the project rewrites its other writes itself)
    value_writers: frozenset[str] = frozenset()
    # functions of those modules that read a checkpoint (torch.load: MMT's load_checkpoint), as
    # bound here: every rank calling one waits for rank 0's saves first (DDP615)
    checkpoint_readers: frozenset[str] = frozenset()
    # functions of those modules that run the model without training it and write files, here
    # or through the project's writers (HRNet's validate: debug images, a results JSON it reads
    # back), as bound here: every rank runs them, rank 0's writes are the real ones (ddp_quiet)
    writing_evaluators: frozenset[str] = frozenset()
    # writers that set fields of an argument (FlowFormer's process_cfg: `cfg.log_dir = ...`), as
    # bound here -> the positions of those arguments: run on rank 0, the others get the object
    mutating_writers: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def about_models(self) -> Neighbours:
        """What project mode keeps of this: the facts about model and loss classes (idle
        parts, freezing, memory banks, pairwise losses, DataParallel subclasses, the project
        functions and classes that wrap: an entry's switch to them, DDP138), and the
        writers whose returned values every rank needs (DDP617). Other writes, trainers and
        DataParallel tests are the project's own business there: it converts those modules too."""
        return Neighbours(
            freezing_classes=self.freezing_classes, pairwise=self.pairwise, idle_parts=self.idle_parts,
            memory_banks=self.memory_banks, dp_classes=self.dp_classes, summing=self.summing, summing_parts=self.summing_parts, selecting=self.selecting,
            count_normalized=self.count_normalized, value_writers=self.writers - self.writer_classes, checkpoint_readers=self.checkpoint_readers,
            wrapping_calls=self.wrapping_calls, downloaders=self.downloaders, own_fetchers=self.own_fetchers,
        )


def wrapping_neighbour(path: str, source: str) -> tuple[str, Path] | None:
    """The module this script imports that wraps a model in DataParallel (and the folder that
    holds both), for a script that names no DataParallel itself but trains: a single-file
    conversion would miss the wrap."""
    trains_here = re.search(r"backward\(|optimi[sz]er|\.step\(", source) is not None
    if not trains_here and not re.search(r"\btrain", source):
        return None
    found = read_neighbours(path, source)
    if not found.wrapping_modules:
        return None
    # (TransUNet's train.py trains nothing itself: it calls trainer.py's trainer_synapse(),
    # which wraps and trains; an evaluation script that calls neither is not refused)
    # (SR3's sr.py: `for _, train_data in enumerate(train_loader): diffusion.optimize_parameters()`,
    # a method of a project object, trains)
    loops_training_data = re.search(r"^\s*for .+ in .*\btrain\w*", source, re.MULTILINE) is not None
    calls_trainer = any(len(re.findall(rf"\b{re.escape(name)}\b", source)) > 1 for name in found.trainers)
    # (BERT4Rec-VAE: `trainer = trainer_factory(...)`, then `trainer.train()`)
    # (ncsnv2: `runner = eval(config.runner)(args, config)`, then `runner.train()`)
    runs_a_trainer = re.search(r"\b\w*(trainer|runner|solver|learner|engine)\w*\.(train|fit|run)\(", source, re.IGNORECASE) is not None
    # (score_sde: main.py calls `run_lib.train(...)` of the very module whose imports wrap)
    calls_its_training = any(
        re.search(rf"(?<![\w.]){re.escape(module)}\.\w*(train|fit|run)\w*\(", source) for module in found.wrapping_modules
    )
    if not (trains_here or calls_trainer or loops_training_data or runs_a_trainer or calls_its_training) and not (
        _calls_imported_training(path, source, {name.split(".")[0] for name in found.trainers})
    ):
        return None
    script = Path(path).parent
    # (the folder an absolute import resolves from: `pkg.models.build` of pkg/models/build.py is
    # imported from the folder above pkg/, which folder mode must hold)
    imported_from = found.wrapping_files[0].resolve().parent
    module = found.wrapping_modules[0]
    if not module.startswith("."):
        for _ in module.split(".")[: -1 if found.wrapping_files[0].name != "__init__.py" else None]:
            imported_from = imported_from.parent
    common = Path(os.path.commonpath([script.resolve(), imported_from]))
    try:
        folder = common.relative_to(Path.cwd().resolve()) if not script.is_absolute() else common
    except ValueError:
        folder = common
    return found.wrapping_modules[0], folder


@functools.lru_cache(maxsize=64)
def read_neighbours(path: str, source: str) -> Neighbours:
    """The project modules `source` (the file at `path`) imports, summarised (none for a file
    that is not on disk), and the script's own data fetchers."""
    script = Path(path)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return Neighbours()
    if not script.is_file():
        return Neighbours(own_fetchers=_own_fetchers(tree))
    folders = search_folders(script.parent, tree)
    _SCRIPT_FOLDERS[:] = folders  # (the modules it imports find theirs on its sys.path too)
    try:
        return replace(_read_neighbours(script, tree, folders), own_fetchers=_own_fetchers(tree))
    finally:
        _SCRIPT_FOLDERS.clear()


# The folders the script being read puts on sys.path: at run time every module imports from
# them too (HRNet's lib/core/function.py imports `utils.vis` from the lib/ that
# tools/_init_paths.py adds).
_SCRIPT_FOLDERS: list[Path] = []


def _read_neighbours(script: Path, tree: ast.Module, folders: list[Path]) -> Neighbours:
    writers, classes, reexports, wrapping, freezing, files, pairwise = set(), set(), {}, [], set(), [], set()
    counted: set[str] = set()  # count_normalized, as bound here
    evaluator_classes: dict[str, dict[str, tuple]] = {}  # as bound here
    trainers: dict[str, tuple[tuple[int, str], ...]] = {}
    constructed: dict[str, tuple[tuple[int, str], ...]] = {}
    mutating: dict[str, tuple[int, ...]] = {}
    idle: dict[str, str] = {}
    naming: list[str] = []
    trainer_classes: dict[str, dict[str, tuple[tuple[int, str], ...]]] = {}
    writing: set[str] = set()  # trainer functions and classes that write files, as bound here
    banks: set[str] = set()
    dp_classes: dict[str, SubclassPlan] = {}
    wrapping_calls: dict[str, tuple[str, ...]] = {}
    summing: set[str] = set()
    selecting: dict[str, int] = {}
    summing_parts: dict[str, int] = {}
    downloading: set[str] = set()
    pickers: set[str] = set()
    readers: set[str] = set()
    evaluators: set[str] = set()
    fetching: set[str] = set()  # downloaders, as bound here
    masking: set[str] = set()  # masked_losses, as bound here

    def as_module(bound: str, summary: ModuleSummary) -> None:
        """A module bound to a name (`import utils`, `from tools import utils`): `bound.name`."""
        writers.update(f"{bound}.{name}" for name in summary.writers)
        classes.update(f"{bound}.{name}" for name in summary.writer_classes)
        freezing.update(f"{bound}.{name}" for name in summary.freezing_classes)
        pairwise.update(f"{bound}.{name}" for name in summary.pairwise)
        counted.update(f"{bound}.{name}" for name in summary.count_normalized)
        evaluator_classes.update((f"{bound}.{name}", methods) for name, methods in summary.evaluator_classes.items())
        trainers.update((f"{bound}.{name}", params) for name, params in summary.trainers.items())
        constructed.update((f"{bound}.{name}", params) for name, params in summary.constructor_loaders.items())
        mutating.update((f"{bound}.{name}", found) for name, found in summary.mutating_writers.items())
        idle.update((f"{bound}.{name}", part) for name, part in summary.idle_parts.items())
        trainer_classes.update((f"{bound}.{name}", methods) for name, methods in summary.trainer_classes.items())
        writing.update(f"{bound}.{name}" for name in summary.writing_trainers)
        banks.update(f"{bound}.{name}" for name in summary.memory_banks)
        dp_classes.update((f"{bound}.{name}", plan) for name, plan in summary.dp_classes.items())
        wrapping_calls.update((f"{bound}.{name}", methods) for name, methods in summary.wrapping_calls.items())
        summing.update(f"{bound}.{name}" for name in summary.summing)
        selecting.update((f"{bound}.{name}", index) for name, index in summary.selecting.items())
        summing_parts.update((f"{bound}.{name}", index) for name, index in summary.summing_parts.items())
        pickers.update(f"{bound}.{name}" for name in summary.device_pickers)
        readers.update(f"{bound}.{name}" for name in summary.checkpoint_readers)
        evaluators.update(f"{bound}.{name}" for name in summary.writing_evaluators)
        fetching.update(f"{bound}.{name}" for name in summary.downloaders)
        masking.update(f"{bound}.{name}" for name in summary.masked_losses)

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = _module_file(folders, node.module or "", node.level, script.parent)
            if module is None:
                # a folder without __init__.py (CLUE's `from tools import utils`): its modules
                for alias in node.names:
                    dotted = f"{node.module}.{alias.name}" if node.module else alias.name
                    sub = _module_file(folders, dotted, node.level, script.parent) if alias.name != "*" else None
                    if sub is not None:
                        as_module(alias.asname or alias.name, _summary(sub))
                continue
            summary = _summary(module)
            if summary.downloads_at_import:
                downloading.add("." * node.level + (node.module or ""))
            # `from drqa import reader`: names that are submodules of a package are modules too
            submodules = [_module_file([module.parent], alias.name, 0, module.parent) for alias in node.names] if module.name == "__init__.py" else []
            if summary.wraps or any(sub is not None and _summary(sub).wraps for sub in submodules) or _wraps_deeper(module, folders):
                wrapping.append(node.module or ".")
                files.append(module)
            elif summary.names_data_parallel:
                naming.append(node.module or ".")
            for alias, sub in zip(node.names, submodules or [None] * len(node.names)):
                if sub is not None:  # `from tools import utils`: `utils.torch_save_model(...)`
                    as_module(alias.asname or alias.name, _summary(sub))
                for found, kind in ((dp_classes, summary.dp_classes), (wrapping_calls, summary.wrapping_calls), (constructed, summary.constructor_loaders), (mutating, summary.mutating_writers), (selecting, summary.selecting),
                                    (summing_parts, summary.summing_parts)):
                    _bind(found, kind, alias)
                for names, kind in (
                    (summing, summary.summing), (pickers, summary.device_pickers), (readers, summary.checkpoint_readers),
                    (evaluators, summary.writing_evaluators), (counted, summary.count_normalized),
                    (fetching, summary.downloaders), (masking, summary.masked_losses),
                ):
                    names.update(_bind({}, dict.fromkeys(kind), alias))
            for alias in node.names:
                if alias.name in summary.evaluator_classes:
                    evaluator_classes[alias.asname or alias.name] = summary.evaluator_classes[alias.name]
                elif alias.name == "*":
                    evaluator_classes.update(summary.evaluator_classes)
                if alias.name in summary.writing_trainers:
                    writing.add(alias.asname or alias.name)
                if alias.name in summary.memory_banks:
                    banks.add(alias.asname or alias.name)
                elif alias.name == "*":
                    banks.update(summary.memory_banks)
                if alias.name in summary.torch_aliases:
                    # (Tacotron-pytorch's `from data import DataLoader`, which data.py takes from torch:
                    # torch's class, under the name the import gives it)
                    reexports["." * node.level + f"{node.module}.{alias.name}" if node.module else "." * node.level + alias.name] = summary.torch_aliases[alias.name]
                if alias.name == "*":
                    reexports.update(summary.torch_aliases)
                    writers.update(summary.writers)
                    classes.update(summary.writer_classes)
                    freezing.update(summary.freezing_classes)
                    pairwise.update(summary.pairwise)
                    counted.update(summary.count_normalized)
                    trainers.update(summary.trainers)
                    idle.update(summary.idle_parts)
                    trainer_classes.update(summary.trainer_classes)
                    writing.update(summary.writing_trainers)
                elif alias.name in summary.trainer_classes:
                    trainer_classes[alias.asname or alias.name] = summary.trainer_classes[alias.name]
                elif alias.name in summary.idle_parts:
                    idle[alias.asname or alias.name] = summary.idle_parts[alias.name]
                elif alias.name in summary.trainers:
                    trainers[alias.asname or alias.name] = summary.trainers[alias.name]
                elif alias.name in summary.pairwise:
                    pairwise.add(alias.asname or alias.name)
                elif alias.name in summary.freezing_classes:
                    freezing.add(alias.asname or alias.name)
                elif alias.name in summary.writers:
                    writers.add(alias.asname or alias.name)
                    if alias.name in summary.writer_classes:
                        classes.add(alias.asname or alias.name)
        elif (loaded := _imported_by_name(node)) is not None:
            # `task = importlib.import_module('task.pose')` (pytorch_stacked_hourglass): `import task.pose as task`
            bound, dotted = loaded
            module = _module_file(folders, dotted, 0, script.parent)
            if module is not None:
                as_module(bound, _summary(module))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module = _module_file(folders, alias.name, 0, script.parent)
                if module is None:
                    continue
                summary = _summary(module)
                if summary.downloads_at_import:
                    downloading.add(alias.name)
                if summary.wraps or _wraps_deeper(module, folders):
                    wrapping.append(alias.name)
                    files.append(module)
                elif summary.names_data_parallel:
                    naming.append(alias.name)
                as_module(alias.asname or alias.name, summary)
    instances = _instance_trainers(tree, trainer_classes)
    trainers.update((call, params) for call, (_, params) in instances.items())
    # (`evaluator = Evaluator(model=model)`, then `evaluator.evaluate(...)`, which writes and reads back)
    evaluators.update(_instance_trainers(tree, evaluator_classes))

    writing.update(call for call, (cls, _) in instances.items() if cls in writing)
    return Neighbours(
        writers=frozenset(writers), writer_classes=frozenset(classes), reexports=reexports,
        wrapping_modules=tuple(dict.fromkeys(wrapping)), freezing_classes=frozenset(freezing), wrapping_files=tuple(files),
        naming_modules=tuple(dict.fromkeys(naming)), pairwise=frozenset(pairwise), trainers=trainers, idle_parts=idle,
        writing_trainers=frozenset(writing & set(trainers)), memory_banks=frozenset(banks), dp_classes=dp_classes,
        wrapping_calls=wrapping_calls, summing=frozenset(summing), summing_parts=summing_parts, downloading_imports=frozenset(downloading), downloaders=frozenset(fetching), masked_losses=frozenset(masking), selecting=selecting, device_pickers=frozenset(pickers),
        checkpoint_readers=frozenset(readers), constructor_loaders=constructed, mutating_writers=mutating,
        writing_evaluators=frozenset(evaluators - writers - set(trainers)), count_normalized=frozenset(counted),
    )


# Code that compares the samples of a batch with each other: a distance of the batch with
# itself, a product with its own transpose, a label-equality matrix.
PAIRWISE = re.compile(
    r"\w*dist\w*\(\s*(\w+)\s*,\s*\1\s*\)"
    r"|(\w+)\.mm\(\s*\2\.t\(\)\s*\)|matmul\(\s*(\w+)\s*,\s*\3\.T\s*\)|(\w+)\s*@\s*\4\.T\b"
    r"|(\w+)\s*==\s*\5\.T\b|(\w+)\s*==\s*\6\.t\(\)|(\w+)\.eq\(\s*\7\.t\(\)\s*\)|eq\(\s*(\w+)\s*,\s*\8\.T\s*\)"
    r"|expand\((\w+),\s*\9\)\.eq\("
    r"|addmm_?\(\s*[^,()]+,\s*[^,()]+,\s*(\w+)\s*,\s*\10\.t\(\)\s*\)|addmm_?\(\s*(\w+)\s*,\s*\11\.t\(\)"
    r"|(\w+)\s*\+\s*\12\.t\(\)"  # `dist = dist + dist.t()`: the squared norms of every pair
)


def _shaped_by_the_batch_size(definition: ast.AST) -> bool:
    """A loss class made for one batch size (thesis_SIMCLR's NT-Xent: `SimCLR_Loss(batch_size,
    temperature)`, whose forward builds its mask of negatives and `torch.diag(sim, self.batch_size)`
    from it): it lays out the whole batch's samples against each other, as DataParallel's gathered
    batch had them."""
    if not isinstance(definition, ast.ClassDef):
        return False
    methods = {node.name: node for node in definition.body if isinstance(node, ast.FunctionDef)}
    init, used = methods.get("__init__"), [methods.get(name) for name in ("forward", "__call__")]
    if init is None or not any(arg.arg == "batch_size" for arg in init.args.args + init.args.kwonlyargs):
        return False
    reads = [
        node for method in methods.values() if method is not init for node in ast.walk(method)
        if isinstance(node, ast.Attribute) and node.attr == "batch_size" and isinstance(node.value, ast.Name) and node.value.id == "self"
    ]
    return any(method is not None for method in used) and bool(reads)


def _a_batch_product(definition: ast.AST) -> bool:
    """The rule the script's own losses are read by (transforms/batch_losses.py), on a project
    module: a matrix product whose later operand is transposed (``torch.mm(x, x.t().data)``,
    ``a @ b.T``), neither operand read from ``self`` (a weight)."""
    for node in ast.walk(definition):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            operands, later = [node.left, node.right], [node.right]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MATRIX_PRODUCTS:
            torch_call = isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
            operands = list(node.args) if torch_call else [node.func.value, *node.args]
            later = operands
        else:
            continue
        reads_self = any(isinstance(n, ast.Name) and n.id == "self" for operand in operands for n in ast.walk(operand))
        if any(_transposed(operand) for operand in later) and not reads_self:
            return True
    return False


def _transposed(node: ast.AST) -> bool:
    """``x.t()``, ``x.T``, ``x.t().data``, ``x.transpose(0, 1)``, ``torch.t(x)``."""
    while isinstance(node, ast.Attribute) and node.attr == "data" or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("contiguous", "detach", "clone", "float")
    ):
        node = node.value if isinstance(node, ast.Attribute) else node.func.value
    if isinstance(node, ast.Attribute) and node.attr == "T":
        return True
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    if node.func.attr == "t":
        return not node.args or isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
    values = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
    return node.func.attr in ("transpose", "permute") and values in ([0, 1], [1, 0])


# Files that mark a project's root: a package there is importable once installed (`pip install -e .`).
ROOT_MARKERS = ("setup.py", "setup.cfg", "pyproject.toml", ".git")


def _instance_trainers(tree: ast.Module, classes: dict[str, dict]) -> dict[str, tuple[str, tuple[tuple[int, str], ...]]]:
    """``trainer = train_utils.Trainer(...)`` then ``trainer.train(...)``: "trainer.train" ->
    (its class as bound here, the loader parameters)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            made = ast.unparse(node.value.func)
            if made in classes:
                for method, params in classes[made].items():
                    found[f"{ast.unparse(node.targets[0])}.{method}"] = (made, params)
    return found


def _wraps_deeper(module: Path, folders: list[Path], depth: int = 3, seen: set | None = None) -> bool:
    """A module whose own project imports wrap a model in DataParallel, a few imports down
    (SR3's sr.py -> model/__init__ -> model/model.py -> model/networks.py's define_G)."""
    seen = set() if seen is None else seen
    if depth == 0 or module in seen:
        return False
    seen.add(module)
    try:
        tree = parse_source(module.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            targets = [(node.module or "", node.level)] + [(f"{node.module}.{a.name}" if node.module else a.name, node.level) for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [(alias.name, 0) for alias in node.names]
        else:
            continue
        for dotted, level in targets:
            found = _module_file([module.parent, *folders], dotted, level, module.parent)
            if found is not None and found != module and (_summary(found).wraps or _wraps_deeper(found, folders, depth - 1, seen)):
                return True
    return False


def _bind(found: dict, kind: dict, alias: ast.alias) -> dict:
    """What ``from module import alias`` binds of one kind of the module's names (all of them
    for ``*``), into ``found``, under the name bound here."""
    if alias.name == "*":
        found.update(kind)
    elif alias.name in kind:
        found[alias.asname or alias.name] = kind[alias.name]
    return found


def _imported_by_name(node: ast.AST) -> tuple[str, str] | None:
    """``name = importlib.import_module("a.b")``: (name, "a.b")."""
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
        return None
    call = node.value
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) in ("importlib.import_module", "import_module") and call.args):
        return None
    first = call.args[0]
    return (node.targets[0].id, first.value) if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def search_folders(folder: Path, tree: ast.Module) -> list[Path]:
    """The script's folder, folders it puts on sys.path with a literal, and the project root
    above it (DrQA's scripts/reader/train.py imports the installed `drqa` package of its root)."""
    found = [folder]
    root = next((up for up in list(folder.parents)[:4] if any((up / marker).exists() for marker in ROOT_MARKERS)), None)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "insert"):
            if ast.unparse(node.func.value) != "sys.path" or not node.args:
                continue
            literal = [arg for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            literal += [
                part for arg in node.args if isinstance(arg, ast.Call)
                for part in arg.args if isinstance(part, ast.Constant) and isinstance(part.value, str)
            ]
            bound = {
                top.targets[0].id: top.value for top in tree.body
                if isinstance(top, ast.Assign) and len(top.targets) == 1 and isinstance(top.targets[0], ast.Name)
            }
            for arg in node.args:
                computed = _computed_folder(arg, folder, bound)
                if computed is not None and computed.is_dir() and computed not in found:
                    found.append(computed)  # (Fine-grained-Re-Identification's `dirname(os.getcwd())`)
            for constant in literal:
                # A relative path is relative to where the script is run from: its folder, or
                # the repository root above it (`sys.path.insert(0, '.')` in
                # script/experiment/train.py, run from the root: person-reid-triplet-loss-baseline)
                bases = [folder] if Path(constant.value).is_absolute() else [folder, *list(folder.parents)[:3]]
                for base in bases:
                    candidate = (base / constant.value).resolve()
                    if candidate.is_dir() and candidate not in found:
                        found.append(candidate)
    for candidate in _joined_folders(folder, tree):
        if candidate not in found:
            found.append(candidate)
    # the folder above that holds a package the script imports (3DUnetCNN's
    # unet3d/scripts/train.py imports `unet3d.*`): its root, with or without a marker file
    tops = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    tops |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    holder = next((up for up in list(folder.parents)[:4] if any((up / top / "__init__.py").is_file() for top in tops)), None)
    if holder is None:
        # (or a namespace package, folders without __init__.py: visionmap's `from python.training.dataset
        # import ...` in python/training/train.py, the repository root put on sys.path at run time)
        dotted_modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level and "." in node.module}
        holder = next((up for up in list(folder.parents)[:4] if any(_module_file([up], module, 0, folder) for module in dotted_modules)), None)
    if holder is not None and holder not in found:
        found.append(holder)
    # `import _init_paths` (HRNet, Faster R-CNN) puts ../lib on sys.path; 3DMPPE's
    # `from config import cfg` puts `join(cfg.root_dir, 'common')` there, root_dir being '..'
    for node in tree.body:
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        names += [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        for name in names:
            helper = folder / f"{name}.py"
            try:
                text = helper.read_text(errors="replace") if helper.is_file() else ""
                if "path" in name or "sys.path" in text:
                    found += [c for c in _joined_folders(folder, ast.parse(text), upward="path" not in name) if c not in found]
            except (OSError, SyntaxError, ValueError):
                pass
    if root is not None and root not in found:
        found.append(root)
    return found + [extra for extra in _SCRIPT_FOLDERS if extra not in found]


def _computed_folder(expr: ast.expr, folder: Path, bound: dict[str, ast.expr], depth: int = 0) -> Path | None:
    """The folder ``os.path.dirname(os.getcwd())``, ``dirname(dirname(abspath(__file__)))``
    names (also through module-level names bound to them), the script run from its own
    folder; None for anything else."""
    name = ast.unparse(expr.func).rpartition(".")[2] if isinstance(expr, ast.Call) else None
    if depth > 8:
        return None
    if name == "getcwd" and not expr.args:
        return folder.resolve()
    if isinstance(expr, ast.Name):
        if expr.id == "__file__":
            return (folder / "__file__").resolve()
        return _computed_folder(bound[expr.id], folder, bound, depth + 1) if expr.id in bound else None
    if name in ("abspath", "realpath", "normpath", "Path") and len(expr.args) == 1:
        return _computed_folder(expr.args[0], folder, bound, depth + 1)
    if name == "dirname" and len(expr.args) == 1 or isinstance(expr, ast.Attribute) and expr.attr == "parent":
        inner = _computed_folder(expr.args[0] if name == "dirname" else expr.value, folder, bound, depth + 1)
        return inner.parent if inner is not None else None
    return None


def _joined_folders(folder: Path, tree: ast.AST, upward: bool = False) -> list[Path]:
    """Folders a file names as ``join(this_dir, '..', 'lib')``: relative to its own folder
    (``upward``: or to a folder above it, the base being a root the file computed)."""
    found = []
    bases = [folder, *list(folder.resolve().parents)[:2]] if upward else [folder]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "join" and len(node.args) > 1:
            parts = node.args[1:]
            if not isinstance(node.args[0], ast.Constant) and all(isinstance(p, ast.Constant) and isinstance(p.value, str) for p in parts):
                candidates = [base.joinpath(*(p.value for p in parts)).resolve() for base in bases]
                found += [candidate for candidate in candidates if candidate.is_dir()][:1]
    return found


def _module_file(folders: list[Path], dotted: str, level: int, here: Path) -> Path | None:
    if level:
        base = here
        for _ in range(level - 1):
            base = base.parent
        roots = [base]
    else:
        roots = folders
    parts = [part for part in dotted.split(".") if part]
    for root in roots:
        target = root.joinpath(*parts) if parts else root
        for candidate in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
            if candidate is not None and candidate.is_file():
                return candidate
    return None


@dataclass(frozen=True)
class ModuleSummary:
    writers: frozenset[str] = frozenset()
    writer_classes: frozenset[str] = frozenset()
    torch_aliases: dict[str, str] = field(default_factory=dict)
    wraps: bool = False
    freezing_classes: frozenset[str] = frozenset()
    pairwise: frozenset[str] = frozenset()
    trainers: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)
    idle_parts: dict[str, str] = field(default_factory=dict)
    # class -> its methods that train (directly or through other methods) -> loader parameters
    trainer_classes: dict[str, dict[str, tuple[tuple[int, str], ...]]] = field(default_factory=dict)
    writing_trainers: frozenset[str] = frozenset()  # trainers and trainer classes that write files
    memory_banks: frozenset[str] = frozenset()  # classes that update a buffer of theirs in place
    names_data_parallel: bool = False  # names the class without wrapping: isinstance tests
    dp_classes: dict[str, SubclassPlan] = field(default_factory=dict)  # DataParallel subclasses that convert
    wrapping_calls: dict[str, tuple[str, ...]] = field(default_factory=dict)  # see Neighbours
    summing: frozenset[str] = frozenset()  # functions that return a sum of everything
    device_pickers: frozenset[str] = frozenset()  # functions that call torch.cuda.set_device
    checkpoint_readers: frozenset[str] = frozenset()  # functions that call torch.load
    constructor_loaders: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)  # see Neighbours
    mutating_writers: dict[str, tuple[int, ...]] = field(default_factory=dict)  # see Neighbours
    writing_evaluators: frozenset[str] = frozenset()  # see Neighbours
    count_normalized: frozenset[str] = frozenset()  # see Neighbours
    # classes with methods that run the model and write files (dcase2017's Evaluator.evaluate
    # writes a submission CSV and reads it back) -> those methods
    evaluator_classes: dict[str, dict[str, tuple]] = field(default_factory=dict)
    selecting: dict[str, int] = field(default_factory=dict)  # see Neighbours
    summing_parts: dict[str, int] = field(default_factory=dict)  # see Neighbours
    downloads_at_import: bool = False  # see Neighbours.downloading_imports
    downloaders: frozenset[str] = frozenset()  # see Neighbours
    masked_losses: frozenset[str] = frozenset()  # see Neighbours


_SUMMARISING: set[Path] = set()  # modules whose summary is being made (imports may cycle)


def _imported_idle_parts(path: Path, tree: ast.Module) -> dict[str, str]:
    """Model classes with a part that gets no gradient in the project modules this one
    imports, by the names they have here (`UpsampleBlock`, `ops.UpsampleBlock`)."""
    return _imported(path, tree, lambda summary: summary.idle_parts)


def _imported_writers(path: Path, tree: ast.Module) -> set[str]:
    """Functions and classes of the project modules this one imports that write files
    (ban-vqa's `utils.Logger(...)`, `utils.save_model(...)`), by their names here."""
    return set(_imported(path, tree, lambda summary: dict.fromkeys(summary.writers | summary.writer_classes, "")))


def _trainer_classes(tree: ast.Module, imported: dict) -> dict[str, dict]:
    """The module's classes with training methods, their own and those they inherit from a base
    of this module or of a project module (wolpertinger_ddpg's `WolpertingerAgent(DDPG)`, whose
    update_policy() steps)."""
    found: dict[str, dict] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        methods: dict = {}
        for base in node.bases:
            name = base.id if isinstance(base, ast.Name) else ast.unparse(base)
            methods.update(found.get(name) or imported.get(name) or {})
        methods.update(_training_methods(node))
        if methods:
            found[node.name] = methods
    return found


def _imported(path: Path, tree: ast.Module, pick) -> dict[str, str]:
    """What ``pick`` takes from the summaries of the project modules this one imports, keyed
    by the names they have here."""
    folders, found = search_folders(path.parent, tree), {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = _module_file(folders, node.module or "", node.level, path.parent)
            if module is None:
                continue
            taken = pick(_summary(module))  # (a module being read reads as empty: imports may cycle)
            found.update((alias.asname or alias.name, taken[alias.name]) for alias in node.names if alias.name in taken)
            found.update(taken if any(alias.name == "*" for alias in node.names) else {})
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module = _module_file(folders, alias.name, 0, path.parent)
                if module is not None:
                    found.update((f"{alias.asname or alias.name}.{name}", v) for name, v in pick(_summary(module)).items())
    return found


def _summary(path: Path) -> ModuleSummary:
    """What a project module holds, read once. A module whose summary is being made (imports
    that come back to it: machine's `callbacks/history.py` imports its own package) reads as
    empty there, and is not kept so."""
    if path in _SUMMARISING:
        return ModuleSummary()
    _SUMMARISING.add(path)
    try:
        return _read_summary(path, tuple(_SCRIPT_FOLDERS))
    finally:
        _SUMMARISING.discard(path)


def async_keywords_renamed(source: str) -> str | None:
    """``.cuda(async=True)`` (Python before 3.7; Random-Erasing, pytorch-vqa, chexnet) with
    ``non_blocking=``, its name since, in code only (strings and comments stay); None where
    the source has no such keyword."""
    import io
    import tokenize

    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in (tokenize.NL, tokenize.COMMENT)]
    except (tokenize.TokenError, SyntaxError):
        return None
    places = [
        token.start for before, token, after in zip(tokens, tokens[1:], tokens[2:])
        if token.type == tokenize.NAME and token.string == "async" and before.string in ("(", ",") and after.string == "="
    ]
    if not places:
        return None
    lines = source.splitlines(keepends=True)
    for row, column in reversed(places):
        lines[row - 1] = lines[row - 1][:column] + "non_blocking" + lines[row - 1][column + len("async"):]
    return "".join(lines)


def parse_source(source: str) -> ast.Module:
    """The module's tree, `async=` keywords read as `non_blocking=` where only they fail (the
    project reader and project mode's import graph read such modules too). Its functions and
    classes know the names the module imports (``ddp_imports``), to read calls by their full name."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        renamed = async_keywords_renamed(source)
        if renamed is None:
            raise
        tree = ast.parse(renamed)
    imports = _imported_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.ddp_imports = imports
    return tree


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Each name an import binds -> what it names (``wavfile`` -> ``scipy.io.wavfile``)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
    return names


def _full_name(func: ast.AST, imports: dict[str, str]) -> str:
    """``wavfile.write`` -> ``scipy.io.wavfile.write`` through the module's imports."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return ""
    return ".".join([imports.get(func.id, func.id), *reversed(parts)])


@functools.lru_cache(maxsize=256)
def _read_summary(path: Path, script_folders: tuple[Path, ...] = ()) -> ModuleSummary:
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
        tree = parse_source(source)
    except SyntaxError:
        # (chexnet's ChexnetTrainer.py: `.cuda(async=True)`; its DataParallel is out of reach)
        return ModuleSummary(wraps="DataParallel" in source)
    except (OSError, ValueError):
        return ModuleSummary()
    aliases = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch" and alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    writers, classes = set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and _only_writes(node):
            writers.add(node.name)
        elif isinstance(node, ast.ClassDef) and _keeps_files(node):
            writers.add(node.name)
            classes.add(node.name)
    # (names a package re-exports are its own to its importers: Random-Erasing's utils/__init__.py
    # does `from .logger import *`, and train.py `from utils import Logger, savefig`)
    taken = _imported(path, tree, lambda summary: {**dict.fromkeys(summary.writers, False), **dict.fromkeys(summary.writer_classes, True)})
    writers |= set(taken)
    classes |= {name for name, is_class in taken.items() if is_class}
    writers |= _calling_writers(tree, writers)
    writers -= _reaching_the_model(tree)
    # (a writer that returns an object it made, M2Det's set_logger -> Logger(log_path): made on
    # rank 0 only like a logger class, never sent to the other ranks as a value)
    classes |= {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in writers and _returns_an_object(node)}
    # (DataParallelWithCallback of Synchronized-BatchNorm: first-order-model's train())
    # (a class statement that subclasses DataParallel wraps nothing: Wave-U-Net's model/utils.py)
    wraps = re.search(r"(?<!Distributed)DataParallel(WithCallback)?\(", re.sub(r"^\s*class .*$", "", source, flags=re.M)) is not None
    # (DataParallel by function: Real-Time-Voice-Cloning's data_parallel_workaround runs
    # replicate/parallel_apply in its train())
    wraps = wraps or re.search(r"\b(data_parallel|parallel_apply)\s*\(", source) is not None
    if path.name == "__init__.py" and not wraps:  # a package re-exporting its modules' classes (DrQA's DocReader)
        # (`from .reader import *`, or by the package's own name: ncsnv2's `from runners.ncsn_runner import *`)
        own = path.parent.name + "."
        wraps = any(
            _summary(sub).wraps
            for node in tree.body if isinstance(node, ast.ImportFrom) and node.module and (node.level == 1 or node.module.startswith(own))
            for sub in [_module_file([path.parent], node.module[len(own):] if node.module.startswith(own) and not node.level else node.module, 0, path.parent)]
            if sub is not None and sub != path
        )
    freezing = {node.name: "" for node in tree.body if isinstance(node, ast.ClassDef) and _freezes_after_init(node)}
    # (and those that subclass or build one: SiamMask's Custom builds ResDown(Features), whose
    # unfix() turns requires_grad on after the wrap)
    known = _imported(path, tree, lambda summary: dict.fromkeys(summary.freezing_classes, ""))
    freezing = frozenset(_through_classes(tree, freezing, known, ""))
    coupled = {
        node.name for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef))
        and (PAIRWISE.search(ast.unparse(node)) or _a_batch_product(node) or _shaped_by_the_batch_size(node))
    }
    imported_coupled = set(_imported(path, tree, lambda summary: dict.fromkeys(summary.pairwise, "")))
    # (and the losses that build or call one: MGN's loss.Loss picks a TripletLoss among its terms;
    # a model that computes one inside its forward did so per GPU under DataParallel too)
    combining = {name for name in _through_calls(tree, coupled, imported_coupled) - coupled - imported_coupled if LOSS_NAME.search(name)}
    pairwise = _with_instances(tree, frozenset(coupled | imported_coupled | combining))
    trainers = {node.name: _iterated_parameters(node) for node in tree.body if isinstance(node, ast.FunctionDef) and _trains(node)}
    trainer_classes = _trainer_classes(tree, _imported(path, tree, lambda summary: summary.trainer_classes))
    bases = {id(part) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) for base in cls.bases for part in ast.walk(base)}
    names = not wraps and any(  # in code, not in a docstring or comment, nor a subclass's base
        (isinstance(node, ast.Attribute) and node.attr == "DataParallel" or isinstance(node, ast.Name) and node.id == "DataParallel")
        and id(node) not in bases
        for node in ast.walk(tree)
    )
    # (through a project helper that writes too: ban-vqa's train() logs with utils.Logger and
    # saves with utils.save_model)
    writing_helpers = writers | _imported_writers(path, tree)
    writing = frozenset(
        node.name for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and (node.name in trainers or node.name in trainer_classes)
        and (_writes(node) or _calls_one_of(node, writing_helpers))
    )
    training_text = _without_constructors(tree, source)
    banks = frozenset(node.name for node in tree.body if isinstance(node, ast.ClassDef) and _updates_buffer(node, training_text))
    # (and those it imports, which importers may take from here: reid/loss/__init__.py's InvNet)
    banks |= frozenset(_imported(path, tree, lambda summary: dict.fromkeys(summary.memory_banks, "")))
    return ModuleSummary(
        frozenset(writers), frozenset(classes), aliases, wraps, freezing, pairwise, trainers, {**_imported_idle_parts(path, tree), **idle_parts(tree, _imported_idle_parts(path, tree))}, trainer_classes,
        # (and the subclasses it imports: Synchronized-BatchNorm's sync_batchnorm/__init__.py
        # `from .replicate import DataParallelWithCallback`)
        writing, banks, names, {**_imported(path, tree, lambda summary: summary.dp_classes), **_dp_classes(tree, aliases)},
        # (and the wrapping classes it imports, which importers may take from here: OpenNRE's
        # framework/__init__.py `from .sentence_re import SentenceRE`)
        {**_imported(path, tree, lambda summary: summary.wrapping_calls), **_wrapping_definitions(tree, path)},
        frozenset(node.name for node in tree.body if isinstance(node, ast.FunctionDef) and _summed_place(node) == -1),
        frozenset(node.name for node in tree.body if isinstance(node, ast.FunctionDef) and "cuda.set_device(" in ast.unparse(node)),
        frozenset(node.name for node in tree.body if isinstance(node, ast.FunctionDef) and "torch.load(" in ast.unparse(node)),
        {node.name: params for node in tree.body if isinstance(node, ast.ClassDef) for params in [_constructor_loaders(node)] if params},
        {node.name: found for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in writers
         for found in [_mutated_arguments(node)] if found},
        frozenset(
            node.name for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name not in writers and node.name not in trainers
            and _evaluates(node) and (_writes(node) or _calls_one_of(node, writing_helpers))
        ),
        count_normalized=_with_instances(tree, _through_calls(
            tree,
            {node.name for node in tree.body
             if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and (normalised_by_a_count(node) or mines_the_batch(node))},
            set(_imported(path, tree, lambda summary: dict.fromkeys(summary.count_normalized, ""))),
        )),
        downloads_at_import=_downloads_at_import(tree),
        masked_losses=frozenset(
            node.name for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and LOSS_CLASS_NAME.search(node.name)
            and "masked_select(" in ast.unparse(node) and (not isinstance(node, ast.FunctionDef) or selecting_parameter(node) is None)
        ) | frozenset(_imported(path, tree, lambda summary: dict.fromkeys(summary.masked_losses, ""))),
        downloaders=_through_calls(
            tree, {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and (_fetches_data(node) or _prepares_data(node))},
            set(_imported(path, tree, lambda summary: dict.fromkeys(summary.downloaders, ""))),
        ),
        summing_parts={
            **_imported(path, tree, lambda summary: summary.summing_parts),
            **{node.name: place for node in tree.body if isinstance(node, ast.FunctionDef) for place in [_summed_place(node)] if place is not None and place >= 0},
        },
        selecting={
            **_imported(path, tree, lambda summary: summary.selecting),
            **{node.name: index for node in tree.body if isinstance(node, ast.FunctionDef) for index in [selecting_parameter(node)] if index is not None},
        },
        evaluator_classes={
            node.name: methods for node in tree.body if isinstance(node, ast.ClassDef)
            for methods in [_evaluating_writers(node, writing_helpers)] if methods
        },
    )


def _evaluating_writers(cls: ast.ClassDef, writing_helpers: set[str]) -> dict[str, tuple]:
    """The public methods of a class that run a model without training it and write files,
    themselves or through the methods of the class they call and the module's writers."""
    methods = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
    found: dict[str, tuple] = {}
    for name in methods:
        if name.startswith("_"):
            continue
        reached, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in reached or current not in methods:
                continue
            reached.add(current)
            todo += [n.func.attr for n in ast.walk(methods[current]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]
        bodies = [methods[n] for n in reached]
        text = "\n".join(ast.unparse(body) for body in bodies)
        runs = EVERY_RANK_WORDS.search(text) is not None and TRAINING_OR_COLLECTIVE.search(text) is None
        if runs and any(_writes(body) or _calls_one_of(body, writing_helpers) for body in bodies):
            found[name] = ()
    return found


LOSS_NAME = re.compile(r"loss|criterion|objective", re.IGNORECASE)


def _with_instances(tree: ast.Module, found: frozenset[str]) -> frozenset[str]:
    """``found`` and the module-level instances of its classes, which importers call as the
    loss (a SenNet kidney-vessel project's utils/loss.py: `loss_func = DiceLoss()`, a Dice over
    the whole batch, imported and called by the training script)."""
    made = {
        target.id for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name) and node.value.func.id in found
        for target in node.targets if isinstance(target, ast.Name)
    }
    return found | made


def _through_calls(tree: ast.Module, found: set[str], imported: set[str]) -> frozenset[str]:
    """The module's functions and classes in ``found`` or ``imported``, and those that call one
    of them, in turn (IIC's ``IID_loss`` calls ``compute_joint``, which divides the batch's joint
    distribution by its own total: the loss is the batch's as much)."""
    found = set(found) | set(imported)
    definitions = [node for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))]
    grown = True
    while grown:
        grown = False
        for node in definitions:
            if node.name not in found and any(
                isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in found
                for call in ast.walk(node)
            ):
                found.add(node.name)
                grown = True
    return frozenset(found)


def normalised_by_a_count(definition: ast.AST) -> bool:
    """A division by a total count of the inputs' content: ``loss_l /= N`` with ``N =
    num_pos.data.sum()`` (DSFD's MultiBoxLoss), ``valid.nelement() / valid.sum()`` (cc's
    photometric loss); not a per-sample count (``mask.sum(dim=1)``), nor a weight's (``self.``)."""
    selections = {
        target.id for node in ast.walk(definition) if isinstance(node, ast.Assign) and _a_selection(node.value)
        for target in node.targets if isinstance(target, ast.Name)
    }
    counts = {
        target.id for node in ast.walk(definition) if isinstance(node, ast.Assign)
        and (_a_total_count(node.value) or _a_length_of(node.value, selections))
        for target in node.targets if isinstance(target, ast.Name)
    }

    def counted(value: ast.AST) -> bool:
        # (a denominator made of totals: RFNet's Dice `2 * num / (l + r + eps)` of `l = torch.sum(output)`)
        return _a_total_count(value) or any(isinstance(node, ast.Name) and node.id in counts for node in ast.walk(value))

    return any(
        isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and counted(node.right) and not _scaled_to_one(node, definition)
        or isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div) and counted(node.value)
        for node in ast.walk(definition)
    )


def _a_selection(value: ast.AST) -> bool:
    """``gt_locations[pos_mask, :]`` (through ``.reshape(-1, 4)``, ``.view(...)``): the elements a
    mask picks from the batch, as many as the batch's content holds."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("reshape", "view", "contiguous", "float"):
        value = value.func.value
    if not isinstance(value, ast.Subscript):
        return False
    index = value.slice.elts[0] if isinstance(value.slice, ast.Tuple) and value.slice.elts else value.slice
    return isinstance(index, (ast.Name, ast.Compare)) and not (isinstance(index, ast.Name) and index.id.isupper())


def _a_length_of(value: ast.AST, selections: set[str]) -> bool:
    """``gt_locations.size(0)``, ``len(x)``, ``x.shape[0]`` of a selection (ULFD's MultiboxLoss:
    ``num_pos = gt_locations.size(0)`` of ``gt_locations[pos_mask, :]``): a count of the batch's
    content."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "size" and value.args:
        measured = value.func.value
    elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "len" and value.args:
        measured = value.args[0]
    elif isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute) and value.value.attr == "shape":
        measured = value.value.value
    else:
        return False
    return isinstance(measured, ast.Name) and measured.id in selections


def _scaled_to_one(division: ast.BinOp, definition: ast.AST) -> bool:
    """``gauss / gauss.sum()`` of a tensor made here from numbers (an SSIM's Gaussian window,
    NTIRE2022_Inpainting's ``gaussian()``: ``torch.exp(-(torch.arange(n) - n // 2) ** 2 / ...)``):
    a kernel scaled to sum to one, not a loss divided by a count of the batch (IIC's joint
    ``p_i_j / p_i_j.sum()`` of the outputs is one)."""
    total = division.right
    if not (isinstance(total, ast.Call) and isinstance(total.func, ast.Attribute) and total.func.attr == "sum"):
        return False
    summed = total.args[0] if isinstance(total.func.value, ast.Name) and total.func.value.id == "torch" and total.args else total.func.value
    if ast.dump(summed) != ast.dump(division.left) or not isinstance(summed, ast.Name):
        return False
    made = [node.value for node in ast.walk(definition) if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == summed.id for t in node.targets)]
    return bool(made) and all(TENSOR_FROM_NUMBERS.search(ast.unparse(value)) for value in made)


# A tensor made from numbers: a window or kernel, not data
TENSOR_FROM_NUMBERS = re.compile(r"\b(torch|np|numpy)\.(Tensor|tensor|FloatTensor|arange|linspace|ones|zeros|array)\(")


# Hard-example mining: the loss keeps the batch's largest elements (OHEM's `torch.sort(loss.view(-1))`
# then `loss[:self.n_min]`), ranked over the flattened batch.
RANKING = re.compile(r"\b(sort|topk|kthvalue|argsort)\(")
FLATTENED = re.compile(r"\b(view|reshape)\(\s*-1\s*\)|\.flatten\(\s*\)")


def mines_the_batch(definition: ast.AST) -> bool:
    """A loss that ranks the elements of the whole flattened batch and keeps the hardest
    (CoinCheung's OhemCELoss): DataParallel ranked the global batch's, each DDP process would
    rank its share's."""
    if isinstance(definition, ast.ClassDef):
        bodies = [m for m in definition.body if isinstance(m, ast.FunctionDef) and m.name in ("forward", "__call__")]
    else:
        bodies = [definition]
    return any(RANKING.search(text) and FLATTENED.search(text) for text in map(ast.unparse, bodies))


def _a_total_count(value: ast.AST) -> bool:
    """``x.sum()`` (through ``.data``, ``.float()``, ``.item()``, ``max(1, ...)``...) with no
    dimension, or over the first, the batch's (Sem_Seg_25's Dice: ``input.sum(dim=0)`` of the
    batch's pixels, flattened: a total per class over the whole batch), of something not read
    from ``self``."""
    for node in ast.walk(value):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sum"):
            continue
        summed = node.func.value
        if isinstance(summed, ast.Name) and summed.id == "torch":
            total = len(node.args) == 1 and not node.keywords or len(node.args) == 2 and _the_first_dimension(node.args[1])
            summed = node.args[0] if node.args else summed
        else:
            total = not node.args and not node.keywords or len(node.args) == 1 and _the_first_dimension(node.args[0])
        if not node.args and len(node.keywords) == 1 and node.keywords[0].arg == "dim":
            total = total or _the_first_dimension(node.keywords[0].value)
        root = summed
        while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
            root = root.func if isinstance(root, ast.Call) else root.value
        if total and not (isinstance(root, ast.Name) and root.id == "self"):
            return True
    return False


def _the_first_dimension(value: ast.AST) -> bool:
    return isinstance(value, ast.Constant) and value.value == 0 and not isinstance(value.value, bool)


def _downloads_at_import(tree: ast.Module) -> bool:
    """A statement of the module's own top level (not in a function, a class or the
    ``__main__`` block) that calls something with ``download=True``."""
    return any(
        isinstance(statement, (ast.Assign, ast.AnnAssign, ast.Expr)) and any(
            isinstance(node, ast.Call) and any(k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)
            for node in ast.walk(statement)
        )
        for statement in tree.body
    )


# A class or function named as a loss (FastSpeech2Loss, `masked_l1_loss`, a Criterion)
LOSS_CLASS_NAME = re.compile(r"loss|criterion", re.IGNORECASE)
# Calls that fetch or unpack data (by their last name), and shell commands that do
FETCHING_CALLS = {
    "urlretrieve", "urlopen", "download_url", "download_and_extract_archive", "download_file_from_google_drive",
    "extract_archive", "extractall", "unpack_archive",
}
SHELL_CALLS = {"system", "run", "call", "check_call", "check_output", "Popen", "popen"}
FETCHING_COMMANDS = re.compile(r"\b(wget|curl|unzip|gdown|tar\s+-?x|git\s+clone)\b")


def _fetches_data(definition: ast.AST, by_keyword: bool = True) -> bool:
    """Does the function or class fetch or unpack data on disk itself: ``download=True`` (not
    counted with ``by_keyword=False``), a download call (``urlretrieve``, ``self.download()``,
    ``gdown.download``), an archive extracted, a shell command that runs wget/curl/unzip
    (pointMLP's data.py)?"""
    for node in ast.walk(definition):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(node.func, ast.Name) else ""
        if name in FETCHING_CALLS or "download" in name.lower():
            return True
        if by_keyword and any(k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords):
            return True
        if name in SHELL_CALLS and any(
            isinstance(part, ast.Constant) and isinstance(part.value, str) and FETCHING_COMMANDS.search(part.value)
            for arg in node.args for part in ast.walk(arg)
        ):
            return True
    return False


def _own_fetchers(tree: ast.Module) -> frozenset[str]:
    """The script's own top-level functions that fetch or unpack data on disk by themselves
    (visionmap's label download: ``urlopen``, an ``open(zip, "wb")``, ``extractall``, the zip
    removed), not through a dataset's ``download=True``, which the script's statements show."""
    return frozenset(
        node.name for node in tree.body
        if isinstance(node, ast.FunctionDef) and _fetches_data(node, by_keyword=False)
        and not any(isinstance(k, ast.keyword) and k.arg == "download" for k in ast.walk(node))
    )


# Calls that write data files (by their last name): a dataset's features, a cache
DATA_WRITING_CALLS = {"save", "savez", "savez_compressed", "savetxt", "dump", "imwrite", "imsave", "write_text", "write_bytes", "to_csv"}


def _prepares_data(definition: ast.AST) -> bool:
    """A Dataset class whose constructor (or a method it calls on ``self``) writes data files:
    DiffASD's DCASE2022Dataset makes each clip's features, then normalises them in place
    (``np.load(p)``, ``np.save(p, ...)``). Built by every rank at once, the ranks rewrite the same
    files under each other; rank 0 builds it first, the others after it (its writes are rank 0's)."""
    if not isinstance(definition, ast.ClassDef):
        return False
    names = [definition.name, *(ast.unparse(base).rpartition(".")[2] for base in definition.bases)]
    if not any("Dataset" in name for name in names):
        return False
    methods = {f.name: f for f in definition.body if isinstance(f, ast.FunctionDef)}
    pending, reached = ["__init__"], set()
    while pending:
        method = methods.get(pending.pop())
        if method is None or method.name in reached:
            continue
        reached.add(method.name)
        for call in (n for n in ast.walk(method) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id if isinstance(call.func, ast.Name) else ""
            if name in DATA_WRITING_CALLS or name in ("open", "File") and _write_mode(call):
                return True
            if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
                pending.append(name)
    return False


def _summed_place(function: ast.FunctionDef) -> int | None:
    """Where the function's one return holds a sum over everything: -1 for the value itself
    (``return torch.sum(x)``, ``return x.sum()``, ``F.cross_entropy(..., reduction="sum")``, or
    the name last bound to one), the place in a tuple it returns (cal_performance's ``return
    loss, n_correct``), None for none."""
    returns = [node for node in ast.walk(function) if isinstance(node, ast.Return) and node.value is not None]
    if len(returns) != 1:
        return None
    value = returns[0].value
    if isinstance(value, ast.Tuple):
        places = [place for place, element in enumerate(value.elts) if _a_total_sum(_last_bound(element, function))]
        return places[0] if len(places) == 1 else None
    return -1 if _a_total_sum(_last_bound(value, function)) else None


def _last_bound(value: ast.expr, function: ast.FunctionDef) -> ast.expr:
    """The value a returned name was bound to last (itself for anything else)."""
    if not isinstance(value, ast.Name):
        return value
    if any(isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == value.id for node in ast.walk(function)):
        return value  # (`loss /= gold.numel()`: a sum made a mean, or anything else: not read as the sum)
    bound = [node.value for node in ast.walk(function) if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == value.id for t in node.targets)]
    return bound[-1] if bound else value


def _a_total_sum(value: ast.expr) -> bool:
    """``x.sum()``, ``torch.sum(x)`` (no dimension), or a loss told to sum (``reduction="sum"``,
    ``size_average=False``)."""
    if not isinstance(value, ast.Call):
        return False
    keywords = {k.arg: k.value for k in value.keywords}
    if isinstance(keywords.get("reduction"), ast.Constant) and keywords["reduction"].value == "sum":
        return True
    if isinstance(keywords.get("reduce"), ast.Constant) and keywords["reduce"].value is False:
        return False  # (no reduction at all)
    if isinstance(keywords.get("size_average"), ast.Constant) and keywords["size_average"].value is False:
        return True
    func = value.func
    if value.keywords or not (isinstance(func, ast.Attribute) and func.attr == "sum"):
        return False
    return not value.args if not (isinstance(func.value, ast.Name) and func.value.id == "torch") else len(value.args) == 1


def _wrapping_definitions(tree: ast.Module, path: Path | None = None) -> dict[str, tuple[str, ...]]:
    """Top-level functions that wrap a model in DataParallel, directly or by calling another
    that does (kospeech's build_model -> build_las -> `return nn.DataParallel(...)`), and
    classes whose constructor (-> ()) or other methods (-> their names) do, or whose base's
    constructor does (FewRel's Proto of framework.FewShotREModel)."""
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    wrapping = {name for name, function in functions.items() if _calls_data_parallel(function, set())}
    if path is not None and any(_imports_by_name(function) for function in functions.values()) and _wrapping_module_in_reach(path) is not None:
        # a factory that imports its class by a name computed at run time (CUT's models/__init__.py:
        # `importlib.import_module("models." + name + "_model")`) makes one of the package's
        # classes, and some class of the package wraps in DataParallel (BaseModel.parallelize)
        wrapping |= {name for name, function in functions.items() if _imports_by_name(function)}
    grown = True
    while grown:
        more = {name for name, function in functions.items() if name not in wrapping and _calls_data_parallel(function, wrapping)}
        wrapping |= more
        grown = bool(more)
    found: dict[str, tuple[str, ...]] = {name: () for name in wrapping}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = _wrapping_methods(cls, wrapping)
        if methods:  # (a model whose forward() runs data_parallel, WassersteinGAN's DCGAN_G: making it wraps)
            found[cls.name] = () if "__init__" in methods or "forward" in methods else tuple(methods)
        elif any(found.get(ast.unparse(base)) == () or _base_wraps(base, tree, path) for base in cls.bases):
            found[cls.name] = ()
    return found


def _imports_by_name(function: ast.AST) -> bool:
    """``importlib.import_module(name)`` / ``__import__(name)`` of a name computed at run time, or
    an ``exec`` of computed text (pytorch_GAN_zoo's loadmodule: ``exec("from " + package + " import " + name)``)."""
    return any(
        isinstance(call, ast.Call) and (call_name(call) or "").rpartition(".")[2] in ("import_module", "__import__", "exec")
        and call.args and not isinstance(call.args[0], ast.Constant)
        for call in ast.walk(function)
    )


def _wrapping_module_in_reach(path: Path, limit: int = 2000) -> Path | None:
    """Does a module that a name computed at run time may import wrap in DataParallel: another
    module of the folder that holds `path`, or any module of the packages beside its top package
    (GAN_zoo's trainer, picked by name, builds a model whose base class wraps, three imports away)?"""
    for sibling in sorted(path.parent.glob("*.py")):
        if sibling != path and _summary(sibling).wraps:
            return sibling
    top = path.parent
    while (top / "__init__.py").exists() and (top.parent / "__init__.py").exists():
        top = top.parent
    root = top.parent if (top / "__init__.py").exists() else top
    packaged = (
        module for module in sorted(root.rglob("*.py"))[:limit]
        if module != path and module.parent != root and (module.parent / "__init__.py").exists()
    )
    return next((module for module in packaged if re.search(r"DataParallel|data_parallel", module.read_text(errors="replace")) and _summary(module).wraps), None)


def _wrapping_methods(cls: ast.ClassDef, wrapping: set[str]) -> list[str]:
    """Methods of the class that wrap, directly or through its other methods (mcan-vqa's
    ``Execution.run()`` calls ``self.train()``, which wraps)."""
    defined = [m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = [m.name for m in defined if _calls_data_parallel(m, wrapping)]
    grown = bool(found)
    while grown:
        more = [m.name for m in defined if m.name not in found and _calls_own_method(m, found)]
        found += more
        grown = bool(more)
    return found


def _calls_own_method(method: ast.AST, names: list[str]) -> bool:
    return any(
        isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in names
        and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"
        for call in ast.walk(method)
    )


_BASES_READ: set[Path] = set()  # modules whose bases are being read (an import cycle ends there)


def _base_wraps(base: ast.expr, tree: ast.Module, path: Path | None) -> bool:
    """A base class of another project module whose constructor wraps in DataParallel:
    ``fewshot_re_kit.framework.FewShotREModel`` (``import fewshot_re_kit``), or a name the
    module imports (``from framework import FewShotREModel``)."""
    if path is None or path in _BASES_READ:
        return False
    dotted = ast.unparse(base)
    module, _, name = dotted.rpartition(".")
    if not module:
        module = next((
            node.module or "" for node in tree.body
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == dotted for a in node.names)
        ), "")
        if not module:
            return False
    roots = [path.parent, *list(path.parents)[1:3]]
    found = _module_file(roots, module, 0, path.parent)
    if found is None or found == path:
        return False
    _BASES_READ.add(path)
    try:
        return _summary(found).wrapping_calls.get(name) == ()
    finally:
        _BASES_READ.discard(path)


def _calls_data_parallel(node: ast.AST, wrapping: set[str]) -> bool:
    """A call of DataParallel (or a variant named so), or of one of ``wrapping``."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            name = call_name(call) or ""
            if re.fullmatch(r"\w*DataParallel(WithCallback)?|data_parallel|parallel_apply", name) and "Distributed" not in name or name in wrapping:
                return True
    return False


def _dp_classes(tree: ast.Module, aliases: dict[str, str]) -> dict[str, SubclassPlan]:
    """The module's DataParallel subclasses whose wraps convert (a subclass of one of them
    too: CPM's BalancedDataParallel of torch's, imported as DataParallel)."""
    found: dict[str, SubclassPlan] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            dotted = ast.unparse(base)
            torch_class = aliases.get(dotted.split(".")[0], dotted.split(".")[0]) + dotted[len(dotted.split(".")[0]):]
            if torch_class.endswith(("nn.DataParallel", "parallel.DataParallel")) or dotted in found:
                plan = subclass_plan(node)
                if isinstance(plan, SubclassPlan):
                    found[node.name] = plan
    return found


def _mutated_arguments(function: ast.FunctionDef) -> tuple[int, ...]:
    """Positions of the parameters whose fields the function sets (`cfg.log_dir = ...`)."""
    params = [a.arg for a in function.args.args]
    set_on = {
        target.value.id for node in ast.walk(function) if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, (ast.Attribute, ast.Subscript)) and isinstance(target.value, ast.Name)
    }
    return tuple(index for index, name in enumerate(params) if name in set_on)


def _constructor_loaders(cls: ast.ClassDef) -> tuple[tuple[int, str], ...]:
    """Constructor parameters kept as ``self.x`` (or as ``self.it = iter(self.x)``) that a
    training method of the class reads: the loaders it trains on besides the ones its methods
    are passed (CamStyleTrainer's camstyle_loader)."""
    methods = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
    init = methods.get("__init__")
    training = set(_training_methods(cls))
    if init is None or not training:
        return ()
    read = {
        node.attr for name in training for node in ast.walk(methods[name])
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }
    params = [a.arg for a in init.args.args[1:]]
    found = []
    for node in ast.walk(init):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)):
            continue
        value, attr = node.value, node.targets[0].attr
        if isinstance(value, ast.Name) and value.id in params and attr in read and "loader" in (value.id + attr).lower():
            found.append((params.index(value.id), value.id))
        kept = {n.attr for n in ast.walk(value) if isinstance(n, ast.Attribute)} | {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "iter" and attr in read:
            for param in params:
                if param in kept or any(
                    isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and a.value.id == param
                    and isinstance(a.targets[0], ast.Attribute) and a.targets[0].attr in kept for a in ast.walk(init)
                ):
                    found.append((params.index(param), param))
    return tuple(dict.fromkeys(found))


def _training_methods(cls: ast.ClassDef) -> dict[str, tuple[tuple[int, str], ...]]:
    """PointRCNN's ``Trainer.train(..., train_loader, ...)`` iterating its loader and calling
    ``self._train_it(batch)``, which runs backward()/step(): method -> loader parameters
    (counted without ``self``, as a call on an instance passes them)."""
    methods = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
    training = {name for name, method in methods.items() if _trains(method)}
    grown = True
    while grown:
        grown = False
        for name, method in methods.items():
            calls = {n.func.attr for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"}
            if name not in training and calls & training:
                training.add(name)
                grown = True
    found = {}
    for name in training:
        params = _iterated_parameters(methods[name])
        found[name] = tuple((index - 1, param) for index, param in params if index > 0)
    return found


def idle_parts(tree: ast.Module, known: dict[str, str] | None = None) -> dict[str, str]:
    """Module classes with a part that gets no gradient: a submodule made in __init__ that no
    method uses, or a submodule's result that forward() computes and never reads."""
    found = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef) or not any("Module" in ast.unparse(base) for base in cls.bases):
            continue
        methods = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
        if "__init__" not in methods or "forward" not in methods:
            continue
        made = [
            target.attr for node in ast.walk(methods["__init__"]) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            for target in node.targets
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
            and re.search(r"(nn\.|^)(Linear|Conv\w*|Sequential|ModuleList|Embedding|LSTM|GRU|BatchNorm\w*)\b|[A-Z]\w*(Net|Block|Encoder|Decoder|Head)\b", ast.unparse(node.value.func))
        ]
        used = {  # read anywhere, __init__ too (`self.conv1 = nn.Sequential(..., self.bn1)`, dgcnn)
            node.attr for method in methods.values() for node in ast.walk(method)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and isinstance(node.ctx, ast.Load)
        }
        unused = [attr for attr in made if attr not in used]
        dropped = _dropped_results(methods["forward"])
        switched = _used_only_under_a_switch(made, methods)
        selected = _selected_by_an_argument(methods["forward"])
        frozen = _run_without_gradients(methods["forward"])
        pieced = _used_only_through_parts(methods)
        if unused or dropped or switched or selected or frozen or pieced:
            found[cls.name] = (
                f"self.{unused[0]} is never used" if unused else f"`{dropped}` is computed and never read" if dropped
                else f"self.{switched[0]} is used only under `{switched[1]}` (a configuration switch)" if switched
                else f"forward() runs only the part `{selected}` picks" if selected
                else f"forward() runs self.{frozen} under no_grad" if frozen
                else f"only some parts of self.{pieced[0]} are used (self.{pieced[0]}.{pieced[1]}, ...), never the whole"
            )
    return _built_from_idle_parts(tree, found, known or {})


def _built_from_idle_parts(tree: ast.Module, found: dict[str, str], known: dict[str, str]) -> dict[str, str]:
    """A model class that builds, in its constructor, a class with a part that gets no
    gradient (CARN's Net builds ops.UpsampleBlock, which runs one branch per scale), or that
    subclasses one, has that part too: the classes of this module, and those `known` from the
    modules it imports."""
    return _through_classes(tree, found, known, "it builds {callee}, where {part}")


def _through_classes(tree: ast.Module, found: dict[str, str], known: dict[str, str], why: str) -> dict[str, str]:
    """``found`` (class -> why) grown by the classes of this module that subclass one of
    ``found`` or ``known``, or build one in their constructor."""
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for cls in classes:
            if cls.name in found:
                continue
            init = next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
            named = [ast.unparse(base) for base in cls.bases]
            named += [ast.unparse(node.func) for node in (ast.walk(init) if init is not None else ()) if isinstance(node, ast.Call)]
            for callee in named:
                part = found.get(callee) or known.get(callee) or found.get(callee.rpartition(".")[2])
                if part is not None:
                    found[cls.name] = why.format(callee=callee, part=part)
                    changed = True
                    break
    return found


WHOLE_MODULE_METHODS = {
    "parameters", "named_parameters", "modules", "named_modules", "train", "eval", "to", "cuda", "cpu", "half", "float",
    "state_dict", "load_state_dict", "apply", "requires_grad_", "zero_grad", "buffers", "named_buffers", "register_buffer",
}
RUNS_THE_WHOLE = re.compile(r"(forward|extract|get|encode|decode|predict|compute|run|infer|embed|features?$|sample|generate|step|loss)", re.IGNORECASE)


def _used_only_through_parts(methods: dict[str, ast.FunctionDef]) -> tuple[str, str] | None:
    """``self.features = models.resnet18(...)`` of which the model only ever uses parts
    (``self.features.conv1`` ... ``.layer4``, BiSeNet's context path; ``list(self.backbone.children())``),
    never the whole: the parts it leaves (the classifier ``fc``) get no gradient."""
    made = [
        target.attr for node in ast.walk(methods["__init__"]) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        for target in node.targets
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    ]
    parents = {child: node for method in methods.values() for node in ast.walk(method) for child in ast.iter_child_nodes(node)}
    for attr in made:
        parts, whole = set(), False
        for method in methods.values():
            for node in ast.walk(method):
                if not (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
                        and node.value.id == "self" and isinstance(node.ctx, ast.Load)):
                    continue
                parent = parents.get(node)
                if isinstance(parent, ast.Attribute) and parent.value is node:
                    called = isinstance(parents.get(parent), ast.Call) and parents[parent].func is parent
                    # (`self.features.layer1(x)` runs a part; `self.t_net.extract_feature(x)` a method
                    # that runs the whole, as far as can be told)
                    if called and parent.attr in WHOLE_MODULE_METHODS:
                        continue  # about the whole, running nothing
                    if not called or parent.attr in ("children", "named_children") or not RUNS_THE_WHOLE.match(parent.attr):
                        parts.add(parent.attr)
                        continue
                whole = True
        if parts and not whole:
            return attr, sorted(parts)[0]
    return None


def _run_without_gradients(forward: ast.FunctionDef) -> str | None:
    """``with torch.no_grad(): x = self.resnet(x)`` in forward() (video-classification's
    ResCNNEncoder): a part called only where no gradient is recorded; its parameters get none."""
    inside, outside = set(), set()
    quiet = [w for w in ast.walk(forward) if isinstance(w, ast.With) and any("no_grad" in ast.unparse(i.context_expr) for i in w.items)]
    quiet_nodes = {id(node) for w in quiet for node in ast.walk(w)}
    for node in ast.walk(forward):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "self":
            (inside if id(node) in quiet_nodes else outside).add(node.func.attr)
    only = sorted(inside - outside)
    return only[0] if only else None


def _selected_by_an_argument(forward: ast.FunctionDef) -> str | None:
    """``self.waveunets[inst]`` with ``inst`` an argument of forward() (Wave-U-Net's one
    network per instrument, a head per task): each call trains only the part it picks."""
    params = {a.arg for a in forward.args.args[2:]}  # not self, not the input
    for node in ast.walk(forward):
        if (
            isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id in params
            and isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"
        ):
            return ast.unparse(node)
    return None


def _used_only_under_a_switch(made: list[str], methods: dict[str, ast.FunctionDef]) -> tuple[str, str] | None:
    """A submodule the model calls only under an ``if`` on a setting (GMA's
    ``if self.args.position_only: ... self.pos_emb(...)``): with the setting off its
    parameters get no gradient (a test of ``self.training`` is not a setting: training takes it)."""
    for attr in made:
        tests = [
            _test_around(node, parents)
            for name, method in methods.items() if name != "__init__"
            for parents in [{child: node for node in ast.walk(method) for child in ast.iter_child_nodes(node)}]
            for node in ast.walk(method)
            if isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
            and node.value.id == "self" and isinstance(node.ctx, ast.Load)
        ]
        if not tests or None in tests or any("training" in ast.unparse(test.test) for test, _ in tests):
            continue
        # (used on both sides of one `if`, DCGAN's `data_parallel(self.main, ...)` or `self.main(input)`:
        # whatever the setting, it is used)
        if any((test, not in_body) in tests for test, in_body in tests):
            continue
        if _made_where_used(attr, methods["__init__"], tests):
            continue
        return attr, ast.unparse(tests[0][0].test)
    return None


def _made_where_used(attr: str, init: ast.FunctionDef, uses: list[tuple[ast.If, bool]]) -> bool:
    """Is the part made only under the very tests it is used under (cutmix's PyramidNet:
    ``if dataset == 'cifar10': self.conv1 = ...`` in ``__init__``, ``if self.dataset ==
    'cifar10': x = self.conv1(x)`` in forward)? Then it exists only where it trains."""
    parents = {child: node for node in ast.walk(init) for child in ast.iter_child_nodes(node)}
    made = [
        _test_around(node, parents) for node in ast.walk(init) if isinstance(node, ast.Assign)
        for target in node.targets if isinstance(target, ast.Attribute) and target.attr == attr
        and isinstance(target.value, ast.Name) and target.value.id == "self"
    ]
    if not made or None in made:
        return False
    # (a setting kept on self first, DBE's `self.cond = config["ct_cond"]`, tested as `self.cond`)
    kept = {}
    for node in init.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self":
            kept[node.targets[0].attr] = None if node.targets[0].attr in kept else ast.unparse(node.value)

    def setting(test: ast.If, in_body: bool) -> tuple[str, bool]:
        text = ast.unparse(test.test)
        text = re.sub(r"\bself\.(\w+)\b", lambda m: kept.get(m.group(1)) or m.group(1), text)
        return re.sub(r"\bself\.", "", text), in_body

    return {setting(*test) for test in made} == {setting(*test) for test in uses}


def _test_around(node: ast.AST, parents: dict) -> tuple[ast.If, bool] | None:
    """The nearest ``if`` whose branch holds ``node``, and whether that is its body; None
    when there is none."""
    parent, child = parents.get(node), node
    while parent is not None and not (isinstance(parent, ast.If) and child in parent.body + parent.orelse):
        parent, child = parents.get(parent), parent
    return (parent, child in parent.body) if parent is not None else None


def _dropped_results(forward: ast.FunctionDef) -> str | None:
    """``multi_feat = self.model_enc_multi(multi)`` with ``multi_feat`` never read."""
    reads = {node.id for node in ast.walk(forward) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    for node in ast.walk(forward):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and isinstance(value.func.value, ast.Name):
                if value.func.value.id == "self" and node.targets[0].id not in reads:
                    return ast.unparse(node)
    return None


def _trains(function: ast.FunctionDef) -> bool:
    """Runs a training step: a backward() and an optimizer's step()."""
    calls = [node.func.attr for node in ast.walk(function) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]
    return "backward" in calls and "step" in calls


def _iterated_parameters(function: ast.FunctionDef) -> tuple[tuple[int, str], ...]:
    """The parameters a training function draws batches from: ``for ... in enumerate(train_loader)``,
    ``tqdm(loader)``, ``iter(loader)``."""
    params = [arg.arg for arg in function.args.args]
    # `tl = train_loader` (robot-surgery-segmentation's utils.train): an alias iterates it too
    aliases = {
        node.targets[0].id: node.value.id for node in ast.walk(function)
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Name) and node.value.id in params
    }
    found = []
    for node in ast.walk(function):
        sources = []
        if isinstance(node, ast.For):
            sources.append(node.iter)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "iter" and node.args:
            sources.append(node.args[0])
        for source in sources:
            while isinstance(source, ast.Call) and source.args and getattr(source.func, "id", getattr(source.func, "attr", "")) in ("enumerate", "tqdm", "iter"):
                source = source.args[0]
            name = aliases.get(source.id, source.id) if isinstance(source, ast.Name) else None
            if name in params and (params.index(name), name) not in found:
                found.append((params.index(name), name))
    return tuple(found)


def _freezes_after_init(cls: ast.ClassDef) -> bool:
    """A method other than __init__ sets `requires_grad` (TSM's train() freezing BatchNorm)."""
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef) or method.name == "__init__":
            continue
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and node.attr in ("requires_grad", "requires_grad_") and (
                isinstance(node.ctx, ast.Store) or node.attr == "requires_grad_"
            ):
                return True
    return False


def _evaluates(function: ast.FunctionDef) -> bool:
    """Runs a model (or sets it to evaluation) and never trains or synchronises: a pass
    every rank can make alike."""
    text = ast.unparse(function)
    return EVERY_RANK_WORDS.search(text) is not None and TRAINING_OR_COLLECTIVE.search(text) is None


def _only_writes(function: ast.FunctionDef) -> bool:
    """Writes files, and runs no model step or collective."""
    text = ast.unparse(function)
    return _writes(function) and not EVERY_RANK_WORDS.search(text)


def _keeps_files(cls: ast.ClassDef) -> bool:
    """A logger-like class: it opens files for writing (or a writer) in its constructor or
    its methods (3DUNet-Pytorch's Train_Logger writes its CSV when it is updated), and none of
    its methods trains or synchronises."""
    text = ast.unparse(cls)
    methods = [item for item in cls.body if isinstance(item, ast.FunctionDef)]
    if any(method.name in ("__getitem__", "__iter__", "forward") for method in methods):
        return False  # a dataset or a model that also writes files: every rank needs it
    return any(_writes(method) for method in methods) and not EVERY_RANK_WORDS.search(text)


def _calls_one_of(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(call, ast.Call) and ast.unparse(call.func) in names for call in ast.walk(node))


def _returns_an_object(function: ast.FunctionDef) -> bool:
    """Does it return only a writer object it makes (``return Logger(path)``, or a name bound
    to one)? Not a tuple (HRNet's create_logger returns a logging logger and two paths: plain
    values, which rank 0 sends to the others, DDP617)."""
    made = {
        target.id for node in ast.walk(function) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and _a_class_name(node.value.func) for target in node.targets if isinstance(target, ast.Name)
    }
    returns = [node.value for node in ast.walk(function) if isinstance(node, ast.Return) and node.value is not None]
    return bool(returns) and not any(isinstance(value, ast.Tuple) for value in returns) and any(
        isinstance(v, ast.Call) and _a_class_name(v.func) or isinstance(v, ast.Name) and v.id in made for v in returns
    )


WRITER_CLASS_NAME = re.compile(r"(Logger|Writer|Summary|Board|Visdom|Recorder|Visuali[sz]er|Tracker|Experiment|Stream)$")


def _a_class_name(func: ast.AST) -> bool:
    """A class that keeps a file or a connection open (a logger, a writer): not plain data
    such as ``argparse.Namespace`` that travels between ranks."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name[:1].isupper() and bool(WRITER_CLASS_NAME.search(name))  # not logging.getLogger


def _writes(node: ast.AST) -> bool:
    imports = getattr(node, "ddp_imports", {})
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id if isinstance(call.func, ast.Name) else ""
        if name in WRITING_CALLS or _full_name(call.func, imports) in FILE_WRITERS:
            return True  # (STYLER's vocoder_infer writes wavs with scipy.io.wavfile.write)
        owner = call.func.value.id if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) else None
        if owner in WRITING_MODULE_CALLS and name in WRITING_MODULE_CALLS[owner]:
            return True
        if name in ("open", "File") and _write_mode(call):
            return True  # (and h5py.File(path, "w"): PReNet's data preparation)
        root = call.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in TRACKER_ROOTS and root is not call.func:
            return True  # an experiment tracker's API (`mlflow.log_metric`, `mlflow.pytorch.log_model`)
        if name == "basicConfig" and any(k.arg == "filename" for k in call.keywords):
            return True  # logging to a file
    return False


def _updates_buffer(cls: ast.ClassDef, source: str) -> bool:
    """The class registers a buffer that its module updates in place (``memory.index_copy_(0,
    y, w)`` in a custom backward, ``self.lut[y] = ...``): a memory bank each rank would keep apart.
    A part of a model or a loss (a module, an autograd function: a `forward` or a `backward`),
    its torch tensors, written after they are made (``source``: the module's text but its
    constructors). Not a Dataset's numpy class weights filled in once (yolov3's, batch 45)."""
    if not _a_model_part(cls):
        return False
    buffers = [
        node.args[0].value for node in ast.walk(cls)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_buffer"
        and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    ]
    # (ECN's exemplar memory: `self.em = nn.Parameter(torch.zeros(n, d))`, rows written by batch
    # labels in a custom backward; a plain tensor attribute likewise)
    buffers += [
        target.attr for node in ast.walk(cls) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        and re.search(r"(^|\.)(Parameter|zeros|ones|empty|randn|rand|full)$", ast.unparse(node.value.func))
        and not re.match(r"(np|numpy)\.", ast.unparse(node.value.func))
        for target in node.targets if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    ]
    for buffer in buffers:
        word = re.escape(buffer)
        if re.search(rf"\b{word}(\.data)?\.(index_copy_|index_add_|index_fill_|scatter_|copy_|mul_|add_)\(", source) or re.search(
            rf"\.{word}\[[^\]]*\]\s*=[^=]", source
        ):
            return True
    return False


def _a_model_part(cls: ast.ClassDef) -> bool:
    """A module or autograd function by its bases (``nn.Module``, ``Function``, a name of a
    loss, net or module), or by a ``forward``/``backward`` of its own."""
    bases = [ast.unparse(base).rpartition(".")[2] for base in cls.bases]
    if any(base in ("Module", "Function") or re.search(r"Loss|Net|Module|Function|Layer|Memory|Bank", base) for base in bases):
        return True
    return any(isinstance(node, ast.FunctionDef) and node.name in ("forward", "backward") for node in cls.body)


def _without_constructors(tree: ast.Module, source: str) -> str:
    """The module's text with every ``__init__`` left out: what runs after objects are made."""
    lines = source.splitlines(keepends=True)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__init__" and node.end_lineno is not None:
            for index in range(node.lineno - 1, node.end_lineno):
                lines[index] = "\n"
    return "".join(lines)


def _reaching_the_model(tree: ast.Module) -> set[str]:
    """Functions of the module that run a model step or a collective themselves, or through
    another function of the module (InsightFace-v2's lfw_test(model) calls evaluate(model),
    which runs the model): never on rank 0 alone."""
    functions = _module_functions(tree)
    return _callers(functions, {name for name, function in functions.items() if EVERY_RANK_WORDS.search(ast.unparse(function))})


def _calling_writers(tree: ast.Module, writers: set[str]) -> set[str]:
    """Functions of the module that write through its other writers (panns' create_logging
    calls create_folder, then opens its log file); those that also reach the model are taken
    out by the caller (_reaching_the_model)."""
    return _callers(_module_functions(tree), writers) - writers


def _module_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _callers(functions: dict[str, ast.FunctionDef], start: set[str]) -> set[str]:
    """``start`` and every function of ``functions`` that calls one of them, directly or
    through the others."""
    called = {
        name: {n.func.id for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        for name, function in functions.items()
    }
    found, grown = set(start), True
    while grown:
        grown = False
        for name, names in called.items():
            if name not in found and names & found:
                found.add(name)
                grown = True
    return found


def _write_mode(call: ast.Call) -> bool:
    mode = next((k.value for k in call.keywords if k.arg == "mode"), call.args[1] if len(call.args) > 1 else None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(flag in mode.value for flag in WRITE_MODES)


def wrapped_by_a_call(path: str, source: str, neighbours: Neighbours) -> FileResult | None:
    """Single-file mode: a script that calls a project function (or makes a project object)
    that wraps a model in DataParallel (AST's traintest.train, end2end-asr's
    init_transformer_model), whatever it wraps itself: the wrap out of sight would stay."""
    for name, methods in neighbours.wrapping_calls.items():
        if name in neighbours.dp_classes:
            continue  # a DataParallel subclass that converts where the script calls it (DDP129)
        if not _calls(source, name):
            continue
        called = [method for method in methods if re.search(rf"\.{re.escape(method)}\s*\(", code_text(source))]
        if methods and not called:
            continue  # a project class whose wrapping method this script never calls
        what = f"`{name}`" + (f" (its {called[0]}())" if methods else "")
        message = (
            f"{what}, which this script calls, wraps a model in DataParallel in a module of this project: converted "
            "alone, the script would leave that wrap (no DDP where the model trains); convert the folder that "
            "holds both (`ddpify convert DIR`), which converts that module with the script"
        )
        return _folder_refusal(path, source, message)
    return None


def device_picked_elsewhere(path: str, source: str, neighbours: Neighbours) -> FileResult | None:
    """Single-file mode: a script that calls a project function which picks the CUDA device
    (squad's `util.get_available_devices()`, `torch.cuda.set_device(cuda:0)`): after set-up
    every rank would move to that GPU; converted with the folder, the function is rewritten too."""
    for name in sorted(neighbours.device_pickers):
        if _calls(source, name):
            message = (
                f"`{name}`, which this script calls, picks the CUDA device (torch.cuda.set_device) in a module of this "
                "project: converted alone, every rank would move to that one GPU after set-up; convert the folder "
                "that holds both (`ddpify convert DIR`), which makes it choose this process's GPU"
            )
            return _folder_refusal(path, source, message)
    return None


def _calls(source: str, name: str) -> bool:
    """Does ``source`` call ``name`` (``util.f(`` for ``util.f``, not ``x.util.f(``)? A dotted
    name may be reached through its package too (OpenNRE's ``opennre.framework.SentenceRE(``
    for ``framework.SentenceRE``, a submodule the package's importers reach). In its code: not
    in a string or a comment (pytorch-unet-segmentation's `test_model(...)` in a disabled
    block made a string, batch 44)."""
    package = r"(?:[A-Za-z_]\w*\.)*" if "." in name else ""
    return re.search(rf"(?<![\w.]){package}{re.escape(name)}\s*\(", code_text(source)) is not None


@functools.lru_cache(maxsize=8)
def code_text(source: str) -> str:
    """The source with every string literal emptied and every comment removed: what runs.
    The source as it is where Python's tokenizer cannot read it."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    cuts = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in (tokenize.STRING, tokenize.COMMENT) or token.type == getattr(tokenize, "FSTRING_MIDDLE", None):
                (row, col), (end_row, end_col) = token.start, token.end
                cuts.append((starts[row - 1] + col, starts[end_row - 1] + end_col, '""' if token.type == tokenize.STRING else ""))
    except (tokenize.TokenError, SyntaxError, IndexError):
        return source
    pieces, at = [], 0
    for start, end, put in cuts:
        pieces += [source[at:start], put]
        at = end
    return "".join(pieces) + source[at:]


def named_elsewhere(path: str, source: str, neighbours: Neighbours) -> FileResult | None:
    """Single-file mode: a script whose project modules test for DataParallel (an unwrap
    before saving a checkpoint, PointRCNN's train_utils): refused, naming folder mode, which
    converts those tests with the script."""
    if not neighbours.naming_modules:
        return None
    module = neighbours.naming_modules[0]
    message = (
        f"`{module}`, a module of this project that the script uses, tests for DataParallel (an `isinstance` before "
        "saving or loading the model): converted alone, the script's DDP model would take its other branch "
        "(checkpoints saved with `module.` keys); convert the folder that holds both (`ddpify convert DIR`)"
    )
    return _folder_refusal(path, source, message)


def imported_project_modules(path: str, source: str) -> list[str]:
    """The modules of the script's own project that it imports (files beside it or below
    its folder), by the names it imports them by."""
    here = Path(path).resolve().parent
    if not Path(path).is_file():
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _module_file([here], node.module or "", node.level, here) is not None:
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _module_file([here], alias.name, 0, here) is not None]
    return list(dict.fromkeys(found))


def _calls_imported_training(path: str, source: str, trainable: set[str]) -> bool:
    """The script hands an object with training methods (``trainable``: an agent whose class,
    or a base of it, has a method that steps) to a function it imports from a module of its
    project, named for training (wolpertinger_ddpg's main.py: `train(**train_args)` of
    train_test.py, the dict holding the agent whose inherited method wraps its networks).
    Both, not a name alone: an evaluation script's `make_train_test_split()` trains nothing."""
    if not trainable:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    here = Path(path).resolve().parent
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        and _module_file([here], node.module or "", node.level, here) is not None
        for alias in node.names if re.fullmatch(r"(train|fit)(_\w*)?|\w*_(train|fit)", alias.name, re.IGNORECASE)
    }
    dicts = {  # `train_args = {"agent": agent, ...}`, handed on as `**train_args`
        target.id: {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
        for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
        for target in node.targets if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported:
            handed = {n.id for value in [*node.args, *(k.value for k in node.keywords)] for n in ast.walk(value) if isinstance(n, ast.Name)}
            handed |= {name for value in handed & set(dicts) for name in dicts[value]}
            if handed & trainable:
                return True
    return False


def imports_distributed_sampling(path: str, source: str) -> bool:
    """Does a project module this script imports name a distributed sampler (a loader builder
    whose own DDP path shards: `DistributedSampler`, mmdet's `DistributedGroupSampler`)?"""
    script = Path(path)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True  # (unread: assume it may)
    if not script.is_file():
        return True
    folders = search_folders(script.parent, tree)
    for node in tree.body:
        names = [(node.module or "", node.level)] if isinstance(node, ast.ImportFrom) else (
            [(alias.name, 0) for alias in node.names] if isinstance(node, ast.Import) else []
        )
        for dotted_name, level in names:
            found = _module_file(folders, dotted_name, level, script.parent)
            if found is not None and re.search(r"Distributed\w*Sampler", found.read_text(errors="replace")):
                return True
    return False


def wrapped_elsewhere(path: str, source: str) -> FileResult | None:
    """Single-file mode: a script that trains a model a module it imports wraps in
    DataParallel (MedicalNet's generate_model, DrQA's model.parallelize()) is refused: this
    file alone cannot be converted, the folder can."""
    if Path(path).is_file() and re.search(r"\btrain", source):
        by_call = wrapped_by_a_call(path, source, read_neighbours(path, source))
        if by_call is not None:
            return by_call
    found = wrapping_neighbour(path, source)
    if found is None:
        return imported_by_name(path, source) or reached_through_a_package(path, source)
    module, folder = found
    message = (
        f"this script trains a model that the module it imports, `{module}` (or a module imported from there), "
        "wraps in DataParallel: converting "
        f"this file alone would leave that wrap; convert the folder that holds both (`ddpify convert {folder}`), "
        "which converts the script and that module together"
    )
    return _folder_refusal(path, source, message)


def imported_by_name(path: str, source: str) -> FileResult | None:
    """Single-file mode: a script that imports a module by a name computed at run time
    (`importlib.import_module("models.trainer." + name)`) in a project where a module within its
    reach wraps in DataParallel (pytorch_GAN_zoo's BaseGAN): what it trains cannot be told from
    this file, and "nothing to convert" would launch N DataParallel jobs."""
    if not Path(path).is_file() or not re.search(r"\btrain", source) or not re.search(r"import_module|__import__|\bexec\s*\(", source):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if not _imports_by_name(tree):
        return None
    module = _wrapping_module_in_reach(Path(path).resolve())
    if module is None:
        return None
    message = (
        f"this script imports a module by a name computed at run time, and `{module.name}`, a module of this project "
        "within its reach, wraps a model in DataParallel: converted alone, that wrap would stay; convert the folder "
        "that holds both (`ddpify convert DIR`)"
    )
    return _folder_refusal(path, source, message)


def reached_through_a_package(path: str, source: str, limit: int = 2000) -> FileResult | None:
    """Single-file mode: a script that trains and uses a package of its project (by an import,
    or by a dotted name in a string: AS-GCN's ``import_class('processor.recognition.REC_Processor')``,
    ipr-gan's ``getattr(models, config.name)``) where a module of that package wraps in
    DataParallel, reached through a base class or a name picked at run time out of this file's
    sight. "Nothing to convert" would launch N DataParallel jobs: refused, naming folder mode."""
    if not Path(path).is_file() or not re.search(r"\btrain", source):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    folders = search_folders(Path(path).resolve().parent, tree)
    for package in _packages_used(tree, folders):
        modules = sorted(package.rglob("*.py"))[:limit]
        module = next((m for m in modules if "DataParallel" in m.read_text(errors="replace") and _summary(m).wraps), None)
        if module is not None:
            message = (
                f"this script uses the package `{package.name}`, and `{module.relative_to(package.parent)}` in it wraps a model "
                "in DataParallel, reached out of this file's sight (a base class, a name picked at run time): converted alone, "
                f"that wrap would stay; convert the folder that holds both (`ddpify convert {package.parent}`)"
            )
            return _folder_refusal(path, source, message)
    return None


def _packages_used(tree: ast.Module, folders: list[Path]) -> list[Path]:
    """The project packages (folders with an ``__init__.py`` in the script's search folders)
    the script imports, or names by a dotted string ('processor.recognition.REC_Processor')."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", node.value):
            names.append(node.value.split(".")[0])
    found = []
    for name in dict.fromkeys(names):
        for folder in folders:
            package = folder / name
            if (package / "__init__.py").is_file() and package not in found:
                found.append(package)
    return found


def _folder_refusal(path: str, source: str, message: str) -> FileResult:
    """The file left untouched with DDP214: what blocks it is in another module of the folder."""
    error = Diagnostic(1, 1, "DDP214", message, Severity.ERROR)
    return FileResult(path, source, source, (error,), None, f"not converted: 1:1: DDP214 {message}")
