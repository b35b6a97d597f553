"""The distributed set-up that ddpify inlines into every converted script.

This is real, tested Python (tests/test_template.py imports and runs it). ddpify copies
the code between the ``ddpify:begin`` and ``ddpify:end`` marker lines into the converted
script, right after its imports, and schedules the imports below for it; the converted
script never imports ddpify.

Names here are prefixed ``ddp_`` so that they cannot be mistaken for the user's own; the
converter refuses a file that already binds one of them to something else.
"""

import atexit
import contextlib
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# ddpify:begin
# Distributed set-up added by ddpify. Launch with
#   torchrun --standalone --nproc-per-node=N this_script.py
# or with srun under Slurm; plain `python this_script.py` starts one process per visible GPU
# (DDPIFY_NO_RELAUNCH=1: just one), and without GPUs runs as a world of one.


def ddp_setup():
    """Join the process group that torchrun or Slurm describes, or form a world of one."""
    if dist.is_initialized():
        return
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env["SLURM_NTASKS"]
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        env.setdefault("MASTER_ADDR", ddp_first_slurm_host(env["SLURM_NODELIST"]))
        env.setdefault("MASTER_PORT", "29500")
    launched = "RANK" in env
    if not launched:
        ddp_relaunch()  # ddpify:relaunch
    env.setdefault("LOCAL_RANK", "0")
    if torch.cuda.is_available():
        # Before any other CUDA work, so that this process never touches another GPU.
        # Modulo the visible count: Slurm may bind one GPU per task (each sees device 0).
        torch.cuda.set_device(int(env["LOCAL_RANK"]) % torch.cuda.device_count())
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if launched:
        dist.init_process_group(backend)
    else:
        # No launcher: an in-process store makes a world of one without any port.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    atexit.register(ddp_cleanup)  # also after an uncaught exception
    if dist.get_rank() != 0:
        # Info and debug records and Python warnings would repeat rank 0's; errors still show.
        logging.disable(logging.INFO)
        import warnings  # here: the script may bind these names to something else

        warnings.simplefilter("ignore")
    if dist.get_world_size() > 1:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        ddp_share_random_state()
        register_optimizer_step_post_hook(ddp_check_in_sync)
        register_optimizer_step_post_hook(ddp_split_random_streams)


def ddp_share_random_state():
    """Every rank starts from rank 0's random state, so that unseeded draws before training
    (splits, permutations, initial weights) agree; a script's own seeding then acts the
    same on every rank."""
    import random
    import sys

    torch.set_rng_state(ddp_from_rank_zero(torch.get_rng_state()))
    version, words, gauss = random.getstate()
    random.setstate((version, tuple(ddp_from_rank_zero(torch.tensor(words)).tolist()), gauss))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, cached = numpy.random.get_state()
        shared = ddp_from_rank_zero(torch.tensor([*keys.tolist(), position], dtype=torch.int64)).tolist()
        numpy.random.set_state((kind, numpy.array(shared[:-1], dtype=numpy.uint32), shared[-1], has_gauss, cached))


def ddp_from_rank_zero(tensor):
    """Rank 0's copy of a CPU tensor, on every rank (through this process's device)."""
    shared = tensor.to(ddp_device())
    dist.broadcast(shared, src=0)
    return shared.cpu()


def ddp_split_random_streams(optimizer, args, kwargs):
    """Once training runs, each rank draws its own numbers (noise, dropout, augmentation),
    as the one data-parallel process drew different ones for each part of the batch."""
    if dist.get_rank() != 0 and not getattr(ddp_split_random_streams, "done", False):
        import random
        import sys

        seed = torch.initial_seed() + dist.get_rank()
        torch.manual_seed(seed)
        random.seed(seed)
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed(seed % 2**32)
    ddp_split_random_streams.done = True


def ddp_check_in_sync(optimizer, args, kwargs):
    """After an optimizer's first step, stop unless every rank holds the same weights.

    Under DistributedDataParallel they are identical; if they differ, part of the model is
    trained outside DDP (a wrap that did not run, a model changed after the wrap) and the
    ranks would silently train different models.
    """
    if getattr(optimizer, "ddp_checked", False):
        return
    optimizer.ddp_checked = True
    with torch.no_grad():
        values = [float(group.get("lr", 0.0)) for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            values += [float(p.double().sum()) for p in group["params"] if p.requires_grad]
    for sizes in ([float(len(values))], values):
        local = torch.tensor(sizes, dtype=torch.float64, device=ddp_device())
        both = torch.cat([local, -local])
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        highest, lowest = both[: len(sizes)], -both[len(sizes) :]
        if not torch.allclose(highest, lowest, rtol=1e-6, atol=1e-7, equal_nan=True):
            raise RuntimeError(
                "the ranks hold different weights after the first optimizer step: part of the "
                "model is trained outside DistributedDataParallel (a wrap that did not run on "
                "every rank, a model changed after it was wrapped, or gradients DDP does not "
                "all-reduce)"
            )


def ddp_sampler(loader):
    """The training loader's DistributedSampler (for set_epoch); stops if the loader does
    not shard, which would have every rank train on all the data."""
    if not isinstance(loader.sampler, torch.utils.data.distributed.DistributedSampler):
        raise RuntimeError(
            f"the training loader samples with {type(loader.sampler).__name__}, not a "
            "DistributedSampler: every rank would train on all the data"
        )
    return loader.sampler


def ddp_next_epoch(loader):
    """A pass over the training loader whose epoch loop is out of sight (another module
    calls the pass): each pass moves its sampler to the next epoch, counting from 0."""
    sampler = ddp_sampler(loader)
    passes = getattr(sampler, "ddp_passes", 0)
    sampler.set_epoch(passes)
    sampler.ddp_passes = passes + 1


def ddp_relaunch():
    """Plain `python train.py` on a machine with several GPUs: run again under torchrun, one
    process per GPU, as the data-parallel script used them all; exit with its status. DDPIFY_NO_RELAUNCH=1
    turns this off; DDPIFY_NPROC=N forces N processes."""
    count = int(os.environ.get("DDPIFY_NPROC", "0")) or torch.cuda.device_count()
    if count < 2 or os.environ.get("DDPIFY_NO_RELAUNCH", "0") not in ("", "0"):
        return
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={count}"]
    raise SystemExit(subprocess.call([*command, *sys.argv]))


def ddp_first_slurm_host(nodelist):
    """The first host of a Slurm node list: "gpu[03-05,09],cpu1" -> "gpu03"."""
    head, bracket, rest = nodelist.partition("[")
    if "," in head or not bracket:
        return head.split(",")[0]
    first = rest.split("]", 1)[0].split(",")[0].split("-")[0]
    suffix = rest.split("]", 1)[1].split(",")[0]
    return head + first + suffix


def ddp_cleanup():
    """Leave the process group; harmless when set-up never ran."""
    if dist.is_initialized():
        dist.destroy_process_group()


def ddp_device():
    """This process's device: the GPU that ddp_setup selected, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def ddp_device_ids():
    """``device_ids`` for DistributedDataParallel: this process's GPU, or None on the CPU."""
    return [torch.cuda.current_device()] if torch.cuda.is_available() else None


def ddp_wrap(module, **options):
    """DistributedDataParallel around a module on this process's device. A module with
    nothing to train (a frozen loss network) is only moved there: DDP refuses it; so is
    every module in a process that set up no group (a project script left as it was)."""
    module = module.to(ddp_device())
    if not any(parameter.requires_grad for parameter in module.parameters()) or not dist.is_initialized():
        return module
    return DistributedDataParallel(module, device_ids=ddp_device_ids(), **options)


def ddp_local_batch_size(global_batch_size):
    """The data-parallel batch size was global: give each process its share of it."""
    world_size = dist.get_world_size()
    if global_batch_size % world_size:
        raise SystemExit(
            f"batch size {global_batch_size} does not divide evenly among {world_size} "
            "processes: launch a number of processes that divides it"
        )
    return global_batch_size // world_size


def ddp_mean(value):
    """The mean of a loss over all processes, for printing: every process must call it.

    Tensors and numbers are averaged on this process's device (NCCL has no CPU path);
    anything else (a meter object, a list) is returned as it is: this rank's own value.
    """
    if torch.is_tensor(value):
        total = value.detach().to(ddp_device(), copy=True)
        dist.all_reduce(total)
        return (total / dist.get_world_size()).to(value.device)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return value
    total = torch.tensor(float(value), dtype=torch.float64, device=ddp_device())
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def ddp_no_sync(model, accumulating):
    """``model.no_sync()`` while gradients only accumulate; nothing when they must be
    synchronised or when the model is not DistributedDataParallel (a world of one)."""
    if accumulating and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def ddp_rank():
    """This process's rank; 0 in a process that set up no group (a script of the project
    that imports this module and was not converted runs as before, on one device)."""
    return dist.get_rank() if dist.is_initialized() else 0


def ddp_world_size():
    """The number of processes; 1 in a process that set up no group."""
    return dist.get_world_size() if dist.is_initialized() else 1


class DdpNoOp:
    """Stands in for a rank-0-only object (SummaryWriter, wandb run, log file) on the others:
    every attribute and call does nothing, so code that every rank runs may use it."""

    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())


# ddpify:end
