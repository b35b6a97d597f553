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
# Distributed set-up added by ddpify. Launch with torchrun --standalone --nproc-per-node=N
# or srun; plain `python` starts one process per visible GPU (DDPIFY_NO_RELAUNCH=1: just one).


def ddp_setup():
    """Join the process group that torchrun or Slurm describes, or form a world of one."""
    if dist.is_initialized():
        return
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=env["SLURM_NTASKS"], LOCAL_RANK=env.get("SLURM_LOCALID", "0"))
        env.setdefault("MASTER_ADDR", ddp_first_slurm_host(env["SLURM_NODELIST"]))
        env.setdefault("MASTER_PORT", "29500")
    ddp_relaunch()  # ddpify:relaunch
    if torch.cuda.is_available():  # before any other CUDA work; Slurm may bind one GPU per task
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in env:
        dist.init_process_group(backend)
    else:  # no launcher: a world of one, with no port
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    atexit.register(ddp_cleanup)  # also after an uncaught exception
    if dist.get_rank() != 0:  # logging and warnings from rank 0 only; errors still show
        import warnings  # here: the script may bind the name to something else

        logging.disable(logging.INFO)
        warnings.simplefilter("ignore")
    if dist.get_world_size() > 1:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        ddp_share_random_state()
        register_optimizer_step_post_hook(ddp_after_step)


def ddp_share_random_state():
    """Every rank starts from rank 0's random state: unseeded draws before training agree."""
    import random
    import sys

    numpy = sys.modules.get("numpy")
    states = [torch.get_rng_state(), random.getstate(), numpy and numpy.random.get_state()]
    dist.broadcast_object_list(states, src=0)
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    if numpy is not None:
        numpy.random.set_state(states[2])


def ddp_after_step(optimizer, args, kwargs):
    """After an optimizer's steps 1, 2, 4, 8, ...: stop unless every rank holds the same weights
    and learning rates (a part trained outside DDP, a decision one rank took alone). After the
    first, each rank draws its own noise, dropout and augmentation."""
    optimizer.ddp_steps = steps = getattr(optimizer, "ddp_steps", 0) + 1
    if steps & (steps - 1):
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    learning_rates = sum((i + 1) * float(group.get("lr", 0.0)) for i, group in enumerate(optimizer.param_groups))
    fingerprint = [len(params), learning_rates, 0.0, 0.0]
    with torch.no_grad():  # sums of squares too: a drift that keeps every sum (a softmax head) shows there
        for i, p in enumerate(params):
            fingerprint[2] += (i + 1) * float(p.double().sum())
            fingerprint[3] += (i + 1) * float(p.double().square().sum())
    local = torch.tensor(fingerprint, dtype=torch.float64, device=ddp_device())
    both = torch.cat([local, -local])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)  # every rank's largest and smallest
    if not torch.allclose(both[:4], -both[4:], rtol=1e-6, atol=1e-7, equal_nan=True):
        raise RuntimeError(
            f"the ranks hold different weights or learning rates after optimizer step {steps}: part of the "
            "model is trained outside DistributedDataParallel (a wrap that did not run on every rank, a model "
            "changed after it was wrapped), or one rank decided alone (a learning rate set from its own loss)"
        )
    if dist.get_rank() != 0 and not getattr(ddp_after_step, "split", False):
        import random
        import sys

        seed = torch.initial_seed() + dist.get_rank()
        torch.manual_seed(seed)
        random.seed(seed)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(seed % 2**32)
    ddp_after_step.split = True


def ddp_sampler(loader):
    """The training loader's DistributedSampler (for set_epoch); stops if it does not shard."""
    if not isinstance(loader.sampler, torch.utils.data.distributed.DistributedSampler):
        raise RuntimeError(
            f"the training loader samples with {type(loader.sampler).__name__}, not a "
            "DistributedSampler: every rank would train on all the data"
        )
    return loader.sampler


def ddp_next_epoch(loader):
    """A pass whose epoch loop is out of sight: each pass moves the sampler on, from 0."""
    sampler = ddp_sampler(loader)
    sampler.set_epoch(getattr(sampler, "ddp_passes", 0))
    sampler.ddp_passes = sampler.epoch + 1


def ddp_relaunch():
    """Plain `python` with several GPUs: run again under torchrun, one process per GPU."""
    count = int(os.environ.get("DDPIFY_NPROC", "0")) or torch.cuda.device_count()
    if "RANK" in os.environ or count < 2 or os.environ.get("DDPIFY_NO_RELAUNCH", "0") not in ("", "0"):
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
    inside, _, after = rest.partition("]")
    return head + inside.split(",")[0].split("-")[0] + after.split(",")[0]


def ddp_cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()


def ddp_device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def ddp_device_ids():
    return [torch.cuda.current_device()] if torch.cuda.is_available() else None


def ddp_wrap(module, **options):
    """DDP on this process's device; a module with nothing to train (DDP refuses it), or any
    module in a process with no group, is only moved there."""
    module = module.to(ddp_device())
    if dist.is_initialized() and any(parameter.requires_grad for parameter in module.parameters()):
        module = DistributedDataParallel(module, device_ids=ddp_device_ids(), **options)
    return module


def ddp_local_batch_size(global_batch_size):
    """DataParallel's batch size was global: each process loads its share."""
    world_size = dist.get_world_size()
    if global_batch_size % world_size:
        raise SystemExit(f"batch size {global_batch_size} does not divide evenly among {world_size} processes")
    return global_batch_size // world_size


def ddp_mean(value):
    """The mean over all processes of a number or tensor (every process calls it); anything
    else (a meter) is this rank's own. Reduced on this process's device: NCCL has no CPU path."""
    if torch.is_tensor(value):
        total = value.detach().to(ddp_device(), copy=True)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        total = torch.tensor(float(value), dtype=torch.float64, device=ddp_device())
    else:
        return value
    dist.all_reduce(total)
    mean = total / dist.get_world_size()
    return mean.to(value.device) if torch.is_tensor(value) else mean.item()


def ddp_no_sync(model, accumulating):
    """``model.no_sync()`` while gradients only accumulate, on a DDP model."""
    return model.no_sync() if accumulating and hasattr(model, "no_sync") else contextlib.nullcontext()


def ddp_rank():
    """0 in a process with no group (a project script left as it was)."""
    return dist.get_rank() if dist.is_initialized() else 0


def ddp_world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


class DdpNoOp:
    """Stands in for a rank-0-only object (writer, tracker, log file) on the other ranks."""

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
