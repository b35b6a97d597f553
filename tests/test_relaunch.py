"""`python train.py` on a machine with several GPUs re-launches itself under torchrun.

The GPU count is forced with DDPIFY_NPROC=2 so that this runs on CPU machines: the two
ranks it starts must train and agree; under torchrun it must not launch again; and
DDPIFY_NO_RELAUNCH=1 or `convert --no-relaunch` leave one process.
"""

from __future__ import annotations

import os
import sys

import pytest

from conftest import run_launched
from ddpify.api import convert_source
from ddpify.diagnostics import ConvertOptions

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

SCRIPT = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=8)
    model = nn.DataParallel(nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return model


if __name__ == "__main__":
    model = main()
'''
# Appended after conversion, so that every rank reports (the converter would guard a print).
# A file per rank: printed lines of two ranks may interleave.
REPORT = (
    'open(f"report{dist.get_rank()}.txt", "w").write(f"rank {dist.get_rank()} of {dist.get_world_size()} '
    'weights {float(sum(p.sum() for p in model.parameters()))}")\n'
)


def converted(tmp_path, relaunch: bool = True):
    result = convert_source(SCRIPT, ConvertOptions(relaunch=relaunch), path="train.py")
    assert result.changed and not result.error
    path = tmp_path / "train.py"
    path.write_text(result.output + "    " + REPORT)
    return path


def run(command, tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", **extra)
    for stale in tmp_path.glob("report*.txt"):
        stale.unlink()
    result = run_launched(command, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return sorted(path.read_text() for path in tmp_path.glob("report*.txt"))


def test_plain_python_with_several_gpus_runs_one_process_per_gpu(tmp_path):
    lines = run([sys.executable, str(converted(tmp_path))], tmp_path, DDPIFY_NPROC="2")
    assert [line.split(" weights ")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"]
    assert lines[0].split(" weights ")[1] == lines[1].split(" weights ")[1], "the two ranks agree"


def test_no_second_launch_under_torchrun(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    lines = run([*torchrun, str(converted(tmp_path))], tmp_path, DDPIFY_NPROC="2")
    assert [line.split(" weights ")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"]


def test_environment_variable_turns_it_off(tmp_path):
    lines = run([sys.executable, str(converted(tmp_path))], tmp_path, DDPIFY_NPROC="2", DDPIFY_NO_RELAUNCH="1")
    assert [line.split(" weights ")[0] for line in lines] == ["rank 0 of 1"]


def test_environment_variable_set_to_zero_leaves_it_on(tmp_path):
    lines = run([sys.executable, str(converted(tmp_path))], tmp_path, DDPIFY_NPROC="2", DDPIFY_NO_RELAUNCH="0")
    assert [line.split(" weights ")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"]


def test_convert_option_leaves_it_out(tmp_path):
    path = converted(tmp_path, relaunch=False)
    assert "ddp_relaunch" not in path.read_text()
    assert "DDPIFY_NO_RELAUNCH" not in path.read_text() and "uses every GPU" not in path.read_text()
    lines = run([sys.executable, str(path)], tmp_path, DDPIFY_NPROC="2")
    assert [line.split(" weights ")[0] for line in lines] == ["rank 0 of 1"]
