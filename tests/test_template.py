"""The inlined set-up block is real code: run it, and keep the converter's view of it in sync."""

from __future__ import annotations

import io
import os

import libcst as cst
import pytest

from ddpify.transforms.process_group import TEMPLATE_IMPORTS, TEMPLATE_NAMES, template_source

torch = pytest.importorskip("torch")
from ddpify.templates import ddp_setup as template  # noqa: E402  (needs torch)


def cleanup():
    """What ddp_setup registers with atexit."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_block_defines_exactly_the_names_the_converter_reserves():
    defined = [s.name.value for s in cst.parse_module(template_source()).body if isinstance(s, (cst.FunctionDef, cst.ClassDef))]
    assert defined == list(TEMPLATE_NAMES)


def test_each_helper_is_a_piece_of_its_own():
    """The converter copies the helpers a script calls, piece by piece (two blank lines apart):
    a helper one blank line below another went only with it (ddp_any with ddp_entries: a
    NameError in a converted script that called ddp_any alone)."""
    from ddpify.transforms.process_group import template_chunks

    assert [name for name, _ in template_chunks() if name is not None] == list(TEMPLATE_NAMES)


def test_block_imports_are_what_the_converter_schedules():
    header = open(template.__file__).read().split("# ddpify:begin")[0]
    for module, _, alias in TEMPLATE_IMPORTS:
        assert f"import {module}" + (f" as {alias}" if alias else "") in header


@pytest.mark.parametrize(
    "nodelist, host",
    [("node1", "node1"), ("gpu[03-05,09],cpu1", "gpu03"), ("a,b[1-2]", "a"), ("n[7]-ib,x", "n7-ib"), ("h[10-12]", "h10")],
)
def test_first_slurm_host(nodelist, host):
    assert template.ddp_first_slurm_host(nodelist) == host


def test_world_of_one_without_a_launcher(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    template.ddp_setup()
    try:
        assert torch.distributed.get_world_size() == 1 and torch.distributed.get_rank() == 0
        assert template.ddp_local_batch_size(32) == 32
        assert template.ddp_device() == torch.device("cpu")
        template.ddp_setup()  # a second call is harmless
    finally:
        cleanup()
    assert not torch.distributed.is_initialized()
    cleanup()  # and so is cleaning up twice


def test_slurm_variables_become_torchrun_ones(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NODELIST", "localhost")
    monkeypatch.setenv("MASTER_PORT", "0")  # let the store pick a free port
    template.ddp_setup()
    try:
        import os

        assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"]) == ("0", "1", "localhost")
        assert torch.distributed.get_world_size() == 1
    finally:
        cleanup()


def test_batch_that_does_not_divide_stops_with_a_message(monkeypatch):
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 3)
    with pytest.raises(SystemExit, match="does not divide evenly among 3"):
        template.ddp_local_batch_size(32)
    # one item per step (a batch size read from a config, MedicalNet, MICCAI-LITS2017): one per process
    assert template.ddp_local_batch_size(1) == 1


UNWRAPPED = """
import torch
from ddpify.templates.ddp_setup import ddp_setup
import torch.distributed as dist

ddp_setup()
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)  # never wrapped: each rank trains its own copy
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 3) + dist.get_rank()  # each rank's own shard
model(x).sum().backward()
optimizer.step()
open(f"trained{dist.get_rank()}", "w").close()  # a file each: printed lines of two ranks interleave
"""


def _torchrun(tmp_path, script: str):
    import os
    import sys

    from conftest import run_launched

    path = tmp_path / "train.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(path)]
    return run_launched(command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)


def test_ranks_that_train_different_weights_stop_after_the_first_step(tmp_path):
    result = _torchrun(tmp_path, UNWRAPPED)
    assert result.returncode != 0
    assert "the ranks hold different weights or learning rates after optimizer step 1" in result.stderr
    assert not list(tmp_path.glob("trained*"))


def test_ranks_in_sync_pass_the_check(tmp_path):
    wrapped = UNWRAPPED.replace(
        "model = torch.nn.Linear(3, 1)  # never wrapped: each rank trains its own copy",
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))",
    )
    result = _torchrun(tmp_path, wrapped)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.glob("trained*")) == ["trained0", "trained1"]


HEAD_OUTSIDE = """
import torch
from ddpify.templates.ddp_setup import ddp_setup
import torch.distributed as dist

ddp_setup()
torch.manual_seed(0)
backbone = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 4))
head = torch.nn.Linear(4, 3)  # face.evoLVe: the softmax head is left outside the wrap
optimizer = torch.optim.SGD([*backbone.parameters(), *head.parameters()], lr=0.5, momentum=0.9)
generator = torch.Generator().manual_seed(dist.get_rank())  # each rank's own shard
for _ in range(2):
    x, y = torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(head(backbone(x)), y).backward()
    optimizer.step()
open(f"trained{dist.get_rank()}", "w").close()
"""


def test_a_head_trained_outside_the_wrap_stops_although_its_sums_agree(tmp_path):
    # Softmax gradients sum to zero over the classes: the head's sums stay equal on every
    # rank while its weights drift apart; the sums of squares differ.
    result = _torchrun(tmp_path, HEAD_OUTSIDE)
    assert result.returncode != 0
    assert "the ranks hold different weights or learning rates after optimizer step 1" in result.stderr
    assert not list(tmp_path.glob("trained*"))


LEARNING_RATE_ALONE = """
import torch
from ddpify.templates.ddp_setup import ddp_setup
import torch.distributed as dist

ddp_setup()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 9):
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    if step == 3 and dist.get_rank() == 1:  # a decay decided on rank 1's own validation loss
        optimizer.param_groups[0]["lr"] *= 0.5
    open(f"step{step}.rank{dist.get_rank()}", "w").close()
"""


def test_a_learning_rate_one_rank_changed_stops_at_the_next_check(tmp_path):
    result = _torchrun(tmp_path, LEARNING_RATE_ALONE)
    assert result.returncode != 0
    assert "after optimizer step 4" in result.stderr
    assert sorted(path.name for path in tmp_path.glob("step*.rank0")) == ["step1.rank0", "step2.rank0", "step3.rank0"]


WHOLE_BATCH = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_alike, ddp_setup, ddp_whole_batch, ddp_wrap


def batch_hard(features, labels, chosen, margin=0.5):
    d = torch.cdist(features, features)
    same = (labels[:, None] == labels[None, :]) & chosen[None, :]
    return torch.relu((d * same).max(1).values - (d + 1e6 * same).min(1).values + margin).mean()


ddp_setup()
torch.manual_seed(0)
x, y, chosen = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 1]), torch.tensor([True, True, False, True, True])
alone = torch.nn.Linear(4, 3)
model = ddp_wrap(torch.nn.Linear(4, 3))
model.module.load_state_dict(alone.state_dict())
whole = batch_hard(alone(x), y, chosen)
whole.backward()
share = [slice(0, 3), slice(3, 5)][dist.get_rank()]  # shares of unequal sizes, a boolean among them
loss = ddp_whole_batch(batch_hard, model(x[share]), y[share], chosen=chosen[share])
loss.backward()
assert torch.allclose(loss, whole), (loss, whole)
assert torch.allclose(model.module.weight.grad, alone.weight.grad, atol=1e-6), (model.module.weight.grad, alone.weight.grad)
# two views of each sample joined into one batch (every first view, then every second view), the
# loss pairing row i with row i + half: gathered piece by piece, the whole keeps that layout
first, second = torch.randn(5, 4), torch.randn(5, 4)
paired = lambda f: -(f[: len(f) // 2] * f[len(f) // 2 :]).sum(1).mean() + torch.cdist(f, f).mean()  # noqa: E731
whole = paired(alone(torch.cat((first, second), 0)))
loss = ddp_whole_batch(paired, model(torch.cat((first[share], second[share]), 0)), ddp_pieces=2)
assert torch.allclose(loss, whole), (loss, whole)
# a whole batch each rank drew from the OS (NTIRE2022_Inpainting's dataset reseeds per item):
# rank 0's, on every rank, whatever its shapes; one drawn alike is kept as it is
drawn = ddp_alike((torch.full((2, 3), float(dist.get_rank())), torch.tensor([True, dist.get_rank() == 1]), "path"))
assert drawn[0].tolist() == [[0.0] * 3] * 2 and drawn[1].tolist() == [True, False] and drawn[2] == "path", drawn
same = (torch.ones(2),)
assert ddp_alike(same)[0] is same[0]
assert ddp_alike([torch.arange(2.0 + dist.get_rank())])[0].tolist() == [0.0, 1.0]
open(f"agreed{dist.get_rank()}", "w").close()
"""


def test_a_loss_on_the_whole_batch_has_the_loss_and_gradient_of_one_process_and_batches_alike(tmp_path):
    result = _torchrun(tmp_path, WHOLE_BATCH)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(path.name for path in tmp_path.glob("agreed*")) == ["agreed0", "agreed1"]


def test_a_loss_on_the_whole_batch_is_the_loss_itself_without_a_group():
    from ddpify.templates.ddp_setup import ddp_whole_batch

    assert ddp_whole_batch(lambda a, b=1: a * b, torch.ones(2), b=3).tolist() == [3.0, 3.0]


def test_mean_of_a_cpu_tensor_is_reduced_on_this_process_s_device(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor: seen.append(tensor))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # (a process group: ddp_sum reduces)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(template, "ddp_device", lambda: torch.device("cpu"))
    value = torch.tensor([3.0])
    assert template.ddp_mean(value).item() == 1.5  # the fake all_reduce adds nothing
    assert seen[0] is not value and seen[0].device == template.ddp_device()


class Meter:
    avg = 2.0


class AverageMeter:
    """The ImageNet example's."""

    def __init__(self, val, total, count):
        self.val, self.sum, self.count, self.avg = val, total, count, total / count


def test_mean_leaves_objects_alone():
    meter = Meter()
    assert template.ddp_mean(meter) is meter  # no collective on an object that holds no sum and count


def test_an_average_meter_is_combined_over_every_process_s_batches(monkeypatch):
    # rank 0 saw 3 samples summing 6 (last batch 1.0), rank 1 saw 1 summing 4 (last batch 3.0)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor: tensor.add_(torch.tensor([4.0, 1.0, 3.0], dtype=tensor.dtype)))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # (a process group: ddp_sum reduces)
    monkeypatch.setattr(template, "ddp_device", lambda: torch.device("cpu"))
    mine = AverageMeter(1.0, 6.0, 3)
    combined = template.ddp_mean(mine)
    assert (combined.sum, combined.count, combined.avg, combined.val) == (10.0, 4, 2.5, 2.0)
    assert (mine.sum, mine.count, mine.avg) == (6.0, 3, 2.0), "the rank's own meter goes on counting its own"


class RunningAverage:
    """A meter whose average is a property of its sum and count."""

    def __init__(self, total, count):
        self.sum, self.count = total, count

    @property
    def avg(self):
        return self.sum / self.count


def test_a_meter_whose_average_is_a_property_is_combined_through_its_sum_and_count(monkeypatch):
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor: tensor.add_(torch.tensor([4.0, 1.0, 0.0], dtype=tensor.dtype)))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # (a process group: ddp_sum reduces)
    monkeypatch.setattr(template, "ddp_device", lambda: torch.device("cpu"))
    assert template.ddp_mean(RunningAverage(6.0, 3)).avg == 2.5


def test_no_sync_only_for_ddp_models_while_accumulating():
    plain = torch.nn.Linear(2, 1)
    with template.ddp_no_sync(plain, True):  # a world of one: the bare module
        pass

    class Fake:
        def no_sync(self):
            return "no_sync"

    assert template.ddp_no_sync(Fake(), True) == "no_sync"
    assert template.ddp_no_sync(Fake(), False) != "no_sync"


def test_stand_in_does_nothing():
    writer = template.DdpNoOp()
    writer.add_scalar("loss", 1.0, 0)
    writer.close()
    with writer as inner:
        inner.log({"a": 1})
    assert not writer and list(writer) == []


UNSEEDED = """
import random
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup

ddp_setup()
split = (torch.randperm(10).tolist(), random.random())  # no seed anywhere
before = [None, None]
dist.all_gather_object(before, split)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 2)).sum().backward()
optimizer.step()
after = [None, None]
dist.all_gather_object(after, torch.randn(3).tolist())  # noise drawn during training
shuffled = [None, None]
order = list(range(10))
random.shuffle(order)  # a dataset built each epoch shuffling its list (pytorch-0.4-yolov3)
dist.all_gather_object(shuffled, order)
if dist.get_rank() == 0:
    print("same before training:", before[0] == before[1], "same during training:", after[0] == after[1])
    print("same list order:", shuffled[0] == shuffled[1])
"""


def test_unseeded_draws_agree_before_training_and_differ_during_it(tmp_path):
    result = _torchrun(tmp_path, UNSEEDED)
    assert result.returncode == 0, result.stderr
    # dropout, noise and augmentation per rank once training runs, as DataParallel's replicas'
    assert "same before training: True same during training: False" in result.stdout
    # python's and numpy's generators stay alike: a dataset's own shuffle agrees across ranks
    assert "same list order: True" in result.stdout


QUIET = """
import logging, sys, warnings
from tqdm import tqdm
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup

ddp_setup()
rank = dist.get_rank()
print(f"print from rank {rank}")
logging.basicConfig(level=logging.INFO)
logging.info(f"info from rank {rank}")
logging.error(f"error from rank {rank}")
warnings.warn(f"warning from rank {rank}")
for _ in tqdm(range(3), desc=f"bar of rank {rank}"):
    pass
tqdm.write(f"tqdm.write from rank {rank}")
logging.getLogger("run").addHandler(logging.FileHandler(f"run{rank}.log"))
logging.getLogger("run").warning("to the file")
sys.stderr.write(f"stderr from rank {rank}\\n")
"""


def test_only_rank_zero_shows_output_but_errors_show_everywhere(tmp_path):
    result = _torchrun(tmp_path, QUIET)
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    for what in ("print", "info", "warning", "bar", "tqdm.write", "error", "stderr"):
        assert f"{what} from rank 0" in shown or f"{what} of rank 0" in shown, what
    for what in ("print", "info", "warning", "bar", "tqdm.write"):
        assert f"{what} from rank 1" not in shown and f"{what} of rank 1" not in shown, what
    assert "error from rank 1" in shown and "stderr from rank 1" in shown
    assert (tmp_path / "run0.log").exists() and not (tmp_path / "run1.log").exists(), "a log file opens for an error only"


def test_wrap_gives_a_module_with_nothing_to_train_what_data_parallel_gave(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    template.ddp_setup()
    try:
        # a perceptual-loss network, DCSR's loss ModuleList: DDP refuses it; DataParallel's wrapper
        # (`.module`, `module.` keys), run in this process, where DataParallel wrapped it
        frozen = torch.nn.Linear(2, 2).requires_grad_(False)
        held = template.ddp_wrap(frozen)
        assert held.module is frozen and set(held.state_dict()) == {"module.weight", "module.bias"}
        assert torch.equal(held(torch.ones(1, 2)), frozen(torch.ones(1, 2)))
        assert template.ddp_wrap(frozen, keys_unwrapped=True) is frozen  # (DataParallel never wrapped it)
        wrapped = template.ddp_wrap(torch.nn.Linear(2, 2), find_unused_parameters=True)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and wrapped.find_unused_parameters
        # a project helper reads the bare model's attributes (rnn-transducer's save_model:
        # `model.encoder.state_dict()` where its flag says "one GPU")
        head = torch.nn.Sequential(torch.nn.Linear(2, 2))
        head.linear_num = 7
        model = template.ddp_wrap(torch.nn.ModuleDict({"encoder": torch.nn.Linear(2, 2), "classifier": head}))
        assert model.encoder is model.module.encoder and model.classifier.linear_num == 7
        assert set(model.encoder.state_dict()) == {"weight", "bias"}
        with pytest.raises(AttributeError):
            model.missing
    finally:
        cleanup()


def test_sampler_of_a_sharded_loader_is_its_distributed_sampler():
    dataset = torch.utils.data.TensorDataset(torch.arange(8.0))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=2, rank=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    assert template.ddp_sampler(loader) is sampler


def test_sampler_of_a_generator_over_a_sharded_loader_is_that_loader_s():
    # pytorch-template's `self.data_loader = inf_loop(data_loader)`: the epoch loop's
    # set_epoch reaches the loader the generator was handed
    dataset = torch.utils.data.TensorDataset(torch.arange(8.0))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=2, rank=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)

    def inf_loop(data_loader):
        while True:
            yield from data_loader

    assert template.ddp_sampler(inf_loop(loader)) is sampler


def test_a_loader_that_does_not_shard_stops_at_set_epoch(monkeypatch):
    dataset = torch.utils.data.TensorDataset(torch.arange(8.0))
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=True)
    monkeypatch.setattr(template.dist, "get_world_size", lambda: 2)
    with pytest.raises(RuntimeError, match="RandomSampler, not a DistributedSampler"):
        template.ddp_sampler(loader)


def test_a_librarys_sampler_helper_allows_a_plain_sampler_in_a_world_of_one():
    # a project script left as it was, training with a converted trainer module
    from ddpify.transforms.process_group import library_helper_text

    text = library_helper_text("ddp_sampler(loader).set_epoch(1)")
    helpers = {"torch": torch, "dist": template.dist}
    exec(compile(text, "<library helpers>", "exec"), helpers)
    dataset = torch.utils.data.TensorDataset(torch.arange(8.0))
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=True)
    sampler = helpers["ddp_sampler"](loader)
    sampler.set_epoch(sampler.epoch + 1)


def test_library_helpers_allow_a_process_with_no_group():
    """A project script that was not converted imports a converted module: rank 0 of a
    world of one, and ddp_wrap leaves the module as it is."""
    assert not template.dist.is_initialized()
    assert template.ddp_rank() == 0 and template.ddp_world_size() == 1
    module = torch.nn.Linear(2, 2)
    assert template.ddp_wrap(module) is module


def test_library_helper_text_uses_the_tolerant_calls():
    from ddpify.transforms.process_group import library_helper_text

    text = library_helper_text("x = ddp_local_batch_size(8)")
    assert "batch_size // ddp_world_size()" in text and "def ddp_world_size():" in text
    assert "dist.get_world_size() if dist.is_initialized() else 1" in text


# -- ddp_shard: a training loader sharded at run time -----------------------------------------


@pytest.fixture(autouse=True)
def _private_reads_undone():
    """ddp_privately's reads of private copies last the process: each test is a run of its own."""
    yield
    state = template.ddp_privately.__dict__
    undo = state.pop("undo_reads", None)
    if undo is not None:
        undo()
    state.pop("private", None)


def _real_bytes(path) -> bytes:
    """The file on disk, past any redirection of this rank's reads."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        return os.read(descriptor, 1 << 20)
    finally:
        os.close(descriptor)


def _real_text(path) -> str:
    return _real_bytes(path).decode()


def _as_rank(monkeypatch, rank: int, world: int = 2) -> None:
    monkeypatch.setattr(template.dist, "get_world_size", lambda: world)
    monkeypatch.setattr(template.dist, "get_rank", lambda: rank)
    for kept in ("cache", "passes", "splits"):  # each rank is a process of its own
        template.ddp_shard.__dict__.pop(kept, None)


def _passes(loader, monkeypatch, rank: int, passes: int = 2) -> list[list[list[int]]]:
    """Each pass's batches, as lists of dataset indices, seen by `rank`."""
    _as_rank(monkeypatch, rank)
    sharded = template.ddp_shard(loader)
    assert template.ddp_shard(loader) is sharded, "one rebuilt loader per loader"
    return [[batch[0].tolist() for batch in sharded] for _ in range(passes)]


INDICES = torch.utils.data.TensorDataset(torch.arange(16))


def test_a_world_of_one_keeps_the_loader(monkeypatch):
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4)
    _as_rank(monkeypatch, 0, world=1)
    assert template.ddp_shard(loader) is loader


def test_in_order_each_global_batch_is_the_original_batch(monkeypatch):
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4)
    original = [batch[0].tolist() for batch in loader]
    ranks = [_passes(loader, monkeypatch, rank) for rank in (0, 1)]
    for step, batch in enumerate(original):
        assert sorted(ranks[0][0][step] + ranks[1][0][step]) == batch  # DataParallel's global batch
    assert len(ranks[0][0]) == len(ranks[1][0]) == len(original)


def test_a_loader_that_drops_its_last_batch_drops_the_tail_instead_of_padding_it(monkeypatch):
    # Real_Time_Segmentation (batch 48): 15 images at 4 a step, drop_last: 3 steps, not 4 with a repeat
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(15)), batch_size=4, drop_last=True)
    original = [batch[0].tolist() for batch in loader]
    ranks = [_passes(loader, monkeypatch, rank) for rank in (0, 1)]
    assert len(ranks[0][0]) == len(ranks[1][0]) == len(original) == 3
    for step, batch in enumerate(original):
        assert sorted(ranks[0][0][step] + ranks[1][0][step]) == batch


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.utils.data.DataLoader(INDICES, batch_size=4, shuffle=True),
        lambda: torch.utils.data.DataLoader(
            INDICES, batch_size=4, sampler=torch.utils.data.WeightedRandomSampler([1.0] * 16, 16, replacement=False)
        ),
    ],
    ids=["shuffle", "own_sampler"],
)
def test_ranks_share_each_epoch_and_reshuffle_for_the_next(monkeypatch, make):
    loader = make()
    zero, one = (_passes(loader, monkeypatch, rank) for rank in (0, 1))
    for epoch in (0, 1):
        seen = [i for batch in zero[epoch] + one[epoch] for i in batch]
        assert sorted(seen) == list(range(16)), "every sample once per epoch, split between the ranks"
    assert zero[0] != zero[1], "the next pass is the next epoch"


def test_a_batch_sampler_has_each_batch_split(monkeypatch):
    # contiguous parts, as DataParallel's scatter cut them (a sampler may arrange each batch
    # for that cut: Multilingual_Text_to_Speech's language groups)
    batches = [[0, 1, 2], [3, 4, 5, 6], [7]]
    loader = torch.utils.data.DataLoader(INDICES, batch_sampler=batches)
    zero, one = (_passes(loader, monkeypatch, rank, passes=1)[0] for rank in (0, 1))
    assert zero == [[0, 1], [3, 4], [7]] and one == [[2], [5, 6], [7]]


class _RepeatSampler:
    """timm's: a batch sampler repeated forever (no length)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class _MultiEpochsDataLoader(torch.utils.data.DataLoader):
    """timm's / RFNet's: its constructor wraps the batch sampler it made in an endless one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._DataLoader__initialized = False
        self.batch_sampler = _RepeatSampler(self.batch_sampler)
        self._DataLoader__initialized = True
        self.iterator = super().__iter__()

    def __len__(self):
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


def test_a_loader_that_repeats_its_batch_sampler_is_rebuilt_from_the_one_inside(monkeypatch):
    loader = _MultiEpochsDataLoader(INDICES, batch_size=4)
    zero, one = (_passes(loader, monkeypatch, rank, passes=1)[0] for rank in (0, 1))
    assert sorted(i for batch in zero + one for i in batch) == list(range(len(INDICES)))
    assert all(len(batch) <= 2 for batch in zero + one)


def test_options_are_kept(monkeypatch):
    def collate(samples):
        return [torch.stack([s[0] for s in samples]) * 10]

    loader = torch.utils.data.DataLoader(INDICES, batch_size=6, drop_last=True, collate_fn=collate)
    _as_rank(monkeypatch, 1)
    sharded = template.ddp_shard(loader)
    assert sharded.collate_fn is collate and sharded.drop_last and sharded.batch_size == 3
    assert [batch[0].tolist() for batch in sharded] == [[10, 30, 50], [70, 90, 110]]


def test_a_list_of_batches_is_split_batch_by_batch_on_every_pass(monkeypatch):
    # SpanBERT's pre-built list of batches: each rank takes its share of every batch, as
    # DataParallel's scatter did; a list is drawn anew on each pass
    batches = [(torch.arange(4), ["a", "b", "c", "d"]), (torch.arange(4, 7), ["e", "f", "g"])]
    shares = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        split = template.ddp_shard(batches)
        shares.append([[x.tolist() for x, _ in split] for _ in range(2)])
    assert shares[0][0] == shares[0][1] == [[0, 1], [4, 5]] and shares[1][0] == [[2, 3], [6]]
    assert [tags for _, tags in template.ddp_shard(batches)][0] == ["a", "b", "c", "d"]  # not a tensor: whole


def test_a_generator_of_batches_is_drawn_alike_on_every_rank_and_split(monkeypatch):
    # UER-py's / ModelsGenesis' own batch generators (random draws), NER-BERT's next(data_iterator)
    import random

    import numpy

    def batches():
        while True:
            yield torch.randperm(8)[:4], numpy.random.rand(4, 2), random.random()

    drawn = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        torch.manual_seed(rank)  # the ranks' own states differ: the draws must not
        iterator = template.ddp_shard(batches())
        drawn.append([next(iterator) for _ in range(2)])
    for step in range(2):
        (x0, a0, r0), (x1, a1, r1) = drawn[0][step], drawn[1][step]
        assert len(set(x0.tolist() + x1.tolist())) == 4 and len(x0) == len(x1) == 2  # one batch, split
        assert a0.shape == a1.shape == (2, 2) and r0 == r1  # arrays split too; a number is whole


def test_a_loader_built_anew_each_epoch_still_moves_to_the_next_epoch(monkeypatch):
    # Retinaface: `batch_iterator = iter(DataLoader(dataset, ..., shuffle=True))` every epoch
    _as_rank(monkeypatch, 0)
    epochs = [[b[0].tolist() for b in template.ddp_shard(torch.utils.data.DataLoader(INDICES, 4, shuffle=True))] for _ in range(2)]
    assert epochs[0] != epochs[1]


class PassThroughLoader(torch.utils.data.DataLoader):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.collate_fn = lambda samples: [torch.stack([s[0] for s in samples]) + 100]


class OwnConstructorLoader(torch.utils.data.DataLoader):
    def __init__(self, dataset, batch_size):
        super().__init__(dataset, batch_size, collate_fn=lambda samples: [torch.stack([s[0] for s in samples]) + 100])


def test_a_subclass_that_passes_its_arguments_on_is_rebuilt_as_itself(monkeypatch):
    _as_rank(monkeypatch, 0)
    sharded = template.ddp_shard(PassThroughLoader(INDICES, batch_size=4))
    assert type(sharded) is PassThroughLoader and [b[0].tolist() for b in sharded][0] == [100, 102]
    # a subclass whose constructor cannot be repeated (torch_geometric's DenseDataLoader): a
    # copy of it samples this rank's share, with its own collate
    original = OwnConstructorLoader(INDICES, 4)
    copied = template.ddp_shard(original)
    assert type(copied) is OwnConstructorLoader and [b[0].tolist() for b in copied][0] == [100, 102]
    assert [b[0].tolist() for b in original][0] == [100, 101, 102, 103]  # the original is left as it was


class EndlessBatches:
    """audioset_tagging_cnn's TrainSampler: batches drawn with the global generators, forever
    (the script stops after so many iterations); no length."""

    def __iter__(self):
        while True:
            yield torch.randperm(16)[:4].tolist()


def test_an_endless_batch_sampler_is_drawn_batch_by_batch(monkeypatch):
    loader = torch.utils.data.DataLoader(INDICES, batch_sampler=EndlessBatches())
    firsts = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        torch.manual_seed(rank)  # the script's own state differs per rank: the draws must not
        drawn = iter(template.ddp_shard(loader))
        firsts.append([next(drawn)[0].tolist() for _ in range(3)])
    for step in range(3):
        assert len(set(firsts[0][step] + firsts[1][step])) == 4, "each global batch split between the ranks"
        assert len(firsts[0][step]) == len(firsts[1][step]) == 2


class ClaimsALength(torch.utils.data.Sampler):
    """StyTR-2's InfiniteSamplerWrapper: endless, yet says its length is 2**31."""

    def __iter__(self):
        while True:
            yield from torch.randperm(16).tolist()

    def __len__(self):
        return 2**31


def test_an_endless_sampler_that_claims_a_huge_length_is_drawn_lazily(monkeypatch):
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4, sampler=ClaimsALength())
    drawn = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        batches = iter(template.ddp_shard(loader))
        drawn.append([next(batches)[0].tolist() for _ in range(2)])  # returns at once, no list(2**31)
    for step in range(2):
        assert len(set(drawn[0][step] + drawn[1][step])) == 4 and len(drawn[0][step]) == 2


class CountedTasks(torch.utils.data.Sampler):
    """torchmeta's task sampler: each draw is costly, and a pass is long (it says so)."""

    def __init__(self):
        self.drawn = 0

    def __len__(self):
        return 10**6

    def __iter__(self):
        for _ in range(len(self)):
            self.drawn += 1
            yield [int(torch.randint(0, 8, ()).item()) for _ in range(4)]


def test_a_sampler_is_drawn_as_the_loop_asks_not_a_whole_pass_ahead(monkeypatch):
    # MRN-ICASSP22's ProtoNet: `next(iter(loader))` each step drew the sampler's whole pass
    tasks = CountedTasks()
    loader = torch.utils.data.DataLoader(INDICES, batch_sampler=tasks)
    firsts = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        firsts.append(next(iter(template.ddp_shard(loader)))[0].tolist())
    assert tasks.drawn <= 4, tasks.drawn
    assert len(firsts[0]) == len(firsts[1]) == 2


def test_an_index_sampler_drawn_lazily_pads_its_last_round_as_distributed_sampler_does(monkeypatch):
    draws = iter([5, 6, 7, 8, 9])  # five indices, three ranks: position 5 takes the first again
    shares = []
    for rank in range(3):
        shares.append(list(template.ddp_every_nth(iter([5, 6, 7, 8, 9]), 3, rank)))
    assert shares == [[5, 8], [6, 9], [7, 5]] and next(draws) == 5


def test_drawing_the_same_order_leaves_the_scripts_random_state_alone(monkeypatch):
    import random

    torch.manual_seed(3)
    random.seed(3)
    expected = torch.rand(1).item(), random.random()
    torch.manual_seed(3)
    random.seed(3)
    draws = template.ddp_same_draw(EndlessBatches(), epoch=5)
    next(draws)
    first = torch.rand(1).item()
    next(draws)
    assert (first, random.random()) == expected


def test_a_loader_of_one_item_per_step_keeps_one_per_process(monkeypatch):
    # single samples, torch's collate: batch_size=1 cannot be divided
    loader = torch.utils.data.DataLoader(INDICES, batch_size=1)
    zero, one = (_passes(loader, monkeypatch, rank, passes=1)[0] for rank in (0, 1))
    assert all(len(batch) == 1 for batch in zero + one)
    assert sorted(i for batch in zero + one for i in batch) == list(range(16))


def test_items_that_are_batches_are_split_as_dataparallel_split_them(monkeypatch):
    # Conv-TasNet (batch 45): each item is a minibatch, its collate takes `batch[0]`; sharded by
    # item, each rank trained on whole items: the global batch doubled and the steps halved
    minibatches = [torch.arange(4 * i, 4 * i + 4) for i in range(4)]
    loader = torch.utils.data.DataLoader(minibatches, batch_size=1, collate_fn=lambda batch: batch[0])
    shares = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        shares.append([batch.tolist() for batch in template.ddp_shard(loader)])
    assert shares[0] == [[0, 1], [4, 5], [8, 9], [12, 13]] and shares[1] == [[2, 3], [6, 7], [10, 11], [14, 15]]


def test_a_sampler_whose_epoch_loop_is_out_of_sight_moves_on_each_pass():
    sampler = template.DdpNextEpochSampler(INDICES, num_replicas=2, rank=0, shuffle=True)
    first, second = list(sampler), list(sampler)
    assert first != second and sorted(first) != first or first != second
    sampler.set_epoch(0)  # an explicit set_epoch still decides
    assert list(sampler) == first


BARE_KEYS = """
import torch
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap

ddp_setup()
model = ddp_wrap(torch.nn.Linear(2, 1))
bare = {k: torch.ones_like(v) for k, v in torch.nn.Linear(2, 1).state_dict().items()}
model.load_state_dict(bare)  # the bare model's checkpoint (CTR-GCN added `module.` only under DataParallel)
assert all(bool((v == 1).all()) for v in model.module.state_dict().values())
prefixed = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
assert all(k.startswith("module.") for k in prefixed)
model.load_state_dict(prefixed)  # and the wrapped model's own
assert all(bool((v == 0).all()) for v in model.module.state_dict().values())
print("loaded both")
"""


def test_the_wrapped_model_loads_checkpoints_with_and_without_the_module_prefix(tmp_path):
    result = _torchrun(tmp_path, BARE_KEYS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("loaded both") == 1  # rank 1 is quiet; its asserts held (rc 0)


ANY = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_any, ddp_setup

ddp_setup()
assert ddp_any(torch.tensor(dist.get_rank() == 1)) is True  # one rank's NaN: every rank skips
assert ddp_any(False) is False
print("agreed")
"""


def test_a_skip_is_decided_alike_on_every_rank(tmp_path):
    result = _torchrun(tmp_path, ANY)
    assert result.returncode == 0, result.stderr
    assert "agreed" in result.stdout


FAILURES = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_failed_here, ddp_failures_agreed, ddp_setup


class Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not sent as it is")


ddp_setup()
skipped = []
for step, failing in enumerate([None, (1, KeyError), (0, Unpicklable), (1, KeyError)]):
    try:
        ddp_failures_agreed()
        if failing and failing[0] == dist.get_rank():
            raise failing[1]("bad sample")
        ddp_failures_agreed(before_backward=True)
    except KeyError as error:
        ddp_failed_here()
        skipped.append((step, "KeyError", error.args[0]))
    except Exception as error:
        ddp_failed_here()
        skipped.append((step, type(error).__name__, str(error)))
assert skipped == [(1, "KeyError", "bad sample"), (2, *(("Unpicklable", "bad sample") if dist.get_rank() == 0 else ("RuntimeError", "Unpicklable: bad sample"))), (3, "KeyError", "bad sample")], skipped
print("skipped together")
try:
    ddp_failures_agreed(before_backward=True)
    if dist.get_rank() == 1:
        raise ValueError("in backward")
    dist.barrier()  # (backward's all-reduce: rank 1 never comes)
except ValueError:
    ddp_failed_here()
"""


def test_a_step_failure_is_taken_by_every_rank_and_one_in_backward_stops_the_run(tmp_path):
    result = _torchrun(tmp_path, FAILURES)
    assert "skipped together" in result.stdout
    assert result.returncode != 0
    assert "rank 1 failed in a training step while the ranks exchanged its gradients" in result.stderr


class DataIterator:
    """ShuffleNet-Series' DataIterator: `.next()` only, re-walking its loader when it runs out."""

    def __init__(self, loader):
        self.loader, self.iterator = loader, iter(loader)

    def next(self):
        try:
            return next(self.iterator)
        except StopIteration:
            self.iterator = iter(self.loader)
            return next(self.iterator)


def test_a_python_2_style_iterator_is_drawn_alike_and_split(monkeypatch):
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4, shuffle=True)
    drawn = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        torch.manual_seed(rank)
        provider = DataIterator(loader)
        drawn.append([template.ddp_shard(provider).next()[0].tolist() for _ in range(3)])
    for step in range(3):
        assert len(set(drawn[0][step] + drawn[1][step])) == 4 and len(drawn[0][step]) == 2


def test_a_generator_made_anew_each_epoch_draws_a_new_order_each_epoch(monkeypatch):
    # P4Transformer: `for batch in metric_logger.log_every(loader, ...)` makes a new generator
    # each epoch over a shuffling loader; each epoch's order must differ, and agree across ranks
    def log_every(loader):
        yield from loader

    orders = {}
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        torch.manual_seed(rank)
        loader = torch.utils.data.DataLoader(INDICES, 4, shuffle=True)
        orders[rank] = [[b[0].tolist() for b in template.ddp_shard(log_every(loader))] for _ in range(2)]
    assert orders[0][0] != orders[0][1]
    assert [len(b) for b in orders[0][0]] == [2] * (len(INDICES) // 4)
    for epoch in range(2):  # the ranks split the same batches between them
        for left, right in zip(orders[0][epoch], orders[1][epoch]):
            assert not set(left) & set(right)


class MinusOneLength(EndlessBatches):
    """piano_transcription's batch sampler: endless, `__len__` returns -1 (len() raises ValueError)."""

    def __len__(self):
        return -1


def test_an_endless_batch_sampler_with_a_negative_length_is_drawn_batch_by_batch(monkeypatch):
    _as_rank(monkeypatch, 0)
    drawn = iter(template.ddp_shard(torch.utils.data.DataLoader(INDICES, batch_sampler=MinusOneLength())))
    assert [len(next(drawn)[0]) for _ in range(3)] == [2, 2, 2]


class _RandomPicks(torch.utils.data.Dataset):
    """VDNet's shape: each item is a random pick, whatever the index."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        import random

        return torch.tensor([random.random(), __import__("numpy").random.rand()])


class _TorchPicks(_RandomPicks):
    """CSPN's validation set: a random sparse mask drawn with torch for each sample."""

    def __getitem__(self, index):
        return torch.rand(2)


def test_the_data_loading_draws_per_rank_where_sharded_and_alike_elsewhere(monkeypatch):
    import random

    from torch.utils.data import dataloader as loading

    seen, after, seeds, whole = {}, {}, {}, {}
    begin, fetch = loading._BaseDataLoaderIter.__init__, loading._SingleProcessDataLoaderIter._next_data
    for rank in (0, 1):
        # (each rank a process of its own: the DataLoader internals as they were before set-up)
        monkeypatch.setattr(loading._BaseDataLoaderIter, "__init__", begin)
        monkeypatch.setattr(loading._SingleProcessDataLoaderIter, "_next_data", fetch)
        _as_rank(monkeypatch, rank)
        random.seed(3), __import__("numpy").random.seed(3), torch.manual_seed(3)
        template.ddp_own_data_draws()
        picks = _RandomPicks()
        shard = torch.utils.data.distributed.DistributedSampler(picks, num_replicas=2, rank=rank, shuffle=False)
        loader = torch.utils.data.DataLoader(picks, batch_size=4, sampler=shard)
        seen[rank] = torch.cat([batch for batch in loader])
        seeds[rank] = iter(loader)._base_seed
        after[rank] = (random.random(), __import__("numpy").random.rand())
        torch.manual_seed(rank)  # torch's stream, split per rank after the first step
        evaluation = torch.utils.data.DataLoader(_TorchPicks(), batch_size=4)  # read whole by every rank
        whole[rank] = (torch.cat([batch for batch in evaluation]), iter(evaluation)._base_seed)
    assert not torch.equal(seen[0], seen[1]), "each rank's dataset draws its own samples"
    assert seeds[1] == seeds[0] + 1, "workers of a sharded loader are seeded per rank"
    assert torch.equal(whole[0][0], whole[1][0]) and whole[0][1] == whole[1][1], "a loader read whole draws alike"
    assert after[0] == after[1], "the script's own draws stay alike"
    assert after[0][0] == (random.seed(3), random.random())[1], "fetches leave the script's stream where it was"


class _FileLogger:
    """HPLFlowNet's Logger: it keeps the handle the script reads (`logger.out_fd`)."""

    def __init__(self, path):
        self.out_fd = open(path, "w")

    def log(self, text):
        self.out_fd.write(text)
        self.out_fd.flush()
        __import__("os").fsync(self.out_fd.fileno())


def test_a_quiet_object_writes_its_files_on_rank_zero_only(monkeypatch, tmp_path):
    for rank in (1, 0):
        _as_rank(monkeypatch, rank)
        monkeypatch.setattr(template.dist, "is_initialized", lambda: True)
        monkeypatch.setattr(template.dist, "barrier", lambda: None)
        logger = template.ddp_quiet(_FileLogger, tmp_path / f"log{rank}.txt")
        logger.log("epoch 0\n")  # a real file on every rank (fsync works)
        logger.out_fd.close()
    assert (tmp_path / "log0.txt").read_text() == "epoch 0\n" and not (tmp_path / "log1.txt").exists()
    import builtins

    assert builtins.open is open, "the real open() is back"


class _EarlyStopping:
    """pytorchtools' EarlyStopping: every rank tests its flag, and it saves the model when the
    loss improves (in __call__) and logs in a method, long after it was made."""

    def __init__(self, folder):
        self.folder, self.best, self.early_stop = folder, None, False

    def __call__(self, loss, state):
        if self.best is None or loss < self.best:
            self.best = loss
            template.torch.save(state, self.folder / "checkpoint.pt")
        self.note(f"loss {loss}")
        return self.best

    def note(self, text):
        with open(self.folder / "stopping.log", "a") as log:
            log.write(text + "\n")

    def restore(self):
        return template.torch.load(self.folder / "checkpoint.pt")


def test_a_quiet_object_keeps_its_later_writes_private_on_the_other_ranks(monkeypatch, tmp_path):
    _as_rank(monkeypatch, 1)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(template.dist, "barrier", lambda: None)
    stopping = template.ddp_quiet(_EarlyStopping, tmp_path)
    assert stopping(0.5, {"w": 1}) == 0.5 and stopping(0.7, {"w": 2}) == 0.5
    stopping.note("by hand")
    assert isinstance(stopping, _EarlyStopping) and stopping.early_stop is False
    assert list(tmp_path.iterdir()) == [], "rank 1 wrote nothing there"
    assert stopping.restore() == {"w": 1}, "it reads back what it wrote"
    import builtins

    assert builtins.open is open and template.torch.save.__name__ != "save_unseen", "the real functions are back"


class _TaskManager:
    """SRGAN's TaskManager: `open(path, 'x')` creates the register, or fails (it exists) and
    the registered tasks are read; a log it appends to keeps what is there."""

    def __init__(self, folder):
        try:
            with open(folder / "register.csv", "x") as made:
                made.write("task\n")
            self.tasks = []
        except FileExistsError:
            with open(folder / "register.csv") as register:
                self.tasks = register.read().split()[1:]
        with open(folder / "history.txt", "a+") as history:
            history.seek(0)
            self.history = history.read()
            history.write("opened\n")


def test_a_quiet_object_still_sees_the_files_that_are_there(monkeypatch, tmp_path):
    (tmp_path / "register.csv").write_text("task\nt1\n")
    (tmp_path / "history.txt").write_text("opened\n")
    _as_rank(monkeypatch, 1)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(template.dist, "barrier", lambda: None)
    manager = template.ddp_quiet(_TaskManager, tmp_path)
    assert manager.tasks == ["t1"] and manager.history == "opened\n"
    assert _real_text(tmp_path / "history.txt") == "opened\n", "rank 1 wrote nothing"


class ConstantConfig(dict):
    """glow's JsonConfig: pickles, but raises when unpickled (its __setitem__ refuses)."""

    def __setitem__(self, key, value):
        raise Exception(f"[JsonConfig]: Can't set constant key {key}")

    def __init__(self, **items):
        super().__init__()
        for key, value in items.items():
            dict.__setitem__(self, key, value)


def test_values_sent_from_rank_zero_keep_their_own_and_stand_in_for_what_cannot_travel(monkeypatch):
    import logging

    sent = {}

    def from_rank_zero(value):  # rank 0 sends, rank 1 receives (one process plays both)
        if template.dist.get_rank() == 0:
            sent["value"] = __import__("pickle").loads(__import__("pickle").dumps(value))
        return sent["value"]

    monkeypatch.setattr(template, "ddp_from_rank_zero", from_rank_zero)
    values = (logging, {"DEVICE": "cuda:0", "lr": 0.1}, "runs/exp", ConstantConfig(k=1))  # MobileFaceNet's init_log, Face-Transformer's config, glow's JsonConfig
    _as_rank(monkeypatch, 0)
    assert template.ddp_shared_values(values) is values
    _as_rank(monkeypatch, 1)
    module, config, folder, constant = template.ddp_shared_values(None)
    assert isinstance(module, template.DdpNoOp) and folder == "runs/exp" and isinstance(constant, template.DdpNoOp)
    assert config == {"DEVICE": "cuda", "lr": 0.1}, "rank 0's GPU is this rank's"


class RewindingLoader:
    """KernelGAT's project loader: `__iter__` returns itself, `next()` raises StopIteration at
    the end of a pass and rewinds, so the next `for` over it is the next epoch."""

    def __init__(self, batches):
        self.batches, self.at = batches, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.at == len(self.batches):
            self.at = 0
            raise StopIteration
        self.at += 1
        return self.batches[self.at - 1]


def test_an_iterator_that_rewinds_itself_is_drawn_again_each_pass(monkeypatch):
    _as_rank(monkeypatch, 1)
    split = template.ddp_shard(RewindingLoader([torch.arange(4), torch.arange(4, 8)]))
    epochs = [[batch.tolist() for batch in split] for _ in range(3)]
    assert epochs == [[[2, 3], [6, 7]]] * 3
    one_shot = template.ddp_shard(iter([torch.arange(4)]))  # a spent iterator stays spent, as in the original
    assert [len(list(one_shot)) for _ in range(2)] == [1, 0]


def test_a_wrapped_model_has_its_module_wrapped(monkeypatch):
    # a checkpoint's pickled DataParallel (Deep-Image-Matting's resume), or a model wrapped before
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    template.ddp_setup()
    try:
        inner = torch.nn.Linear(2, 1)
        wrapped = template.ddp_wrap(torch.nn.DataParallel(inner))
        assert wrapped.module is inner
        assert template.ddp_wrap(wrapped).module is inner
        # a part wrapped before the whole it was handed to (LEDNet's encoder in the decoder model)
        whole = torch.nn.Sequential(template.ddp_wrap(torch.nn.Linear(2, 2)), torch.nn.Linear(2, 1))
        assert not any(isinstance(part, template.DistributedDataParallel) for part in template.ddp_wrap(whole).module.modules())
    finally:
        cleanup()


def test_a_shuffling_sampler_no_rank_shards_draws_the_same_order_on_every_rank(monkeypatch):
    # MonoDepth's shuffled validation loader, read whole by every rank after torch's stream
    # was split per rank: the order (and so the summed metric) must not differ between ranks
    from torch.utils.data import sampler as sampling

    kinds = (sampling.RandomSampler, sampling.SubsetRandomSampler, sampling.WeightedRandomSampler)
    unpatched = {kind: kind.__iter__ for kind in kinds}
    orders = []
    try:
        for rank in (0, 1):
            torch.manual_seed(0)  # the state every rank starts from (ddp_share_random_state)
            template.ddp_orders_alike()
            torch.manual_seed(100 + rank)  # split per rank after the first step
            loader = torch.utils.data.DataLoader(INDICES, batch_size=4, shuffle=True)
            orders.append([[b[0].tolist() for b in loader] for _ in range(2)])
            for kind, iterate in unpatched.items():
                kind.__iter__ = iterate
    finally:
        for kind, iterate in unpatched.items():
            kind.__iter__ = iterate
    assert orders[0] == orders[1]
    assert orders[0][0] != orders[0][1]  # still a new order each pass


def test_rank_zero_replaces_a_checkpoint_whole_while_another_reader_holds_it(monkeypatch, tmp_path):
    # Crossformer: every rank reloads the best checkpoint, then rank 0 saves it again to the
    # same path; a rank still reading must see the previous file whole, never a truncated one
    monkeypatch.setattr(torch, "save", torch.save)
    path = tmp_path / "checkpoint.pth"
    torch.save({"w": torch.arange(4)}, path)
    reader = open(path, "rb")
    template.ddp_atomic_saves()
    torch.save({"w": torch.arange(8)}, path)
    try:
        assert torch.load(reader)["w"].tolist() == [0, 1, 2, 3], "the open file is the old one, whole"
    finally:
        reader.close()
    assert torch.load(path)["w"].numel() == 8 and not list(tmp_path.glob("*.ddpify-partial"))
    import io

    buffer = io.BytesIO()
    torch.save({"w": 1}, buffer)  # a file object is written as it is
    assert buffer.getvalue()


def _evaluate_into(folder, predictions):
    """HRNet's COCO evaluation: the results are written to a fixed path, then read back."""
    import json

    path = folder / "results" / "keypoints_results_0.json"
    path.parent.mkdir(exist_ok=True)
    with open(path, "w") as f:
        json.dump(predictions, f)
    with open(path) as f:
        return sum(json.load(f))


def test_a_quiet_evaluation_reads_back_what_this_rank_wrote(monkeypatch, tmp_path):
    _as_rank(monkeypatch, 1)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keypoints_results_0.json").write_text("[100]")  # rank 0's, half written or older
    assert template.ddp_quiet(_evaluate_into, tmp_path, [1, 2, 3]) == 6
    assert _real_text(tmp_path / "results" / "keypoints_results_0.json") == "[100]", "rank 1 wrote nothing"
    assert template.ddp_quiet(_evaluate_into, tmp_path, [4]) == 4, "the next pass writes its copy again"


def _write_detections(path, detections):
    import pickle

    with open(path, "wb") as f:
        pickle.dump(detections, f)


def _read_detections(path):
    import pickle

    with open(path, "rb") as f:
        return pickle.load(f)


def test_what_a_quiet_call_wrote_reads_as_this_rank_s_copy_after_it(monkeypatch, tmp_path):
    # SSD's evaluation: one project function writes the detections (made quiet), the next one
    # reads them back outside it; the real file is rank 0's, not written yet (FileNotFoundError)
    _as_rank(monkeypatch, 1)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)
    path = str(tmp_path / "detections.pkl")
    template.ddp_quiet(_write_detections, path, [1, 2])
    assert not os.path.exists(path)
    assert _read_detections(path) == [1, 2]
    with open(path, "wb") as f:  # written outside a private call: the real file is this rank's again
        f.write(b"")
    assert os.path.getsize(path) == 0 and open(path, "rb").read() == b""
    template.ddp_quiet(_write_detections, path, [3])
    torch.save([4], path)  # (torch writes from C++: outside a private call, the real file again too)
    assert torch.load(path) == [4]


def _save_best(folder, weights):
    """A project trainer's checkpoint: torch.save to a named path (written from C++, not open())."""
    torch.save({"w": weights}, folder / "best.pth")
    return torch.load(folder / "best.pth")["w"]


def test_a_quiet_function_saves_its_checkpoints_privately(monkeypatch, tmp_path):
    _as_rank(monkeypatch, 1)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)
    torch.save({"w": 0}, tmp_path / "best.pth")  # rank 0's
    assert template.ddp_quiet(_save_best, tmp_path, 7) == 7, "this rank reads back its own"
    assert torch.load(io.BytesIO(_real_bytes(tmp_path / "best.pth")))["w"] == 0, "rank 1 wrote nothing"
    assert torch.load(tmp_path / "best.pth")["w"] == 7, "and reads its own from then on"
    assert template.torch.save is torch.save and template.torch.load is torch.load


class _RunFolder:
    """pytorch-playground's logger: clears its run folder, makes it again, writes a log there."""

    def __init__(self, folder):
        import shutil

        if os.path.exists(folder):
            shutil.rmtree(folder)
        os.makedirs(folder)
        with open(os.path.join(folder, "log.txt"), "w") as f:
            f.write("started")
        os.rename(os.path.join(folder, "log.txt"), os.path.join(folder, "log.old"))
        os.remove(os.path.join(folder, "log.old"))


def test_a_quiet_object_clears_and_makes_folders_only_in_its_private_copies(monkeypatch, tmp_path):
    import shutil

    _as_rank(monkeypatch, 1)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(template.dist, "barrier", lambda: None)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.old").write_text("rank 0's")
    template.ddp_quiet(_RunFolder, str(tmp_path / "run"))
    assert (tmp_path / "run" / "log.old").read_text() == "rank 0's", "rank 1 removed and renamed nothing"
    assert not (tmp_path / "run" / "log.txt").exists()
    assert os.remove.__module__ in ("posix", "nt") and shutil.rmtree.__module__ == "shutil" and os.makedirs.__module__ == "os"


def test_a_sparse_batch_is_split_as_a_dense_one(monkeypatch):
    # DeepRecommender's data layer yields sparse rating matrices (tensor_split has no sparse form)
    _as_rank(monkeypatch, 1)
    batch = torch.arange(15.0).reshape(5, 3)
    assert torch.equal(template.ddp_scatter(batch.to_sparse()).to_dense(), template.ddp_scatter(batch))


UNCLOSED_LOG = """
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

log = open("train.log", "w")  # never closed: Python flushes it at exit
model = nn.DataParallel(nn.Linear(3, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for (x,) in DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4):
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
log.write("end of training\\n")
"""


def test_the_global_optimizer_hooks_go_at_exit_so_open_files_are_flushed(tmp_path):
    # a global optimizer hook defined in the script held the script's globals past the point where
    # Python flushes its open files: a log written through a module-level open() lost its tail
    import subprocess
    import sys

    from ddpify.api import convert_source

    converted = convert_source(UNCLOSED_LOG, path="train.py").output
    assert "ddp_wrap(" in converted
    (tmp_path / "train.py").write_text(converted)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env={**env, "DDPIFY_NO_RELAUNCH": "1"}, check=True, timeout=120)
    assert (tmp_path / "train.log").read_text() == "end of training\n"


def test_a_shard_lives_only_as_long_as_what_it_shards(monkeypatch):
    # DiscoGAN makes new loader iterators each epoch: a cache of every object seen kept their
    # workers and open files alive for the whole run
    import gc
    import weakref

    _as_rank(monkeypatch, 0)
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4)
    assert template.ddp_shard(loader) is template.ddp_shard(loader), "rebuilt once per loader"
    gone = weakref.ref(loader)
    del loader
    gc.collect()
    assert gone() is None


def test_whole_batches_are_the_same_batches_on_every_rank(monkeypatch):
    # ddp_shard(..., whole_batches=True): each rank draws every batch whole (the model's calls split it)
    episodes = [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    ranks = []
    for rank in (0, 1):
        loader = torch.utils.data.DataLoader(INDICES, batch_sampler=episodes)
        _as_rank(monkeypatch, rank)
        ranks.append([batch[0].tolist() for batch in template.ddp_shard(loader, whole_batches=True)])
    assert ranks[0] == ranks[1] == episodes


def test_a_scattered_call_runs_the_model_on_this_rank_s_share_and_gathers_every_output(monkeypatch):
    _as_rank(monkeypatch, 1)
    seen = []

    def model(x, y):
        seen.append((x.tolist(), y.tolist()))
        return x * 10

    monkeypatch.setattr(template, "ddp_gathered", lambda outputs: ("gathered", outputs.tolist()))
    assert template.ddp_scattered(model, torch.arange(4), torch.arange(4) + 4) == ("gathered", [20, 30])
    assert seen == [([2, 3], [6, 7])]


def test_a_scattered_call_with_nothing_to_split_runs_the_model_whole_and_gathers_nothing(monkeypatch):
    # a whole-data step (DDP316) handed a graph object: every rank runs it whole, as one process did
    _as_rank(monkeypatch, 1)
    graph = object()
    monkeypatch.setattr(template, "ddp_gathered", lambda outputs: pytest.fail("gathered what was not split"))
    assert template.ddp_scattered(lambda g, scale=2.0: (g, scale), graph, scale=torch.tensor(3.0)) == (graph, torch.tensor(3.0))


def test_a_batch_object_with_tensor_fields_is_split_and_a_batch_with_nothing_to_split_stops(monkeypatch):
    # torchtext's Batch (`batch.src`, `batch.trg`) was handed whole to every rank
    _as_rank(monkeypatch, 1)

    class Batch:
        def __init__(self, src, trg):
            self.src, self.trg, self.fields = src, trg, ["src", "trg"]

    share = template.ddp_batch_share(Batch(torch.arange(4), torch.arange(4) + 10))
    assert share.src.tolist() == [2, 3] and share.trg.tolist() == [12, 13] and share.fields == ["src", "trg"]
    with pytest.raises(RuntimeError, match="holds no tensor or array to split"):
        template.ddp_batch_share(["a sentence", "another"])


def test_a_prefetcher_s_end_of_pass_is_handed_on_as_it_is(monkeypatch):
    # QuARE's DataPreFetcher.next() returns None at the end of a pass (`while data is not None`),
    # apex's data_prefetcher a pair of Nones: drawn alike on every rank, every rank stops alike
    _as_rank(monkeypatch, 1)
    assert template.ddp_batch_share(None) is None
    assert template.ddp_batch_share((None, None)) == (None, None)


def test_a_torchtext_batch_of_time_major_pairs_is_cut_along_its_batch_dimension(monkeypatch):
    # NEU_NMT_v2: torchtext's Batch holds `src = (tokens, lengths)`, tokens time-major
    # (time x batch), and `batch_size`: every tensor is cut where it is as long as the batch
    _as_rank(monkeypatch, 1)

    class Batch:
        def __init__(self):
            self.batch_size = 4
            self.src = (torch.arange(24).view(6, 4), torch.tensor([6, 5, 4, 3]))
            self.trg = torch.arange(32).view(8, 4)

    share = template.ddp_batch_share(Batch())
    tokens, lengths = share.src
    assert tokens.tolist() == [[2 + 4 * t, 3 + 4 * t] for t in range(6)] and lengths.tolist() == [4, 3]
    assert share.trg.shape == (8, 2) and share.batch_size == 2


def test_a_batch_object_whose_tensors_disagree_on_their_first_dimension_stops(monkeypatch):
    _as_rank(monkeypatch, 1)

    class Batch:
        def __init__(self):
            self.src, self.trg = torch.zeros(6, 4), torch.zeros(8, 4)

    with pytest.raises(RuntimeError, match="which one is the batch is not known"):
        template.ddp_batch_share(Batch())


def test_a_pickled_wrapped_model_is_a_data_parallel_of_its_module():
    # `torch.save(model)` of the wrapped model: the project's loader (`checkpoint['model'].module`)
    # reads what DataParallel's checkpoints held, not a class of the converted script
    import pickle

    wrapped = template.DdpModel.__new__(template.DdpModel)
    torch.nn.Module.__init__(wrapped)
    wrapped.module = torch.nn.Linear(2, 1)
    loaded = pickle.loads(pickle.dumps(wrapped))
    assert type(loaded) is torch.nn.DataParallel
    assert torch.equal(loaded.module.weight, wrapped.module.weight)
    assert torch.equal(loaded(torch.ones(1, 2)), wrapped.module(torch.ones(1, 2)))



def test_a_pickled_model_data_parallel_never_wrapped_is_the_bare_module():
    # MachineTranslation's `torch.save(self.model.module if do_parallel else self.model)` without
    # the flag saved the bare model; a DataParallel shell around its state had no `.module`
    import pickle

    wrapped = template.DdpModel.__new__(template.DdpModel)
    torch.nn.Module.__init__(wrapped)
    wrapped.module = torch.nn.Linear(2, 1)
    wrapped.ddp_keys_unwrapped = True
    loaded = pickle.loads(pickle.dumps(wrapped))
    assert type(loaded) is torch.nn.Linear
    assert torch.equal(loaded(torch.ones(1, 2)), wrapped.module(torch.ones(1, 2)))

UNFROZEN_LATE = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap

ddp_setup()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
for p in net[0].parameters():
    p.requires_grad_(False)  # frozen when wrapped, unfrozen later by a step function out of sight
model = ddp_wrap(net)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for p in net[0].parameters():
    p.requires_grad_(True)
x = torch.randn(4, 3) + dist.get_rank()  # each rank's own shard
model(x).sum().backward()
optimizer.step()
torch.save([p.detach() for p in net.parameters()], f"weights{dist.get_rank()}.pt")
"""


def test_parameters_unfrozen_after_the_wrap_are_averaged_before_each_step(tmp_path):
    # SiamDW's project step function unfreezes backbone blocks after the wrap: DDP never averaged
    # them, and each rank trained its own copy
    result = _torchrun(tmp_path, UNFROZEN_LATE)
    assert result.returncode == 0, result.stderr
    ranks = [torch.load(tmp_path / f"weights{rank}.pt") for rank in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(*ranks))


SEARCH_WEIGHTS = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap

ddp_setup()
torch.manual_seed(0)
net = torch.nn.Linear(3, 2)
alphas = (1e-3 * torch.randn(2, 3)).requires_grad_()  # PC-DARTS' architecture weights: a plain tensor
net._arch_parameters = [alphas]  # held by the model
proxies = torch.nn.Parameter(torch.randn(3, 2))  # a loss's own weights (ProxyGML)
model = ddp_wrap(net)
arch_optimizer = torch.optim.Adam([alphas, proxies], lr=0.1)
x = torch.randn(4, 3) + dist.get_rank()  # each rank's own shard
for step in range(2):
    arch_optimizer.zero_grad()
    (model(x) @ alphas @ proxies).pow(2).mean().backward()
    arch_optimizer.step()
torch.save([alphas.detach(), proxies.detach()], f"weights{dist.get_rank()}.pt")
"""


def test_weights_an_optimizer_steps_outside_ddp_are_averaged_before_each_step(tmp_path):
    # PC-DARTS steps its architecture tensors (not parameters of any module) with their own
    # optimizer, ProxyGML its loss's proxies: DDP never saw them, and each rank searched its own
    # architecture and kept its own proxies
    result = _torchrun(tmp_path, SEARCH_WEIGHTS)
    assert result.returncode == 0, result.stderr
    ranks = [torch.load(tmp_path / f"weights{rank}.pt") for rank in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(*ranks))


def test_a_sampler_that_reseeds_from_entropy_still_draws_alike_on_every_rank(monkeypatch):
    # FastGAN's InfiniteSampler calls `np.random.seed()` (no argument) each time it wraps around:
    # each rank drew its own permutation, and the shares overlapped
    import numpy

    class Reseeding(torch.utils.data.Sampler):
        def __iter__(self):
            numpy.random.seed()
            return iter(numpy.random.permutation(16).tolist())

        def __len__(self):
            return 16

    orders = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        with template.DdpSameRandom(3):
            orders.append(list(Reseeding()))
    assert orders[0] == orders[1]
    numpy.random.seed()  # (the seeding functions are put back: entropy again outside a draw)
    assert numpy.random.seed.__module__ != template.__name__


def test_a_batch_shorter_than_the_world_gives_each_rank_one_of_its_samples(monkeypatch):
    # d-bert's torchtext iterator keeps a last batch of 1: rank 1's share was empty and
    # pack_padded_sequence stopped it
    _as_rank(monkeypatch, 1, world=4)
    assert template.ddp_batch_share((torch.arange(2), torch.arange(2) + 10)) == (torch.tensor([1]), torch.tensor([11]))
    _as_rank(monkeypatch, 3, world=4)
    assert template.ddp_batch_share([torch.arange(2)])[0].tolist() == [1]
    # (the model's inputs of a batch every rank holds whole keep DataParallel's cut: a share may be empty)
    assert template.ddp_scatter(torch.arange(2)).tolist() == []


ATTRIBUTES_SET = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap


class Flow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)

    def reverse(self):
        return self.h_cache * 2


ddp_setup()
model = ddp_wrap(Flow())
if hasattr(model, "layer"):  # (NanoFlow's test: DataParallel answered no, the bare model yes)
    model.h_cache = torch.ones(1)
model.train(False)
model.require_backward_grad_sync = True
assert model.module.reverse().item() == 2.0 and "h_cache" not in model.__dict__
assert model.training is False and model.module.training is False
assert "require_backward_grad_sync" in model.__dict__ and "require_backward_grad_sync" not in model.module.__dict__
print("ok", dist.get_rank())
"""


def test_an_attribute_set_on_the_wrapped_model_that_the_wrapper_lacks_is_the_model_s(tmp_path):
    # NanoFlow: `model.h_cache = nn.Parameter(...)` for the model's own reverse(): set on the DDP
    # wrapper, reverse() found no h_cache (a crash at the first checkpoint's synthesis)
    result = _torchrun(tmp_path, ATTRIBUTES_SET)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ok") == 1  # (rank 0's output only)


class _IdentitySampler(torch.utils.data.Sampler):
    """ReID's RandomIdentitySampler in a fixed order: P identities of K images each, in a row."""

    def __init__(self, people: int, images: int) -> None:
        self.people, self.images = people, images

    def __iter__(self):
        return iter(range(self.people * self.images))

    def __len__(self) -> int:
        return self.people * self.images


def test_a_users_sampler_batched_by_torch_has_each_batch_cut_in_contiguous_parts(monkeypatch):
    # huangzh13/ReID.template.pytorch: a batch of 4 people x 4 images; each rank taking every other
    # draw left each rank 2 images of each person, and the triplet loss's hardest positive was gone
    # at 4 ranks. DataParallel's scatter cut each batch in contiguous parts: each person's images together.
    loader = torch.utils.data.DataLoader(INDICES, batch_size=8, sampler=_IdentitySampler(4, 4))
    zero, one = (_passes(loader, monkeypatch, rank, passes=1)[0] for rank in (0, 1))
    assert zero == [[0, 1, 2, 3], [8, 9, 10, 11]] and one == [[4, 5, 6, 7], [12, 13, 14, 15]]


def test_a_batch_of_one_that_cannot_be_divided_says_so_once(monkeypatch):
    _as_rank(monkeypatch, 0, world=2)
    template.ddp_local_batch_size.__dict__.pop("told", None)
    with pytest.warns(UserWarning, match="batch size 1 cannot be divided among 2 processes"):
        assert template.ddp_local_batch_size(1) == 1
    assert template.ddp_local_batch_size(1) == 1  # (said once)


def test_a_users_sampler_with_a_batch_of_one_gives_each_rank_its_own_samples(monkeypatch):
    # (a review: contiguous parts of a batch of one gave every rank the same sample, N times the work)
    loader = torch.utils.data.DataLoader(INDICES, batch_size=1, sampler=_IdentitySampler(4, 4))
    zero, one = (_passes(loader, monkeypatch, rank, passes=1)[0] for rank in (0, 1))
    assert len(zero) == len(one) == 8 and not {i for b in zero for i in b} & {i for b in one for i in b}


def test_a_users_sampler_batch_that_does_not_divide_stops_with_a_message(monkeypatch):
    loader = torch.utils.data.DataLoader(INDICES, batch_size=5, sampler=_IdentitySampler(4, 4))
    _as_rank(monkeypatch, 0)
    with pytest.raises(SystemExit, match="batch size 5 does not divide evenly"):
        template.ddp_shard(loader)


def test_a_loader_sharded_where_it_was_built_moves_to_the_next_epoch_on_each_pass(monkeypatch):
    # WoodScape: the parent trainer's module built the loader with a DistributedSampler; the
    # subclass's loop in another module draws it with no set_epoch: every epoch was the first's order
    _as_rank(monkeypatch, 0)
    sampler = torch.utils.data.DistributedSampler(INDICES, num_replicas=2, rank=0, shuffle=True)
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4, sampler=sampler)
    drawn = template.ddp_shard(loader)
    assert template.ddp_shard(loader) is drawn and len(drawn) == len(loader) and drawn.dataset is INDICES
    orders = [[i for batch in drawn for i in batch[0].tolist()] for _ in range(3)]
    assert sampler.epoch == 2 and orders[0] != orders[1] != orders[2]
    sampler.set_epoch(7)  # (a loop that sets the epoch itself: not moved again)
    list(drawn)
    assert sampler.epoch == 7


def test_an_iterator_of_a_sharded_loader_is_not_split_again(monkeypatch):
    # WassersteinGAN (batch 45): `data_iter = iter(ddp_shard(dataloader))`, then
    # `ddp_shard(data_iter).next()`: each rank kept half of its share of every batch
    _as_rank(monkeypatch, 0)
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4)
    shard = template.ddp_shard(loader)
    drawn = iter(shard)
    assert template.ddp_shard(drawn) is drawn and len(next(drawn)[0]) == 2
    sampler = torch.utils.data.DistributedSampler(INDICES, num_replicas=2, rank=0, shuffle=False)
    by_hand = iter(torch.utils.data.DataLoader(INDICES, batch_size=2, sampler=sampler))
    assert template.ddp_shard(by_hand) is by_hand
    whole = iter(loader)  # (an iterator of a loader nothing sharded is still split)
    assert template.ddp_shard(whole) is not whole


IDLE_HEAD = """
import sys
import warnings
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap

class Backbone(torch.nn.Module):  # a torchvision classifier's shape: a head the feature model never calls
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.fc = torch.nn.Linear(4, 3)

class Features(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Backbone()
        self.out = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.out(torch.relu(self.model.body(x)))

def train(find_unused, accumulate):
    torch.manual_seed(0)
    net = Features()
    model = ddp_wrap(net, find_unused_parameters=find_unused)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(4, 6, 4, generator=torch.Generator().manual_seed(1))
    rank = dist.get_rank()
    for step in range(4):
        x = data[step, rank * 3:(rank + 1) * 3]
        parts = (x[:2], x[2:]) if accumulate else (x,)
        for part in parts:  # a second forward before the step: DDP's check raises there
            model(part).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return torch.cat([p.detach().flatten() for p in net.parameters()])

ddp_setup()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mended, accumulated = train(False, False), train(False, True)
told = [str(w.message) for w in caught if "find_unused_parameters" in str(w.message)]
reference, accumulated_reference = train(True, False), train(True, True)
gathered = [torch.zeros_like(mended) for _ in range(2)]
dist.all_gather(gathered, mended)
sys.stderr.write(f"rank {dist.get_rank()}: {told}\\n")
assert len(told) == 2 and "2 parameter(s) of Features" in told[0], told
assert torch.equal(gathered[0], gathered[1])
assert torch.allclose(mended, reference, atol=1e-7), (mended - reference).abs().max()
assert torch.allclose(accumulated, accumulated_reference, atol=1e-7)
assert not torch.equal(mended[8:20], reference[8:20] * 0)  # (the body trained: it is not all zeros)
print("trained as with find_unused_parameters")
"""


def test_parameters_the_forward_leaves_out_are_found_at_the_first_step(tmp_path):
    """Person_reID's ft_net calls a ResNet's parts one by one and never its fc: DDP made
    without find_unused_parameters stopped the run at the second step. The wrapped model
    finds them at the first step and trains as DDP with find_unused_parameters would."""
    result = _torchrun(tmp_path, IDLE_HEAD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("trained as with find_unused_parameters") == 1


DRAWN_ON_RANK_ZERO = """
import random
import numpy
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_shared_values

ddp_setup()
def split():  # a project function that writes files and draws (NLP_Project's index split)
    return numpy.random.randint(100, size=3).tolist(), random.random()
values = ddp_shared_values(split() if dist.get_rank() == 0 else None)
after = [None, None]
dist.all_gather_object(after, (numpy.random.rand(), random.random(), values))
if dist.get_rank() == 0:
    print("alike after rank 0 drew alone:", after[0] == after[1])
"""


def test_draws_rank_zero_made_alone_are_made_on_every_rank(tmp_path):
    pytest.importorskip("numpy")
    result = _torchrun(tmp_path, DRAWN_ON_RANK_ZERO)
    assert result.returncode == 0, result.stderr
    assert "alike after rank 0 drew alone: True" in result.stdout


FAILED_RANK = """
import time
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup

ddp_setup()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
model(torch.randn(2, 2)).sum().backward()
if dist.get_rank() == 1:
    raise ValueError("this rank failed")
time.sleep(2)
dist.all_reduce(torch.ones(1))  # rank 0 waits here for a rank that is gone
"""


def test_exit_waits_for_the_other_ranks_but_not_after_an_error(tmp_path):
    """Leaving the process group while another rank still held DDP's reducer aborted a rank
    after training had finished (exit -6, in half the runs of a plain DDP script): on gloo the
    ranks wait for each other at exit. Not a rank that failed: it leaves at once, and torchrun
    stops the others (a barrier there would hold the run for its timeout)."""
    import subprocess
    import sys
    import time

    path = tmp_path / "train.py"
    path.write_text(FAILED_RANK)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(path)]
    started = time.monotonic()
    result = subprocess.run(command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "this rank failed" in result.stderr
    assert time.monotonic() - started < 120, "the failed rank waited at the exit barrier"
    assert "ddp_exit" in template_source() and "monitored_barrier" in template_source()


def test_named_tuples_of_totals_are_averaged_too(monkeypatch):
    import collections

    Totals = collections.namedtuple("Totals", "loss steps")
    monkeypatch.setattr(template.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(template, "ddp_sum", lambda value, mean=False: value * 10 if not isinstance(value, tuple) else template.ddp_entries(value, mean))
    monkeypatch.setattr(template.dist, "all_reduce", lambda tensor, op=None: None)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)  # (a process group: ddp_sum reduces)
    monkeypatch.setattr(template, "ddp_device", lambda: torch.device("cpu"))
    assert template.ddp_entries(Totals(1.0, 2), True) == Totals(10.0, 20)


def test_a_running_window_of_losses_is_averaged_entry_by_entry(monkeypatch):
    # (pva-faster-rcnn, batch 46: `loss_hist = collections.deque(maxlen=500)`, its mean printed as the
    # running loss; a deque was passed through as this rank's own while DDP608 said it was averaged)
    import collections

    monkeypatch.setattr(template.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(template.dist, "all_reduce", lambda tensor, op=None: tensor.mul_(2) if op is None else None)
    monkeypatch.setattr(template.dist, "is_initialized", lambda: True)  # (a process group: ddp_sum reduces)
    monkeypatch.setattr(template, "ddp_device", lambda: torch.device("cpu"))
    window = collections.deque([1.0, 3.0], maxlen=5)
    averaged = template.ddp_mean(window)
    assert type(averaged) is collections.deque and averaged.maxlen == 5 and list(averaged) == [1.0, 3.0]


TOTALS = """
import collections
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_mean, ddp_setup, ddp_sum

ddp_setup()
rank = dist.get_rank()
totals = collections.OrderedDict(loss=1.0 + rank, steps=4 + rank, name="gan", meter=object())
mean = ddp_mean(totals)
assert list(mean) == ["loss", "steps", "name", "meter"] and mean["name"] == "gan" and mean["meter"] is totals["meter"]
assert mean["loss"] == 1.5 and mean["steps"] == 4.5, mean
assert ddp_sum([1, torch.tensor([1.0, 2.0])])[1].tolist() == [2.0, 4.0]
assert ddp_mean((2.0 * rank,)) == (1.0,)
uneven = ddp_mean([1.0] * (rank + 1))  # per-rank lists of other lengths: each rank's own
assert uneven == [1.0] * (rank + 1)
print("entries averaged")
"""


def test_dicts_and_lists_of_totals_are_averaged_entry_by_entry(tmp_path):
    """DDP608 printed `ddp_mean(losses)` of a dict of epoch totals (an OCT GAN's) and a list of
    per-epoch losses (NLP_Project's): both came back as rank 0's own."""
    result = _torchrun(tmp_path, TOTALS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("entries averaged") == 1


PAST_THE_WRAPPER = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_through, ddp_wrap

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

def train(how):
    torch.manual_seed(0)
    G = ddp_wrap(Net())
    optimizers = [torch.optim.SGD(G.module.a.parameters(), lr=0.1), torch.optim.SGD(G.module.b.parameters(), lr=0.1)]
    data = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(1))
    rank = dist.get_rank()
    def run_G(x):  # ParamsDrag's helper: the parts called past the wrapper
        return G.module.b(torch.relu(G.module.a(x)))
    for step in range(3):
        x = data[step, rank * 3:(rank + 1) * 3]
        out = G(x) if how == "forward" else run_G(x) if how == "past" else ddp_through(G, "b", torch.relu(G.module.a(x)))
        out.pow(2).mean().backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return torch.cat([p.detach().flatten() for p in G.module.parameters()])

ddp_setup()
reference, past = train("forward"), train("past")
gathered = [torch.zeros_like(past) for _ in range(2)]
dist.all_gather(gathered, past)
assert torch.equal(gathered[0], gathered[1]), (gathered[0] - gathered[1]).abs().max()
assert torch.allclose(past, reference, atol=1e-6), (past - reference).abs().max()
through = train("through")  # a part, not a method, run through DDP's forward
assert torch.allclose(through[-9:], reference[-9:], atol=1e-6)
print("averaged as through DDP")
"""


def test_parts_called_past_the_wrapper_have_their_gradients_averaged(tmp_path):
    """ParamsDrag's training forward calls `G.module.mapping(...)`, `G.module.synthesis(...)` in a
    helper: DDP's forward never ran, nothing was averaged, the ranks trained models of their
    own. Such gradients are averaged before the step; ddp_through runs a part through DDP."""
    result = _torchrun(tmp_path, PAST_THE_WRAPPER)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("averaged as through DDP") == 1


TWO_PAST_THE_WRAPPER = """
import torch
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap

ddp_setup()
torch.manual_seed(0)
# two wrapped models of other shapes, both trained past their wrappers in one step: the
# averaging goes model by model in the order every rank made them (a set's order differs)
models = [ddp_wrap(torch.nn.Linear(4, 3)), ddp_wrap(torch.nn.Linear(3, 1))]
optimizer = torch.optim.SGD([p for m in models for p in m.parameters()], lr=0.1)
data = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(1))
for step in range(3):
    x = data[step, dist.get_rank() * 3:(dist.get_rank() + 1) * 3]
    models[1].module(models[0].module(x)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
weights = torch.cat([p.detach().flatten() for m in models for p in m.parameters()])
gathered = [torch.zeros_like(weights) for _ in range(2)]
dist.all_gather(gathered, weights)
assert torch.equal(gathered[0], gathered[1])
print("both averaged")
"""


def test_several_models_past_their_wrappers_are_averaged_in_one_order(tmp_path):
    result = _torchrun(tmp_path, TWO_PAST_THE_WRAPPER)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("both averaged") == 1


LET_GO = """import copy, gc
import torch
import torch.nn as nn
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap

ddp_setup()
model = ddp_wrap(nn.Linear(16, 16))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    copy_ = ddp_wrap(copy.deepcopy(model.module))  # ncsnv2's EMA copy, wrapped every 100 steps
    with torch.no_grad():
        copy_(torch.randn(4, 16))
    del copy_
gc.collect()
alive = sum(isinstance(o, nn.Linear) for o in gc.get_objects())
open(f"alive{torch.distributed.get_rank()}", "w").write(str(alive))
"""


def test_a_wrapped_copy_let_go_is_freed(tmp_path):
    # ncsnv2: the template's registries held every wrapped EMA copy (never trained, so never
    # checked off): 113 MB more per copy, until the GPU ran out; DataParallel's were freed
    result = _torchrun(tmp_path, LET_GO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(tmp_path / f"alive{rank}").read_text() for rank in (0, 1)] == ["1", "1"]


def test_a_scatter_of_tensors_of_different_lengths_stops_instead_of_pairing_rows_wrongly(monkeypatch):
    # YOLO's targets: one row per box, beside the images; DataParallel cut both by rows
    _as_rank(monkeypatch, 1, world=2)
    with pytest.raises(ValueError, match="differ in length"):
        template.ddp_scatter((torch.zeros(8, 3), torch.zeros(15, 6)))
    assert [t.shape[0] for t in template.ddp_scatter((torch.zeros(8, 3), torch.zeros(8)))] == [4, 4]


def test_a_drawn_batch_splits_a_list_of_per_sample_arrays_by_sample(monkeypatch):
    # object_relation_transformer's get_batch(): the rows of every caption (4 images x 5) beside
    # `gts`, one array of captions per image (5 or 6): each rank takes its images' rows and gts
    numpy = pytest.importorskip("numpy")
    _as_rank(monkeypatch, 1, world=2)
    monkeypatch.setattr(template, "ddp_alike", lambda batch: batch)
    gts = [numpy.full((5 + i % 2, 3), i) for i in range(4)]
    batch = {"feats": torch.arange(20).view(20, 1), "gts": gts, "bounds": {"wrapped": False}}
    share = template.ddp_drawn(lambda: batch)
    assert share["feats"].flatten().tolist() == list(range(10, 20))
    assert [int(array[0, 0]) for array in share["gts"]] == [2, 3] and share["bounds"] == {"wrapped": False}
    with pytest.raises(ValueError, match="differ in length"):  # (7 images' captions for 20 rows: not by sample)
        template.ddp_drawn(lambda: {"feats": torch.zeros(20, 1), "gts": [numpy.zeros((5 + i % 2, 3)) for i in range(7)]})


FROZEN_WRAP = """
import torch
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap
import torch.distributed as dist

ddp_setup()
torch.manual_seed(0)
encoder = torch.nn.Linear(6, 4)
for p in encoder.parameters():
    p.requires_grad = False
encoder = ddp_wrap(encoder)  # nothing to train: no DDP is built
decoder = torch.nn.Linear(4, 3)  # DataParallel never wrapped it
optimizer = torch.optim.SGD(decoder.parameters(), lr=0.5)
x = torch.randn(4, 6) + dist.get_rank()  # each rank's own share
decoder(encoder(x)).sum().backward()
optimizer.step()
weights = decoder.weight.detach().clone()
dist.all_reduce(weights)
assert torch.allclose(weights / 2, decoder.weight), "the ranks trained apart"
open(f"trained{dist.get_rank()}", "w").close()
"""


def test_a_module_trained_beside_a_frozen_wrap_is_averaged_at_its_step(tmp_path):
    # (neural-image-captioning: a frozen encoder wrapped, the decoder beside it; no DDP model
    # was built, so no optimizer hook was there to average the decoder's gradients)
    result = _torchrun(tmp_path, FROZEN_WRAP)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.glob("trained*")) == ["trained0", "trained1"]


def test_sum_of_a_numpy_count_is_reduced_as_a_number(monkeypatch):
    # (ST-GCN: `correct += np.sum(pred == y)`, printed as the sum across ranks; it was rank 0's own)
    np = pytest.importorskip("numpy")

    def doubled(tensor):
        tensor *= 2  # as if another rank held the same value

    monkeypatch.setattr(torch.distributed, "all_reduce", doubled)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # (a process group: ddp_sum reduces)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(template, "ddp_device", lambda: torch.device("cpu"))
    total = template.ddp_sum(np.int64(3))
    assert total == 6 and isinstance(total, np.int64)
    assert template.ddp_mean(np.float32(1.5)) == 1.5
    assert template.ddp_sum(np.array([1.0, 2.0])).tolist() == [2.0, 4.0]


def test_a_part_of_a_cut_keeps_its_kind_and_covers_the_cut_once():
    # a counted loop's cut (DDP315): each rank's contiguous part, together the whole cut; a cut
    # shorter than the world (the last one of `X[i:i + bs]`) gives each rank one row, still a tensor
    rows = torch.arange(10).reshape(5, 2)
    parts = [template.ddp_part(rows, 2, rank) for rank in range(2)]
    assert torch.equal(torch.cat(parts), rows)
    assert [len(part) for part in parts] == [3, 2]
    short = [template.ddp_part(rows[:1], 2, rank) for rank in range(2)]
    assert all(torch.is_tensor(part) and part.shape == (1, 2) for part in short)
    assert template.ddp_part([4, 5, 6, 7], 2, 1) == [6, 7]
    assert template.ddp_part([], 2, 1) == []


def test_a_load_keeps_what_the_cpu_saved_and_brings_gpu_storage_here(tmp_path, monkeypatch):
    # (a Dataset's tensors saved from the CPU must stay there: forked DataLoader workers cannot use CUDA)
    path = tmp_path / "data.pt"
    torch.save({"x": torch.arange(4.0)}, path)
    assert torch.load(path, map_location=template.ddp_map_location)["x"].device == torch.device("cpu")
    moved = []
    monkeypatch.setattr(torch.serialization, "default_restore_location", lambda storage, where: moved.append(where) or storage)
    storage = torch.arange(2.0).untyped_storage()
    assert template.ddp_map_location(storage, "cpu") is storage and not moved
    template.ddp_map_location(storage, "cuda:3")
    assert moved == [str(template.ddp_device())]


def test_a_progress_bar_over_a_loader_draws_from_the_loader_s_shard(monkeypatch):
    # AttGAN (batch 48): `ddp_shard(progressbar(loader))`, a project helper returning `tqdm(loader)`:
    # split batch by batch, every rank loaded the whole global batch; the loader under the bar is sharded
    from tqdm import tqdm

    _as_rank(monkeypatch, 1)
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4)
    for _ in range(2):  # (a new bar each epoch, over the same loader: sharded once)
        bar = tqdm(loader, disable=True)
        assert template.ddp_shard(bar) is bar and bar.iterable is template.ddp_shard(loader)
        assert len(bar) == len(loader) and [len(batch[0]) for batch in bar] == [2] * len(loader)


def test_a_mean_in_a_process_with_no_group_is_its_own_value():
    # (an imported module's step returns ddp_mean(...) of its losses: a script that was not converted runs it too)
    assert not torch.distributed.is_initialized()
    losses = {"d_loss": 0.5, "gp": torch.tensor(2.0)}
    assert template.ddp_mean(losses) is losses and template.ddp_mean(1.5) == 1.5


POSITIONAL_ENCODING = """
import torch
import torch.nn as nn
import torch.distributed as dist
from ddpify.templates.ddp_setup import ddp_setup, ddp_wrap


class PositionalEncoding(nn.Module):  # (the PyTorch tutorial's: its buffer's strides overlap)
    def __init__(self):
        super().__init__()
        self.register_buffer("pe", torch.arange(96.0).reshape(6, 16).unsqueeze(0).transpose(0, 1))
        self.linear = nn.Linear(16, 1)

    def forward(self, x):
        return self.linear(x + self.pe[: x.size(0)])


ddp_setup()
model = ddp_wrap(PositionalEncoding())
model(torch.ones(6, 1, 16)).sum().backward()
assert torch.equal(model.module.pe, torch.arange(96.0).reshape(6, 1, 16))
print("trained", dist.get_rank())
dist.destroy_process_group()
"""


def test_a_buffer_whose_strides_overlap_is_broadcast_as_a_plain_one(tmp_path):
    # ersatz (batch 49): DDP's buffer broadcast stopped the first forward on both ranks
    result = _torchrun(tmp_path, POSITIONAL_ENCODING)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["trained", "0"]  # (both ranks trained: rank 1's output is silenced)


def test_a_builder_s_loader_is_rebuilt_in_a_world_of_one_too_so_its_epoch_can_be_set(monkeypatch):
    # OKDDip (batch 49): `ddp_shard(DataLoader(trainset, shuffle=True, **kwargs), everywhere=True)` in the
    # builder; train.py calls `train_loader.sampler.set_epoch(epoch)`: a SequentialSampler has none
    _as_rank(monkeypatch, 0, world=1)
    loader = torch.utils.data.DataLoader(INDICES, batch_size=4)
    assert template.ddp_shard(loader) is loader
    rebuilt = template.ddp_shard(loader, everywhere=True)
    rebuilt.sampler.set_epoch(1)
    assert [i for batch in rebuilt for i in batch[0].tolist()] == list(range(16))
