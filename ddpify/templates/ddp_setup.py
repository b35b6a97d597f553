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
import re

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

# ddpify:begin
# Distributed set-up added by ddpify: launch with torchrun or srun; plain `python` uses every GPU.


def ddp_setup():
    """Join the process group of torchrun or srun, or form a world of one."""
    import atexit, functools, logging, subprocess, sys, warnings  # noqa: E401 (here: the script may bind these names)

    env = os.environ
    if dist.is_initialized():
        return
    if torch.multiprocessing.parent_process() is not None:  # a DataLoader worker importing the script
        return dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if "RANK" not in env and "SLURM_PROCID" in env:  # srun
        env.update(RANK=env["SLURM_PROCID"], WORLD_SIZE=env["SLURM_NTASKS"], LOCAL_RANK=env.get("SLURM_LOCALID", "0"))
        env.setdefault("MASTER_ADDR", ddp_first_slurm_host(env["SLURM_NODELIST"]))
        env.setdefault("MASTER_PORT", "29500")
    # plain `python` with several GPUs: run again under torchrun (DDPIFY_NO_RELAUNCH=1: a world of one)  # ddpify:ddp_relaunch
    count = int(env.get("DDPIFY_NPROC", "0")) or torch.cuda.device_count()  # ddpify:ddp_relaunch
    if "RANK" not in env and count > 1 and env.get("DDPIFY_NO_RELAUNCH", "0") in ("", "0"):  # ddpify:ddp_relaunch
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={count}"]  # ddpify:ddp_relaunch
        raise SystemExit(subprocess.call([*run, *sys.argv]))  # ddpify:ddp_relaunch
    if torch.cuda.is_available():  # before any other CUDA work; Slurm may bind one GPU per task
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    one = {} if "RANK" in env else dict(store=dist.HashStore(), rank=0, world_size=1)  # no launcher: a world of one
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", **one)
    atexit.register(ddp_exit)  # also after an error
    if dist.get_rank() != 0:  # output from rank 0 only (prints, tqdm, logging, warnings); errors still show
        sys.stdout = open(os.devnull, "w")
        env["TQDM_DISABLE"] = "1"  # tqdm imported from now on
        logging.disable(logging.WARNING)
        logging.FileHandler.__init__ = functools.partialmethod(logging.FileHandler.__init__, delay=True)
        warnings.simplefilter("ignore")
        if "tqdm.std" in sys.modules:  # imported already: its bars are made disabled
            bar = sys.modules["tqdm.std"].tqdm
            bar.__init__ = functools.partialmethod(bar.__init__, disable=True)
    if dist.get_rank() == 0 and dist.get_world_size() > 1:  # ddpify:ddp_atomic_saves
        ddp_atomic_saves()  # ddpify:ddp_atomic_saves
    ddp_share_random_state()  # ddpify:ddp_share_random_state
    ddp_self_check()  # ddpify:ddp_self_check


def ddp_exit():
    """Leave the process group at exit. On gloo the ranks first wait for each other (five
    minutes at most): a rank that tears down its connections while another still holds
    DDP's reducer aborts that one after training finished ("terminate called without an
    active exception", exit -6). Not after an error: the other ranks may never arrive."""
    import datetime, sys  # noqa: E401

    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo" and dist.get_world_size() > 1 and not hasattr(sys, "last_value"):
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(minutes=5))
        except RuntimeError:  # a rank that left early or failed: leave all the same
            pass
    dist.destroy_process_group()


def ddp_share_random_state():
    """Every rank starts from rank 0's random state: unseeded draws before training agree.
    After the first optimizer step the other ranks draw their own dropout and noise from
    torch, as DataParallel's replicas did for their own samples. Python's and numpy's
    generators stay alike on every rank: a dataset built each epoch that shuffles its list
    with them (pytorch-0.4-yolov3) must give every rank the same order to take its share of;
    what the data loading draws is each rank's own (ddp_own_data_draws)."""
    import atexit
    import random
    import sys

    from torch.optim.optimizer import register_optimizer_step_post_hook

    if dist.get_world_size() == 1:
        return
    numpy = sys.modules.get("numpy")
    states = ddp_from_rank_zero([torch.get_rng_state(), random.getstate(), numpy and numpy.random.get_state()])
    torch.set_rng_state(states[0])
    random.setstate(states[1])
    if numpy is not None:
        numpy.random.set_state(states[2])

    def split(optimizer, args, kwargs):  # once (a hook cannot remove itself while hooks run)
        if dist.get_rank() != 0 and not split.done:
            torch.manual_seed(torch.initial_seed() + dist.get_rank())
        split.done = True

    split.done = False
    atexit.register(register_optimizer_step_post_hook(split).remove)  # a hook held past exit keeps the script's open files unflushed
    ddp_own_data_draws()


def ddp_own_data_draws():
    """Random draws of the data loading are each rank's own, as each of DataParallel's batches
    drew its samples' once: DataLoader workers are seeded per rank, and a dataset read in this
    process (num_workers=0) draws from this rank's Python and numpy streams while the script's
    own draws stay alike (VDNet's dataset picks each sample with `random`, whatever the index:
    alike, every rank would train on the same samples)."""
    import random
    import sys

    from torch.utils.data import dataloader as loading

    rank, own = dist.get_rank(), {}
    begin, fetch = loading._BaseDataLoaderIter.__init__, loading._SingleProcessDataLoaderIter._next_data

    def sharded(sampler):
        """Does this sampler give the rank its own share? (a loader every rank reads whole, an
        evaluation, draws alike: CSPN's validation masks, drawn per rank, gave each rank its own
        error and its own learning-rate cuts)"""
        while sampler is not None:
            if getattr(sampler, "ddp_own_share", False) or hasattr(sampler, "num_replicas") and hasattr(sampler, "rank"):
                return True  # (torch's distributed sampler, or one made like it)
            sampler = getattr(sampler, "sampler", None)
        return False

    alike = torch.Generator()
    alike.set_state(torch.get_rng_state())  # rank 0's, on every rank (ddp_share_random_state)
    torch_alike = [torch.get_rng_state()]

    def seeded_per_rank(self, loader):
        begin(self, loader)
        self.ddp_own_draws = sharded(loader.batch_sampler) or sharded(loader.sampler)
        if self.ddp_own_draws:
            self._base_seed += rank  # each worker seeds torch, random and numpy from it
        else:  # (torch's own stream is split per rank after the first step)
            self._base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=alike))

    def fetched_alike(self):
        """A loader read whole in this process: torch draws from a stream alike on every rank
        (Python's and numpy's are the script's, alike already)."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(torch_alike[0])
            try:
                return fetch(self)
            finally:
                torch_alike[0] = torch.get_rng_state()

    def fetched_per_rank(self):
        if not getattr(self, "ddp_own_draws", True):
            return fetched_alike(self)
        numpy = sys.modules.get("numpy")
        shared = random.getstate(), numpy and numpy.random.get_state()
        if not own:  # from the script's state at the first fetch (seeded runs repeat)
            random.seed(hash(shared[0]) + rank)
            numpy and numpy.random.seed((hash(shared[0]) + rank) % 2**32)
        else:
            random.setstate(own["random"])
            numpy and own["numpy"] is not None and numpy.random.set_state(own["numpy"])
        try:
            return fetch(self)
        finally:
            own.update(random=random.getstate(), numpy=numpy and numpy.random.get_state())
            random.setstate(shared[0])
            numpy and numpy.random.set_state(shared[1])

    loading._BaseDataLoaderIter.__init__, loading._SingleProcessDataLoaderIter._next_data = seeded_per_rank, fetched_per_rank
    ddp_orders_alike()


def ddp_orders_alike():
    """A shuffling sampler no rank shards (an evaluation loader every rank reads whole) draws
    the same order on every rank: from torch's stream, split per rank after the first step,
    each rank would sum its metric in another order (MonoDepth's best-model test then differed
    by a rounding, one rank saved and waited at the barrier while the other trained on)."""
    import copy

    from torch.utils.data import sampler as sampling

    alike = torch.Generator()
    alike.set_state(torch.get_rng_state())  # rank 0's, on every rank (ddp_share_random_state)

    def drawn_alike(iterate):
        def __iter__(self):
            if self.generator is not None:
                return iterate(self)
            seeded = copy.copy(self)
            seeded.generator = torch.Generator().manual_seed(int(torch.randint(2**62, (), generator=alike)))
            return iterate(seeded)

        return __iter__

    for kind in (sampling.RandomSampler, sampling.SubsetRandomSampler, sampling.WeightedRandomSampler):
        kind.__iter__ = drawn_alike(kind.__iter__)


def ddp_atomic_saves():
    """Rank 0's torch.save to a path writes a temporary file and renames it over the path:
    another rank still reading the previous file there (Crossformer reloads its best model on
    every rank, then rank 0 saves it again to the same path) keeps reading a whole file."""
    save = torch.save

    def saved_whole(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)):
            return save(obj, f, *args, **kwargs)  # a file object: written as it is
        partial = f"{os.fspath(f)}.ddpify-partial"
        save(obj, partial, *args, **kwargs)
        os.replace(partial, f)

    torch.save = saved_whole


def ddp_from_rank_zero(value):
    """Rank 0's `value` on every rank, pickled into a byte tensor (broadcast_object_list
    would need numpy, which torch does not require)."""
    import pickle

    device = ddp_device()
    mine = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
    size = torch.tensor([mine.numel()], device=device)
    dist.broadcast(size, src=0)
    shared = mine.to(device) if dist.get_rank() == 0 else torch.empty(int(size), dtype=torch.uint8, device=device)
    dist.broadcast(shared, src=0)
    return pickle.loads(bytes(shared.cpu().tolist()))


def ddp_self_check():
    """After each optimizer's steps 1, 2, 4, 8, ...: stop unless every rank holds the same
    weights and learning rates."""
    if dist.get_world_size() > 1:
        import atexit

        from torch.optim.optimizer import register_optimizer_step_post_hook

        atexit.register(register_optimizer_step_post_hook(ddp_after_step).remove)


def ddp_after_step(optimizer, args, kwargs):
    """Stop if a part is trained outside DDP or one rank took a decision alone."""
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


def ddp_sampler(loader):
    """The training loader's DistributedSampler (for set_epoch); stops if it does not shard.
    A generator over the loader (pytorch-template's endless ``inf_loop(data_loader)``): the
    sampler of the loader it was handed."""
    if not hasattr(loader, "sampler") and getattr(loader, "gi_frame", None) is not None:
        loader = next((held for held in loader.gi_frame.f_locals.values() if hasattr(held, "sampler")), loader)
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


class DdpNextEpochSampler(DistributedSampler):
    """A DistributedSampler whose epoch loop is out of sight (a project's trainer): each
    pass is the next epoch, reshuffled; an explicit set_epoch still decides."""

    def __iter__(self):
        order = super().__iter__()
        self.set_epoch(self.epoch + 1)
        return order


def ddp_shard(loader, global_batch=True, whole_batches=False, everywhere=False):
    """A training DataLoader rebuilt once with each rank drawing its share of every epoch
    (DataParallel's global batch kept, unless global_batch=False); each pass is the next epoch.
    Anything else the loop draws batches from is split batch by batch (DdpSplit).
    ``whole_batches``: every rank draws the same whole batches (the model's calls split them).
    ``everywhere``: rebuilt in a world of one too (a builder's loader whose callers call
    ``loader.sampler.set_epoch``)."""
    if dist.get_world_size() == 1 and not everywhere or getattr(loader, "ddp_sharded", False) or ddp_iterates_a_shard(loader):
        return loader
    if isinstance(getattr(loader, "sampler", None), DistributedSampler):
        # sharded where it was built (another module's loader: WoodScape's trainers): each pass that
        # nothing moved to another epoch is the next one
        if getattr(loader, "ddp_epochs", None) is None:
            loader.ddp_epochs = DdpEpochs(loader)
        return loader.ddp_epochs
    # rebuilt once per object, kept on it: the shard lives as long as what it shards (an iterator
    # made each epoch, and its workers, are let go with it); a list or a generator, which
    # take no attributes, is split anew on each call
    kept = "ddp_whole_batches" if whole_batches else "ddp_shard_made"
    made = getattr(loader, kept, None)
    if made is None:
        made = ddp_rebuilt(loader, global_batch, whole_batches)
        try:
            setattr(loader, kept, made)
        except (AttributeError, TypeError):
            pass
    return made


def ddp_own_collate(loader):
    """A collate function of the script's own (not torch's default one)."""
    collate = getattr(loader, "collate_fn", None)
    return collate is not None and getattr(collate, "__module__", "").split(".")[0] != "torch"


def ddp_iterates_a_shard(source):
    """An iterator of a DataLoader that is sharded already (its DistributedSampler, or this
    shard's own): its batches are this rank's share (WassersteinGAN's `data_iter =
    iter(dataloader)`, drawn by `data_iter.next()`: a second split kept half of each share)."""
    if not hasattr(source, "__next__"):  # (a DataLoader has an `_index_sampler` too)
        return False
    index = getattr(source, "_index_sampler", None)  # (torch's DataLoader iterators hold the loader's)
    return any(
        isinstance(sampler, DistributedSampler) or type(sampler).__name__ == "DdpShard"
        for sampler in (index, getattr(index, "sampler", None))
    )


def ddp_rebuilt(loader, global_batch, whole_batches=False):
    """The loader with its sampler (or each batch of its batch sampler) split across the ranks,
    or with ``whole_batches`` drawn alike and whole on every rank."""
    import functools
    import inspect

    from torch.utils.data import BatchSampler, DataLoader, IterableDataset

    inner = getattr(loader, "iterable", None)
    if type(loader).__module__.split(".")[0] == "tqdm" and isinstance(inner, DataLoader):
        # a tqdm bar over a DataLoader (made by a helper out of sight: AttGAN's `progressbar(loader)`):
        # the loader under it is sharded, so each rank loads only its share; the bar shows its length
        loader.iterable = ddp_shard(inner, global_batch, whole_batches)
        loader.total = len(loader.iterable)
        return loader
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        # not a DataLoader (a list of batches, a generator, a project's own loader class, a
        # stream): every rank draws its batches alike, and takes its share of each (or, with
        # whole_batches, all of it: IIC's `zip(*iterators)` before a loss over the whole batch)
        return DdpSplit(loader, whole=whole_batches)
    fixed = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
    options = {n: getattr(loader, n) for n in inspect.signature(DataLoader).parameters if n not in fixed and hasattr(loader, n)}
    batches, dataset = loader.batch_sampler, loader.dataset
    while not hasattr(batches, "__len__") and isinstance(getattr(batches, "sampler", None), BatchSampler):
        # an endless wrapper the loader's constructor puts around its batch sampler (timm's
        # MultiEpochsDataLoader's _RepeatSampler): rebuilt from the batch sampler inside, it wraps again
        batches = batches.sampler
    # a subclass whose constructor cannot be repeated (torch_geometric's DenseDataLoader): a copy
    # of it that samples its share, its own collate and iteration kept
    make = type(loader) if ddp_rebuildable(loader) else functools.partial(ddp_resampled, loader)
    if global_batch and not whole_batches and type(batches) is BatchSampler and batches.batch_size == 1 and ddp_own_collate(loader):
        # one item per step that the script's collate makes the step's batch (Conv-TasNet's items
        # are minibatches, `batch[0]` taken): DataParallel split that batch; every rank draws the
        # same item and takes its share (sharded by item, the global batch grew by the world size)
        return DdpSplit(loader)
    if whole_batches:
        rebuilt = make(dataset, batch_sampler=DdpShard(batches, dataset, per_batch=True, whole=True), **options)
    elif type(batches) is BatchSampler and (type(batches.sampler).__module__ == "torch.utils.data.sampler" or batches.batch_size == 1):
        shard = DdpShard(batches.sampler, dataset, per_batch=False, drop_last=batches.drop_last)
        # batch_size=1 of single samples (torch's collate): nothing to divide
        local = ddp_local_batch_size(batches.batch_size) if global_batch and batches.batch_size > 1 else batches.batch_size
        rebuilt = make(dataset, local, sampler=shard, drop_last=batches.drop_last, **options)
    elif batches is None:  # batch_size=None: one sample per step
        rebuilt = make(dataset, None, sampler=DdpShard(loader.sampler, dataset, per_batch=False), **options)
    else:  # the user's batch sampler, or the user's sampler batched here (ReID's identity sampler: P people,
        # K images each, in a row): each batch split across the ranks in DataParallel's contiguous parts
        if global_batch and type(batches) is BatchSampler:
            ddp_local_batch_size(batches.batch_size)  # (a batch that does not divide stops, as above)
        rebuilt = make(dataset, batch_sampler=DdpShard(batches, dataset, per_batch=global_batch), **options)
    rebuilt.ddp_sharded = True
    return rebuilt


class DdpEpochs:
    """A loader whose DistributedSampler was set where it was built, drawn by a loop that sets no
    epoch: a pass that begins at the epoch the last pass began at (nothing set it since) moves the
    sampler to the next epoch, so each pass reshuffles, as its DataParallel pass did."""

    def __init__(self, loader):
        self.loader, self.begun = loader, None

    def __iter__(self):
        sampler = self.loader.sampler
        if self.begun is not None and sampler.epoch == self.begun:
            sampler.set_epoch(sampler.epoch + 1)
        self.begun = sampler.epoch
        return iter(self.loader)

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):  # the loader's own attributes (`loader.dataset`)
        return getattr(self.loader, name)


class DdpSplit:
    """Batches from a source that is not a rebuildable DataLoader, drawn alike on every rank
    (its random generators swapped for a state shared by the ranks while it draws), each rank
    taking its share of every tensor's and array's first dimension (or DataParallel's `dim`), as DataParallel's scatter
    split each batch. A list is drawn anew on each pass; an iterator goes on where it was,
    and a pass that ran it to its end lets the next pass draw again (KernelGAT's loader
    rewinds itself after its StopIteration: one pass per epoch). ``whole``: every rank takes
    every batch whole (the model's calls split them: a loss that couples the batch)."""

    def __init__(self, source, whole=False):
        # each one made draws from its own seed (P4Transformer makes one per epoch, of a new
        # `log_every(loader)` generator: seeded alike, every epoch would replay the first)
        made = ddp_shard.__dict__["splits"] = ddp_shard.__dict__.get("splits", -1) + 1
        self.source, self.same, self.whole = source, DdpSameRandom(made), whole
        self.ddp_sharded = True
        self.ongoing = self.step = None
        if hasattr(source, "__next__") or (hasattr(source, "next") and not hasattr(source, "__iter__")):
            self.step = getattr(source, "__next__", None) or source.next  # ShuffleNet's .next()

    def __iter__(self):
        if self.step is None:
            draws = ddp_draw_by_draw(self.source, self.same)
        else:
            draws = self.ongoing = self.ongoing or self.drawing(self.step)
        return (self.share(item) for item in draws)

    def __next__(self):
        if self.ongoing is None:
            self.ongoing = self.drawing(self.step) if self.step else ddp_draw_by_draw(self.source, self.same)
        return self.share(next(self.ongoing))

    def share(self, item):
        return ddp_alike(item) if self.whole else ddp_batch_share(item)

    next = __next__  # Python 2's spelling, as the script calls it

    def drawing(self, step):
        while True:
            with self.same:
                try:
                    item = step()
                except StopIteration:
                    self.ongoing = None  # the next pass draws again
                    return
            yield item

    def __len__(self):
        return len(self.source)

    def __getattr__(self, name):  # the source's own attributes (`loader.dataset`)
        return getattr(self.source, name)


def ddp_alike(batch):
    """A batch every rank must hold whole and alike (the model's calls split it), checked: a
    dataset that draws from the OS (NTIRE2022_Inpainting's ``np.random.seed()`` in
    ``__getitem__``) gives each rank another batch, and the outputs gathered from the ranks
    would meet another rank's targets. Every rank sums up its batch the same way (kinds,
    shapes, an order-sensitive checksum of each tensor or array, a digest of anything else);
    where the sums differ, rank 0's whole batch is sent to every rank."""
    import pickle
    import zlib

    if dist.get_world_size() == 1:
        return batch
    parts = []
    for leaf in ddp_leaves(batch):
        values = leaf if torch.is_tensor(leaf) else None
        if values is None and type(leaf).__module__ == "numpy" and hasattr(leaf, "shape"):
            try:
                values = torch.as_tensor(leaf)
            except (TypeError, RuntimeError):  # (an array of objects)
                values = None
        if values is not None and values.dtype != torch.bool and not values.is_complex():
            flat = values.detach().reshape(-1).double()
            parts += [1.0, float(values.dim()), *map(float, values.shape), float(flat.sum()), float(flat.cumsum(0).sum()) if flat.numel() else 0.0]
        elif values is not None:
            parts += [2.0, float(zlib.crc32(values.detach().cpu().numpy().tobytes()))]
        else:
            parts += [3.0, float(zlib.crc32(pickle.dumps(leaf)))]
    summary = torch.tensor(parts, dtype=torch.float64, device=ddp_device())

    def alike(values):  # (the same on every rank: its highest and lowest across ranks agree)
        highest, lowest = values.clone(), values.clone()
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
        return torch.equal(highest, lowest)

    # (every rank makes the same collectives, whatever its batch holds)
    if alike(torch.tensor([float(summary.numel())], dtype=torch.float64, device=ddp_device())) and alike(summary):
        return batch
    devices = [leaf.device for leaf in ddp_leaves(batch) if torch.is_tensor(leaf)]
    sent = ddp_from_rank_zero(ddp_leaves(batch, lambda leaf: leaf.cpu() if torch.is_tensor(leaf) else leaf))
    return ddp_leaves(sent, lambda leaf: leaf.to(devices[0]) if torch.is_tensor(leaf) and devices else leaf)


def ddp_batch_share(batch):
    """This rank's share of a batch drawn whole (ddp_scatter); an object that carries its tensors
    as attributes (torchtext's Batch: `batch.src`, `batch.trg`) is opened too. None, or a tuple
    of Nones, is a source's end of pass (apex's and QuARE's prefetchers: `while data is not
    None`), drawn alike on every rank: handed on as it is, every rank stops alike. Any other
    batch with nothing to split stops the run: every rank would train on all of it."""
    if all(leaf is None for leaf in ddp_leaves(batch)):
        return batch
    if any(torch.is_tensor(leaf) or hasattr(leaf, "ndim") for leaf in ddp_leaves(batch)):
        return ddp_scatter(batch, each_one=True)
    fields = getattr(batch, "__dict__", {})
    if any(torch.is_tensor(leaf) for value in fields.values() for leaf in ddp_leaves(value)):
        import copy

        # (torchtext's fields may be time-major, `(tokens, lengths)` pairs: each tensor is cut
        # along the dimension as long as the batch, never along time)
        size = fields.get("batch_size")
        sizes = {leaf.shape[0] for value in fields.values() for leaf in ddp_leaves(value) if torch.is_tensor(leaf) and leaf.dim()}
        if not isinstance(size, int) and len(sizes) > 1:
            raise RuntimeError(
                f"a training batch ({type(batch).__name__}) holds tensors of first dimensions {sorted(sizes)}: which one is "
                "the batch is not known, so it cannot be split between the ranks; make the loop draw from a DataLoader"
            )
        share = copy.copy(batch)
        share.__dict__.update((name, ddp_leaves(value, lambda leaf: ddp_cut(leaf, size))) for name, value in fields.items())
        if isinstance(size, int):
            share.batch_size = len(ddp_part(range(size), dist.get_world_size(), dist.get_rank()))
        return share
    raise RuntimeError(
        f"a training batch ({type(batch).__name__}) holds no tensor or array to split between the ranks: every rank "
        "would train on all of it; make the loop draw from a DataLoader, or give each rank its share by hand"
    )


def ddp_cut(leaf, size=None):
    """This rank's share of a tensor of a batch of ``size`` samples, cut along its first
    dimension of that length (its first when the size is not known); anything else whole."""
    if not torch.is_tensor(leaf) or not leaf.dim():
        return leaf
    dims = [dim for dim in range(leaf.dim()) if leaf.shape[dim] == size] if size is not None else [0]
    if not dims:
        raise RuntimeError(f"a tensor of shape {tuple(leaf.shape)} in a batch of {size} samples has no batch dimension to split")
    parts = ddp_part(range(leaf.shape[dims[0]]), dist.get_world_size(), dist.get_rank())
    return leaf.narrow(dims[0], parts[0], len(parts))


def ddp_drawn(draw, *args, **kwargs):
    """A training batch the script draws itself (MusicTransformer's
    ``dataset.slide_seq2seq_batch(...)``), alike on every rank (Python's and numpy's random
    generators are alike on every rank, as the script seeded them; a draw from torch's, which
    each rank has of its own after the first step, is rank 0's: ddp_alike), then this rank's
    share of it, as DataParallel's scatter split it."""
    batch = draw(*args, **kwargs)
    if dist.get_world_size() == 1:
        return batch
    batch = ddp_alike(batch)
    return ddp_scatter(batch, samples=ddp_sample_lists(batch))


def ddp_sample_lists(item):
    """The lists (and tuples) in a drawn dict whose arrays are not as long as its own arrays
    (or differ in length among themselves): one item per sample (object_relation_transformer's
    ``gts``, each image's captions beside the rows of every caption), split as a sequence of
    samples, not array by array."""
    if not isinstance(item, dict):
        return frozenset()
    arrays = lambda values: [value for value in values if torch.is_tensor(value) or type(value).__module__ == "numpy"]
    rows = {len(value) for value in arrays(item.values()) if getattr(value, "ndim", 0)}
    return frozenset(
        id(value) for value in item.values() if isinstance(value, (list, tuple)) and arrays(value)
        and (len({len(part) for part in arrays(value)}) > 1 or not {len(part) for part in arrays(value)} <= rows)
    )


def ddp_scatter(item, each_one=False, samples=frozenset()):
    """This rank's share of a batch: every tensor (and numpy array) split along its first
    dimension, tuples, lists and dicts walked into (ddp_leaves), anything else whole, as
    DataParallel's scatter."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dim = getattr(dist, "ddp_scatter_dim", 0)  # (DataParallel's `dim`: LakhNES's time-major batches)

    def share(leaf):
        if torch.is_tensor(leaf) and leaf.is_sparse and leaf.dim() > dim:  # (tensor_split has no sparse form)
            size, larger = divmod(leaf.shape[dim], world)
            start = rank * size + min(rank, larger)
            return leaf.index_select(dim, torch.arange(start, start + size + (rank < larger), device=leaf.device))
        if each_one and torch.is_tensor(leaf) and leaf.dim() > dim and 0 < leaf.shape[dim] < world:
            # a drawn batch shorter than the world (a last batch of 1): each rank one of its samples,
            # as a batch sampler's share gives (an empty share would stop a forward: `pack_padded_sequence`)
            return leaf.narrow(dim, rank % leaf.shape[dim], 1)
        if torch.is_tensor(leaf):
            return leaf.tensor_split(world, dim)[rank] if leaf.dim() > dim else leaf
        if type(leaf).__module__ == "numpy" and getattr(leaf, "ndim", 0) > dim:
            import numpy

            return numpy.array_split(leaf, world, axis=dim)[rank]
        if id(leaf) in samples:  # (one item per sample: this rank's run of them)
            size, larger = divmod(len(leaf), world)
            start = rank * size + min(rank, larger)
            return type(leaf)(leaf[start:start + size + (rank < larger)])
        return leaf

    leaves = ddp_leaves(item, whole=samples)
    sizes = {leaf.shape[dim] for leaf in leaves if (torch.is_tensor(leaf) or type(leaf).__module__ == "numpy") and getattr(leaf, "ndim", 0) > dim}
    counts = {len(leaf) for leaf in leaves if id(leaf) in samples}
    if len(sizes) > 1 or any(size % count or count % world for size in sizes for count in counts):
        # (YOLO's targets: one row per box, not per image; a cut by rows would pair boxes with
        # another rank's images, which DataParallel did too and a single process never does)
        raise ValueError(f"ddp_scatter: the batch's tensors differ in length along dimension {dim} ({sorted(sizes | counts)}): "
                         "they cannot all be cut by sample; shard this loader with a DistributedSampler by hand")
    return ddp_leaves(item, share, whole=samples)


def ddp_resampled(loader, dataset, batch_size=None, sampler=None, batch_sampler=None, drop_last=False, **options):
    """A copy of ``loader`` that draws its batches from ``sampler`` (in batches of
    ``batch_size``) or ``batch_sampler``: what its constructor would have made of them."""
    import copy

    from torch.utils.data import BatchSampler

    if batch_sampler is None and batch_size is not None:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    copied = copy.copy(loader)
    fields = dict(batch_size=batch_size, drop_last=drop_last, batch_sampler=batch_sampler, _iterator=None)
    fields["sampler"] = sampler if sampler is not None else loader.sampler
    copied.__dict__.update(fields)  # (a DataLoader refuses to have these set once it is made)
    return copied


def ddp_rebuildable(loader):
    """torch's DataLoader, or a subclass whose constructor only passes its arguments on
    (deepspeech's and Conv-TasNet's AudioDataLoader, which set their collate_fn)."""
    import inspect

    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        return False
    kinds = {p.kind for p in list(inspect.signature(type(loader).__init__).parameters.values())[1:]}
    return type(loader) is DataLoader or kinds == {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}


class DdpShard(torch.utils.data.Sampler):
    """This rank's share of a sampler: every rank draws the same order (its random generators
    seeded by the epoch), then takes every world-size-th index (padded, so every rank takes
    as many steps), or of a batch sampler its part of each batch (ddp_part)."""

    def __init__(self, sampler, dataset, per_batch, whole=False, drop_last=False):
        self.sampler, self.dataset, self.per_batch, self.epoch, self.chosen = sampler, dataset, per_batch, 0, None
        self.drop_last = drop_last  # (the loader drops its last partial batch: the tail is dropped, not padded)
        self.whole = whole  # every rank keeps every batch whole (the model's calls split it)
        self.ddp_own_share = not whole  # (its loader's random draws are this rank's own: ddp_own_data_draws)

    def set_epoch(self, epoch):
        self.chosen = epoch

    def __iter__(self):
        passes = ddp_shard.__dict__.setdefault("passes", {})  # a loader built anew each epoch counts on
        self.epoch = passes.get(id(self.dataset), 0) if self.chosen is None else self.chosen
        passes[id(self.dataset)], self.chosen = self.epoch + 1, None
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(self.epoch)
        drawn = ddp_same_draw(self.sampler, self.epoch)
        world, rank = dist.get_world_size(), dist.get_rank()
        if self.whole:
            return map(list, drawn)
        if self.per_batch:
            return (ddp_part(batch, world, rank) for batch in map(list, drawn))
        try:
            # (an endless sampler may claim a length it never ends at: StyTR-2's
            # InfiniteSamplerWrapper says 2**31; piano_transcription's says -1: no padding)
            padded = 0 <= len(self.sampler) < 2**30
        except (TypeError, NotImplementedError, ValueError):
            padded = False
        if padded and self.drop_last:
            import itertools

            return ddp_every_nth(itertools.islice(drawn, len(self.sampler) // world * world), world, rank, False)
        return ddp_every_nth(drawn, world, rank, padded)

    def __len__(self):
        if self.per_batch:
            return len(self.sampler)
        world = dist.get_world_size()
        return len(self.sampler) // world if self.drop_last else -(-len(self.sampler) // world)


def ddp_part(batch, world, rank):
    """This rank's contiguous part of a batch, as DataParallel's scatter cut it (a batch
    sampler may arrange each batch for that cut: Multilingual_Text_to_Speech's language
    groups); a batch shorter than the world gives each rank one of its samples."""
    if len(batch) < world:  # (a slice: a tensor's or array's one row stays a tensor or array)
        return batch[rank % len(batch) : rank % len(batch) + 1] if len(batch) else batch
    size, larger = divmod(len(batch), world)
    start = rank * size + min(rank, larger)
    return batch[start : start + size + (rank < larger)]


def ddp_same_draw(sampler, epoch):
    """The sampler's draws, made alike on every rank, one at a time as the loop asks for them
    (a whole pass drawn ahead would be the loop's first wait: torchmeta's task sampler, drawn
    anew each step by `next(iter(loader))`; an index list over 80M samples)."""
    return ddp_draw_by_draw(sampler, DdpSameRandom(epoch))


def ddp_every_nth(drawn, world, rank, padded=True):
    """Every world-size-th of the draws, from this rank's on; padded as DistributedSampler pads
    (the first draws again), so every rank takes as many steps, where the pass ends."""
    first, count = [], 0
    for index in drawn:
        if len(first) < world:
            first.append(index)
        if count % world == rank:
            yield index
        count += 1
    end = count + (-count % world if padded else 0)
    for position in range(count, end):
        if position % world == rank and position - count < len(first):
            yield first[position - count]


def ddp_draw_by_draw(sampler, same):
    """The draws in rounds of 1, 2, 4, ... up to 4096 under the shared state: the first batch
    waits for a few draws only, and a long pass swaps the random states once per round."""
    with same:
        draws = iter(sampler)
    size = 1
    while True:
        with same:
            drawn = [item for _, item in zip(range(size), draws)]
        yield from drawn
        if len(drawn) < size:
            return
        size = min(2 * size, 4096)


class DdpSameRandom:
    """While entered, torch's (CPU), random's and numpy's generators run from a state seeded
    alike on every rank; the script's own states are put back on exit."""

    def __init__(self, seed):
        import random
        import sys

        numpy = sys.modules.get("numpy")
        self.generators = [(torch.get_rng_state, torch.set_rng_state), (random.getstate, random.setstate)]
        self.generators += [(numpy.random.get_state, numpy.random.set_state)] if numpy else []
        script = self.swap(None)
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if numpy:
            numpy.random.seed(seed)
        self.other = self.swap(script)

    def swap(self, states):
        saved = [get() for get, _ in self.generators]
        for (_, put), state in zip(self.generators, states or ()):
            put(state)
        return saved

    def __enter__(self):
        self.other = self.swap(self.other)
        self.reseeds = ddp_seeds_from_the_stream()

    def __exit__(self, *error):
        self.reseeds()
        self.other = self.swap(self.other)


def ddp_seeds_from_the_stream():
    """While a draw is made alike on every rank, a sampler's seeding from the system's entropy
    (FastGAN's `np.random.seed()` each time it wraps around) seeds from the shared stream
    instead, so the ranks still draw alike. Returns what puts the seeding functions back."""
    import random
    import sys

    modules = [module for module in (random, getattr(sys.modules.get("numpy"), "random", None)) if module is not None]
    originals = [module.seed for module in modules]

    def alike(original, module):
        def seed(*args, **kwargs):
            if (args[0] if args else kwargs.get("a", kwargs.get("seed"))) is not None:
                return original(*args, **kwargs)
            return original(random.getrandbits(32) if module is random else int(module.randint(0, 2**31 - 1)))

        return seed

    for module, original in zip(modules, originals):
        module.seed = alike(original, module)

    def put_back():
        for module, original in zip(modules, originals):
            module.seed = original

    return put_back


def ddp_first_slurm_host(nodelist):
    """The first host of a Slurm node list: "gpu[03-05,09],cpu1" -> "gpu03"."""
    import re

    return re.sub(r"\[(\d+)[^\]]*\]", r"\1", nodelist).split(",")[0]


def ddp_device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def ddp_map_location(storage, location):
    """torch.load's map_location: what was saved on a GPU loads onto this process's device, what
    was saved on the CPU stays there, as it loaded before (a Dataset's tensors kept off the GPU:
    forked DataLoader workers cannot use CUDA)."""
    if location.startswith("cpu"):
        return storage
    return torch.serialization.default_restore_location(storage, str(ddp_device()))


def ddp_wrap(module, keys_unwrapped=False, scatter_dim=0, **options):
    """DDP on this process's device; a module with nothing to train (DDP refuses it), or any
    module in a process with no group, is only moved there. With ``keys_unwrapped`` (a head
    DataParallel never wrapped) its state_dict keeps the keys it had. A wrapped model (a
    checkpoint's pickled DataParallel, a model wrapped before) has its module wrapped.
    ``scatter_dim``: the dimension DataParallel split batches along (``dim=1``)."""
    if scatter_dim:  # (kept beside the process group, where the run-time batch split reads it)
        dist.ddp_scatter_dim = scatter_dim
    while isinstance(module, DistributedDataParallel) or type(module).__name__ == "DataParallel":
        module = module.module
    for part in module.modules():  # a part wrapped before the whole it was handed to: not nested in it
        part._modules.update({k: c.module for k, c in part._modules.items() if isinstance(c, DistributedDataParallel)})
    module = module.to(ddp_device())
    if dist.is_initialized() and any(p.requires_grad for p in module.parameters()):
        ddp_plain_buffers(module)
        ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
        module = DdpModel(module, device_ids=ids, **options)
        module.ddp_keys_unwrapped = keys_unwrapped
    elif dist.is_initialized() and not keys_unwrapped:
        # nothing to train (DDP refuses it: DCSR's loss ModuleList): what DataParallel gave, its
        # `.module` and `module.` keys, run in this process
        module = ddp_held(module)
    if dist.is_initialized():
        DdpModel.watch_steps()
    return module


def ddp_plain_buffers(module):
    """Buffers laid out in memory as a new tensor of their shape would be: DDP's broadcast of the
    buffers at each forward refuses one whose strides overlap on a dimension of size one (the
    PyTorch tutorial's positional encoding, ``pe.unsqueeze(0).transpose(0, 1)``: "some elements of
    the input tensor and the written-to tensor refer to a single memory location")."""
    for part in module.modules():
        for name, buffer in part._buffers.items():
            if buffer is not None and buffer.stride() != torch.empty(buffer.shape, device="meta").stride():
                part._buffers[name] = buffer.clone(memory_format=torch.contiguous_format)


class DdpModel(DistributedDataParallel):
    """DDP that also answers for the model's own attributes (`model.encoder`), as code
    written for the bare model reads them (a project's helper, out of the converter's sight)."""

    # (weakly, as `live`: a copy wrapped again and again and let go, an EMA's every 100 steps,
    # that never trains, is freed as the original freed its DataParallel)
    made = []  # wrapped, not yet stepped
    unchecked = []  # wrapped without find_unused_parameters, not yet through a backward
    ddp_made = 0  # models made (ddp_index; named apart from the model's own attributes)
    live = None  # every wrapped model (weakly)
    started = set()  # weights outside DDP that start as rank 0's (see late_parameters)
    late_done = set()  # optimizers whose late gradients were averaged right after backward() already

    def __init__(self, module, **options):
        import weakref

        super().__init__(module, **options)
        DdpModel.watch_steps()
        DdpModel.made.append(weakref.ref(self))
        DdpModel.unchecked.append(weakref.ref(self))
        self.ddp_index, DdpModel.ddp_made = DdpModel.ddp_made, DdpModel.ddp_made + 1  # (the order every rank made its models in)
        DdpModel.live.add(self)
        self.ddp_unseen = True
        # what DDP averages: the parameters that trained when it was made
        self.ddp_averaged = {id(p) for p in module.parameters() if p.requires_grad}
        self.ddp_forwards = 0  # forwards that DDP averages the backward of
        self.ddp_stepped_at = {}  # optimizer -> ddp_forwards when it last stepped this model
        self.ddp_ready = True

    def forward(self, *args, **kwargs):
        """Weights a pass past the wrapper set from its own batch (ArtFlow's `glow.module(x)`
        starts Glow's ActNorm from the data it sees) differ per rank, and DDP only averages
        gradients: rank 0's are every rank's at the first forward, and at the first step
        (a start made inside the first forward)."""
        if self.ddp_unseen:
            self.ddp_unseen = False
            ddp_broadcast_weights(self)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.ddp_forwards += 1
        try:
            return super().forward(*args, **kwargs)
        except RuntimeError as error:  # a second forward before any step (gradients accumulated)
            if "Expected to have finished reduction" not in str(error) or not self.ddp_find_idle():
                raise
            return super().forward(*args, **kwargs)

    @staticmethod
    def watch_steps():
        """The optimizer hooks, once, from the first wrap (also one that built no DDP: a frozen
        encoder's, beside a decoder DataParallel never wrapped, whose gradients they average)."""
        import atexit
        import weakref

        from torch.optim.optimizer import register_optimizer_step_pre_hook

        if DdpModel.live is None:
            DdpModel.live = weakref.WeakSet()
            atexit.register(register_optimizer_step_pre_hook(DdpModel.first_step).remove)
            atexit.register(register_optimizer_step_pre_hook(DdpModel.late_parameters).remove)
            atexit.register(register_optimizer_step_pre_hook(DdpModel.idle_parameters).remove)
            atexit.register(register_optimizer_step_pre_hook(DdpModel.bypassed).remove)

    @staticmethod
    def bypassed(optimizer, args, kwargs):
        """Gradients of a wrapped model's parameters when no DDP forward ran since this optimizer
        last stepped it: the training called its parts past the wrapper (ParamsDrag's helper runs
        `G.module.mapping(...)`, `G.module.synthesis(...)`), so DDP averaged nothing and each rank
        would train a model of its own. They are averaged here, as DDP would have."""
        if dist.get_world_size() == 1:
            return
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in sorted(DdpModel.live, key=lambda model: model.ddp_index):  # (alike on every rank: collectives)
            mine = [p for p in model.module.parameters() if id(p) in stepped and p.requires_grad]
            if not mine:
                continue
            seen, model.ddp_stepped_at[id(optimizer)] = model.ddp_stepped_at.get(id(optimizer), 0), model.ddp_forwards
            if seen == model.ddp_forwards:
                ddp_average_gradients(mine)

    @staticmethod
    def idle_parameters(optimizer, args, kwargs):
        """Each wrapped model, at the first step after its first backward: see ddp_find_idle."""
        for kept in list(DdpModel.unchecked):
            model = kept()
            if model is None:
                DdpModel.unchecked.remove(kept)
            elif any(p.grad is not None for p in model.module.parameters()):
                DdpModel.unchecked.remove(kept)
                model.ddp_find_idle()

    def ddp_find_idle(self):
        """Parameters the forward left out (a torchvision backbone's `fc` that the model's
        forward never calls): DDP made without find_unused_parameters waits for their
        gradients, leaves the buckets that hold them unaveraged and stops the run at the next
        forward. Every rank looks at once, after the first backward: the gradients are
        averaged here and DDP looks for unused parameters at each step from now on, as if
        made with find_unused_parameters=True (the step trains what that would have)."""
        import warnings

        if self.find_unused_parameters or self.static_graph:  # (a world of one's DDP stops on them too)
            return False
        trained = [p for p in self.module.parameters() if p.requires_grad]
        missing = torch.tensor([float(p.grad is None) for p in trained], dtype=torch.float64, device=ddp_device())
        dist.all_reduce(missing)  # (ranks without a gradient, per parameter)
        if not missing.any():
            return False
        ddp_average_gradients(trained)  # (averaged already where DDP's bucket was full: alike, so unchanged)
        self.find_unused_parameters = True
        parameters, sparse = self._build_params_for_reducer()  # a new reducer, as DDP's __setstate__ builds one
        self._ddp_init_helper(parameters, sparse, self._build_debug_param_to_name_mapping(parameters), self.static_graph)
        warnings.warn(f"{int(missing.gt(0).sum())} parameter(s) of {type(self.module).__name__} got no gradient: "
                      "DDP now looks for unused parameters at each step (find_unused_parameters=True)")
        return True

    @staticmethod
    def first_step(optimizer, args, kwargs):
        while DdpModel.made:
            model = DdpModel.made.pop()()
            if model is not None:
                ddp_broadcast_weights(model)

    @staticmethod
    def late_parameters(optimizer, args, kwargs):
        """(an optimizer whose late gradients were averaged right after this backward: done)"""
        if id(optimizer) in DdpModel.late_done:
            DdpModel.late_done.discard(id(optimizer))
            return
        DdpModel.average_late(optimizer)

    @staticmethod
    def average_late(optimizer):
        """Gradients an optimizer is about to apply that no DDP averages: parameters unfrozen
        after the wrap (SiamDW's step function unfreezes backbone blocks every few epochs), a
        search's or a loss's own weights (PC-DARTS' architecture tensors, ProxyGML's proxies).
        Those that are weights (a module's parameters, tensors a wrapped model holds; not a
        perturbation of this rank's own batch) start as rank 0's and have their gradients
        averaged before each step, as DDP does for its own."""
        import weakref

        if dist.get_world_size() == 1:
            return
        DdpModel.watch_steps()  # (called right after backward() before any wrap's)
        models = list(DdpModel.live)
        averaged = set().union(*(model.ddp_averaged for model in models))
        weights = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad and id(p) not in averaged]
        if any(not isinstance(p, torch.nn.Parameter) for p in weights):
            held = {id(t) for model in models for part in model.module.modules() for value in vars(part).values()
                    for t in (value if isinstance(value, (list, tuple)) else [value]) if torch.is_tensor(t)}
            weights = [p for p in weights if isinstance(p, torch.nn.Parameter) or id(p) in held]
        if not weights:
            return
        # New weights start as rank 0's (as DDP broadcasts its module's when it is built). The ranks
        # decide together, and send every one of these weights when any rank sees a new one: an id
        # is reused once its object is freed, at another moment on each rank (a probe rebuilt each
        # epoch: one rank broadcast while the other went on, a hang; Andrewzh112's SimSiam, batch 46)
        unseen = torch.tensor([float(any(id(p) not in DdpModel.started for p in weights))], device=ddp_device())
        dist.all_reduce(unseen, op=dist.ReduceOp.MAX)
        if unseen.item():
            for p in weights:
                if id(p) not in DdpModel.started:
                    DdpModel.started.add(id(p))
                    weakref.finalize(p, DdpModel.started.discard, id(p))  # (its id leaves with it)
                dist.broadcast(p.data, 0)
        ddp_average_gradients(weights)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)

    def __repr__(self):
        """A model DataParallel never wrapped (``keys_unwrapped``) prints as the original printed it."""
        return repr(self.module) if self.__dict__.get("ddp_keys_unwrapped") is True else super().__repr__()

    def __setattr__(self, name, value):
        """An attribute the wrapper does not have, set on it, is the model's (NanoFlow's
        `model.h_cache = ...`, read by the model's own methods), as reading one is."""
        own = name.startswith(("_", "ddp_")) or name in self.__dict__ or hasattr(type(self), name)
        if own or not self.__dict__.get("ddp_ready") or name in self._modules or name in self._parameters or name in self._buffers:
            return super().__setattr__(name, value)
        setattr(self.module, name, value)

    def __reduce_ex__(self, protocol):
        """Pickled (``torch.save(model)``, ``copy.deepcopy``) as DataParallel's checkpoints held
        it: a DataParallel of the module, which loads anywhere (this class lives in this script
        only, and a DDP model needs a process group); a model DataParallel never wrapped
        (``keys_unwrapped``: `torch.save(model.module if parallel else model)`) as the bare
        module it saved."""
        import copyreg

        if getattr(self, "ddp_keys_unwrapped", False):
            return copyreg._reconstructor, (type(self.module), object, None), self.module.__reduce_ex__(2)[2]
        state = ddp_alone(self).__reduce_ex__(2)[2]
        return copyreg._reconstructor, (torch.nn.DataParallel, object, None), state  # ddpify: ignore[DDP100]

    def state_dict(self, *args, **kwargs):
        """The keys DataParallel's checkpoints had: the bare model's (``keys_unwrapped``), or
        those of a model whose one part DataParallel wrapped (``keys_unwrapped="features"``:
        ``features.module.0.weight``, the ImageNet example's VGG recipe)."""
        part = getattr(self, "ddp_keys_unwrapped", False)
        if not part:
            return super().state_dict(*args, **kwargs)
        state = self.module.state_dict(*args, **kwargs)
        if part is True:
            return state
        return type(state)((f"{part}.module.{k[len(part) + 1:]}" if k.startswith(f"{part}.") else k, v) for k, v in state.items())

    def load_state_dict(self, state_dict, strict=True, **kwargs):
        """A checkpoint saved by the bare model (no `module.` prefix) loads too: code that
        added the prefix only when DataParallel wrapped (CTR-GCN's reload of its best model)
        no longer knows that this model is wrapped."""
        part = getattr(self, "ddp_keys_unwrapped", False)
        if isinstance(part, str):  # (`features.module.0.weight`: DataParallel wrapped that part only)
            state_dict = {k.replace(f"{part}.module.", f"{part}.", 1): v for k, v in state_dict.items()}
        if state_dict and not any(key.startswith("module.") for key in state_dict):
            return self.module.load_state_dict(state_dict, strict=strict, **kwargs)
        return super().load_state_dict(state_dict, strict=strict, **kwargs)


def ddp_late_gradients(*optimizers):
    """The gradients these optimizers will apply that no DDP averages (a module DataParallel
    never wrapped, weights unfrozen after the wrap), averaged now, right after backward(): what
    reads them before the step (a gradient clip, a test of their norm) sees the global batch's,
    as under DataParallel; the step then leaves them as they are. Every rank calls it."""
    for optimizer in optimizers:
        DdpModel.average_late(optimizer)
        DdpModel.late_done.add(id(optimizer))


def ddp_average_gradients(weights):
    """Each weight's gradient, averaged over the ranks as DDP averages its own (a gradient on
    any rank: every rank averages it, zero where it has none). Every rank calls it."""
    device, world = ddp_device(), dist.get_world_size()
    present = torch.tensor([float(p.grad is not None) for p in weights], dtype=torch.float64, device=device)
    dist.all_reduce(present)
    for p, count in zip(weights, present.tolist()):
        if count:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= world


def ddp_alone(model):
    """The wrapped model for code that rank 0 runs alone (an evaluation handed the model, two
    calls down from here): a DataParallel of the module with no devices, which runs it in this
    process (DDP's forward would wait for the other ranks) and keeps DataParallel's `.module`
    and checkpoint keys."""
    if not isinstance(model, DistributedDataParallel):
        return model
    if getattr(model, "ddp_keys_unwrapped", False):
        return model.module  # (a part DataParallel never wrapped: its own keys)
    return ddp_held(model.module)


def ddp_held(module):
    """A DataParallel of the module with no devices: it runs the module in this process, with
    DataParallel's `.module` and checkpoint keys."""
    held = torch.nn.DataParallel.__new__(torch.nn.DataParallel)  # ddpify: ignore[DDP100]
    torch.nn.Module.__init__(held)
    held.module, held.device_ids, held.dim = module, [], 0
    return held


def ddp_broadcast_weights(model):
    """Rank 0's weights and buffers on every rank, in place: a change made to the model after
    DDP was built (a checkpoint loaded, an init applied) is the same everywhere."""
    if dist.get_world_size() > 1:
        for tensor in getattr(model, "module", model).state_dict().values():
            dist.broadcast(tensor, 0)


def ddp_through(model, method, *args, **kwargs):
    """``model.module.<method>(...)`` run through DDP's forward, so that its backward is
    averaged like forward()'s (StyleSpeech trains with meta_learner_1 after its warm-up).
    Without DDP, the method itself."""
    if not isinstance(model, DistributedDataParallel):
        return getattr(model, method)(*args, **kwargs)
    inner = model.module
    # shadows the class's forward for this call only (set past nn.Module's __setattr__: a part,
    # ParamsDrag's `G.module.synthesis`, would become a child named `forward` instead)
    object.__setattr__(inner, "forward", getattr(inner, method))
    try:
        return model(*args, **kwargs)
    finally:
        object.__delattr__(inner, "forward")


def ddp_wrap_every_parameter(module, **options):
    """ddp_wrap for a model whose parameters are frozen or unfrozen after the wrap: DDP
    registers every parameter and skips those without a gradient."""
    frozen = [p for p in module.parameters() if not p.requires_grad]
    for parameter in frozen:
        parameter.requires_grad_(True)
    try:
        return ddp_wrap(module, find_unused_parameters=True, **options)
    finally:
        for parameter in frozen:
            parameter.requires_grad_(False)


def ddp_local_batch_size(batch_size):
    """DataParallel's batch size was global: each process loads its share (one item per
    step cannot be divided: each process loads one, MICCAI-LITS2017's 3D volumes)."""
    if batch_size == 1:
        if dist.get_world_size() > 1 and not ddp_local_batch_size.__dict__.get("told"):
            import warnings

            ddp_local_batch_size.told = True
            warnings.warn(
                f"batch size 1 cannot be divided among {dist.get_world_size()} processes: each loads 1, so the "
                "global batch is the number of processes (DataParallel's was 1)", stacklevel=2,
            )
        return 1
    if batch_size % dist.get_world_size():
        raise SystemExit(f"batch size {batch_size} does not divide evenly among {dist.get_world_size()} processes")
    return batch_size // dist.get_world_size()


def ddp_whole_batch(loss, *args, ddp_pieces=1, **kwargs):
    """A loss that compares the samples of a batch with each other (triplet mining, contrastive
    losses), computed on the whole global batch as DataParallel computed it: each tensor
    argument holding this process's share (the first tensor's first dimension) is gathered from
    every process in rank order, and every process computes the same loss from them. The
    gradient of each share goes back to its process (DdpGathered), so DDP's mean of the
    gradients is the whole batch's, as DataParallel's was. ``ddp_pieces``: the batch was made
    of that many pieces joined (two views of each sample): gathered piece by piece, so the
    whole keeps DataParallel's layout (every sample's first view, then every second view)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return loss(*args, **kwargs)
    tensors = [item for item in ddp_leaves((args, kwargs)) if torch.is_tensor(item) and item.dim()]
    if not tensors:
        return loss(*args, **kwargs)
    share = tensors[0].shape[0]
    sizes = torch.zeros(dist.get_world_size(), dtype=torch.long, device=ddp_device())
    sizes[dist.get_rank()] = share // ddp_pieces
    dist.all_reduce(sizes)
    sizes = sizes.tolist()

    def gathered(item):
        if not (torch.is_tensor(item) and item.dim() and item.shape[0] == share):
            return item
        if item.dtype == torch.bool:  # (gloo gathers no booleans)
            return gathered(item.to(torch.uint8)).bool()
        return torch.cat([DdpGathered.apply(piece, sizes) for piece in item.chunk(ddp_pieces)])

    return loss(*ddp_leaves(args, gathered), **ddp_leaves(kwargs, gathered))


class DdpWholeBatchLoss:
    """A loss handed to code ddpify does not rewrite (a trainer of another module, the script
    converted alone): each call computes it on the whole global batch (ddp_whole_batch), as
    DataParallel did; anything else asked of it is the loss's own."""

    def __init__(self, loss):
        self.ddp_loss = loss

    def __call__(self, *args, **kwargs):
        return ddp_whole_batch(self.ddp_loss, *args, **kwargs)

    def __getattr__(self, name):
        if name == "ddp_loss":
            raise AttributeError(name)
        return getattr(self.ddp_loss, name)


def ddp_gathered(outputs, pieces=1):
    """The model's outputs for the whole global batch, gathered from every process in rank
    order (DdpGathered: each share's gradient goes back to its process), as DataParallel
    gathered them for a loss that compares the batch's samples."""
    return ddp_whole_batch(lambda gathered: gathered, outputs, ddp_pieces=pieces)


def ddp_scattered(model, *args, **kwargs):
    """DataParallel's forward, for a batch every rank holds whole: each process runs the model
    on its share of the arguments' first dimension (ddp_scatter) and gets every process's
    outputs, in rank order (ddp_gathered: each share's gradient goes back to its process).
    Arguments with no first dimension to split run whole on every rank, as one process ran them."""
    dim = getattr(dist, "ddp_scatter_dim", 0)
    leaves = ddp_leaves((args, kwargs))
    if dist.get_world_size() == 1 or not any(getattr(leaf, "ndim", 0) > dim for leaf in leaves):
        return model(*args, **kwargs)  # (nothing to split, a graph object: every rank runs it whole)
    return ddp_gathered(model(*ddp_scatter(args), **ddp_scatter(kwargs)))


def ddp_leaves(item, change=None, whole=frozenset()):
    """The tensors (and other leaves) inside tuples, lists and dicts, depth first; with
    ``change``, the same structure with each leaf changed. A list or tuple whose id is in
    ``whole`` is a leaf."""
    if isinstance(item, dict):
        items = {key: ddp_leaves(value, change, whole) for key, value in item.items()}
        return type(item)(items) if change else [leaf for value in items.values() for leaf in value]
    if isinstance(item, (list, tuple)) and id(item) not in whole:
        parts = [ddp_leaves(value, change, whole) for value in item]
        if not change:
            return [leaf for part in parts for leaf in part]
        return type(item)(*parts) if hasattr(item, "_fields") else type(item)(parts)
    return change(item) if change else [item]


class DdpGathered(torch.autograd.Function):
    """Every process's share of a tensor, in rank order (shares of unequal sizes padded for the
    gather). Every process computed the same loss from the whole: the gradient of a share is
    the sum over the processes of theirs, which DDP's mean then makes the whole batch's."""

    @staticmethod
    def forward(ctx, share, sizes):
        ctx.sizes = sizes
        padded = share.new_zeros((max(sizes), *share.shape[1:])).to(ddp_device())
        padded[: share.shape[0]] = share
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)]).to(share.device)

    @staticmethod
    def backward(ctx, grad):
        device, grad = grad.device, grad.to(ddp_device(), copy=True).contiguous()
        dist.all_reduce(grad)
        start = sum(ctx.sizes[: dist.get_rank()])
        return grad[start : start + ctx.sizes[dist.get_rank()]].to(device), None


def ddp_selected_mean(loss, selection, weighted=False):
    """A loss averaged over the elements a mask selects (valid pixels, tokens that are not
    padding), weighted by this process's count over the mean count: DDP's average of the
    processes' gradients is then the mean over every selected element of the global batch, as
    DataParallel's loss was. A share that selects nothing adds nothing (its mean is not a number).
    Without gradients (a loss function evaluation calls too) the loss is left as it is."""
    if dist.get_world_size() == 1 or not torch.is_grad_enabled():
        return loss
    selection = torch.as_tensor(selection)  # (a numpy mask too)
    # (a mask counts what it selects; `weighted`: the targets' class weights add up; anything else, an
    # input's selected elements, counts its elements)
    counted = selection.dtype == torch.bool or weighted
    count = (selection.detach().sum() if counted else torch.tensor(selection.numel())).to(ddp_device(), torch.float64)
    weight = (count / ddp_mean(count)).to(loss.device, loss.dtype)
    return torch.where(count.to(loss.device) > 0, loss * weight, torch.zeros_like(loss))


def ddp_class_weights(weight, target, ignore_index=-100):
    """What a class-weighted cross entropy or NLL loss's mean divides by, target by target: the
    weight of each target's class (0 where it is ignored); for targets that are probabilities,
    one per sample (their mean divides by the batch)."""
    if target.is_floating_point() or weight is None:
        return torch.ones(target.shape[0], device=target.device)
    kept = target != ignore_index
    return torch.where(kept, weight.to(target.device)[target.masked_fill(~kept, 0)], torch.zeros((), device=target.device))


def ddp_mean(value):
    """The mean over the processes of a number or tensor (every process calls it)."""
    return ddp_sum(value, mean=True)


def ddp_sum(value, mean=False):
    """The sum over the processes of a number or tensor (every process calls it); a dict, list
    or tuple of them (a dict of epoch totals, a list of per-epoch losses) entry by entry where
    every rank holds one of the same keys and shapes; an average meter over every process's
    batches; anything else is this rank's own. Reduced on this process's device: NCCL has no
    CPU path. In a process with no group (an imported module's step, run by a script that was not
    converted) this process's own."""
    if not dist.is_initialized():
        return value
    if isinstance(value, (dict, list, tuple)) or type(value).__name__ == "deque":  # (a running window of losses)
        return ddp_entries(value, mean)
    if ddp_a_meter(value):
        return ddp_meter(value)
    if type(value).__module__ == "numpy" and getattr(getattr(value, "dtype", None), "kind", "") in ("i", "u", "f"):
        # (ST-GCN's `correct += np.sum(pred == y)`: a numpy count, summed as a number is)
        total = ddp_sum(torch.as_tensor(value), mean)
        return total.numpy() if value.shape else total.item() if mean else type(value)(total.item())
    if not torch.is_tensor(value) and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        return value
    total = (value.detach() if torch.is_tensor(value) else torch.tensor(float(value), dtype=torch.float64)).to(ddp_device(), copy=True)
    dist.all_reduce(total)
    total = total / dist.get_world_size() if mean else total
    if torch.is_tensor(value):
        return total.to(value.device)
    return total.item() if mean or isinstance(value, float) else int(total.item())


def ddp_a_meter(value):
    """An average meter (the ImageNet example's AverageMeter): numbers `sum`, `count`, `avg`."""
    import numbers

    return not torch.is_tensor(value) and all(isinstance(getattr(value, name, None), numbers.Number) for name in ("sum", "count", "avg"))


def ddp_meter(meter):
    """A copy of the meter over every process's batches: its sum and count added up, its
    average their quotient, its last value the mean of the processes' (the global batch's)."""
    import copy

    last = getattr(meter, "val", 0.0)
    totals = torch.tensor([float(meter.sum), float(meter.count), float(last)], dtype=torch.float64, device=ddp_device())
    dist.all_reduce(totals)
    total, count, last = totals.tolist()
    combined = copy.copy(meter)
    combined.sum, combined.count = total, int(count) if isinstance(meter.count, int) else count
    for name, value in (("avg", total / count if count else meter.avg), ("val", last / dist.get_world_size())):
        if hasattr(meter, name):
            try:
                setattr(combined, name, value)
            except AttributeError:
                pass  # (an average the meter computes itself, a property: from its sum and count)
    return combined


def ddp_entries(value, mean):
    """ddp_sum of each number or tensor a dict, list or tuple holds (the rest as they are), when
    the keys and shapes are alike on every rank (agreed first: a collective per entry on some
    ranks only would hang); else this rank's own, as a meter is."""
    import copy
    import zlib

    keys = list(value) if isinstance(value, dict) else list(range(len(value)))
    entries = [value[key] for key in keys]
    summed = [torch.is_tensor(v) or isinstance(v, (int, float)) and not isinstance(v, bool) for v in entries]
    shapes = [tuple(v.shape) if torch.is_tensor(v) else None for v in entries]
    signature = float(zlib.crc32(repr((type(value).__name__, [repr(k) for k in keys], summed, shapes)).encode()))
    bounds = torch.tensor([signature, -signature], dtype=torch.float64, device=ddp_device())
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    if bounds[0] != -bounds[1] or not any(summed):
        return value
    reduced = [ddp_sum(v, mean) if plain else v for v, plain in zip(entries, summed)]
    if isinstance(value, dict):
        made = copy.copy(value)  # (an OrderedDict, a defaultdict: its own kind)
        made.update(zip(keys, reduced))
        return made
    if hasattr(value, "_fields"):  # a named tuple
        return type(value)(*reduced)
    if type(value).__name__ == "deque":  # (pva-faster-rcnn's `loss_hist`, its running loss printed: batch 46)
        return type(value)(reduced, maxlen=value.maxlen)
    return type(value)(reduced) if type(value) in (list, tuple) else value  # (another kind of sequence: as it is)


def ddp_any(flag):
    """True on every rank when it is true on any (every process calls it): a training loop's
    skip decided alike everywhere, so no rank waits in an all-reduce the others skipped."""
    if dist.get_world_size() == 1:
        return bool(flag)
    agreed = torch.tensor(float(bool(flag)), device=ddp_device())
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return bool(agreed.item())


def ddp_all(flag):
    """True on every rank when it is true on all (every process calls it): a training step
    taken on a condition this rank computed is taken by all or by none."""
    return not ddp_any(not flag)


def ddp_agreed(flag):
    """Rank 0's truth of ``flag`` on every rank (every process calls it): a branch that holds a
    collective, or leaves a loop that trains, is taken by all ranks or by none."""
    if dist.get_world_size() == 1:
        return flag
    decided = torch.tensor(float(bool(flag)), device=ddp_device())
    dist.broadcast(decided, src=0)
    return bool(decided.item())


def ddp_failures_agreed(before_backward=False):
    """A point in a training step's ``try`` that every rank passes (every process calls it): where
    another rank failed earlier in the step, its error is raised here too, so every rank takes the
    script's ``except`` branch together instead of waiting in a collective for the failed one.
    ``before_backward``: the step's gradients are exchanged after this point, and a failure there
    cannot be skipped by one rank alone."""
    DdpStepFailures.exchanging = before_backward
    DdpStepFailures.agree(None)


def ddp_failed_here():
    """First in the ``except`` branch of a training step's ``try``: a rank whose own step failed
    hands its error to the others at their next agreement point. One that failed once the
    gradients were being exchanged stops the run with its error (the others wait in backward's
    all-reduce for it: a hang otherwise)."""
    import sys

    error = sys.exc_info()[1]
    if dist.get_world_size() == 1 or getattr(error, "ddp_from_rank", None) is not None:
        return
    if DdpStepFailures.exchanging:
        raise RuntimeError(
            f"rank {dist.get_rank()} failed in a training step while the ranks exchanged its gradients: the "
            "others cannot skip the step with it"
        ) from error
    DdpStepFailures.agree(error)  # (rank 0 takes the except branch with this error: its own prints show it)


class DdpStepFailures:
    """A training step's failures, agreed across the ranks (see ddp_failures_agreed)."""

    exchanging = False  # past the step's last agreement point: its gradients are being exchanged

    @staticmethod
    def agree(error):
        """Every rank learns whether one failed; the ranks that did not raise the first one's error."""
        import pickle

        if dist.get_world_size() == 1 or not ddp_any(error is not None):
            return
        sent = None
        if error is not None:
            try:
                sent = pickle.loads(pickle.dumps(error))  # (the same kind of error: the script's handler may test it)
            except Exception:
                sent = RuntimeError(f"{type(error).__name__}: {error}")
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, sent)
        if error is None:
            rank, first = next((rank, found) for rank, found in enumerate(errors) if found is not None)
            first.ddp_from_rank = rank
            raise first


def ddp_no_sync(model, accumulating):
    """``model.no_sync()`` while gradients only accumulate, on a DDP model."""
    return model.no_sync() if accumulating and hasattr(model, "no_sync") else contextlib.nullcontext()


def ddp_rank():
    """0 in a process with no group (a project script left as it was)."""
    return dist.get_rank() if dist.is_initialized() else 0


def ddp_world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def ddp_quiet(make, *args, **kwargs):
    """``make(*args, **kwargs)``; on ranks other than 0 the files it opens for writing are
    private copies only this rank sees: a real object (its file handle read outside a guard,
    HPLFlowNet's ``logger.out_fd``; a SummaryWriter's log folder; an early-stopping object whose
    flag every rank tests and which saves the model when it improves), or a project evaluation
    that writes its results and reads them back (HRNet's COCO keypoints JSON), whose writes
    nobody else sees; what this rank reads back of them is what it wrote. An object made so
    keeps its later writes private too: its methods run the same way."""
    import functools

    if ddp_rank() == 0:
        return make(*args, **kwargs)
    made = ddp_privately(make, *args, **kwargs)
    kind = type(made)
    if not isinstance(make, type) or kind.__module__ == "builtins":
        return made  # (a function's result, or a plain value: nothing of its own writes later)

    def method(self, name):
        value = kind.__getattribute__(self, name)
        if name.startswith("__") or not callable(value) or not hasattr(value, "__self__"):
            return value
        return functools.partial(ddp_privately, value)

    private = {"__getattribute__": method, "__module__": kind.__module__, "__qualname__": kind.__qualname__}
    if callable(made):
        private["__call__"] = lambda self, *more, **options: ddp_privately(kind.__call__, self, *more, **options)
    try:
        made.__class__ = type(kind.__name__, (kind,), private)
    except TypeError:
        pass  # (a class whose objects cannot change class: only what its constructor writes is private)
    return made


def ddp_privately(call, *args, **kwargs):
    """``call(*args, **kwargs)`` on a rank other than 0, the files it opens for writing
    private copies this rank alone sees and reads back; a call inside another one runs as it is."""
    import builtins
    import io
    import tempfile

    state = ddp_privately.__dict__
    if state.get("active"):
        return call(*args, **kwargs)
    private = state.setdefault("private", {})  # real path -> this rank's copy
    if "undo_reads" not in state:
        state["undo_reads"] = ddp_private_reads(private)
    opened = builtins.open

    def private_folder():
        import atexit
        import shutil

        folder = tempfile.mkdtemp(prefix="ddpify-rank-")
        atexit.register(shutil.rmtree, folder, True)
        return folder

    def unseen(file, mode="r", *more, **options):
        named = isinstance(file, (str, bytes, os.PathLike))
        real = os.path.abspath(os.fsdecode(file)) if named else None
        if not set(mode) & set("wax+"):
            return opened(private.get(real, file), mode, *more, **options)
        there = real in private or named and os.path.exists(file)
        if "x" in mode and there:  # an exclusive creation tests the file system (SRGAN's TaskManager)
            raise FileExistsError(17, "File exists", file)
        if not named:
            return opened(file, mode, *more, **options)  # (a descriptor: already this rank's)
        if real not in private:
            folder = state.get("folder") or state.setdefault("folder", private_folder())
            copied = os.path.join(folder, f"{len(private)}-{os.path.basename(real)}")
            if there and "w" not in mode and set(mode) & set("a+"):  # appended to or read back: what is there
                with opened(file, "rb") as source, opened(copied, "wb") as copy:
                    copy.write(source.read())
            private[real] = copied
        return opened(private[real], mode, *more, **options)

    saved, loaded = torch.save, torch.load  # (torch writes a named file from C++, past open())

    def save_unseen(obj, f, *more, **options):
        if not isinstance(f, (str, os.PathLike)):
            return saved(obj, f, *more, **options)
        with unseen(f, "wb") as handle:
            return saved(obj, handle, *more, **options)

    def load_unseen(f, *more, **options):
        named = isinstance(f, (str, os.PathLike))
        return loaded(private.get(os.path.abspath(os.fsdecode(f)), f) if named else f, *more, **options)

    # (io.open: tensorboard's event files are opened through it)
    builtins.open, io.open, torch.save, torch.load = unseen, unseen, save_unseen, load_unseen
    undo = ddp_quiet_folders(private)
    state["active"] = True
    try:
        return call(*args, **kwargs)
    finally:
        state["active"] = False
        builtins.open, io.open, torch.save, torch.load = opened, opened, saved, loaded
        undo()


def ddp_private_reads(private):
    """On a rank other than 0, a file a private call wrote reads as this rank's copy from then
    on, also outside such a call (SSD's detections: one project function writes them, the next
    reads them back; the real file is rank 0's, maybe not yet written). A write outside makes
    the real file this rank's again. Returns what undoes it."""
    import builtins
    import io

    opened, loaded = builtins.open, torch.load
    real = lambda file: os.path.abspath(os.fsdecode(file)) if isinstance(file, (str, bytes, os.PathLike)) else None  # noqa: E731

    def reading(file, mode="r", *more, **options):
        if real(file) in private:
            if not set(mode) & set("wax+"):
                file = private[real(file)]
            elif not ddp_privately.__dict__.get("active"):
                private.pop(real(file))
        return opened(file, mode, *more, **options)

    def loading(f, *more, **options):
        return loaded(private.get(real(f), f) if real(f) else f, *more, **options)

    def saving(obj, f, *more, **options):
        if real(f) in private and not ddp_privately.__dict__.get("active"):
            private.pop(real(f))  # (written outside: the real file is this rank's again)
        return saved(obj, f, *more, **options)

    saved = torch.save
    builtins.open, io.open, torch.load, torch.save = reading, reading, loading, saving

    def undo():
        builtins.open, io.open, torch.load, torch.save = opened, opened, loaded, saved

    return undo


def ddp_quiet_folders(private):
    """For ddp_quiet on ranks other than 0: removing, renaming and clearing files and folders
    touch only this rank's private copies (rank 0 sets up the real ones: a project logger that
    clears its run folder and makes it again); making a folder that exists is no error."""
    import shutil

    real = lambda path: os.path.abspath(os.fsdecode(path))  # noqa: E731
    made, kept = os.makedirs, (os.remove, os.unlink, os.rename, os.replace, shutil.rmtree, os.makedirs)

    def removed(path, *more, **options):
        copy = private.pop(real(path), None)
        if copy is not None and os.path.exists(copy):
            kept[0](copy)

    def moved(source, target, *more, **options):
        if real(source) in private:
            private[real(target)] = private.pop(real(source))

    def cleared(path, *more, **options):
        for name in [name for name in private if name == real(path) or name.startswith(real(path) + os.sep)]:
            removed(name)

    os.remove = os.unlink = removed
    os.rename = os.replace = moved
    shutil.rmtree = cleared
    os.makedirs = lambda path, mode=0o777, exist_ok=False: made(path, mode, exist_ok=True)

    def undo():
        os.remove, os.unlink, os.rename, os.replace, shutil.rmtree, os.makedirs = kept

    return undo


def ddp_shared_values(values):
    """What a project function that writes files returned on rank 0 (it ran there alone), on
    every rank: rank 0 keeps its own; the others get a copy, or a stand-in for what cannot be
    sent (fastdvdnet's init_logging returns a SummaryWriter with its logger). Python's and
    numpy's random states go with them: what rank 0 drew there alone (NLP_Project's index
    split) every rank's generator has passed too, as ddp_share_random_state keeps them alike."""
    import pickle
    import random
    import sys

    def sendable(value):  # sent and made again: glow's JsonConfig pickles, but raises when unpickled
        try:
            pickle.loads(pickle.dumps(value))
            return value
        except Exception:  # (whatever pickle raises for an object it cannot send)
            return DdpNoOp

    mine = dist.get_rank() == 0
    several = isinstance(values, tuple)
    numpy = sys.modules.get("numpy")
    states = random.getstate(), numpy and numpy.random.get_state()
    sent = (several, tuple(map(sendable, values)) if several else (sendable(values),), states) if mine else None
    several, received, states = ddp_from_rank_zero(sent)
    if mine:
        return values
    random.setstate(states[0])  # what rank 0 drew alone, every rank has drawn (the generators stay alike)
    if numpy is not None and states[1] is not None:
        numpy.random.set_state(states[1])
    made = tuple(DdpNoOp() if value is DdpNoOp else ddp_here(value) for value in received)
    return made if several else made[0]


def ddp_here(value):
    """Rank 0's CUDA device (`cuda:0`, in a value or a configuration dict it sent:
    Face-Transformer's get_config) is this process's on the others."""
    if isinstance(value, torch.device) and value.type == "cuda":
        return ddp_device()
    if isinstance(value, str) and value.startswith("cuda:") and value[5:].isdigit():
        return "cuda"
    if isinstance(value, dict):
        for key, item in list(value.items()):
            value[key] = ddp_here(item)
    return value


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
