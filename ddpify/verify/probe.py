"""Run a training script in this process and record what it did (for tests and `verify`).

    python -m ddpify.verify.probe SCRIPT [ARGS...]
    python -m torch.distributed.run --nproc-per-node=2 -m ddpify.verify.probe SCRIPT [ARGS...]

The script runs unmodified (``runpy``, as ``__main__``); nothing on disk is edited. The
probe patches a few torch and builtin entry points first and, when the script ends, writes
into ``$DDPIFY_PROBE_DIR``:

- ``rank<R>.json``: what this rank did: process group and DistributedDataParallel
  creation, the indices every sampler yielded per pass (as indices of the dataset under any
  ``Subset``), ``set_epoch`` values, the user lines that printed or logged, ``torch.save``
  paths, files opened for writing, optimizer steps, each optimizer's hyper-parameters and
  how many of its trained parameters no DDP module holds, a hash of the parameters right
  after the last optimizer step and at exit, BatchNorm layers that used batch statistics,
  Dropout layers and functional dropout calls that were active in training, the first
  optimizer step after which the ranks disagreed (below), exit status and wall time;
- ``rank<R>.pt``: the parameters after the last optimizer step (for the equivalence
  comparison).

Parameters are read through the optimizers, so that a DataParallel run, a plain run and a
DDP run are compared parameter by parameter. They are kept as they were right after each
optimizer's latest step (one copy, on their device), because a script may overwrite them
before it exits (loading rank 0's checkpoint on every rank), which would hide ranks that
trained apart.

The cross-rank check the converted script used to carry (``ddp_after_step``) is the
probe's own: under a process group of more than one rank, after each optimizer's steps 1,
2, 4, 8, ... every rank all-reduces the number of its trained parameters, their sums and
sums of squares and its learning rates; the first check at which any rank differs is
recorded (the step, what differed, each rank's own values). The run goes on, so that every
other verdict sees the whole run. A script that still carries its own check is checked
twice, in the same order on every rank (its own check then stops it).

Settings, all optional, by environment variable:
``DDPIFY_PROBE_MAX_STEPS`` stops the script cleanly after that many optimizer steps;
``DDPIFY_PROBE_NO_SHUFFLE`` forces shuffling off in every DataLoader and DistributedSampler;
``DDPIFY_PROBE_BN_EVAL`` makes BatchNorm normalise with its running statistics;
``DDPIFY_PROBE_NO_DROPOUT`` turns dropout off (nn.Dropout* layers and F.dropout* calls);
``DDPIFY_PROBE_SEED`` seeds torch and ``random`` before the script starts;
``DDPIFY_PROBE_PATH`` is prepended to ``sys.path`` (the original script's folder);
``DDPIFY_PROBE_TAG`` starts every line the script prints with ``[TAG rank R] ``.

This module imports torch; only launched processes import it, never the CLI.
"""

from __future__ import annotations

import builtins
import ctypes
import functools
import hashlib
import itertools
import json
import os
import random
import runpy
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, Sampler, Subset
from torch.utils.data.distributed import DistributedSampler

from ddpify.names import WRITE_MODES

# Frames this deep are searched for the user's line behind a write (print -> file.write is
# one level; logging, pathlib and torch.save a few more).
USER_FRAME_DEPTH = 20
# Modules that print on the caller's behalf: a write from inside them belongs to the frame
# that called them. A write from any other code outside the user's folders (the warnings
# module, a library's own print or log record) is that library's, and every rank's copy of
# it is not the user's doing.
OUTPUT_MODULES = frozenset({"logging", "tqdm", "rich", "loguru", "click", "traceback", "pprint"})
# Param-group entries compared across ranks after each optimizer's last step.
HYPER_PARAMETERS = ("lr", "momentum", "weight_decay", "betas")
_original_open = builtins.open
_original_save = torch.save
HELPER_FRAMES = ("ddp_", "saved_whole")  # frames of the helpers ddpify puts in a converted script


# Steps past --max-steps that training not driven by a DataLoader may take before the probe
# stops the script outright.
HARD_STOP_MARGIN = 64


class StopTraining(BaseException):
    """Raised when training goes on well past ``--max-steps`` without a DataLoader to end
    (a BaseException so that a script's own ``except Exception`` cannot swallow it)."""


class Recorder:
    """Everything one rank did, kept as plain data (it becomes ``rank<R>.json``)."""

    def __init__(self, script: str, user_dirs: list[str]) -> None:
        self.user_dirs = tuple(os.path.join(os.path.abspath(d), "") for d in user_dirs)
        self.started = time.monotonic()
        self.optimizers: list = []
        self.ddp_models: list = []
        # Each optimizer's parameters as they were right after its latest step, by index.
        self.snapshots: dict[int, list] = {}
        # ids of the parameters that some DistributedDataParallel module synchronises.
        self.ddp_param_ids: set[int] = set()
        # BatchNorm layers (ids) that normalised with the batch's own statistics.
        self.batch_stat_layers: set[int] = set()
        # Dropout layers (ids) and functional dropout call sites that dropped in training.
        self.dropout_layers: set[int] = set()
        self.dropout_sites: set[str] = set()
        self.data = {
            "script": os.path.abspath(script),
            "process_group": None,
            "ddp_models": 0,
            "samplers": [],
            "steps": 0,
            "optimizers": [],
            "outputs": {},
            "saves": [],
            "written_files": [],
            "status": None,
            "error": None,
            "stopped_at_max_steps": False,
            "set_epoch_calls": [],
            # The first cross-rank check that found the ranks apart (None: they agreed).
            "diverged": None,
            "sync_checks": 0,  # cross-rank checks made (steps 1, 2, 4, ... of each optimizer)
        }
        self._sampler_ids = itertools.count()
        self.drawing_shard = 0  # inside a DdpShard drawing the pass of the sampler it splits
        self.max_steps: int | None = None
        # Loops (by site) in which an optimizer stepped: these are the ones --max-steps ends.
        self.training_sites: set[str] = set()

    def training_is_over(self, record: dict) -> bool:
        over = self.max_steps is not None and self.data["steps"] >= self.max_steps
        return over and record["site"] in self.training_sites

    # -- where a call came from ----------------------------------------------------------
    def user_site(self, depth: int = 2) -> str | None:
        """``file:line`` of the nearest frame in the user's code (the script's folders)."""
        frame = sys._getframe(depth)
        for _ in range(USER_FRAME_DEPTH):
            if frame is None:
                return None
            name = frame.f_code.co_filename
            # (ddpify's own helpers in the script, ddp_atomic_saves' wrapper: the line that called them)
            if self.is_user_file(name) and not frame.f_code.co_name.startswith(HELPER_FRAMES):
                return f"{os.path.basename(name)}:{frame.f_lineno}"
            frame = frame.f_back
        return None

    def is_user_file(self, name: str) -> bool:
        return name.startswith(self.user_dirs) and "site-packages" not in name and name != __file__

    def printing_site(self, depth: int) -> str | None:
        """``file:line`` of the user's line behind a write to stdout/stderr, or None when the
        write is a library's own (a warning, a library's print or log record)."""
        try:
            frame = sys._getframe(depth)
        except ValueError:  # no Python caller: the interpreter printing an uncaught exception
            return None
        for _ in range(USER_FRAME_DEPTH):
            if frame is None:
                return None
            name = frame.f_code.co_filename
            if self.is_user_file(name):
                return f"{os.path.basename(name)}:{frame.f_lineno}"
            module = str(frame.f_globals.get("__name__", "")).split(".")[0]
            if name != __file__ and module not in OUTPUT_MODULES:
                return None
            frame = frame.f_back
        return None

    def output(self, stream: str, text: str) -> None:
        if not text.strip():
            return  # print's separators and line ends
        site = self.printing_site(depth=3)
        if site is not None:
            key = f"{stream} {site}"
            self.data["outputs"][key] = self.data["outputs"].get(key, 0) + 1

    # -- samplers --------------------------------------------------------------------------
    def sampler_pass(self, sampler) -> dict:
        if not hasattr(sampler, "_ddpify_id"):
            sampler._ddpify_id = next(self._sampler_ids)
        shard = type(sampler).__name__ == SHARD_SAMPLER
        distributed = isinstance(sampler, DistributedSampler) or shard
        if not hasattr(sampler, "_ddpify_subsets"):  # once per sampler: summaries walk the dataset
            sampler._ddpify_subsets = _subset_chain(_dataset_of(sampler))
            sampler._ddpify_subset_summary = _subset_summary(sampler._ddpify_subsets, _size(sampler))
        record = {
            "sampler": sampler._ddpify_id,
            # The user's loop that drew from it: ranks agree on it even where one rank
            # iterates an extra loader (evaluation on rank 0), so passes are matched by it.
            "site": self.user_site(depth=2) or f"sampler {sampler._ddpify_id}",
            "kind": type(sampler).__name__,
            "distributed": distributed,
            "dataset_size": _size(sampler),
            # Indices below are the base dataset's, through any Subset (random_split).
            "subset": sampler._ddpify_subset_summary,
            "num_replicas": getattr(sampler, "num_replicas", 1) if distributed else 1,
            "shuffle": bool(getattr(sampler, "shuffle", False)) if distributed else type(sampler).__name__ == "RandomSampler",
            "drop_last": bool(getattr(sampler, "drop_last", False)) if distributed else False,
            "epoch": getattr(sampler, "epoch", None) if distributed else None,
            **(_shard_summary(sampler) if shard else {}),
            "indices": [],
            "complete": False,
            "steps_at_start": self.data["steps"],
            "steps_at_end": self.data["steps"],
        }
        self.data["samplers"].append(record)
        return record

    # -- optimizers -------------------------------------------------------------------------
    def add_optimizer(self, optimizer) -> int:
        self.optimizers.append(optimizer)
        self.data["optimizers"].append({"steps": 0, "trained_params": None, "outside_ddp": None, "hyper": None})
        return len(self.optimizers) - 1

    def optimizer_index(self, optimizer) -> int:
        found = next((i for i, known in enumerate(self.optimizers) if known is optimizer), None)
        return self.add_optimizer(optimizer) if found is None else found

    def optimizer_stepped(self, optimizer) -> None:
        """Called after every step: what this optimizer holds right now is what ranks compare."""
        index = self.optimizer_index(optimizer)
        record = self.data["optimizers"][index]
        record["steps"] += 1
        if record["steps"] == 1:
            # At the first step: by then every DDP wrap the script meant to make is made.
            record["trained_params"], record["outside_ddp"] = self.count_outside_ddp(optimizer)
        record["hyper"] = _hyper_parameters(optimizer)
        self.snapshots[index] = _copy_into(self.snapshots.get(index), _parameters_of(optimizer))

    def count_outside_ddp(self, optimizer) -> tuple[int, int]:
        """(parameters this optimizer trains, how many of them no DDP module synchronises)."""
        trained = [p for p in _parameters_of(optimizer) if p.requires_grad]
        # (the converted script's optimizer hook averages the gradients of module parameters
        # DDP does not hold, DdpModel.late_parameters: synchronised as DDP's are)
        hooked = _averaging_hook_registered()
        return len(trained), sum(id(p) not in self.ddp_param_ids and not (hooked and isinstance(p, torch.nn.Parameter)) for p in trained)

    def finish(self, status: int, error: str | None) -> None:
        self.data["status"] = status
        self.data["error"] = error
        self.data["seconds"] = round(time.monotonic() - self.started, 3)
        stepped = [t for index in sorted(self.snapshots) for t in self.snapshots[index]]
        self.data["weights"] = {
            "after_last_step": _weights_summary(stepped),
            "at_exit": _weights_summary(self.final_parameters()),
        }
        self.data["batchnorm_batch_stats"] = len(self.batch_stat_layers)
        self.data["dropout_in_training"] = len(self.dropout_layers) + len(self.dropout_sites)
        self.data.setdefault("rank", _env_int("RANK", _env_int("SLURM_PROCID", 0)))
        directory = os.environ.get("DDPIFY_PROBE_DIR")
        if not directory:
            return
        rank = self.data["rank"]
        saved = {"params": self.parameters_after_last_step(), "set_epoch": self.data["set_epoch_calls"]}
        _original_save(saved, os.path.join(directory, f"rank{rank}.pt"))
        with _original_open(os.path.join(directory, f"rank{rank}.json"), "w") as handle:
            json.dump(self.data, handle)

    def optimizer_parameters(self) -> list[list]:
        """Each optimizer's parameters, in order."""
        return [[p for g in o.param_groups for p in g["params"]] for o in self.optimizers]

    def parameters_after_last_step(self) -> list[list]:
        """Each optimizer's parameters after its last step (now, for one that never stepped)."""
        groups = self.optimizer_parameters()
        return [[t.detach().cpu().clone() for t in self.snapshots.get(i, group)] for i, group in enumerate(groups)]

    def final_parameters(self) -> list:
        tensors = [p for group in self.optimizer_parameters() for p in group]
        return tensors or [p for m in self.ddp_models for p in m.parameters()]


def _averaging_hook_registered() -> bool:
    """Does a global optimizer step hook of the converted script average the gradients of the
    weights no DDP holds (its DdpModel.late_parameters)?"""
    from torch.optim import optimizer as optim

    hooks = getattr(optim, "_global_optimizer_pre_hooks", {})
    return any(getattr(hook, "__qualname__", "") == "DdpModel.late_parameters" for hook in hooks.values())


def _parameters_of(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _copy_into(kept: list | None, tensors: list) -> list:
    """``tensors``' values, in ``kept`` while shapes match (one copy a step, no allocation)."""
    with torch.no_grad():
        if kept is None or [(k.shape, k.dtype, k.device) for k in kept] != [(t.shape, t.dtype, t.device) for t in tensors]:
            return [t.detach().clone() for t in tensors]
        for copy, tensor in zip(kept, tensors):
            copy.copy_(tensor)
    return kept


def _weights_summary(tensors: list) -> dict | None:
    """SHA-256 of the values' bytes, their number, and how many are NaN or infinite (NaN
    weights have the same bytes on every rank: equal hashes alone would pass them)."""
    if not tensors:
        return None
    digest, nonfinite = hashlib.sha256(), 0
    for tensor in tensors:
        values = tensor.detach().cpu().contiguous().reshape(-1)
        # any dtype, bit for bit (ctypes, not .numpy(): torch does not require numpy)
        digest.update(ctypes.string_at(values.data_ptr(), values.numel() * values.element_size()) if values.numel() else b"")
        if values.is_floating_point() or values.is_complex():
            nonfinite += int((~torch.isfinite(values)).sum())
    return {"hash": digest.hexdigest(), "count": sum(t.numel() for t in tensors), "nonfinite": nonfinite}


# -- the cross-rank check -------------------------------------------------------------------

FINGERPRINT = ("trained parameter tensors", "learning rates", "weights (sums)", "weights (sums of squares)")


def _fingerprint(optimizer) -> list[float]:
    """What ranks compare after a step: the trained tensors' count, the param groups'
    learning rates and the weights' sums and sums of squares (each weighted by its position,
    so that two swapped tensors differ; squares: a drift that keeps every sum, a softmax
    head trained apart, shows there)."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    rates = sum((i + 1) * float(group.get("lr", 0.0)) for i, group in enumerate(optimizer.param_groups))
    values = [float(len(params)), rates, 0.0, 0.0]
    with torch.no_grad():
        for i, p in enumerate(params):
            values[2] += (i + 1) * float(p.double().sum())
            values[3] += (i + 1) * float(p.double().square().sum())
    return values


def _collective_device():
    """NCCL reduces on the GPU only; gloo on the CPU."""
    if "nccl" in str(dist.get_backend()) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_ranks_agree(recorder: "Recorder", optimizer, steps: int) -> None:
    """After an optimizer's steps 1, 2, 4, 8, ... under a group of more than one rank: the
    largest and smallest of each rank's fingerprint, all-reduced; the first time they are
    apart is recorded (every rank sees the same reduced values and records it)."""
    if steps & (steps - 1) or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    local = torch.tensor(_fingerprint(optimizer), dtype=torch.float64, device=_collective_device())
    both = torch.cat([local, -local])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    recorder.data["sync_checks"] += 1
    largest, smallest = both[:4].cpu(), (-both[4:]).cpu()
    close = torch.isclose(largest, smallest, rtol=1e-6, atol=1e-7, equal_nan=True)
    if bool(close.all()) or recorder.data["diverged"] is not None:
        return
    recorder.data["diverged"] = {
        "step": steps,
        "optimizer": recorder.optimizer_index(optimizer),
        "apart": [name for name, same in zip(FINGERPRINT, close.tolist()) if not same],
        "largest": largest.tolist(),
        "smallest": smallest.tolist(),
        "mine": local.cpu().tolist(),
    }


def _hyper_parameters(optimizer) -> list[dict]:
    return [{key: _plain(group[key]) for key in HYPER_PARAMETERS if key in group} for group in optimizer.param_groups]


def _plain(value):
    """A JSON value for a hyper-parameter (a float, a tensor, a tuple of them)."""
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return repr(value)


def _dataset_of(sampler):
    for name in ("dataset", "data_source"):
        source = getattr(sampler, name, None)
        if source is not None:
            return source
    return None


def _size(sampler) -> int | None:
    source = _dataset_of(sampler)
    try:
        return len(source) if source is not None else len(sampler)
    except TypeError:
        return None


def _subset_chain(dataset) -> list:
    """The ``indices`` of each Subset wrapped around the base dataset, outermost first."""
    chain = []
    while isinstance(dataset, Subset):
        chain.append(dataset.indices)
        dataset = dataset.dataset
    return chain


def _base_index(chain: list, index: int) -> int:
    for indices in chain:
        index = int(indices[index])
    return index


def _subset_summary(chain: list, size: int | None) -> dict | None:
    """Which base samples the Subset holds: a digest (ranks with different random splits
    differ) and how many distinct ones (a Subset may list a sample twice)."""
    if not chain or size is None:
        return None
    base = [_base_index(chain, position) for position in range(size)]
    return {"digest": hashlib.sha256(json.dumps(base).encode()).hexdigest()[:16], "distinct": len(set(base))}


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else default


# -- patches -------------------------------------------------------------------------------


def patch_optimizers(recorder: Recorder) -> None:
    original_init = torch.optim.Optimizer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        recorder.add_optimizer(self)

    def after_step(optimizer, args, kwargs):
        # Registered before the script runs, so it runs before the converted set-up's own
        # hooks (ddp_after_step). Its one collective (the cross-rank check, at an
        # optimizer's steps 1, 2, 4, ...) comes at the same step on every rank.
        recorder.data["steps"] += 1
        recorder.optimizer_stepped(optimizer)
        check_ranks_agree(recorder, optimizer, recorder.data["optimizers"][recorder.optimizer_index(optimizer)]["steps"])
        # The loop being trained is the latest pass still open (an earlier open one is a
        # loop that was left with `break`).
        record = next((r for r in reversed(recorder.data["samplers"]) if not r["complete"]), None)
        if record is not None:
            record["steps_at_end"] = recorder.data["steps"]
            recorder.training_sites.add(record["site"])
        if recorder.max_steps is not None and recorder.data["steps"] >= recorder.max_steps + HARD_STOP_MARGIN:
            raise StopTraining

    torch.optim.Optimizer.__init__ = init
    register_optimizer_step_post_hook(after_step)


def patch_samplers(recorder: Recorder, no_shuffle: bool) -> None:
    original_set_epoch = DistributedSampler.set_epoch
    original_sampler_init = DistributedSampler.__init__
    original_loader_init = DataLoader.__init__

    def set_epoch(self, epoch):
        recorder.data["set_epoch_calls"].append(int(epoch))
        return original_set_epoch(self, epoch)

    def sampler_init(self, *args, **kwargs):
        original_sampler_init(self, *args, **kwargs)
        if no_shuffle:
            self.shuffle = False

    @functools.wraps(original_loader_init)  # (its signature is DataLoader's: ddp_shard rebuilds from it)
    def loader_init(self, *args, **kwargs):
        if no_shuffle and kwargs.get("shuffle"):
            kwargs["shuffle"] = False
        if no_shuffle and len(args) >= 3 and args[2] is True:
            args = (*args[:2], False, *args[3:])
        original_loader_init(self, *args, **kwargs)

    DistributedSampler.set_epoch = set_epoch
    DistributedSampler.__init__ = sampler_init
    DataLoader.__init__ = loader_init
    for cls in _sampler_classes():
        cls.__iter__ = _recording_iter(recorder, cls.__iter__)


def _sampler_classes() -> list:
    """Every sampler class torch defines (subclasses the user defines are not traced)."""
    from torch.utils.data import sampler as module

    classes = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Sampler)]
    return [c for c in classes + [DistributedSampler] if "__iter__" in vars(c) and c.__name__ != "BatchSampler"]


# ddpify's run-time shard of a training loader (the emitted ddp_shard): every rank draws the
# same pass of the user's sampler, then takes its share of it.
SHARD_SAMPLER = "DdpShard"


def _shard_summary(shard) -> dict:
    """What a DdpShard pass is: distributed over the world; each sample once per epoch only
    where it splits a sampler that draws every sample once (sequential, or shuffled without
    replacement), not where it splits a user's batches or weighted draws."""
    inner = shard.sampler
    plain = type(inner).__name__ == "SequentialSampler" or (
        type(inner).__name__ == "RandomSampler" and not inner.replacement and inner._num_samples is None
    )
    return {
        "num_replicas": dist.get_world_size() if dist.is_initialized() else 1,
        "shuffle": type(inner).__name__ == "RandomSampler",
        "dataset_size": len(shard.dataset) if plain and not shard.per_batch else None,
        # every rank draws the same whole batches, the model's calls split them (ddp_scattered)
        "whole": getattr(shard, "whole", False),
    }


def patch_shard_samplers(recorder: Recorder) -> None:
    """DdpShard is defined by the converted script itself: its class is patched as it is made.
    The user's sampler it draws from is not a training pass of its own."""
    own = Sampler.__dict__.get("__init_subclass__")

    def init_subclass(cls, **kwargs):
        if own is not None:
            own.__func__(cls, **kwargs)
        else:
            super(Sampler, cls).__init_subclass__(**kwargs)
        if cls.__name__ == SHARD_SAMPLER and "__iter__" in vars(cls):
            cls.__iter__ = _shard_iter(recorder, cls.__iter__)

    Sampler.__init_subclass__ = classmethod(init_subclass)


def _shard_iter(recorder: Recorder, original):
    def draw(step):  # the user's sampler is drawn in here (a pass at once, or draw by draw): not recorded
        recorder.drawing_shard += 1
        try:
            return step()
        finally:
            recorder.drawing_shard -= 1

    def __iter__(self):
        drawn = draw(lambda: original(self))
        record = recorder.sampler_pass(self)
        while True:
            item = draw(lambda: next(drawn, record))
            if item is record:
                break
            if recorder.training_is_over(record):
                record["truncated"] = True
                return
            for index in item if isinstance(item, (list, tuple)) else [item]:
                record["indices"].append(_base_index(self._ddpify_subsets, int(index)))
            yield item
        record["complete"] = True
        record["steps_at_end"] = recorder.data["steps"]

    return __iter__


def _recording_iter(recorder: Recorder, original):
    def __iter__(self):
        if recorder.drawing_shard:
            yield from original(self)
            return
        record = recorder.sampler_pass(self)
        for index in original(self):
            if recorder.training_is_over(record):
                # --max-steps: the training loop ends here, as if its data ran out; the
                # rest of the script (evaluation, saves, prints) still runs.
                record["truncated"] = True
                return
            record["indices"].append(_base_index(self._ddpify_subsets, int(index)))
            yield index
        record["complete"] = True
        record["steps_at_end"] = recorder.data["steps"]

    return __iter__


def patch_distributed(recorder: Recorder) -> None:
    original_init = dist.init_process_group
    original_ddp_init = torch.nn.parallel.DistributedDataParallel.__init__

    def init_process_group(*args, **kwargs):
        result = original_init(*args, **kwargs)
        recorder.data["process_group"] = {
            "backend": str(dist.get_backend()),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "local_rank": _env_int("LOCAL_RANK", 0),
        }
        recorder.data["rank"] = dist.get_rank()
        return result

    def ddp_init(self, *args, **kwargs):
        original_ddp_init(self, *args, **kwargs)
        recorder.data["ddp_models"] += 1
        recorder.ddp_models.append(self)
        # Taken now: parameters added to the model after the wrap are not synchronised.
        ignored = getattr(self, "parameters_to_ignore", set())
        recorder.ddp_param_ids.update(id(p) for name, p in self.module.named_parameters() if name not in ignored)

    dist.init_process_group = init_process_group
    torch.nn.parallel.DistributedDataParallel.__init__ = ddp_init


def patch_files(recorder: Recorder) -> None:
    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            path = os.path.abspath(f).removesuffix(".ddpify-partial")  # (rank 0's save, renamed over the path)
            recorder.data["saves"].append({"path": path, "site": recorder.user_site()})
        return _original_save(obj, f, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(flag in mode for flag in WRITE_MODES):
            site = recorder.user_site()
            if site is not None:
                recorder.data["written_files"].append({"path": os.path.abspath(file), "site": site})
        return _original_open(file, mode, *args, **kwargs)

    torch.save = save
    builtins.open = open_


def patch_batchnorm(recorder: Recorder) -> None:
    """Note BatchNorm layers that normalise with batch statistics: each process then uses its
    own part of the batch (as DataParallel's replicas did), which one process cannot match.
    SyncBatchNorm has its own forward and is not counted."""
    original_forward = _BatchNorm.forward
    # --equivalence with BatchNorm: both runs normalise with the running statistics (a fixed
    # transform), so one process and N processes compute the same thing.
    running_stats_only = os.environ.get("DDPIFY_PROBE_BN_EVAL") == "1"

    def forward(self, input):
        if self.training or self.running_mean is None:
            recorder.batch_stat_layers.add(id(self))
        if running_stats_only and self.training and self.running_mean is not None:
            self.training = False
            try:
                return original_forward(self, input)
            finally:
                self.training = True
        return original_forward(self, input)

    _BatchNorm.forward = forward


DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def patch_dropout(recorder: Recorder) -> None:
    """Note Dropout that drops while training (a layer, or a functional call outside one);
    with ``DDPIFY_PROBE_NO_DROPOUT`` (``verify --equivalence``) make it the identity: one
    process draws the whole batch's masks from one stream, each rank its share's from its
    own, and no seed makes them alike."""
    import torch.nn.functional as F
    from torch.nn.modules import dropout as layers

    off = os.environ.get("DDPIFY_PROBE_NO_DROPOUT") == "1"
    inside_layer = [0]

    def layer_forward(original):
        def forward(self, *args, **kwargs):
            if self.training and getattr(self, "p", 0):
                recorder.dropout_layers.add(id(self))
                if off:
                    self.training = False
                    try:
                        return original(self, *args, **kwargs)
                    finally:
                        self.training = True
            inside_layer[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                inside_layer[0] -= 1

        return forward

    def functional(original):
        def dropout(input, p=0.5, training=True, inplace=False):
            if training and p and not inside_layer[0]:
                recorder.dropout_sites.add(recorder.user_site(depth=2) or original.__name__)
            if training and p and off:
                training = False
            return original(input, p, training, inplace)

        return dropout

    for cls in vars(layers).values():
        if isinstance(cls, type) and issubclass(cls, layers._DropoutNd) and "forward" in vars(cls):
            cls.forward = layer_forward(cls.forward)
    for name in DROPOUT_FUNCTIONS:
        if hasattr(F, name):
            setattr(F, name, functional(getattr(F, name)))


class RecordingStream:
    """Wraps sys.stdout / sys.stderr: passes everything through, notes the user line behind it."""

    def __init__(self, stream, name: str, recorder: Recorder, tag: str = "") -> None:
        self._stream, self._name, self._recorder = stream, name, recorder
        self._tag, self._line_start, self._pending = tag, True, []

    def write(self, text):
        self._recorder.output(self._name, text)
        if not self._tag or not text:
            return self._stream.write(text)
        for piece in text.splitlines(keepends=True):
            if self._line_start:
                self._pending.append(self._tag)
            self._pending.append(piece)
            self._line_start = piece.endswith("\n")
        if self._line_start:
            self._emit()
        return len(text)

    def flush(self):
        self._emit()
        return self._stream.flush()

    def _emit(self) -> None:
        # One write per whole line: the ranks share torchrun's pipe unbuffered, and print()'s
        # text and its newline written apart interleave with the other rank's line.
        if self._pending:
            self._stream.write("".join(self._pending))
            self._pending.clear()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _line_tag(label: str) -> str:
    """``[converted rank 1] `` under a launcher, ``[original] `` for one plain process."""
    if not label:
        return ""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
    return f"[{label} rank {rank}] " if rank is not None else f"[{label}] "


def seed(value: str | None) -> None:
    if value is not None:
        torch.manual_seed(int(value))
        random.seed(int(value))


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m ddpify.verify.probe SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    user_dirs = [os.path.dirname(os.path.abspath(script))]
    if os.environ.get("DDPIFY_PROBE_PATH"):
        user_dirs.insert(0, os.environ["DDPIFY_PROBE_PATH"])
    sys.path[:0] = user_dirs
    max_steps = os.environ.get("DDPIFY_PROBE_MAX_STEPS")
    recorder = Recorder(script, user_dirs)
    recorder.max_steps = int(max_steps) if max_steps else None
    patch_optimizers(recorder)
    patch_samplers(recorder, bool(os.environ.get("DDPIFY_PROBE_NO_SHUFFLE")))
    patch_shard_samplers(recorder)
    patch_distributed(recorder)
    patch_files(recorder)
    patch_batchnorm(recorder)
    patch_dropout(recorder)
    seed(os.environ.get("DDPIFY_PROBE_SEED"))
    tag = _line_tag(os.environ.get("DDPIFY_PROBE_TAG", ""))
    sys.stdout = RecordingStream(sys.stdout, "stdout", recorder, tag)
    sys.stderr = RecordingStream(sys.stderr, "stderr", recorder, tag)
    status, error = 0, None
    try:
        runpy.run_path(script, run_name="__main__")
    except StopTraining:
        recorder.data["stopped_at_max_steps"] = True
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        error = None if status == 0 else str(stop.code)
    except BaseException:
        status, error = 1, traceback.format_exc(limit=-3)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()  # a stop at --max-steps skipped the script's clean-up
        sys.stdout.flush()  # a last line without its newline still shows
        sys.stderr.flush()
        recorder.finish(status, error)
    raise SystemExit(status)


if __name__ == "__main__":
    main()

