"""A script with its own DDP path beside DataParallel: after conversion, torchrun takes it."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import FIXTURES, run_launched
from ddpify.api import convert_source

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def test_torchrun_runs_the_scripts_own_ddp_path(tmp_path):
    source = (FIXTURES / "existing_ddp" / "local_rank.py").read_text()
    result = convert_source(source, path="train.py")
    assert result.launch_command == "torchrun --standalone --nproc-per-node=gpu train.py"
    (tmp_path / "train.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr
    # Each rank printed it: the process group exists, so the DDP branch ran, not DataParallel.
    # (counted by word: the two ranks' printed lines may interleave)
    assert run.stdout.count("True") == 2 and "False" not in run.stdout


def test_the_original_under_torchrun_never_reaches_its_ddp_path(tmp_path):
    (tmp_path / "train.py").write_text((FIXTURES / "existing_ddp" / "local_rank.py").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.stdout.count("False") == 2 and "True" not in run.stdout  # why the fix is needed


@pytest.mark.parametrize(
    "name, expected",
    [("distributed_flag.py", "distributed: True"), ("world_size_switch.py", "DistributedDataParallel")],
)
def test_the_printed_launch_line_takes_the_ddp_path(tmp_path, name, expected):
    """The switch that selects the DDP path (a --distributed flag, the WORLD_SIZE torchrun
    sets) is on the launch line ddpify prints: run that line, with 2 processes."""
    result = convert_source((FIXTURES / "existing_ddp" / name).read_text(), path="train.py")
    launch = result.launch_command.split()
    assert launch[:3] == ["torchrun", "--standalone", "--nproc-per-node=gpu"] and launch[3] == "train.py"
    (tmp_path / "train.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *launch[3:]]
    run = run_launched(command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr
    # each rank prints it; the two ranks' lines may interleave: count the last word
    assert run.stdout.count(expected.split()[-1]) == 2, run.stdout


def test_the_scripts_own_sampler_moves_to_the_next_epoch_and_its_dataparallel_path_still_runs(tmp_path):
    # BERT-NER / HF run_* scripts: DistributedSampler on the DDP path, never set_epoch
    result = convert_source((FIXTURES / "existing_ddp" / "local_rank.py").read_text(), path="train.py")
    assert 'if hasattr(train_dataloader.sampler, "set_epoch"):' in result.output
    shown = 'print("distributed:", torch.distributed.is_initialized())'
    # each rank writes its own file (two ranks' prints can interleave)
    probe = 'open("epoch_%s.txt" % os.environ.get("RANK", "solo"), "w").write(str(getattr(train_sampler, "epoch", "none")))'
    (tmp_path / "train.py").write_text(result.output.replace(shown, probe))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(command, cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert [(tmp_path / f"epoch_{rank}.txt").read_text() for rank in (0, 1)] == ["1", "1"]  # the last of 2 epochs
    single = run_launched([sys.executable, "train.py"], attempts=1, cwd=tmp_path, env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    assert (tmp_path / "epoch_solo.txt").read_text() == "none"  # RandomSampler: no set_epoch


def test_a_training_loader_drawn_through_cycle_keeps_its_distributed_sampler():
    # CodeBERT: `train_dataloader = cycle(train_dataloader)` then next() each step; only an
    # evaluation loader's DistributedSampler becomes a SequentialSampler (DDP012)
    source = (FIXTURES / "existing_ddp" / "local_rank_elsewhere.py").read_text().replace(
        "    for epoch in range(2):\n        for x, y in train_dataloader:\n",
        "    batches = cycle(train_dataloader)\n    for epoch in range(2):\n        for step in range(4):\n            x, y = next(batches)\n",
    ).replace("import torch\n", "from itertools import cycle\n\nimport torch\n", 1)
    result = convert_source(source, path="train.py")
    assert "else DistributedSampler(train_data)" in result.output, result.diagnostics
    assert "eval_sampler = SequentialSampler(eval_dataset)\n" in result.output


def test_writes_outside_the_own_paths_guards_run_on_rank_zero_and_its_dataparallel_path_still_writes(tmp_path):
    # SSRGAN-PyTorch: its own DDP path guards some saves and not others (`*-last.pth`, the log)
    source = (FIXTURES / "existing_ddp" / "distributed_flag.py").read_text()
    source = source.replace(
        '    print("distributed:", dist.is_initialized())\n',
        '        torch.save(model.state_dict(), "last.pth")\n        with open("log.txt", "a") as log:\n'
        '            log.write(f"epoch {epoch}\\n")\n    print("distributed:", dist.is_initialized())\n',
    )
    result = convert_source(source, path="train.py")
    assert "if ddp_rank() == 0:\n            torch.save(model.state_dict()" in result.output, result.diagnostics
    (tmp_path / "train.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *result.launch_command.split()[3:]]
    for _ in range(3):  # a run lost to gloo's exit abort is repeated, from a fresh log
        (tmp_path / "log.txt").unlink(missing_ok=True)
        run = run_launched(command, attempts=1, cwd=tmp_path, env=env, timeout=300)
        if run.returncode == 0:
            break
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "log.txt").read_text() == "epoch 0\nepoch 1\n", "written by rank 0 alone"
    (tmp_path / "log.txt").unlink()
    single = run_launched([sys.executable, "train.py"], attempts=1, cwd=tmp_path, env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    assert (tmp_path / "log.txt").read_text() == "epoch 0\nepoch 1\n", "the DataParallel path, with no group, writes"


OWN_PATH_OUT_OF_SIGHT = '''import argparse
import torch
import torch.nn as nn
from proj import get_loader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    n_gpu = torch.cuda.device_count()
    if args.local_rank != -1:
        torch.distributed.init_process_group(backend="nccl")
    loader = get_loader(4)
    model = nn.Linear(1, 1)
    if args.local_rank != -1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
    elif n_gpu > 1:
        model = torch.nn.DataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("sampler, taken", [("RandomSampler(ds)", False), ("DistributedSampler(ds) if dist.is_initialized() else None", True)])
def test_an_own_path_training_on_a_project_loader_is_taken_only_where_that_loader_may_shard(tmp_path, sampler, taken):
    # (qa-hard-em: prepro.get_dataloader sampled at random on every path: every rank trained on all the data)
    (tmp_path / "proj.py").write_text(
        f"import torch.distributed as dist\nfrom torch.utils.data import DataLoader, {sampler.split('(')[0]}, TensorDataset\n\n\n"
        f"def get_loader(bs):\n    ds = TensorDataset()\n    return DataLoader(ds, sampler={sampler}, batch_size=bs)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(OWN_PATH_OUT_OF_SIGHT)
    result = convert_source(OWN_PATH_OUT_OF_SIGHT, path=str(script))
    codes = {d.code for d in result.diagnostics}
    assert ("DDP006" in codes) is taken
    assert ("DDP014" in codes) is not taken
    assert ("ddp_shard(loader)" in result.output) is not taken
