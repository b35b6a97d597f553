"""DDP6xx: side effects run once, on global rank 0.

Statements that only print, log to a tracker, save or touch files are wrapped in
``if dist.get_rank() == 0:``; runs of them share one guard. A guard never wraps a
statement that calls the model, a ``torch.distributed`` collective, ``backward()``, or a
function that does any of these: only rank 0 would reach the collective and the others
would hang. Such a statement is left alone and reported.

Side effects: ``print``, ``sys.stdout/stderr.write``, ``tqdm.write``, ``torch.save``,
``shutil`` copies/moves/removals, ``os.remove/unlink/rename/replace/mkdir/rmdir``,
``wandb.init/log/save/watch/finish`` statements, image and array writers
(``torchvision.utils.save_image``, ``numpy.save``, ``plt.savefig``, ``cv2.imwrite``),
checkpoint helpers imported from the project (``save_checkpoint``, ``save_model``), and ``with open(path, "w"/"a"/"x") as f:``
blocks. ``writer = SummaryWriter(...)`` / ``run = wandb.init(...)`` are made on rank 0 only;
the other ranks get a stand-in whose every method does nothing (DDP606), so a function that
every rank runs may still call ``writer.add_scalar(...)``.

DDP601  guarded; after a guarded ``torch.save`` (or any other file written or removed) the
other ranks wait at a barrier, where every rank reaches it, so nothing reads a half-written
checkpoint or results file::

    print(f"loss: {loss:>7f}")
    torch.save(model.state_dict(), "model.pt")
    # becomes
    if dist.get_rank() == 0:
        print(f"loss: {loss:>7f}")
        torch.save(model.state_dict(), "model.pt")
    dist.barrier()

DDP602  (warning) not guarded: the statement also calls the model, a collective, or a
function that does; split it so that only the side effect is guarded.

DDP603  (warning) not guarded: the statement shares a line with others that are not side
effects (``a = 1; save(a)``); put it on its own line. (A line of side effects only after a
colon, ``if not os.path.exists(d): os.mkdir(d)``, becomes a guarded block: DDP601.)

DDP604  tqdm progress bars are disabled on the other ranks (the loop still runs there)::

    for x, y in tqdm(loader):       ->   for x, y in tqdm(loader, disable=dist.get_rank() != 0):

DDP605  ``os.makedirs(path)`` and pathlib's ``path.mkdir()`` get ``exist_ok=True``: every rank
may create the folder, no race (``FileExistsError`` on the rank that comes second).

DDP606  a tensorboard ``SummaryWriter`` is constructed on rank 0 only; the other ranks get
``DdpNoOp()``, an emitted stand-in whose methods do nothing::

    writer = SummaryWriter("runs")  ->  writer = SummaryWriter("runs") if dist.get_rank() == 0 else DdpNoOp()

``wandb.init(...)`` starts a run on every rank, disabled on all but rank 0, so what the script
reads from wandb (``args = wandb.config``, ``wandb.run.summary[...]``: DepMamba) is there on
every rank and only rank 0 logs::

    wandb.init(project="p")   ->   wandb.init(project="p", mode=None if dist.get_rank() == 0 else "disabled")

(Single-file mode) a project function that writes files and returns values (liif's
``log, writer = utils.set_save_path(path)``, which clears and remakes the run folder) runs on
rank 0 only too; the other ranks get one stand-in per returned value.

DDP620  an object a project function fills in while it writes files (FlowFormer's
``process_cfg(cfg)`` sets ``cfg.log_dir`` and makes that folder) runs on rank 0 only; every rank
then gets rank 0's object::

    process_cfg(cfg)
    # becomes
    if dist.get_rank() == 0:
        process_cfg(cfg)
    dist.barrier()
    cfg = ddp_from_rank_zero(cfg if dist.get_rank() == 0 else None)

DDP619  a result of a method of an object made on rank 0 only, bound whole where every rank
goes (PENet's ``is_best = logger.rank_conditional_save_best(mode, avg, epoch)``): rank 0 calls it
and every rank gets its result, so the object stays on rank 0 only::

    is_best = logger.save_best(avg)
    # becomes
    is_best = ddp_from_rank_zero(logger.save_best(avg) if dist.get_rank() == 0 else None)

DDP618  ``input(...)`` is asked on rank 0 only (the other ranks have no terminal: they would wait
forever), and every rank gets its answer::

    response = input("Overwrite? (Y/N)")
    # becomes
    response = ddp_from_rank_zero(input("Overwrite? (Y/N)") if dist.get_rank() == 0 else None)

DDP617  (single-file mode) a project function that writes files and returns plain values
every rank goes on using (SimSiam's ``args = get_args()``, which makes a timestamped log
folder; squad's ``get_save_dir()``, a fresh numbered run folder): rank 0 runs it once and
every rank gets rank 0's values, so the folder is made once and every rank names the same::

    args = get_args()  ->  args = ddp_from_rank_zero(get_args() if dist.get_rank() == 0 else None)

DDP607  a dataset built with ``download=True`` (or by a project function or class that fetches
data on disk: pointMLP's ``ModelNet40(...)``, whose constructor runs wget and unzip; or a project
Dataset class whose constructor writes its data files: DiffASD's features, normalised in place) is
made by rank 0 first; never a function that also runs the model (rank 0 alone would wait in
DDP's collectives); the other
ranks build it after rank 0 is done (no two processes write the same files) (a warning where
it runs at import time: the script's own top level above its ``__main__`` block, or a project
module's top level, imported here)::

The script's own top-level functions that fetch data by themselves (visionmap's label
download: the archive written, extracted and removed, with an early return once the labels
are there), called as statements of their own, are run whole the same way, nothing guarded
inside them (a guard on the archive's write alone let rank 1 extract a half-written zip)::

    train_set = datasets.MNIST("data", train=True, download=True)
    # becomes
    if dist.get_rank() != 0:
        dist.barrier()  # rank 0 downloads first
    train_set = datasets.MNIST("data", train=True, download=True)
    if dist.get_rank() == 0:
        dist.barrier()

DDP614  ``torch.save(model, path)`` of a whole wrapped model saves the module inside,
``getattr(model, "module", model)``: a pickled DDP wrapper does not load in a process without
a process group. ``torch.onnx.export(model, ...)``, a write on rank 0, exports it too: the
export runs the model, and DDP's forward on rank 0 alone would wait for the other ranks.

DDP615  a ``torch.load`` that every rank runs waits at a barrier first: rank 0 may still be
writing the file (a best-model save under a metric condition has no barrier after it, and the
save may be in another module: Informer's EarlyStopping, hedwig's trainer)::

    model.load_state_dict(torch.load("best.pt"))
    # becomes
    dist.barrier()
    model.load_state_dict(torch.load("best.pt", map_location=ddp_map_location))

DDP609  a file handle kept for writing (``self.file = open(path, "w")``, a logger's) is
opened on rank 0 only; the other ranks write to the null device, a real file whatever is
asked of it (``fileno()``, MMT's Logger; ``flush``, ``name``), so it escapes no guard
(otherwise every rank truncates and writes the same file)::

    self.file = open(fpath, "w")  ->  self.file = open(fpath, "w") if dist.get_rank() == 0 else open(os.devnull, "w")

Elsewhere (``open(path, "w").write(...)`` in an expression) it is a warning: left alone.

DDP622  an existence check whose branches make, remove or refuse the path it tests (a run
folder: ``if os.path.exists(out): raise ... else: os.makedirs(out)``) is decided once, by rank 0
before any rank writes, and every rank takes rank 0's branch (otherwise a rank that checks after
another made the folder takes the other branch)::

    if os.path.exists(out_dir):   ->   if ddp_from_rank_zero(os.path.exists(out_dir)):

So is a check whose branch picks another name for the path (vcdb_retrieval's ``if
os.path.exists(log_dir): log_dir = f"{log_dir}_{current_time}"``): a rank that checked after
rank 0 made the folder would name another one.

So is an assert that the path is not there yet (NAIC's ``assert osp.exists(save_dir) == False``
before a Logger, run on rank 0 alone, makes the folder)::

    assert not os.path.exists(d)   ->   assert ddp_from_rank_zero(not os.path.exists(d))

DDP623  a write of what the model computes (FastGAN's ``save_image(netG(fixed_noise)[0], path)``):
the model's forward is collective, so every rank computes the value, into a name of its own, and
only the write runs on rank 0::

    save_image(netG(z), path)   ->   ddp_written = netG(z)
                                     if dist.get_rank() == 0:
                                         save_image(ddp_written, path)

DDP616  single-file mode: a function of another module of the project, read but not
rewritten, that trains or runs the model and writes files (robot-surgery-segmentation's
``utils.train`` saves the model and appends to a log; HRNet's ``validate`` writes its COCO
results JSON and reads it back) runs on every rank, and on ranks other than 0 the files it
opens for writing are private copies that only that rank reads back (``ddp_quiet``)::

    perf = validate(cfg, valid_loader, model, output_dir)
    # becomes
    perf = ddp_quiet(validate, cfg, valid_loader, model, output_dir)

Converting the folder (``ddpify convert DIR``) guards those writes where they are instead.

DDP626  (warning) single-file mode: a function of another module of the project, read but not
rewritten, runs the training loop (Conv_AutoEncoder's ``train(epoch, total, train_loader,
optimizer, model)`` of train.py): the loader is sharded here, and the losses it prints or logs
there are rank 0's share of each batch; converting the folder averages them.

DDP625  (warning) not guarded: a script's module-level write that runs at import, before the
process group is set up (in ``main()``): no rank is known there yet, and every rank runs it at once
(EXTD's ``os.system("python3 bbox_setup.py build_ext --inplace")``): run it once before launching,
or move it into the ``__main__`` block.

DDP608  a printed loss is the mean across ranks: DataParallel printed the loss of the
global batch, each DDP rank only has its share. The reduction runs on every rank, just
before the guard, and only where every rank surely reaches it (conditions on loop
counters and settings, no exception handler; in an imported module, only in a function whose
own loop trains: every rank calls it); elsewhere rank 0's own value is printed and a warning
says so::

    if i % 100 == 99:
        print(f"loss: {loss.item():.3f}")
    # becomes
    if i % 100 == 99:
        loss_mean = ddp_mean(loss.item())
        if dist.get_rank() == 0:
            print(f"loss: {loss_mean:.3f}")

An average meter the training loop updates, read by a print or log line after it, shows every
rank's batches (its sum and count added up; vcdb_retrieval's logged train loss)::

    logger.info(f"train_loss: {losses.avg}")   ->   logger.info(f"train_loss: {ddp_sum(losses).avg}")
"""

from __future__ import annotations

import functools

import re

import sys

import libcst as cst
from libcst.metadata import ScopeProvider

from ddpify.analysis import calls_in, dotted, in_data_loading, innermost_loop, names_in, same_path_on_every_rank, under_rank_guard, walk
from ddpify.analysis.entry import callers_run_after_setup, runs_after_setup
from ddpify.analysis.tree import calls_bound, statement_of
from ddpify.analysis.data_sites import training_condition
from ddpify.analysis.statistics import constructs, is_loss as _is_loss, loss_derived as _loss_derived, names_holding, over_whole_data, text_value as _text
from ddpify.analysis.guard_units import EXISTENCE_CHECKS, REMOVERS, GuardUnits, argument_escapes, bound_target, path_code, stand_in_escapes
from ddpify.names import FILE_WRITERS, TRACKER_FACTORIES, WRITE_MODES
from ddpify.diagnostics import Severity
from ddpify.transforms.base import Block, Pair, Transform, append_arg, keyword, keyword_arg

TQDM_WRITES = tuple(f"tqdm.{module}tqdm.write" for module in ("", "auto.", "notebook.", "std."))
LOGGING_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log", "setLevel", "addHandler"}
# Experiment trackers driven through their module (a run started by `wandb.init`): their
# calls as statements run on rank 0 only, as wandb.init does.
TRACKER_MODULES = {"wandb", "mlflow", "tensorboard_logger"}
WANDB_CALLS = tuple(f"wandb.{name}" for name in ("init", "log", "save", "watch", "finish"))
# tensorboard_logger (WideResNet): configure() starts an event file, log_value() writes to it
TENSORBOARD_LOGGER = tuple(f"tensorboard_logger.{name}" for name in ("configure", "log_value", "log_histogram", "log_images"))
SIDE_EFFECTS = {
    "builtins.print",
    "sys.stdout.write",
    "sys.stderr.write",
    *TQDM_WRITES,
    *(f"shutil.{name}" for name in ("copy", "copy2", "copyfile", "copytree", "move", "rmtree")),
    *(f"os.{name}" for name in ("remove", "unlink", "rename", "replace", "mkdir", "rmdir")),
    *WANDB_CALLS,
    *FILE_WRITERS,
    *TENSORBOARD_LOGGER,
}
# Output to the terminal: ddp_setup() quiets the ranks other than 0, so it needs no guard.
OUTPUT_CALLS = {"builtins.print", "sys.stdout.write", "sys.stderr.write", *TQDM_WRITES}
# Side effects that only show something (no file another rank may read next): no barrier.
SHOWN_ONLY = {"builtins.print", "sys.stdout.write", "sys.stderr.write", *TQDM_WRITES, *WANDB_CALLS, *TENSORBOARD_LOGGER}
OPEN = {"builtins.open", "io.open", "gzip.open", "bz2.open", "lzma.open", "codecs.open", "h5py.File"}
# Files whose stand-in on the other ranks is one in memory, not the null device (HDF5 writes a
# structure it seeks in): autoplace's feature cache, `with h5py.File(cache, mode='w') as h5:`
IN_MEMORY = {"h5py.File"}
# pathlib writes in one call: the statement runs on rank 0 only, like a `with open(...)` block.
# (save_pretrained: Hugging Face models and tokenizers write a folder)
PATH_WRITES = ("write_text", "write_bytes", "save_pretrained", "save_vocabulary", "to_json_file", "to_csv")
# Shell commands that write files (a copy of the code into the run folder).
SHELL_CALLS = {"os.system", "subprocess.getstatusoutput", "subprocess.getoutput", "subprocess.call", "subprocess.run", "subprocess.check_call"}
# Shell commands that only look (a GPU listing, a date, a commit id); any other command may write
# (a copy, an in-place build: EXTD's `python3 bbox_setup.py build_ext --inplace`, run by every
# rank at once into one build folder): once, on rank 0, the others waiting.
SHELL_READS = re.compile(r"\s*(nvidia-smi|ls|echo|cat|hostname|pwd|date|which|whoami|df|free|uname|nproc|sleep|git\s+(rev-parse|log|status|describe|diff))\b")
# A method that writes what it is called on to a file, given the path.
SAVE_METHOD = re.compile(r"^save(_(weights|checkpoint|model|network|networks|state|ckpt|image|images|fig))?$|^savefig$")
# Libraries that read and write images, arrays, audio and tables: their functions named to
# write (`plt.imsave`, `skimage.io.imsave`, `nib.save`, `sitk.WriteImage`, `tifffile.imwrite`)
# write a file, whichever of them the script calls.
IO_LIBRARIES = {
    "matplotlib", "skimage", "scipy", "imageio", "tifffile", "nibabel", "SimpleITK", "soundfile", "librosa", "PIL",
    "cv2", "numpy", "pandas", "h5py", "torchvision", "torchaudio", "open3d", "trimesh", "plyfile", "mmcv", "pydicom",
}
WRITER_NAME = re.compile(r"^(im|mim|vol)?(save|write)(_?\w+)?$|^savefig$|^savemat$|^savetxt$|^Write\w*$|^to_(csv|json|excel|parquet|pickle|hdf)$")
# Checkpoint helpers that projects import from their utils (torchreid, SupContrast, FlowNet).
PROJECT_SAVERS = {"save_checkpoint", "save_model", "save_ckpt", "save_network", "save_networks"}


class RankZeroTransform(Transform):
    CODE_PREFIX = "DDP6"

    def __init__(self, context) -> None:
        super().__init__(context)
        # statement, whether GuardUnits is planned yet -> _would_guard's answer
        self._would_guard_memo: dict[tuple[cst.CSTNode, bool], bool] = {}
        self._made_here: set[cst.CSTNode] = set()  # statements making a rank-0-only tracker
        self._fetches: set[cst.Call] = set()  # method results of rank-0-only objects, sent from rank 0
        self._written_in_memory: set[cst.CSTNode] = set()  # `with` blocks writing an in-memory file on the other ranks

    def check(self) -> None:
        # Decided on the original tree before anything is rewritten: the blocks that go under
        # one guard, and the rank-0-only objects whose values would leave it.
        self._paths_of_functions: dict[tuple, bool] = {}  # (function, with settled tests) -> does every caller run it on every rank?
        self._units = GuardUnits(
            self.context.module, self.context.metadata, self._would_guard, self._reaches_model, self._may_run_model_for_a_value
        )
        self.context.rank_zero_only = self._rank_zero_only
        self.context.decided_by_rank_zero = self._decided_for_every_rank
        # (a caller in a block this transform puts on rank 0 alone would leave a broadcast inside
        # the helper to rank 0: the others wait at the block's barrier)
        self._callers_run_after = callers_run_after_setup(
            self.facts, self.context.parent,
            lambda statement: not self._under_rank_guard(statement) and not self._rank_zero_only(statement),
        )
        self._plan_quiet_calls()
        self._plan_fetches()
        self._warn_downloading_imports()

    def _warn_downloading_imports(self) -> None:
        """An import of a project module whose own top-level code downloads a dataset: it runs
        on every rank at once, at import, before any process group exists (DDP607 can move no
        barrier around it)."""
        downloading = self.context.neighbours.downloading_imports
        for statement in self.context.module.body if downloading else ():
            for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.ImportFrom) and small.module is not None or isinstance(small, cst.ImportFrom) and small.relative:
                    names = ["." * len(small.relative) + (self.context.code(small.module) if small.module is not None else "")]
                elif isinstance(small, cst.Import):
                    names = [self.context.code(alias.name) for alias in small.names]
                else:
                    continue
                for name in (n for n in names if n in downloading):
                    self.context.report(
                        small, "DDP607",
                        f"`{name}` downloads a dataset at import (`download=True` in its top-level code): every rank "
                        "runs it at once, before the set-up; download once before launching, or move it into a "
                        "function called after the set-up",
                        Severity.WARNING,
                    )

    def _plan_quiet_calls(self) -> None:
        """Project functions out of sight that train or evaluate on every rank and write files
        there: every rank runs them, and on ranks other than 0 what they write goes to private
        copies that only that rank reads back (ddp_quiet)."""
        neighbours = self.context.neighbours
        self._quiet_calls: set[cst.Call] = set()
        told = set()
        for call in calls_in(self.context.module) if neighbours.trainers else ():
            name = dotted(call.func)
            if name in neighbours.trainers and name not in neighbours.writing_trainers and name not in told:
                told.add(name)  # (Conv_AutoEncoder's `train(epoch, total, train_loader, optimizer, model)` of train.py)
                self.context.report(
                    call, "DDP626",
                    f"`{name}()` trains in another module of this project (read, not rewritten): the losses it prints or "
                    "logs are rank 0's share of each batch; convert the folder (`ddpify convert DIR`) to show them "
                    "averaged over the ranks",
                    Severity.WARNING,
                )
        for call in calls_in(self.context.module) if neighbours.writing_trainers or neighbours.writing_evaluators else ():
            name = dotted(call.func)
            if name not in neighbours.writing_trainers | neighbours.writing_evaluators:
                continue
            if self._import_time(call) or self._under_rank_guard(call) or self._inside_guarded(call):
                continue
            self._quiet_calls.add(call)
            does = "trains" if name in neighbours.writing_trainers else "runs the model"
            self.context.report(
                call,
                "DDP616",
                f"`{name}()` {does} in another module of this project (read, not rewritten) and writes files there "
                "(checkpoints, logs, results it reads back): every rank runs it, and on ranks other than 0 its files "
                "are private copies only that rank reads (ddp_quiet); converting the folder guards those writes instead",
            )

    # -- what is a side effect ------------------------------------------------------------

    def _side_effect(self, statement: cst.CSTNode) -> cst.Call | None:
        if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)):
            return None
        call = statement.value
        if self._shows_output(call):
            return None  # ddp_setup() quiets the other ranks' output: no guard needed
        if self._wandb_started(call):
            return None  # (every rank starts a run, disabled on the others: leave_Call)
        if self.context.qualified(call.func) & SIDE_EFFECTS:
            return call
        if any(name.split(".")[0] in IO_LIBRARIES and WRITER_NAME.match(name.rpartition(".")[2]) for name in self.context.qualified(call.func)):
            return call  # (AnimeStyleTransfer's `plt.imsave(path, image)`)
        if any(name.split(".")[0] in TRACKER_MODULES for name in self.context.qualified(call.func)):
            # the tracker module's own API as a statement (`wandb.config.update(args)` after a
            # rank-0-only wandb.init(): raises on the other ranks)
            return call
        if self._imported_saver(call.func) and not self._from_project(call.func):
            return call
        if dotted(call.func) in self.context.neighbours.writers:
            return call  # a function of the script's project that only writes files (save_args, create_exp_dir)
        if any(self._opens_for_writing(arg.value) for arg in call.args):
            # a file opened for writing in the call itself (`pickle.dump(preds, open(path, "wb"))`,
            # `yaml.dump(config, open(path, "w"))`): written whole by this statement
            return call
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in PATH_WRITES:
            return call
        if self.context.qualified(call.func) & SHELL_CALLS and call.args and self._shell_writes(call.args[0].value):
            return call  # `os.system("cp -r ...")`, Chexpert's subprocess.getstatusoutput('cp -R ...')
        if isinstance(call.func, cst.Attribute) and SAVE_METHOD.match(call.func.attr.value) and call.args \
                and call.func.attr.value not in self._methods_here and not self._from_project(call.func):
            # `image.save(path)` (PIL), Darknet's `cur_model.save_weights(path)`, IIC's
            # `fig.savefig(path)` of `fig, ax = plt.subplots()`: a file written by a method (the
            # model's own methods are reached through DdpModel); not a function of a project module
            # converted with this one (sftrackpp's `utils.save_model(net.module, path)`: guarded there)
            return call
        return None

    def _shell_writes(self, command: cst.BaseExpression) -> bool:
        """A command that may write: any but those that only look; an argument list's first
        word (``["python", "setup.py", ...]``) read as the command."""
        if isinstance(command, (cst.List, cst.Tuple)):
            words = [self._literal_start(element.value) for element in command.elements]
            start = " ".join(words[:2])
        else:
            start = self._literal_start(command)
        return bool(start.strip()) and not SHELL_READS.match(start)

    def _literal_start(self, value: cst.BaseExpression) -> str:
        """The literal text a command starts with (a string, an f-string, a `+` or `%` of one)."""
        while isinstance(value, cst.BinaryOperation):
            value = value.left
        if isinstance(value, cst.SimpleString):
            return str(value.evaluated_value or "")
        if isinstance(value, cst.FormattedString):
            return "".join(part.value for part in value.parts if isinstance(part, cst.FormattedStringText))
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "format":
            return self._literal_start(value.func.value)
        return ""

    @property
    def _methods_here(self) -> set[str]:
        """Methods of this file's classes: their own writes are guarded inside them."""
        if not hasattr(self, "_method_names"):
            self._method_names = {
                item.name.value for node in walk(self.context.module) if isinstance(node, cst.ClassDef)
                for item in node.body.body if isinstance(item, cst.FunctionDef)
            }
        return self._method_names

    def _shows_output(self, call: cst.Call) -> bool:
        """A print to the terminal, ``sys.stdout.write``, ``tqdm.write``: shown by rank 0 only
        because ddp_setup() quiets the other ranks (a print into a file is a write)."""
        names = self.context.qualified(call.func)
        if not names & OUTPUT_CALLS:
            return False
        target = keyword_arg(call, "file")
        return target is None or self.context.qualified(target.value) & {"sys.stdout", "sys.stderr"} != set()

    def _from_project(self, func: cst.BaseExpression) -> bool:
        """Project mode: the function's own module is converted too, and guards its writes."""
        root = (dotted(func) or "").split(".")[0]
        return root in self.facts.project_names

    def _imported_saver(self, func: cst.BaseExpression) -> bool:
        """``save_checkpoint(...)`` / ``util.save_model(...)`` from the project's utils: every
        rank would write the same files at once. (A saver defined in this file has its own
        ``torch.save`` guarded inside.)"""
        name = dotted(func) or ""
        if name.split(".")[-1] not in PROJECT_SAVERS:
            return False
        if isinstance(func, cst.Name):
            scope = self.context.metadata.get_metadata(ScopeProvider, func, None)
            assignments = list(scope[func.value]) if scope is not None else []
            return not any(isinstance(getattr(a, "node", None), cst.FunctionDef) for a in assignments)
        # `saver.save_checkpoint(...)` with a Saver class of this file: guarded (with its
        # barrier) inside; a guard here too would leave that barrier to rank 0 alone (a hang)
        return name.split(".")[-1] not in self._defined_here

    @property
    def _defined_here(self) -> set[str]:
        if not hasattr(self, "_defined_names"):
            self._defined_names = {
                node.name.value for node in walk(self.context.module) if isinstance(node, cst.FunctionDef)
            }
        return self._defined_names

    def _writes_file(self, statement: cst.CSTNode) -> bool:
        """``with open(path, "w") as f:`` (every item opens a file for writing)."""
        if not isinstance(statement, cst.With):
            return False
        return all(self._opens_for_writing(item.item) for item in statement.items)

    def _opens_for_writing(self, node: cst.BaseExpression) -> bool:
        """``open(path, "w")`` (and gzip's, bz2's, ...), or pathlib's ``path.open("w")``: the
        mode is the first argument of a method ``open`` on a value (3D-ResNets' Logger)."""
        if not isinstance(node, cst.Call):
            return False
        if not (self.context.qualified(node.func) & OPEN or self._method_open(node.func)):
            return False
        mode = self._open_mode(node)
        # A mode string, not a path that happens to hold a "w" (`Image.open("weights.png")`); a
        # mode chosen at run time writes if any of its choices does (DCSR's `open_type = 'a' if
        # os.path.exists(path) else 'w'`)
        values = self._mode_choices(mode.value) if mode is not None else []
        return any(0 < len(value) <= 4 and set(value) <= set("rwxabt+") and any(flag in value for flag in WRITE_MODES) for value in values)

    def _mode_choices(self, node: cst.BaseExpression, depth: int = 0) -> list[str]:
        """The strings a mode expression may be: a literal, either side of `a if c else b`, or
        what a name is bound to in its scope."""
        if isinstance(node, cst.IfExp):
            return self._mode_choices(node.body, depth) + self._mode_choices(node.orelse, depth)
        if isinstance(node, cst.Name) and depth < 2:
            scopes = self.facts.analyzer.scopes
            bound = [getattr(a, "node", None) for a in scopes.assignments_of(node)]
            values = [scopes.assigned_value(b)[0] for b in bound if isinstance(b, cst.Name)]
            return [found for value in values if value is not None for found in self._mode_choices(value, depth + 1)]
        value = getattr(node, "evaluated_value", None)
        return [value] if isinstance(value, str) else []

    def _open_mode(self, call: cst.Call) -> cst.Arg | None:
        """The mode argument of ``open(path, mode)`` (gzip's, ...) or of pathlib's ``path.open(mode)``."""
        positional = [arg for arg in call.args if arg.keyword is None]
        index = 1 if self.context.qualified(call.func) & OPEN else 0
        return keyword_arg(call, "mode") or (positional[index] if len(positional) > index else None)

    def _method_open(self, func: cst.BaseExpression) -> bool:
        """``<value>.open``: a method, not a module's function (``gzip.open`` is in OPEN)."""
        if not (isinstance(func, cst.Attribute) and func.attr.value == "open"):
            return False
        return not any(name.rpartition(".")[0] in sys.stdlib_module_names for name in self.context.qualified(func))

    def _would_guard(self, original: cst.BaseStatement) -> bool:
        """_guardable without its reports: a write on its own line, nothing unsafe in it.
        Remembered: each statement asks of every statement around it (an `elif` chain of 20
        branches took exponential time, Bag-of-Tricks-for-AT)."""
        key = (original, hasattr(self, "_units"))  # (GuardUnits asks while it is planned)
        if key not in self._would_guard_memo:
            self._would_guard_memo[key] = self._would_guard_now(original)
        return self._would_guard_memo[key]

    def _would_guard_now(self, original: cst.BaseStatement) -> bool:
        if self._under_rank_guard(original) or self._inside_guarded(original) or self._in_a_worker(original):
            return False
        if self._before_setup(original):
            return False
        if self._writes_file(original):
            return not any(self._reaches_model(call) for call in calls_in(original))
        if isinstance(original, cst.For):
            return self._a_loop_of_writes(original)
        if not isinstance(original, cst.SimpleStatementLine) or len(original.body) != 1:
            return False
        if self._side_effect(original.body[0]) is None:
            return False
        return not any(self._reaches_model(call) for call in calls_in(original))

    def _a_loop_of_writes(self, loop: cst.For) -> bool:
        """A ``for`` loop that only writes files (DiffASD's features, one ``np.save`` per clip):
        guarded whole, with one barrier after it, not a guard and a barrier per iteration. Its
        body: writes, and names bound for them that nothing after the loop reads."""
        if loop.orelse is not None or loop.asynchronous is not None or not isinstance(loop.body, cst.IndentedBlock):
            return False
        if loop in self.facts.training_loops or any(self._reaches_model(call) for call in calls_in(loop)):
            return False
        statements = loop.body.body
        if not all(isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 for statement in statements):
            return False
        writes = [statement for statement in statements if self._side_effect(statement.body[0]) is not None]
        bound = {name for statement in statements if statement not in writes for name in self._names_bound(statement)}
        if not writes or any(not isinstance(statement.body[0], cst.Assign) or not self._names_bound(statement) for statement in statements if statement not in writes):
            return False
        bound |= set(self._names_bound_by_target(loop.target))
        return not self._read_after(loop, bound)

    def _names_bound(self, statement: cst.SimpleStatementLine) -> list[str]:
        small = statement.body[0]
        if not isinstance(small, cst.Assign):
            return []
        names = [name for target in small.targets for name in self._names_bound_by_target(target.target)]
        return names if all(isinstance(target.target, (cst.Name, cst.Tuple, cst.List)) for target in small.targets) else []

    @staticmethod
    def _names_bound_by_target(target: cst.BaseExpression) -> list[str]:
        if isinstance(target, cst.Name):
            return [target.value]
        if isinstance(target, (cst.Tuple, cst.List)):
            return [name for element in target.elements for name in RankZeroTransform._names_bound_by_target(element.value)]
        return ["<not a name>"]

    def _read_after(self, loop: cst.For, names: set[str]) -> bool:
        """Is one of ``names`` read after the loop in its function, or elsewhere in a loop around
        it (a next pass reads what the last one bound)? (Read before it, from a binding of its own:
        DiffASD's `mel` of the loop above.)"""
        if "<not a name>" in names:
            return True
        scope = self._function_of(loop) or self.context.module
        nodes = walk(scope)
        inside = {id(node) for node in walk(loop)}
        start = next(index for index, node in enumerate(nodes) if node is loop)
        later = nodes[start + len(inside):]
        around = loop
        node = self.context.parent(loop)
        while node is not None and node is not scope:
            if isinstance(node, (cst.For, cst.While)):
                around = node
            node = self.context.parent(node)
        again = [node for node in walk(around) if id(node) not in inside] if around is not loop else []
        # (a name the loop around binds again for itself is its own there: DiffASD's `mel = self.makemel(...)`)
        rebound = {name for node in again if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 for name in self._names_bound(node)}
        rebound |= {name for node in again if isinstance(node, cst.For) for name in self._names_bound_by_target(node.target)}
        return any(isinstance(node, cst.Name) and node.value in names for node in later) or any(
            isinstance(node, cst.Name) and node.value in names - rebound for node in again
        )

    def _inside_guarded(self, original: cst.CSTNode) -> bool:
        """Inside a statement that is guarded as a whole (``with open(path, "wb") as f:`` around
        ``torch.save(state, f)`` or a project writer)."""
        node = self.context.parent(original)
        while node is not None and not isinstance(node, (cst.Module, cst.FunctionDef)):
            units = getattr(self, "_units", None)  # (GuardUnits itself asks while it is planned)
            if isinstance(node, cst.BaseStatement) and (units is not None and units.guarded(node) or self._would_guard(node)):
                return True
            node = self.context.parent(node)
        return False

    def _rank_zero_only(self, statement: cst.CSTNode) -> bool:
        """Does rank 0 run this statement alone once converted: it, or a statement around it,
        is guarded (a value computed only for a write joins the write's guard)."""
        guarded = self._units.guarded(statement) or self._would_guard(statement)
        return guarded or self._inside_guarded(statement) or self._under_rank_guard(statement)

    def _in_a_worker(self, original: cst.CSTNode) -> bool:
        """In a Dataset's or Sampler's method (a DataLoader worker: no process group, and each
        rank loads its own samples, so what it writes per sample is its own)."""
        return in_data_loading(original, self.context.parent)

    def _guardable(self, original: cst.BaseStatement | None) -> bool:
        if original is None or self._under_rank_guard(original) or self._inside_unit(original) or self._in_a_worker(original):
            return False
        if self._inside_guarded(original):
            return False  # (a guard, and its barrier, inside a block rank 0 runs alone: AoANet's hang)
        if self._before_setup(original):
            self._report_before_setup(original)
            return False
        if self._writes_file(original):
            if all(self._null_device_mode(item.item) is not None for item in original.items):
                return not any(self._reaches_model(call) for call in calls_in(original))  # (else the null device: _with_file_on_rank_zero)
            return self._safe_to_guard(original)
        if isinstance(original, cst.For):
            return self._would_guard(original)
        if not isinstance(original, cst.SimpleStatementLine):
            return False
        calls = [self._side_effect(small) for small in original.body]
        if not any(calls):
            return False
        if len(original.body) > 1:
            self._report_inline(original, calls)
            return False
        return self._safe_to_guard(original)

    def _before_setup(self, original: cst.BaseStatement) -> bool:
        """A script's module-level statement that runs before the process group is set up (the
        set-up opens ``main()``, called from the ``__main__`` block): no rank is known yet."""
        return (
            not self.context.is_library and self.facts.setup_anchor is not None
            and self.context.at_module_level(original)
            and not runs_after_setup(original, self.facts, self.context.parent)
        )

    def _report_before_setup(self, original: cst.BaseStatement) -> None:
        if not isinstance(original, cst.SimpleStatementLine) or not any(self._side_effect(small) for small in original.body):
            return
        self.context.report(
            original,
            "DDP625",
            "runs at import, before the process group is set up, so on every rank at once (EXTD's in-place "
            "extension build): run it once before launching, or move it into the `__main__` block",
            Severity.WARNING,
        )

    def _inside_unit(self, original: cst.CSTNode) -> bool:
        """Below a statement that rank 0 does as a whole (a check and the writes under it)."""
        node = self.context.parent(original)
        while node is not None and not isinstance(node, cst.Module):
            if node in self._units.folder_units:
                return True
            node = self.context.parent(node)
        return False

    def _safe_to_guard(self, original: cst.BaseStatement) -> bool:
        unsafe = [call for call in calls_in(original) if self._reaches_model(call)]
        if unsafe:
            self.context.report(
                original,
                "DDP602",
                f"not limited to rank 0: it also calls `{self.context.code(unsafe[0].func)}`, which may run "
                "the model or a collective that every rank must reach",
                Severity.WARNING,
            )
        return not unsafe

    def _report_inline(self, node: cst.CSTNode, calls: list) -> None:
        name = self.context.code(next(call for call in calls if call).func)
        self.context.report(
            node, "DDP603", f"{name}() shares its line with other statements: put it on its own line", Severity.WARNING
        )

    def _reaches_model(self, call: cst.Call) -> bool:
        function = self.facts.contexts.get(call)
        params = set()
        if function is not None and function.function is not None:
            params = {p.name.value for p in function.function.params.params}
        return self.facts.analyzer.call_is_unsafe(call, params) or self._through_a_holder(call)

    def _may_run_model_for_a_value(self, call: cst.Call) -> bool:
        """A value made for a rank-0 write joins the guard only if computing it cannot run the
        model: a call handed the model may (a project helper's loss landscape; DDP's forward is
        collective, every rank must join), so that value stays on every rank, only its write
        is rank 0's."""
        return self._reaches_model(call) or any(dotted(arg.value) in self.facts.model_names for arg in call.args)

    @property
    def _rank_zero(self) -> str:
        return f"{self.context.rank} == 0"

    @property
    def _other_ranks(self) -> str:
        return f"{self.context.rank} != 0"

    def _under_rank_guard(self, node: cst.CSTNode) -> bool:
        return under_rank_guard(node, self.context.parent, self.context.code) or self._called_by_a_chosen_rank(node)

    def _called_by_a_chosen_rank(self, node: cst.CSTNode) -> bool:
        """Inside a function some call of which, in this file, a rank test selects already
        (VRP-DACT's own DDP path: `elif opts.distributed and rank == 1: agent.save(epoch)`): its
        writes are that rank's; a rank-0 guard inside would skip them all. Or inside one of the
        script's own data fetchers that rank 0 runs first, whole (_own_fetchers)."""
        chosen = self._chosen_rank_callees
        function = self._function_of(node)
        while isinstance(function, cst.FunctionDef):
            if function.name.value in chosen or function in self._own_fetchers.values():
                return True
            function = self._function_of(function)
        return False

    @functools.cached_property
    def _own_fetchers(self) -> dict[str, cst.FunctionDef]:
        """The script's own top-level functions that fetch data on disk (a download, then the
        archive extracted and removed: visionmap's labels), each called only as a statement of
        its own that every rank reaches after the set-up: rank 0 runs the whole function first,
        the others after it (they find its files); guards and barriers inside its body would split
        what one process must do in order (a zip extracted on rank 1 while rank 0 writes it)."""
        named = self.context.neighbours.own_fetchers
        found = {
            node.name.value: node for node in self.context.module.body
            if isinstance(node, cst.FunctionDef) and node.name.value in named
        }
        calls: dict[str, list[cst.Call]] = {}
        for call in calls_in(self.context.module):
            if isinstance(call.func, cst.Name) and call.func.value in found:
                calls.setdefault(call.func.value, []).append(call)
        return {name: node for name, node in found.items() if calls.get(name) and all(map(self._fetched_first, calls[name]))}

    def _fetched_first(self, call: cst.Call) -> bool:
        """A call of an own fetcher that DDP607 makes rank 0's first: a statement of its own
        (`fetch(root)`, `labels = fetch(root)`), after the set-up, on every rank, not in a worker."""
        statement = statement_of(call, self.context.parent)
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return False
        small = statement.body[0]
        value = small.value if isinstance(small, (cst.Expr, cst.Assign, cst.Return)) else None
        if value is not call or under_rank_guard(statement, self.context.parent, self.context.code):
            return False
        if in_data_loading(statement, self.context.parent) or self._import_time(statement) or self._may_run_model_for_a_value(call):
            return False
        return isinstance(self.context.parent(statement), (cst.Module, cst.IndentedBlock)) and self._same_path_on_every_rank(statement)

    @functools.cached_property
    def _chosen_rank_callees(self) -> frozenset[str]:
        """Names of the functions and methods this file calls under a test that selects a rank
        other than 0 (`rank == 1`): a guard for rank 0 inside would skip those calls' writes.
        (Under `if rank == 0:` the function's own guard is only redundant: it stays.)"""
        return frozenset(
            (dotted(call.func) or "").rpartition(".")[2] for call in calls_in(self.context.module)
            if self._under_another_rank_s_test(call)
        )

    def _under_another_rank_s_test(self, node: cst.CSTNode) -> bool:
        while node is not None and not isinstance(node, cst.Module):
            if isinstance(node, cst.If) and _ANOTHER_RANK.search(self.context.code(node.test)):
                return True
            node = self.context.parent(node)
        return False

    # -- expressions: progress bars, makedirs, SummaryWriter --------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self._import_time(original_node):
            return updated_node
        if original_node in self._quiet_calls:
            self.context.use_helper("ddp_quiet")
            return updated_node.with_changes(func=cst.Name("ddp_quiet"), args=[cst.Arg(updated_node.func), *updated_node.args])
        names = self.context.qualified(original_node.func)
        if self._wandb_started(original_node) and not self._rank_zero_only_call(original_node):
            return self._wandb_disabled_elsewhere(original_node, updated_node)
        if "torch.save" in names:
            return self._save_unwrapped(original_node, updated_node)
        if "torch.onnx.export" in names:
            return self._export_unwrapped(original_node, updated_node)
        if self._hands_the_model(original_node, names) and self._rank_zero_alone(original_node) and not self.context.own_ddp_path:
            return self._handed_unwrapped(original_node, updated_node)
        if self._opens_for_writing(original_node) and not self._rank_zero_alone(original_node) and not self._in_a_worker(original_node):
            if isinstance(self.context.parent(original_node), cst.WithItem) and self._null_device_mode(original_node) is not None:
                return self._with_file_on_rank_zero(original_node, updated_node)
            if not isinstance(self.context.parent(original_node), cst.WithItem) and not self._kept_handle(original_node):
                self.context.report(
                    original_node,
                    "DDP609",
                    "file opened for writing on every rank: write it in a `with open(...)` block "
                    "(which ddpify limits to rank 0) or under `if dist.get_rank() == 0:`",
                    Severity.WARNING,
                )
        if "os.makedirs" in names and keyword_arg(original_node, "exist_ok") is None and not self._in_folder_unit(original_node):
            self.context.report(original_node, "DDP605", "os.makedirs(..., exist_ok=True): every rank may create it")
            return append_arg(updated_node, keyword("exist_ok", cst.Name("True")))
        if original_node in self._fetches:
            self.context.add_import("torch.distributed", None, "dist")
            self.context.use_helper("ddp_from_rank_zero")
            self.context.report(
                original_node, "DDP619",
                f"`{self.context.code(original_node.func)}(...)` of an object made on rank 0 only: rank 0 calls it and "
                "every rank gets its result",
            )
            asked = cst.parse_expression(f"ddp_from_rank_zero(_ if {self._rank_zero} else None)")
            return asked.with_changes(args=[cst.Arg(asked.args[0].value.with_changes(body=updated_node))])
        if "builtins.input" in names and self._asks_on_every_rank(original_node):
            # (ncsnv2's "Folder already exists. Overwrite? (Y/N)": only rank 0 has the terminal)
            self.context.add_import("torch.distributed", None, "dist")
            self.context.use_helper("ddp_from_rank_zero")
            self.context.report(original_node, "DDP618", "input() is asked on rank 0 only; every rank gets its answer")
            asked = cst.parse_expression(f"ddp_from_rank_zero(_ if {self._rank_zero} else None)")
            return asked.with_changes(args=[cst.Arg(asked.args[0].value.with_changes(body=updated_node))])
        if names & TRACKER_FACTORIES and self._tracker_value(original_node):
            return self._made_on_rank_zero(original_node, updated_node)
        if names & TRACKER_FACTORIES and self._tracker_with_item(original_node):
            return self._made_on_rank_zero(original_node, updated_node).with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        if _path_mkdir(original_node) and not names & {"os.mkdir"} and not self._under_rank_guard(original_node):
            self.context.report(original_node, "DDP605", "Path.mkdir(..., exist_ok=True): every rank may create it")
            return append_arg(updated_node, keyword("exist_ok", cst.Name("True")))
        return updated_node

    def _asks_on_every_rank(self, call: cst.Call) -> bool:
        """An input() every rank reaches, in a function (at the top level it may run before
        the set-up), where every rank goes on the same path."""
        if not isinstance(self._function_of(call), cst.FunctionDef) or self._under_rank_guard(call):
            return False
        node = self.context.parent(call)
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Module)):
            if isinstance(node, (cst.If, cst.While)) and not self._same_path_on_every_rank(node.body):
                # a folder's existence, checked before anything writes it, is the same for all
                calls = calls_in(node.test)
                if not calls or not all((dotted(c.func) or "").endswith(EXISTENCE_CHECKS) for c in calls):
                    return False
            node = self.context.parent(node)
        return True

    def _in_folder_unit(self, node: cst.CSTNode) -> bool:
        """Part of a folder set-up that rank 0 does alone (see GuardUnits): no exist_ok needed."""
        while node is not None and not isinstance(node, cst.BaseStatement):
            node = self.context.parent(node)
        return node in self._units.folder_units

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.Dict:
        if self._import_time(original_node):
            return updated_node
        """``state = {"net": net, ...}`` saved with ``torch.save(state, ...)``: the module
        inside DDP is pickled, not the wrapper."""
        if not self._saved(original_node):
            return updated_node
        elements = []
        for original, element in zip(original_node.elements, updated_node.elements):
            name = dotted(original.value) if isinstance(original, cst.DictElement) else None
            if name in self.facts.model_names:
                unwrapped = self._unwrapped(name)
                self.context.report(original.value, "DDP614", f"whole model pickled in a checkpoint: saves {unwrapped}, the module inside DDP")
                element = element.with_changes(value=cst.parse_expression(unwrapped))
            elements.append(element)
        return updated_node.with_changes(elements=elements)

    def _saved(self, node: cst.Dict) -> bool:
        """Is this dict what a torch.save call saves (directly, or through the name it is assigned to)?"""
        parent = self.context.parent(node)
        if isinstance(parent, cst.Arg):
            call = self.context.parent(parent)
            return isinstance(call, cst.Call) and "torch.save" in self.context.qualified(call.func) and call.args[0] is parent
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return dotted(parent.targets[0].target) in self._saved_names
        return False

    @property
    def _saved_names(self) -> set[str]:
        if not hasattr(self, "_saved_names_cache"):
            self._saved_names_cache = {
                dotted(node.args[0].value)
                for node in self.facts.contexts
                if isinstance(node, cst.Call) and node.args and "torch.save" in self.context.qualified(node.func)
            } - {None}
        return self._saved_names_cache

    def _unwrapped(self, name: str) -> str:
        # getattr: the name may hold the bare module here (a conditional wrap, a world of one,
        # or a helper's parameter of the same name).
        return f'getattr({name}, "module", {name})'

    def _save_unwrapped(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``torch.save(model, path)`` pickles the whole DDP wrapper, which does not load
        without a process group: save the module inside it."""
        return self._model_unwrapped(original, updated, "whole model pickled: saves {}, the module inside DDP")

    def _model_unwrapped(self, original: cst.Call, updated: cst.Call, message: str) -> cst.Call:
        """The call given the module inside DDP where its first argument is the wrapped model."""
        first = updated.args[0].value if updated.args and updated.args[0].keyword is None else None
        name = dotted(first) if first is not None else None
        if name not in self.facts.model_names:
            return updated
        unwrapped = self._unwrapped(name)
        self.context.report(original, "DDP614", message.format(unwrapped))
        return updated.with_changes(args=[updated.args[0].with_changes(value=cst.parse_expression(unwrapped)), *updated.args[1:]])

    def _hands_the_model(self, call: cst.Call, names: set[str]) -> bool:
        """A function of the script or its project given the wrapped model itself (InsightFace's
        `megaface_test(model)`, which runs it two calls down), not torch's, a builtin or a logger."""
        if any(name.split(".")[0] in ("builtins", "torch", "logging", "numpy", "copy", *TRACKER_MODULES) for name in names):
            return False
        # (by keyword too: Rotation-RetinaNet's `evaluate(model=model, ...)`, two modules down to the forward)
        return any(not arg.star and dotted(arg.value) in self.facts.model_names for arg in call.args)

    def _rank_zero_alone(self, call: cst.Call) -> bool:
        """Does rank 0 alone run this call once converted (a guard there, or one this transform adds)?"""
        if self._under_rank_guard(call):
            return True
        parent = self.context.parent(call)
        if isinstance(parent, cst.Assign) and parent.value is call and not self._import_time(parent):
            # (`megaface_acc = megaface_test(model)`: a project writer's values, made on rank 0)
            if self._project_writer_values(parent) or self._project_writer_values(parent, plain=True):
                return True
        statement = parent
        while statement is not None and not isinstance(statement, cst.BaseStatement):
            statement = self.context.parent(statement)
        return statement is not None and self._rank_zero_only(statement)

    def _handed_unwrapped(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """Rank 0 alone hands the model on: the module inside DDP goes (DDP's forward, run by one
        rank, would wait for the others: it broadcasts buffers)."""
        args = []
        for arg in updated.args:
            name = dotted(arg.value) if not arg.star else None
            if name in self.facts.model_names:
                arg = arg.with_changes(value=cst.Call(cst.Name("ddp_alone"), [cst.Arg(arg.value)]))
            args.append(arg)
        self.context.use_helper("ddp_alone")
        self.context.report(
            original, "DDP614",
            f"`{self.context.code(original.func)}(...)` runs on rank 0 alone and is handed the model: it gets the module "
            "in a DataParallel of no devices (ddp_alone: DataParallel's keys and `.module`; DDP's forward, run by one "
            "rank, would wait for the others)",
        )
        return updated.with_changes(args=args)

    def _export_unwrapped(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``torch.onnx.export(model, x, path)`` runs the model to trace it: on rank 0 alone,
        DDP's forward would wait for the other ranks (it broadcasts buffers); the module inside
        DDP is exported instead (signatrix EfficientDet exported on every rank)."""
        return self._model_unwrapped(
            original, updated,
            "exported to ONNX on rank 0: {}, the module inside DDP (tracing DDP's forward would wait for the other ranks)",
        )

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if not self._decided_once(original_node):
            return updated_node
        return self._test_from_rank_zero(original_node, updated_node)

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        if not self._existence_probe(original_node) or not self._probes_a_shared_name(original_node):
            return updated_node
        return self._test_from_rank_zero(original_node, updated_node)

    def leave_Assert(self, original_node: cst.Assert, updated_node: cst.Assert) -> cst.Assert:
        # (NAIC: `assert osp.exists(config.save_dir) == False`, then a Logger that rank 0 alone
        # runs makes the folder: rank 1, checking after it, failed 2 runs in 5)
        if not _says_absent(original_node.test) or not self._existence_probe(original_node):
            return updated_node
        return self._test_from_rank_zero(original_node, updated_node)

    def _test_from_rank_zero(self, original_node: cst.If | cst.While | cst.Assert, updated_node: cst.If | cst.While | cst.Assert) -> cst.CSTNode:
        self.context.use_helper("ddp_from_rank_zero")
        taken = "stops or goes on with it" if isinstance(original_node, cst.Assert) else "takes its branch"
        self.context.report(
            original_node.test,
            "DDP622",
            f"`{self.context.code(original_node.test)}` is decided by rank 0 before any rank writes, and every rank "
            f"{taken} (a rank that checked after another made the folder would take the other branch)",
        )
        return updated_node.with_changes(test=cst.Call(cst.Name("ddp_from_rank_zero"), [cst.Arg(updated_node.test)]))

    def _decided_for_every_rank(self, check: cst.CSTNode) -> bool:
        """Is this test decided by rank 0 for every rank (DDP622), so every rank takes its branch?"""
        if isinstance(check, cst.If):
            return self._decided_once(check)
        return isinstance(check, cst.While) and self._existence_probe(check) and self._probes_a_shared_name(check)

    def _existence_probe(self, check: cst.If | cst.While | cst.Assert) -> bool:
        """A test of whether paths exist only, on every rank's path after the set-up, not
        guarded itself. A `while` over one is a probe for a free name (``while
        os.path.exists(f"{out}_{i}"): i += 1``): a rank that probes after another made the
        folder would pick the next name."""
        tests = _outer_calls(check.test)
        if not tests or not all((dotted(c.func) or "").endswith(EXISTENCE_CHECKS) for c in tests):
            return False
        if self.context.rank_read_at_run_time or in_data_loading(check, self.context.parent):
            return False  # (an imported module's callers are out of sight: one may run it on rank 0 alone)
        if self._import_time(check) or self._under_rank_guard(check) or self._units.guarded(check):
            return False
        return runs_after_setup(check, self.facts, self.context.parent, self._callers_run_after) and self._same_path_on_every_rank(check)

    def _decided_once(self, check: cst.If) -> bool:
        """An existence check on every rank's path, not guarded itself, whose branches make,
        remove or refuse (raise, exit) the path it tests, or leave the loop it probes in (a
        run folder picked as the first free `out_0, out_1, ...`: a deraining trainer made one
        folder per rank): H's audio trainer raised on the rank that came second, after the
        first had made the run folder."""
        if not self._existence_probe(check):
            return False
        tests = _outer_calls(check.test)
        tested = {path_code(call) for call in tests} - {None}
        branches = [check.body, *([check.orelse] if check.orelse is not None else [])]
        # (`if not os.path.isdir(d): os.makedirs(d)` alone needs no decision: exist_ok does, DDP605)
        makers = ("makedirs", "mkdir") if check.orelse is not None else ()
        for branch in branches:
            for call in calls_in(branch):
                name = dotted(call.func) or ""
                if name in ("sys.exit", "exit"):
                    return True
                if name.endswith((*makers, "rmtree", "remove", "unlink")) and path_code(call) in tested:
                    return True
            if any(isinstance(node, cst.Raise) for node in walk(branch)):
                return True
            if tested & {self.context.code(t.target) for node in walk(branch) if isinstance(node, cst.Assign) for t in node.targets}:
                return True  # another name for the path (vcdb_retrieval: `log_dir = f"{log_dir}_{current_time}"`)
            if _leaves_loop(branch) and isinstance(innermost_loop(check, self.context.parent), (cst.For, cst.While)) \
                    and self._probes_a_shared_name(check):
                return True
        return False

    def _probes_a_shared_name(self, check: cst.If | cst.While) -> bool:
        """The paths it tests are named alike on every rank (a run folder's `out_0, out_1, ...`),
        the names bound inside it aside (decided by this very test): not a per-sample file
        (`f"targets/{idx}.txt"`), which each rank must look up for itself."""
        bound_here = {n.value for node in walk(check) if isinstance(node, (cst.Assign, cst.AugAssign))
                      for t in (node.targets if isinstance(node, cst.Assign) else [node]) for n in walk(t.target) if isinstance(n, cst.Name)}
        for call in _outer_calls(check.test):
            path = call.args[0].value if call.args else call.func.value if isinstance(call.func, cst.Attribute) else None
            if path is None or not self.context.settled.names_alike(path, check, bound_here):
                return False
        return True

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if self._import_time(original_node):
            return updated_node
        stream = self._replaced_stream(original_node)
        if stream is not None:
            return self._stream_on_rank_zero(original_node, updated_node, stream)
        value = original_node.value
        if isinstance(value, cst.Call) and self._kept_handle(value):
            what = self.context.code(value)
            code, message = "DDP609", f"{what} opened on rank 0 only (a stand-in file that writes nothing on the others)"
        elif isinstance(value, cst.Call) and self._tracker_made(value):
            what = self.context.code(value.func)
            code, message = "DDP606", f"{what}(...) made on rank 0 only (a stand-in that does nothing on the others)"
        elif isinstance(value, cst.Call) and self._project_writer_values(original_node):
            return self._writer_values_on_rank_zero(original_node, updated_node)
        elif isinstance(value, cst.Call) and self._project_writer_values(original_node, plain=True):
            return self._writer_values_shared(original_node, updated_node)
        else:
            return updated_node
        if self._under_rank_guard(original_node):
            return updated_node
        if code == "DDP609":
            return self._file_on_rank_zero(original_node, updated_node, message)
        held = self._held_model(value) if code == "DDP606" else None
        if held is not None:
            return self._made_quietly(original_node, updated_node, held, what, holds=True)
        target = bound_target(original_node)
        escape = self._escape_or_fetch(target) if target is not None else None
        if escape is not None:
            return self._made_quietly(original_node, updated_node, escape, what)
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(original_node, code, message)
        self.context.use_helper("DdpNoOp")
        self._made_here.add(self.context.parent(original_node))
        on_rank_zero = cst.parse_expression(f"_ if {self._rank_zero} else DdpNoOp()").with_changes(body=updated_node.value)
        return updated_node.with_changes(value=on_rank_zero)

    def _replaced_stream(self, assign: cst.Assign) -> str | None:
        """``sys.stdout = Logger(path)`` after the set-up (AlignedReID's, DeepCubeA's log that
        copies every print to a file): the stream the set-up quieted on ranks other than 0."""
        if len(assign.targets) != 1 or self._under_rank_guard(assign):
            return None
        names = self.context.qualified(assign.targets[0].target)
        stream = next((name for name in ("sys.stdout", "sys.stderr") if name in names), None)
        if stream is None or not runs_after_setup(assign, self.facts, self.context.parent):
            return None
        return self.context.code(assign.targets[0].target)

    def _stream_on_rank_zero(self, original: cst.Assign, updated: cst.Assign, stream: str) -> cst.Assign:
        """Rank 0 gets the new stream; the others keep their quiet one (a stand-in object would
        be no stream: a library reading ``sys.stdout.encoding`` fails on it)."""
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(
            original, "DDP601",
            f"{stream} replaced on rank 0 only (the other ranks keep the quiet stream the set-up gave them: "
            "their prints are not copied into its file)",
        )
        on_rank_zero = cst.parse_expression(f"_ if {self._rank_zero} else {stream}").with_changes(body=updated.value)
        return updated.with_changes(value=on_rank_zero)

    def _made_quietly(self, original: cst.Assign, updated: cst.Assign, escape: cst.CSTNode, what: str, holds: bool = False) -> cst.Assign:
        """A writer or tracker some code reads outside a guard (``escape``, HPLFlowNet's
        ``logger.out_fd``), or one that ``holds`` the wrapped model: a stand-in could not give
        it, or rank 0 alone would run the model's collectives, so every rank makes a real one, and
        on the other ranks the files it opens for writing are nameless temporary files (ddp_quiet)."""
        line = self.context.position(escape)[0]
        why = (
            f"it holds the wrapped model through `{self.context.code(escape)}`: what it runs of the model, DDP's "
            "forward and backward, every rank must join"
            if holds
            else f"line {line} takes `{self.context.code(escape)}` from it outside a rank-0 guard"
        )
        self.context.report(
            original,
            "DDP606",
            f"{what}(...) is made on every rank ({why}): on ranks other than 0 the files it opens for writing are "
            "nameless temporary files",
        )
        self.context.use_helper("ddp_quiet")
        call = updated.value
        return updated.with_changes(value=call.with_changes(func=cst.Name("ddp_quiet"), args=[cst.Arg(call.func), *call.args]))

    def _file_on_rank_zero(self, original: cst.Assign, updated: cst.Assign, message: str) -> cst.Assign:
        """The other ranks open the null device with the same mode: a file like the other."""
        call = original.value
        mode = self._open_mode(call)
        self.context.add_import("torch.distributed", None, "dist")
        self.context.add_import("os", None, None)
        self.context.report(original, "DDP609", message.replace("(a stand-in file that writes nothing on the others)", "(the null device on the others)"))
        stand_in = f"open(os.devnull, {self.context.code(mode.value)})"
        on_rank_zero = cst.parse_expression(f"_ if {self._rank_zero} else {stand_in}").with_changes(body=updated.value)
        return updated.with_changes(value=on_rank_zero)

    def _null_device_mode(self, call: cst.Call) -> cst.BaseExpression | None:
        """The mode of ``open(path, mode)`` where the null device stands in for the file: it
        only writes (no reading back: ``r``, ``+``; no exclusive create: ``x``)."""
        if not self.context.qualified(call.func) & OPEN:
            return None
        mode = self._open_mode(call)
        value = getattr(mode.value, "evaluated_value", None) if mode is not None else None
        return mode.value if isinstance(value, str) and not set(value) & set("rx+") else None

    def _with_file_on_rank_zero(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``with open(path, "w") as f:`` around code every rank runs (the model, a collective:
        RecycleD's IQA pass prints its results into the file as it evaluates): the block runs
        on every rank, rank 0 writes the file, the others the null device (every rank truncating
        one file emptied it)."""
        self.context.add_import("torch.distributed", None, "dist")
        self.context.add_import("os", None, None)
        where = "an in-memory file" if self.context.qualified(original.func) & IN_MEMORY else "the null device"
        self.context.report(
            original, "DDP609",
            f"{self.context.code(original.func)}(...) opened on rank 0 only ({where} on the others): the block "
            "also runs code every rank runs",
        )
        stand_in = f"open(os.devnull, {self.context.code(self._null_device_mode(original))})"
        if self.context.qualified(original.func) & IN_MEMORY:
            # (every rank creating one HDF5 file: a lock error on one rank, a hang on the others)
            stand_in = self.context.code(updated)[:-1].rstrip().rstrip(",") + ', driver="core", backing_store=False)'
            if not updated.args or self.context.code(updated).rstrip()[-1] != ")":
                stand_in = f"open(os.devnull, {self.context.code(self._null_device_mode(original))})"
            self._written_in_memory.add(statement_of(original, self.context.parent))
        on_rank_zero = cst.parse_expression(f"_ if {self._rank_zero} else {stand_in}").with_changes(body=updated)
        return on_rank_zero.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def _project_writer_values(self, assign: cst.Assign, plain: bool = False) -> list[cst.BaseExpression] | None:
        """``log, writer = utils.set_save_path(save_path)`` (liif): a project function that
        writes files (clears and makes the run folder, opens a log and a SummaryWriter) and
        returns what the script logs with. The names it binds, when each is plain. With
        ``plain``: what it returns is only ever read, never called (``args.lr``, a folder)."""
        name = dotted(assign.value.func)
        neighbours = self.context.neighbours
        writers = neighbours.writers | neighbours.value_writers if plain else neighbours.writers
        if name not in writers or name in neighbours.writer_classes or len(assign.targets) != 1:
            return None
        target = assign.targets[0].target
        names = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        if not names or not all(isinstance(n, cst.Name) for n in names):
            return None
        if plain:
            if any(self._ever_called(name, assign) for name in names):
                return None  # an object some code calls (a logger): it may not travel between ranks
        elif not all(self._only_called(name, assign) for name in names):
            return None  # a plain value every rank goes on using (multiview-pose's output folder)
        return names if not self._under_rank_guard(assign) else None

    def _ever_called(self, name: cst.Name, binding: cst.Assign) -> bool:
        """Is ``name`` (or a method of it) called anywhere, other than as a logging logger
        (``logger.info(...)``: a logging.Logger travels between ranks by its name; HRNet's
        create_logger returns one with its run folders)?"""
        return any(called and not self._logging_call(node) for node, called in self._uses_calling(name, binding, with_nodes=True))

    def _logging_call(self, node: cst.Name) -> bool:
        parent = self.context.parent(node)
        return isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in LOGGING_METHODS

    def _writer_values_shared(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        what = dotted(original.value.func)
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(
            original,
            "DDP617",
            f"{what}() writes files (a function of the project): rank 0 runs it once and every rank gets its values "
            "(a folder made once, the same name on every rank)",
        )
        self.context.use_helper("ddp_shared_values")
        shared = cst.parse_expression(f"ddp_shared_values(_ if {self._rank_zero} else None)")
        inner = shared.args[0].value.with_changes(body=updated.value)
        return updated.with_changes(value=shared.with_changes(args=[shared.args[0].with_changes(value=inner)]))

    def _only_called(self, name: cst.Name, binding: cst.Assign) -> bool:
        """Is every other use of ``name`` a call of it or of one of its methods (``log(...)``,
        ``writer.add_scalar(...)``)? Only such an object can be a stand-in elsewhere."""
        return all(self._uses_calling(name, binding))

    def _uses_calling(self, name: cst.Name, binding: cst.Assign, with_nodes: bool = False):
        """For each use of ``name`` outside ``binding``: is it a call of it or of one of its
        methods? (with the use, when ``with_nodes``)"""
        bound = {id(n) for n in walk(binding)}
        for node in walk(self.context.module):
            if not isinstance(node, cst.Name) or node.value != name.value or id(node) in bound:
                continue
            parent = self.context.parent(node)
            method = isinstance(parent, cst.Attribute) and parent.value is node
            called = parent if method else node
            calling = isinstance(self.context.parent(called), cst.Call) and self.context.parent(called).func is called
            yield (node, calling) if with_nodes else calling

    def _writer_values_on_rank_zero(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        names = self._project_writer_values(original)
        what = dotted(original.value.func)
        if any(self._escapes(name, original, "DDP606", f"{what}()'s value") for name in names):
            return updated
        self.context.add_import("torch.distributed", None, "dist")
        self.context.use_helper("DdpNoOp")
        self.context.report(
            original,
            "DDP606",
            f"{what}() writes files (a function of the project): it runs on rank 0 only, and the other ranks get "
            "stand-ins that do nothing for what it returns",
        )
        self._made_here.add(self.context.parent(original))
        target = original.targets[0].target
        stand_in = "(" + ", ".join("DdpNoOp()" for _ in names) + ")" if isinstance(target, (cst.Tuple, cst.List)) else "DdpNoOp()"
        on_rank_zero = cst.parse_expression(f"_ if {self._rank_zero} else {stand_in}").with_changes(body=updated.value)
        return updated.with_changes(value=on_rank_zero)

    def _escapes(self, target: cst.BaseExpression, made: cst.CSTNode, code: str, what: str) -> bool:
        """Does a value taken from the rank-0 object bound to ``target`` leave a guard? Then
        it is made on every rank, with a warning that says where."""
        escape = self._escape_or_fetch(target)
        if escape is not None:
            line = self.context.position(escape)[0]
            self.context.report(
                made,
                code,
                f"{what} is made on every rank: line {line} takes `{self.context.code(escape)}` from it outside a "
                "rank-0 guard, which a stand-in on the other ranks could not give",
                Severity.WARNING,
            )
        return escape is not None

    def _fetchable(self, call: cst.Call) -> bool:
        """A method result of a rank-0-only object that rank 0 can send to the others: every
        rank reaches the call, in a function (after the set-up), running nothing of the model."""
        return (
            isinstance(self._function_of(call), cst.FunctionDef)
            and self._same_path_on_every_rank(call)
            and not any(self._reaches_model(inner) for inner in calls_in(call))
        )

    def _plan_fetches(self) -> None:
        """Decided before the walk (a function above the object's binding may read from it):
        the objects made on rank 0 only, and the method results rank 0 sends to the others."""
        for node in walk(self.context.module):
            if not (isinstance(node, cst.Assign) and isinstance(node.value, cst.Call) and self._tracker_made(node.value)):
                continue
            if self._import_time(node) or self._under_rank_guard(node):
                continue
            target = bound_target(node)
            if target is not None:
                self._escape_or_fetch(target)

    def _escape_or_fetch(self, target: cst.BaseExpression) -> cst.CSTNode | None:
        """The first use that takes a value from the rank-0-only object bound to ``target``
        outside a guard; None when there is none, and then the method results rank 0 sends
        to the others are planned (DDP619)."""
        guarded = lambda node: node is not None and (self._units.guarded(node) or self._would_guard(node))  # noqa: E731
        fetched: list[cst.Call] = []
        fetch = lambda call: self._fetchable(call) and (fetched.append(call) or True)  # noqa: E731
        escape = stand_in_escapes(target, self.context.module, self.context.parent, guarded, fetch)
        if escape is None:
            self._fetches.update(fetched)
        return escape

    def _held_model(self, call: cst.Call) -> cst.BaseExpression | None:
        """An argument of ``call`` that is a wrapped model, or an object built with one
        (OCT-WSSS's ``CAMGeneratorAndSave(cam=self.cam)``, ``self.cam = GradCAM(model=
        self.cam_model)``): the object may run the model's forward and backward."""
        models = self.facts.model_names
        for arg in call.args:
            name = dotted(arg.value)
            built = self._built_by.get(name or "", [])
            if name in models or any(dotted(given.value) in models for made in built for given in made.args):
                return arg.value
        return None

    @functools.cached_property
    def _built_by(self) -> dict[str, list[cst.Call]]:
        """Each name (``saver``, ``self.cam``) -> the calls assigned to it."""
        return calls_bound(self.context.module)

    def _through_a_holder(self, call: cst.Call) -> bool:
        """``saver.save(x)``, ``cam(x)``: a call of an object, or of its method, that a class
        built holding the wrapped model (``_held_model``): it may run DDP's forward and
        backward. (A function's value, ``kept = averaged_copy(model)``, is no holder: a copy.)"""
        func = call.func.value if isinstance(call.func, cst.Attribute) else call.func
        name = dotted(func)
        return name is not None and name not in self.facts.model_names and any(
            (dotted(made.func) or "").rpartition(".")[2][:1].isupper() and self._held_model(made) is not None
            for made in self._built_by.get(name, [])
        )

    def _tracker_made(self, call: cst.Call) -> bool:
        """A tracker, or an object of a project class that keeps files open for writing
        (dgcnn's IOStream, pytorch-pose's Logger: single-file mode reads their modules)."""
        if self._wandb_started(call):
            return False
        return bool(self.context.qualified(call.func) & TRACKER_FACTORIES) or dotted(call.func) in self.context.neighbours.writer_classes

    def _rank_zero_only_call(self, call: cst.Call) -> bool:
        statement = self.context.parent(call)
        while statement is not None and not isinstance(statement, cst.BaseStatement):
            statement = self.context.parent(statement)
        return statement is not None and (self._inside_guarded(statement) or self._units.guarded(statement))

    def _wandb_disabled_elsewhere(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(
            original, "DDP606",
            "wandb.init() starts a run on every rank, disabled on all but rank 0 (mode=\"disabled\"): wandb.config "
            "and wandb.run are there on every rank, and only rank 0 logs",
        )
        given = next((arg for arg in updated.args if arg.keyword is not None and arg.keyword.value == "mode"), None)
        chosen = self.context.code(given.value) if given is not None else "None"
        mode = cst.parse_expression(f'{chosen} if {self._rank_zero} else "disabled"')
        if given is not None:
            return updated.with_changes(args=[arg.with_changes(value=mode) if arg is given else arg for arg in updated.args])
        return append_arg(updated, keyword("mode", mode))

    def _wandb_started(self, call: cst.Call) -> bool:
        """``wandb.init(...)`` where every rank goes: a run on every rank, disabled on all but
        rank 0, so what the script reads from wandb (``args = wandb.config``,
        ``wandb.run.summary[...]``) is there on every rank, and only rank 0 logs (DepMamba)."""
        return "wandb.init" in self.context.qualified(call.func) and not self._under_rank_guard(call)

    def _tracker_value(self, call: cst.Call) -> bool:
        """``return SummaryWriter(...)`` or ``{"writer": SummaryWriter(...)}``: a writer made
        inside a value (an assignment of the call itself is leave_Assign's)."""
        parent = self.context.parent(call)
        if isinstance(parent, cst.Assign) and parent.value is call:
            return False
        if isinstance(parent, cst.Arg) and parent.value is call and self._put_in_a_container(parent):
            # `output_writers.append(SummaryWriter(...))` (cc's validation writers): an element, as in a list
            return not self._under_rank_guard(call)
        if isinstance(parent, cst.Arg) and parent.value is call and not self._under_rank_guard(call):
            # `train(SummaryWriter(...))` in a function (at the top level it may run before the
            # set-up, which the call itself may hold): followed into the function that receives it
            if not isinstance(self._function_of(call), cst.FunctionDef):
                return False
            guarded = lambda node: node is not None and (self._units.guarded(node) or self._would_guard(node))  # noqa: E731
            return argument_escapes(call, self.context.module, self.context.parent, guarded) is None
        return isinstance(parent, (cst.Return, cst.DictElement, cst.Element)) and not self._under_rank_guard(call)

    def _put_in_a_container(self, arg: cst.Arg) -> bool:
        """``writers.append(arg)`` / ``.insert(i, arg)`` / ``.add(arg)``: the value is an element."""
        call = self.context.parent(arg)
        return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in ("append", "insert", "add")

    def _tracker_with_item(self, call: cst.Call) -> bool:
        """``with SummaryWriter(path) as writer:`` (pvcnn): made on rank 0 only, as an assigned
        one is, unless a value taken from it leaves a guard (then it stays on every rank)."""
        item = self.context.parent(call)
        if not isinstance(item, cst.WithItem) or item.item is not call or self._under_rank_guard(call):
            return False
        if item.asname is None or not isinstance(item.asname.name, (cst.Name, cst.Attribute)):
            return True
        return not self._escapes(item.asname.name, call, "DDP606", self.context.code(call.func))

    def _made_on_rank_zero(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        what = self.context.code(original.func)
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(original, "DDP606", f"{what}(...) made on rank 0 only (a stand-in that does nothing on the others)")
        self.context.use_helper("DdpNoOp")
        on_rank_zero = cst.parse_expression(f"_ if {self._rank_zero} else DdpNoOp()")
        return on_rank_zero.with_changes(body=updated)

    def _kept_handle(self, call: cst.Call) -> bool:
        """``self.file = open(path, "w")``: a file handle kept for writing (a logger's), the
        whole value of an assignment outside any rank guard."""
        parent = self.context.parent(call)
        return (
            isinstance(parent, cst.Assign)
            and parent.value is call
            and self._opens_for_writing(call)
            and not self._under_rank_guard(call)
            and not self._import_time(call)
        )

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        if self._import_time(original_node):
            return updated_node
        calls = [self._side_effect(small) for small in original_node.body]
        if not any(calls):
            return updated_node
        if all(calls) and not any(self._reaches_model(call) for call in calls) and not self._under_rank_guard(original_node):
            # `if not os.path.exists(d): os.mkdir(d)` (votenet): the suite becomes a block under a guard
            self.context.add_import("torch.distributed", None, "dist")
            for call in calls:
                self.context.report(call, "DDP601", f"{self.context.code(call.func)}() runs on rank 0 only")
            smalls = [small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for small in updated_node.body]
            guard = cst.If(test=cst.parse_expression(self._rank_zero), body=cst.IndentedBlock([cst.SimpleStatementLine(smalls)]))
            return cst.IndentedBlock([guard], footer=[], header=updated_node.trailing_whitespace)
        self._report_inline(original_node, calls)
        return updated_node

    # -- statements ---------------------------------------------------------------------------

    def _import_time(self, node: cst.CSTNode) -> bool:
        """Module-level code of an imported module runs before the entry's set-up: no guards."""
        return self.context.is_library and self.context.at_module_level(node)

    def edit_block(self, owner: cst.CSTNode, block: Block) -> Block:
        if self._import_time(owner) or self._own_fetchers and self._called_by_a_chosen_rank(owner):
            return block
        result: Block = []
        run: list[Pair] = []  # consecutive statements of one kind share one guard
        kind = None
        pairs = [*block, (None, None)]
        for at, pair in enumerate(pairs):
            current = None
            hoisted = self._hoisted_write(pair)
            if hoisted is not None:
                if run:
                    result.extend(self._guard(run) if kind == "guard" else self._download_first_on_rank_zero(run))
                    run, kind = [], None
                values, write = hoisted
                result.extend((None, value) for value in values)
                result.extend(self._guard([write]))
                continue
            if pair[1] is not None:
                guarded = pair[0] is not None and self._units.guarded(pair[0]) or self._guardable(pair[0])
                current = "guard" if guarded else "download" if self._downloads(owner, pair[0]) else None
            if run and current != kind:
                result.extend(self._guard(run) if kind == "guard" else self._download_first_on_rank_zero(run))
                run = []
            kind = current
            if current is not None:
                run.append(pair)
            elif pair[1] is not None:
                result.extend(self._wait_before_load(self._averaged_print(pair)))
                if pair[0] in self._written_in_memory and self._barrier_reached(pair[0]):
                    # the others read what rank 0 wrote (a feature cache) only once it is closed
                    result.append((None, cst.parse_statement("dist.barrier()")))
                if pair[0] in self._made_here and pairs[at + 1][0] not in self._made_here and self._barrier_reached(pair[0]):
                    # the others wait until rank 0 made it (a SummaryWriter makes its log folder)
                    result.append((None, cst.parse_statement("dist.barrier()")))
        return result

    def _hoisted_write(self, pair: Pair) -> tuple[list[cst.BaseStatement], Pair] | None:
        """``save_image(netG(fixed_noise)[0], path)`` (FastGAN's sample grid): the write runs the
        model for what it writes, which every rank must do (DDP's forward is collective). The
        value is computed on every rank first, into a name of its own, and only the write is
        rank 0's. None where the statement is not such a write."""
        original, updated = pair
        if not self._hoistable(original):
            return None
        call, new_call = original.body[0].value, updated.body[0].value
        values, args = [], []
        for index, (arg, new_arg) in enumerate(zip(call.args, new_call.args)):
            if any(self._reaches_model(inner) for inner in calls_in(arg.value)):
                name = self.context.fresh_name("ddp_written")
                values.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], new_arg.value)]))
                new_arg = new_arg.with_changes(value=cst.Name(name))
            args.append(new_arg)
        values[0] = values[0].with_changes(leading_lines=updated.leading_lines)
        write = updated.with_changes(body=[updated.body[0].with_changes(value=new_call.with_changes(args=args))], leading_lines=[])
        self.context.report(
            original, "DDP623",
            f"`{self.context.code(call.func)}(...)` writes what the model computes: the value is computed on every rank "
            "(the model's forward is collective), and only the write runs on rank 0",
        )
        return values, (original, write)

    def _hoistable(self, original: cst.BaseStatement | None) -> bool:
        """A write on its own line whose only reason to stay on every rank is a call in its
        arguments that may run the model or a collective: that call stays where it ran, on
        whichever ranks reach it (a barrier after the write only where every rank does)."""
        if not isinstance(original, cst.SimpleStatementLine) or len(original.body) != 1:
            return False
        if self._under_rank_guard(original) or self._inside_guarded(original) or self._inside_unit(original):
            return False
        if self._in_a_worker(original):
            return False  # (a Dataset's __getitem__ writing what it loads: each rank's own samples, sharded)
        call = self._side_effect(original.body[0])
        if call is None or any(self._reaches_model(inner) for inner in calls_in(call.func)):
            return False
        unsafe = [inner for arg in call.args for inner in calls_in(arg.value) if self._reaches_model(inner)]
        return bool(unsafe) and all(arg.star == "" for arg in call.args)

    def _barrier_reached(self, original: cst.CSTNode) -> bool:
        return self._same_path_on_every_rank(original) and not self.context.rank_read_at_run_time

    def _wait_before_load(self, pair: Pair) -> Block:
        """Every rank reads a checkpoint that rank 0 may still be writing (a best-model save
        under a metric condition has no barrier after it): wait for rank 0 first."""
        original, updated = pair
        readers = self.context.neighbours.checkpoint_readers  # (MMT's load_checkpoint(path) of the best model)
        loads = [
            call for call in calls_in(original)
            if "torch.load" in self.context.qualified(call.func) or dotted(call.func) in readers
        ] if isinstance(original, cst.SimpleStatementLine) else []
        if not loads or self._under_rank_guard(original) or not self._same_path_on_every_rank(original):
            return [pair]
        if in_data_loading(original, self.context.parent):
            return [pair]  # (a DataLoader worker has no process group: a barrier there hangs)
        self.context.add_import("torch.distributed", None, "dist")
        self.context.report(original, "DDP615", "every rank waits for rank 0's saves before reading the checkpoint")
        # (the save may be in another module: Informer's EarlyStopping, hedwig's trainer; a
        # library may run in a script left as it was, with no process group)
        text = f"if {self.context.world_size} > 1:\n    dist.barrier()\n" if self.context.rank_read_at_run_time else "dist.barrier()"
        barrier = cst.parse_statement(text).with_changes(leading_lines=updated.leading_lines)
        return [(None, barrier), (original, updated.with_changes(leading_lines=[]))]

    def _downloads(self, owner: cst.CSTNode, original: cst.BaseStatement | None) -> bool:
        if not isinstance(original, cst.SimpleStatementLine) or self._under_rank_guard(original):
            return False
        # (or a project function or class that fetches data on disk: pointMLP's ModelNet40, whose
        # constructor runs `wget` and `unzip` through data.py's download())
        fetching = self.context.neighbours.downloaders | self._own_fetchers.keys()
        downloading = any(
            arg.keyword is not None and arg.keyword.value == "download" and self.context.code(arg.value) == "True"
            for call in calls_in(original)
            for arg in call.args
        ) or any(dotted(call.func) in fetching for call in calls_in(original)) and not any(
            # (a function that builds such a dataset and trains or runs the model with it, DiffASD's
            # `train(config)`, `cal_metric(model, ...)`: rank 0 alone would wait in DDP's collectives)
            self._may_run_model_for_a_value(call) for call in calls_in(original) if not constructs(call)
        )
        if downloading and isinstance(owner, cst.Module) and self.facts.setup_anchor is self.facts.main_guard:
            # Module-level code above the `__main__` block runs before ddp_setup().
            self.context.report(
                original, "DDP607", "download=True at import time runs on every rank: move it into main()", Severity.WARNING
            )
            return False
        return downloading

    def _download_first_on_rank_zero(self, run: list[Pair]) -> Block:
        self.context.add_import("torch.distributed", None, "dist")
        for original, _ in run:
            self.context.report(original, "DDP607", "rank 0 fetches or prepares the data on disk first; the other ranks wait, then read its files")
        (first_original, first), rest = run[0], run[1:]
        before = cst.parse_statement(f"if {self._other_ranks}:\n    dist.barrier()  # rank 0 downloads first\n")
        # (an imported module's, in a process with no group: a script of the project left as it
        # was, ncsnv2's data module under its test script; rank 0 alone, no barrier to wait at)
        alone = f"{self.context.world_size} > 1 and " if self.context.rank_read_at_run_time else ""
        after = cst.parse_statement(f"if {alone}{self._rank_zero}:\n    dist.barrier()\n")
        before = before.with_changes(leading_lines=first.leading_lines)
        # `before` stands for the first original (set-up must precede its barrier).
        block = [(first_original, before), (None, first.with_changes(leading_lines=[])), *rest]
        leaving = block[-1][1]
        if isinstance(leaving, cst.SimpleStatementLine) and isinstance(leaving.body[0], cst.Return) and leaving.body[0].value is not None:
            # (`return datasets.CIFAR10(..., download=True)`: the value is made, rank 0's barrier
            # passed, then it is returned; a barrier after the return would never run)
            name = self.context.fresh_name("downloaded")
            made = leaving.with_changes(body=[cst.Assign([cst.AssignTarget(cst.Name(name))], leaving.body[0].value)])
            back = cst.SimpleStatementLine([cst.Return(cst.Name(name))])
            return [*block[:-1], (block[-1][0], made), (None, after), (None, back)]
        return [*block, (None, after)]

    def _guard(self, run: list[Pair]) -> Block:
        # A barrier only where every rank reaches it, else it would hang.
        # In an imported module the callers are not in sight: no barrier there.
        barrier = self._same_path_on_every_rank(run[0][0]) and not self.context.rank_read_at_run_time
        writes = [self._report_guarded(original, barrier) for original, _ in run]
        self.context.add_import("torch.distributed", None, "dist")
        statements = [updated for _, updated in run]
        # The comments above the first statement stay above everything emitted for it.
        comments = statements[0].leading_lines
        statements[0] = statements[0].with_changes(leading_lines=[])
        emitted = [cst.If(test=cst.parse_expression(self._rank_zero), body=cst.IndentedBlock(body=statements), leading_lines=comments)]
        if barrier and self._removes_what_others_read(run):
            # (bert_ner's `temp`: rank 0 writes it, every rank reads it, rank 0 removes it; the
            # others must have read it first)
            emitted = [cst.parse_statement("dist.barrier()").with_changes(leading_lines=comments), emitted[0].with_changes(leading_lines=[])]
        if any(writes) and barrier:
            # Nothing may read a file before rank 0 has finished writing it.
            emitted.append(cst.parse_statement("dist.barrier()"))
        if barrier:
            # an object a writer of the project filled in on rank 0 (FlowFormer's process_cfg
            # sets cfg.log_dir): every rank gets rank 0's
            for name in self._filled_in(run):
                self.context.use_helper("ddp_from_rank_zero")
                self.context.report(run[0][0], "DDP620", f"`{name}`, filled in by a writer that runs on rank 0 only, is sent to every rank")
                emitted.append(cst.parse_statement(f"{name} = ddp_from_rank_zero({name} if {self._rank_zero} else None)"))
        # The first emitted statement stands for the run's first original: set-up placed
        # before that original must come before the guard (it calls dist.get_rank()).
        return [(run[0][0] if index == 0 else None, statement) for index, statement in enumerate(emitted)]

    def _removes_what_others_read(self, run: list[Pair]) -> bool:
        """Does the run remove a path (os.remove, shutil.rmtree) that the function around it
        also reads or writes outside the run, where other ranks may still be reading it?"""
        originals = [original for original, _ in run if original is not None]
        inside = {id(node) for original in originals for node in walk(original)}
        removed = {path_code(call) for original in originals for call in calls_in(original) if (dotted(call.func) or "").endswith(REMOVERS)}
        removed.discard(None)
        if not removed:
            return False
        scope = self._function_of(originals[0])
        return any(id(call) not in inside and path_code(call) in removed for call in calls_in(scope) if scope is not None)

    def _filled_in(self, run: list[Pair]) -> list[str]:
        """Names passed, in the run, to a project writer at a position it sets fields of."""
        mutating = self.context.neighbours.mutating_writers
        found = []
        for original, _ in run:
            for call in calls_in(original) if original is not None else ():
                positions = mutating.get(dotted(call.func) or "", ())
                positional = [a.value for a in call.args if a.keyword is None and not a.star]
                found += [positional[i].value for i in positions if i < len(positional) and isinstance(positional[i], cst.Name)]
        return list(dict.fromkeys(found))

    def _report_guarded(self, original: cst.BaseStatement, barrier: bool) -> bool:
        """Report DDP601 for one guarded statement; True if it writes or removes files, which
        another rank may read next (a checkpoint; HRNet's results JSON, written then loaded
        by every rank's evaluation; a run folder removed, then made again by every rank)."""
        after = "; the other ranks wait at a barrier" if barrier else ""
        if original in self._units.folder_units:
            what = "a folder removed and made anew" if self._units.removes_then_makes(original) else "an existence check and what is made after it"
            self.context.report(original, "DDP601", f"set-up on disk ({what}) on rank 0 only{after}")
            return True
        if original in self._units.joined:
            self.context.report(original, "DDP601", "computed only for the write below it: on rank 0 only, with that write")
            return False
        if original in self._units.followers:
            self.context.report(original, "DDP601", "uses what the write above it made: on rank 0 only, with that write")
            return False
        if isinstance(original, cst.With):
            self.context.report(original, "DDP601", f"file written by rank 0 only (`with open(...)` block){after}")
            return True
        if isinstance(original, cst.For):
            self.context.report(original, "DDP601", f"a loop that only writes files runs on rank 0 only{after}")
            return True
        call = self._side_effect(original.body[0])  # guarded lines hold one statement
        writes = not self.context.qualified(call.func) & SHOWN_ONLY
        if writes:  # (a checkpoint another rank may still be reading: replaced whole)
            self.context.use_helper("ddp_atomic_saves")
        self.context.report(original, "DDP601", f"{self.context.code(call.func)}() runs on rank 0 only{after if writes else ''}")
        return writes

    # -- printed losses ------------------------------------------------------------------------

    def _averaged_print(self, pair: Pair) -> Pair:
        """A print of a training loss shows its mean across ranks, and a count the training loop
        adds up from its batches shows the sum over the ranks, as DataParallel printed the
        global batch's; every rank runs the print (only rank 0's output shows), so every rank
        reaches the collective. Where a rank may skip the line, or rank 0 alone runs it, rank
        0's own value is printed and a warning says so."""
        original, updated = pair
        shown = self._printed_values(original)
        if not shown:
            return pair
        # (a printed callable is no value: AdaptiveMaskedProxies' `"Using loss {}".format(loss_fn)`)
        shown = {name: how for name, how in shown.items() if name not in self._called_names}
        if not shown:
            return pair
        texts = {name for name in shown if self._bound_to_text(name, original)}
        shown = {name: how for name, how in shown.items() if name not in texts}
        where = None
        if not shown:
            # (Rotation-RetinaNet's `s = ("%10s" * 2) % (...)`, then `logger.debug(s)`: a mean of text is the text)
            shown, where = dict.fromkeys(texts, ""), "it is text already made from the values"
        elif self._function_of(original) in self.facts.training_and_evaluating:
            where = "this loop also evaluates, on data every rank holds whole"
        elif self.context.own_ddp_path:
            where = "the script's own DDP path runs it, and its DataParallel path has no process group"
        elif self.context.is_library and not self._in_a_training_function(original):
            # (a function that trains is called by every rank: its collectives need them all, DiffASD's train())
            where = "the callers of this imported module's function are not in sight"
        elif self._guarded_above(original):
            where = "only rank 0 runs this line"
        elif not self._same_path_on_every_rank(original) and not self._settled_path(original):
            where = "this line's conditions may differ between ranks"
        if where:
            self.context.report(
                original,
                "DDP608",
                f"prints rank 0's own {', '.join(shown)} (a value across ranks needs a collective that every rank "
                f"reaches, and {where})",
                Severity.WARNING,
            )
            return pair
        meters = self._meters_read(original.body[0].value, original)
        means = [name for name, how in shown.items() if how == "ddp_mean"]
        sums = [name for name, how in shown.items() if how == "ddp_sum" and name not in meters]
        for helper in set(shown.values()):
            self.context.use_helper(helper)
        parts = [f"the mean of {_listed(means)}"] if means else []
        parts += [f"the sum of {_listed(sums)}"] if sums else []
        parts += [f"the meters {_listed(sorted(meters & set(shown)))} over every rank's batches"] if meters & set(shown) else []
        phase = self._summed_over_phases(original, shown)
        # (a loop over phases: its sums are this rank's share after a training pass, the whole
        # data's after an evaluating pass, which every rank holds alike)
        when = f" (the sums where `{self.context.code(phase)}`: the other passes evaluate whole data)" if phase else ""
        self.context.report(
            original,
            "DDP608",
            f"prints {' and '.join(parts)} across ranks{when}, as DataParallel printed the global batch's "
            "(an average meter's sum and count are added up; any other object prints rank 0's own values)",
        )
        return original, updated.visit(_AcrossRanks(shown, phase))

    def _in_a_training_function(self, original: cst.BaseStatement) -> bool:
        """Is the statement in a function whose own loop trains (not a helper it calls)?"""
        function = self._function_of(original)
        return function is not None and any(self._function_of(loop) is function for loop in self.facts.training_loops)

    @functools.cached_property
    def _called_names(self) -> set[str]:
        """Names the file calls (`loss_fn(input=..., target=...)`): functions, not values."""
        return {node.func.value for node in walk(self.context.module) if isinstance(node, cst.Call) and isinstance(node.func, cst.Name)}

    def _bound_to_text(self, name: str, original: cst.BaseStatement) -> bool:
        """Is every binding of ``name`` in the print's function a string made there (an
        f-string, a `%` or `.format()` of a literal, `str(...)`)?"""
        function = self._function_of(original)
        values = [
            node.value for node in walk(function if function is not None else self.context.module)
            if isinstance(node, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in node.targets)
        ]
        return bool(values) and all(_text(value) for value in values)

    def _printed_values(self, original: cst.BaseStatement) -> dict[str, str]:
        """Printed names -> the helper that combines them across ranks: ``ddp_mean`` for a loss
        (or a value computed from one), ``ddp_sum`` for a count the training loop adds up."""
        if not isinstance(original, cst.SimpleStatementLine) or len(original.body) != 1:
            return {}
        statement = original.body[0]
        if not (isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call)):
            return {}
        call = statement.value
        printed = "builtins.print" in self.context.qualified(call.func) and self._shows_output(call)
        if not printed and not _logs_a_value(call):
            return {}
        shown = {name: "ddp_mean" for name in _loss_names(call, self._derived_losses)}
        # (vcdb_retrieval's `logger.info(f"train_loss: {losses.avg}")` after the loop: a meter's sum
        # and count, added up over the ranks, are the global batches')
        shown.update((name, "ddp_sum") for name in self._meters_read(call, original) if name not in shown)
        if not shown:
            return {}
        combined = self._shard_sums(original)
        for name in _variable_names(call):
            if name in combined and name not in shown:
                shown[name] = combined[name]
        whole = self._added_up_over_whole_data(original, shown)
        averaged = {name for scope, name in self.context.averaged_statistics if scope is self._function_of(original)}
        if averaged:  # (and what is made of them: OKDDip's `metrics_string` of the averaged `train_metrics`)
            averaged = _made_only_from(averaged, self._function_of(original) or self.context.module)
        shown = {name: how for name, how in shown.items() if name not in whole | averaged}
        return {name: "ddp_sum" if self._share_over_whole_data(original, name) else how for name, how in shown.items()}

    def _meters_read(self, call: cst.Call, original: cst.BaseStatement) -> set[str]:
        """Meters the call reads a field of (``losses.avg``) that a training loop of the same
        function updates from its batches (``losses.update(loss.item(), n)``): each rank's holds
        its share's (ddp_sum adds up an average meter's sum and count; anything else stays as it is)."""
        read = {
            node.value.value for node in walk(call)
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.attr.value in METER_FIELDS
        }
        if not read:
            return set()
        function = self._function_of(original)
        updated = {
            node.func.value.value for loop in self.facts.training_loops if self._function_of(loop) is function
            for node in walk(loop) if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "update" and isinstance(node.func.value, cst.Name) and node.args
        }
        return read & updated

    def _share_over_whole_data(self, original: cst.BaseStatement, name: str) -> bool:
        """``epoch_loss = running_loss / len(loader.dataset)``: what the training loop added up of
        this rank's share, divided by the whole data's size: the ranks' quotients add up to the
        original's (a mean across ranks would print 1/N of it)."""
        bound = self._last_bound(original, name)
        divided, whole = over_whole_data(bound, self.context.code, self.context.shard_lengths) if bound is not None else (set(), False)
        if not hasattr(self, "_scaled_names"):  # (a world-scaled summed loss's sum is the global batch's on every rank)
            self._scaled_names = names_holding(self.context.module, self.context.world_scaled)
        return whole and bool(divided & set(self._accumulated(self._function_of(original)))) and not divided & self._scaled_names

    def _last_bound(self, original: cst.BaseStatement, name: str) -> cst.BaseExpression | None:
        """The value ``name`` was last assigned, in the print's function, before the print."""
        found = None
        for node in walk(self._function_of(original) or self.context.module):
            if node is original:
                break
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and dotted(node.targets[0].target) == name:
                found = node.value
            elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign) and dotted(node.target) == name:
                found = cst.BinaryOperation(node.target, cst.Divide(), node.value)  # (`train_loss /= len(dataset)`)
        return found

    def _accumulated(self, function: cst.CSTNode | None) -> dict[str, cst.CSTNode]:
        """Names the training loops of ``function`` add to (``running_loss += ...``) -> that loop."""
        return {
            inner.target.value: loop for loop in self.facts.training_loops if self._function_of(loop) is function
            for inner in walk(loop) if isinstance(inner, cst.AugAssign) and isinstance(inner.operator, cst.AddAssign)
            and isinstance(inner.target, cst.Name)
        }

    def _summed_over_phases(self, original: cst.BaseStatement, shown: dict[str, str]) -> cst.BaseExpression | None:
        """The test of a loop whose passes train on this rank's share or evaluate the whole data
        (``for phase in ['train', 'val']:``), where a printed sum adds up: the same line needs
        the sum across ranks after one pass and this rank's own value after the other."""
        accumulated = self._accumulated(self._function_of(original))
        for name, how in shown.items():
            bound = self._last_bound(original, name)
            names = {name} | ({n.value for n in names_in(bound)} if bound is not None else set())
            for loop in {accumulated[n] for n in names if n in accumulated}:
                condition = training_condition(loop, self.facts)
                if how == "ddp_sum" and condition is not None:
                    test, trains = condition
                    return test if trains else cst.UnaryOperation(cst.Not(), test)
        return None

    def _added_up_over_whole_data(self, original: cst.BaseStatement, names) -> set[str]:
        """The printed names last added up, before the print, in a loop that trains nothing (an
        evaluation over data every rank holds whole, MCPDepth's `total_val_loss` and `counter`):
        every rank holds the whole set's value already, and a mean or sum across ranks would
        misstate it (a count times the world size)."""
        function = self._function_of(original)
        last: dict[str, cst.CSTNode] = {}
        for node in walk(function) if function is not None else ():
            if node is original:
                break
            if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) and node.target.value in names:
                last[node.target.value] = node
        whole = set()
        for name, node in last.items():
            loop = self.context.parent(node)
            while loop is not None and not isinstance(loop, (cst.For, cst.While, cst.FunctionDef, cst.Module)):
                loop = self.context.parent(loop)
            if isinstance(loop, (cst.For, cst.While)) and loop not in self.facts.training_loops:
                whole.add(name)
        return whole

    def _shard_sums(self, node: cst.CSTNode) -> dict[str, str]:
        """Names the training loops of ``node``'s function add up, with the helper that combines
        them across ranks: ``ddp_sum`` for a batch quantity each rank counts of its shard only
        (``total += labels.size(0)``, ``correct += ...``), ``ddp_mean`` for each step's mean
        (``epoch_error += error.item()``, ``error = torch.mean(...)``, GANet). Step counters
        (``+= 1``) are the same on every rank."""
        function = node
        while function is not None and not isinstance(function, (cst.FunctionDef, cst.Module)):
            function = self.context.parent(function)
        found: dict[str, str] = {}
        # (a loop's counter moved on by a setting, HSR's `epoch += self.start_epoch`: alike on every rank)
        counters = {n.value for loop in walk(function) if isinstance(loop, cst.For) for n in walk(loop.target) if isinstance(n, cst.Name)}
        for loop in self.facts.training_loops:
            if self._function_of(loop) is not function:
                continue
            for inner in walk(loop):
                if (
                    isinstance(inner, cst.AugAssign)
                    and isinstance(inner.operator, cst.AddAssign)
                    and isinstance(inner.target, cst.Name)
                    and inner.target.value not in counters
                    and not isinstance(inner.value, cst.Integer)
                    and found.get(inner.target.value) != "ddp_sum"  # (a count anywhere is a count)
                ):
                    found[inner.target.value] = "ddp_mean" if self._adds_a_mean(loop, inner.value) else "ddp_sum"
                elif _a_batch_mean_bound(inner, self.context.code):
                    # (DCGAN's `D_x = output.mean().item()`, printed beside the losses: this rank's half)
                    found.setdefault(inner.targets[0].target.value, "ddp_mean")
        return {name: how for name, how in found.items() if name not in self._derived_losses}

    def _adds_a_mean(self, loop: cst.CSTNode, value: cst.BaseExpression) -> bool:
        """``epoch_error += error.item()`` with ``error = torch.mean(...)`` (GANet), or a ratio
        (``acc = num_correct / img.shape[0]``, a batch's accuracy: fourierer's ImageNet script): a
        mean per step added up (and divided by the steps), not a count of the shard."""
        inner = value.func.value if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "item" else value
        if _a_ratio(inner):
            return True
        if not isinstance(inner, cst.Name):
            return False
        return any(
            isinstance(node, cst.Assign) and any(dotted(t.target) == inner.value for t in node.targets)
            and (re.search(r"\bmean\(", self.context.code(node.value)) is not None or _a_ratio(node.value))
            for node in walk(loop)
        )

    def _function_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        parent = self.context.parent(node)
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
            parent = self.context.parent(parent)
        return parent

    def _guarded_above(self, node: cst.CSTNode) -> bool:
        """Inside a statement that runs on rank 0 only: a rank guard, or a block this
        transform guards (``with open(path, "w"):``)."""
        parent = self.context.parent(node)
        while parent is not None and not isinstance(parent, cst.Module):
            if isinstance(parent, cst.With) and self._writes_file(parent):
                return True
            parent = self.context.parent(parent)
        return self._under_rank_guard(node)

    @property
    def _derived_losses(self) -> frozenset[str]:
        if not hasattr(self, "_derived"):
            self._derived = _loss_derived(self.context.module)
        return self._derived

    def _settled_path(self, node: cst.CSTNode) -> bool:
        """Every test around the line, in its function and at each call of it, reads only names
        alike on every rank (i3d's `if phase == 'val':` of `for phase in ['train', 'val']:`, a
        counter every rank counts alike): every rank prints there, so a collective may too."""
        settled = self.context.settled
        return self._same_path_on_every_rank(node, lambda owner: settled is not None and settled.uniform(owner.test, owner))

    @functools.cached_property
    def _exit_handlers(self) -> frozenset[str]:
        """Functions the file registers to run at exit or on a signal (autoplace's
        ``atexit.register(unexpected_exit)``, ``signal.signal(SIGINT, handler)``)."""
        found = set()
        for call in calls_in(self.context.module):
            names = self.context.qualified(call.func)
            handed = [arg.value for arg in call.args if arg.keyword is None]
            if names & {"atexit.register"} and handed:
                found.add(dotted(handed[0]) or "")
            elif names & {"signal.signal"} and len(handed) > 1:
                found.add(dotted(handed[1]) or "")
        for node in walk(self.context.module):
            if isinstance(node, cst.FunctionDef) and any(
                self.context.qualified(d.decorator) & {"atexit.register"} for d in node.decorators
            ):
                found.add(node.name.value)
        return frozenset(found - {""})

    def _same_path_on_every_rank(self, node: cst.CSTNode, decided=None) -> bool:
        """Within its function, and, for a function of this file, at each of its calls
        (DeepCubeA's copy_files, called under `if last_loss < loss_thresh:`, a value of each
        rank's own: a barrier inside it waits for ranks that never come). ``decided``: tests
        taken alike on every rank besides those same_path_on_every_rank knows."""
        if not same_path_on_every_rank(node, self.context.parent, decided):
            return False
        function = node
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = self.context.parent(function)
        if function is None:
            return True
        if function.name.value in self._exit_handlers:
            return False  # (run at exit or on a signal: after a crash one rank runs it alone, a barrier there hangs)
        seen, key = self._paths_of_functions, (function, decided is not None)
        if key not in seen:
            seen[key] = True  # (a function that calls itself)
            calls = [call for call, _ in self.facts.analyzer.calls.call_sites(function)]
            seen[key] = all(self._same_path_on_every_rank(call, decided) for call in calls)
        return seen[key]


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


# Calls inside a print that only format the value they are given.
FORMATTING = {"format", "round", "float", "int", "str", "abs", "item", "mean", "sum", "cpu", "detach", "tolist", "numpy"}


def _handed_to_calls(call: cst.Call) -> set[int]:
    """Nodes inside a print that are arguments of another call (``validate(..., criterion)``):
    what that call returns is printed, not them."""
    inside: set[int] = set()
    for node in walk(call):
        if isinstance(node, cst.Call) and node is not call:
            func = node.func
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
            if name not in FORMATTING:
                inside |= {id(n) for arg in node.args for n in walk(arg.value)}
    return inside


# `rank == 1`, `args.local_rank == 3`: a test that picks one rank other than 0
_ANOTHER_RANK = re.compile(r"rank\w*\s*==\s*[1-9]|[1-9]\s*==\s*[\w.\[\]'\"]*rank", re.IGNORECASE)


def _a_batch_mean_bound(node: cst.CSTNode, code) -> bool:
    """``D_x = output.mean().item()``: one name bound to a mean (or a ratio) computed in the loop."""
    if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)):
        return False
    return re.search(r"\bmean\(", code(node.value)) is not None or _a_ratio(node.value)


def _made_only_from(averaged: set[str], scope: cst.CSTNode) -> set[str]:
    """``averaged`` and the names every binding of which in ``scope`` is computed from them
    (``metrics_string = " ; ".join(... for k, v in train_metrics.items())``): the global values too."""
    bindings: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(scope):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    bindings.setdefault(target.target.value, []).append(node.value)
        elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
            bindings.setdefault(node.target.value, []).append(None)  # (added to: not made from them alone)
    found, grown = set(averaged), True
    while grown:
        grown = False
        for name, values in bindings.items():
            if name not in found and all(value is not None and {n.value for n in names_in(value)} & found for value in values):
                found.add(name)
                grown = True
    return found


def _loss_names(call: cst.Call, derived: frozenset[str] = frozenset()) -> list[str]:
    """Names of losses a print shows: ``loss.item()`` and bare ``running_loss``."""
    nodes = walk(call)
    handed = _handed_to_calls(call)
    nodes = [n for n in nodes if id(n) not in handed]
    not_variables = {id(n.value) for n in nodes if isinstance(n, cst.Attribute)}
    not_variables |= {id(n.attr) for n in nodes if isinstance(n, cst.Attribute)}
    not_variables |= {id(n.keyword) for n in nodes if isinstance(n, cst.Arg) and n.keyword is not None}
    items = [n.func.value.value for n in nodes if _is_item_call(n)]
    bare = [n.value for n in nodes if isinstance(n, cst.Name) and id(n) not in not_variables]
    return [name for name in [*items, *bare] if _is_loss(name, derived)]


def _is_item_call(node: cst.CSTNode) -> bool:
    return (
        isinstance(node, cst.Call)
        and not node.args
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "item"
        and isinstance(node.func.value, cst.Name)
    )


def _item_names(statement: cst.CSTNode) -> set[str]:
    return {n.func.value.value for n in walk(statement) if _is_item_call(n)}


def _variable_names(call: cst.Call) -> set[str]:
    """Bare variable names a call reads (not attribute fields, not keyword names)."""
    nodes = walk(call)
    skip = {id(n.attr) for n in nodes if isinstance(n, cst.Attribute)}
    skip |= {id(n.keyword) for n in nodes if isinstance(n, cst.Arg) and n.keyword is not None}
    return {n.value for n in nodes if isinstance(n, cst.Name) and id(n) not in skip}


class _AcrossRanks(cst.CSTTransformer):
    """Inside one print: ``loss.item()`` -> ``ddp_mean(loss.item())``, a bare ``loss`` ->
    ``ddp_mean(loss)``, a counted ``correct`` -> ``ddp_sum(correct)``."""

    def __init__(self, helpers: dict[str, str], summed_when: cst.BaseExpression | None = None) -> None:
        super().__init__()
        self.helpers = helpers
        self.summed_when = summed_when  # (``ddp_sum(correct) if phase == 'train' else correct``)

    def _combined(self, helper: str, value: cst.BaseExpression) -> cst.BaseExpression:
        combined = cst.Call(func=cst.Name(helper), args=[cst.Arg(value)])
        if helper != "ddp_sum" or self.summed_when is None:
            return combined
        return cst.IfExp(
            test=self.summed_when.deep_clone(), body=combined, orelse=value.deep_clone(),
            lpar=[cst.LeftParen()], rpar=[cst.RightParen()],
        )

    def visit_Call(self, node: cst.Call) -> bool:
        return not (_is_item_call(node) and node.func.value.value in self.helpers)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if _is_item_call(original_node) and original_node.func.value.value in self.helpers:
            return self._combined(self.helpers[original_node.func.value.value], updated_node)
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        helper = self.helpers.get(original_node.value)
        if helper is None:
            return updated_node
        return self._combined(helper, updated_node)


def _path_mkdir(call: cst.Call) -> bool:
    """``path.mkdir()`` / ``path.mkdir(parents=True)``: pathlib's signature, keywords only (an
    sftp or fsspec ``mkdir(path)`` takes the path as its first argument and is left alone)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "mkdir"):
        return False
    keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    return len(keywords) == len(call.args) and keywords <= {"mode", "parents"}


# The fields of an average meter a log line shows (the ImageNet example's AverageMeter)
METER_FIELDS = {"avg", "sum", "val", "count", "average", "mean"}


def _logs_a_value(call: cst.Call) -> bool:
    """A logged value every rank reaches (rank 0's is kept): ``logger.info(...)`` (logging is
    quiet on the other ranks), ``writer.add_scalar(...)`` (a stand-in there, DDP606); the same
    mean across ranks as a printed loss (AdaBound's curves, amc's tensorboard)."""
    if not isinstance(call.func, cst.Attribute):
        return False
    method, receiver = call.func.attr.value, (dotted(call.func.value) or "").lower()
    if method in ("add_scalar", "add_scalars"):
        return True
    return method in ("info", "debug", "warning") and "log" in receiver


def _leaves_loop(branch: cst.CSTNode) -> bool:
    """Does the branch `break` out of (or `return` from) the loop around the test? Nested
    loops and functions inside it have their own."""
    stack = list(branch.children)
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.Break, cst.Return)):
            return True
        if not isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(node.children)
    return False


def _says_absent(test: cst.BaseExpression) -> bool:
    """``not exists(p)``, ``exists(p) == False``, ``exists(p) is False``: the path must not be there
    yet (a run folder this run is about to make)."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return isinstance(test.expression, cst.Call)
    if isinstance(test, cst.Comparison) and isinstance(test.left, cst.Call) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        negated = isinstance(target.operator, (cst.Equal, cst.Is)) and dotted(target.comparator) == "False"
        return negated or isinstance(target.operator, (cst.NotEqual, cst.IsNot)) and dotted(target.comparator) == "True"
    return False


def _outer_calls(test: cst.BaseExpression) -> list[cst.Call]:
    """The calls a test is made of, not those inside their arguments (the `.format(i)` of
    ``os.path.exists(out + "_{}".format(i))``)."""
    found, stack = [], [test]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            found.append(node)
        else:
            stack.extend(node.children)
    return found


def _a_ratio(value: cst.BaseExpression) -> bool:
    """A value divided by something (``correct / x.shape[0]``, ``(...).sum().item() / n``): a
    fraction, whose sum over ranks means nothing; its mean is the global batch's (shares of one
    size)."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("item", "float", "detach", "cpu"):
        value = value.func.value
    return isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Divide)
