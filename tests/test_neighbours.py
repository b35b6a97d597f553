"""Single-file mode reads the project modules a script imports (ddpify/project/neighbours.py):
their writers run on rank 0, a DataParallel wrap inside them is named, not missed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import GLOO_EXIT_ABORT, run_launched
from ddpify.api import convert_file
from ddpify.cli import app

UTIL = '''import os, json


class IOStream:
    def __init__(self, path):
        self.f = open(path, "a")

    def cprint(self, text):
        print(text)
        self.f.write(text + "\\n")
        self.f.flush()


def save_args(args, folder):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "args.json"), "a") as f:
        f.write(json.dumps(vars(args)) + "\\n")


def evaluate_into(model, x, path):
    with open(path, "a") as f:
        f.write(str(model(x).sum().item()))
'''

TRAIN = '''import argparse
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from util import IOStream, save_args, evaluate_into

parser = argparse.ArgumentParser()
args = parser.parse_args()
io = IOStream("run.log")
save_args(args, "exp")
torch.manual_seed(0)
model = nn.DataParallel(nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
for epoch in range(2):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    io.cprint("epoch %d" % epoch)
    evaluate_into(model, x, "eval.txt")
'''


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_writers_of_imported_modules_run_on_rank_zero(tmp_path):
    project(tmp_path, {"util.py": UTIL, "train.py": TRAIN})
    result = convert_file(tmp_path / "train.py")
    output = result.output
    assert 'io = IOStream("run.log") if dist.get_rank() == 0 else DdpNoOp()' in output
    assert 'if dist.get_rank() == 0:\n    save_args(args, "exp")' in output
    # a helper that runs the model runs on every rank (DDP's forward may broadcast buffers),
    # its files written by rank 0 only (ddp_quiet: private copies on the others)
    assert '\n    ddp_quiet(evaluate_into, model, x, "eval.txt")' in output and "DDP601 evaluate_into" not in str(result.diagnostics)


def test_converted_writers_write_once_under_two_ranks(tmp_path):
    from conftest import run_launched

    project(tmp_path, {"util.py": UTIL, "train.py": TRAIN})
    (tmp_path / "train.py").write_text(convert_file(tmp_path / "train.py").output)
    for _ in range(3):  # a run lost to gloo's exit abort is repeated: from a clean folder
        (tmp_path / "run.log").unlink(missing_ok=True)
        (tmp_path / "exp" / "args.json").unlink(missing_ok=True)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
        result = run_launched(command, attempts=1, cwd=tmp_path, timeout=240)
        if result.returncode == 0:
            break
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run.log").read_text().splitlines() == ["epoch 0", "epoch 1"]
    assert len((tmp_path / "exp" / "args.json").read_text().splitlines()) == 1


PROBING = 'import torch\nimport torch.nn as nn\n\n\ndef fit_probe(features, labels):\n    probe = nn.Linear(features.shape[1], 2)\n    optimizer = torch.optim.SGD(probe.parameters(), lr=0.5)\n    for _ in range(3):\n        optimizer.zero_grad()\n        nn.functional.cross_entropy(probe(features), labels).backward()\n        optimizer.step()\n    return probe\n\n\n'
PROBED = 'import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom probing import fit_probe\n\n\ndef main():\n    torch.manual_seed(0)\n    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))\n    loader = DataLoader(TensorDataset(x, y), batch_size=8)\n    model = nn.DataParallel(nn.Linear(4, 3))\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(30):\n        for xb, yb in loader:\n            optimizer.zero_grad()\n            model(xb).pow(2).mean().backward()\n            optimizer.step()\n        with torch.no_grad():\n            features = model(x)\n        probe = fit_probe(features, y)\n        print(f"epoch {epoch}: {probe.weight.sum().item():.4f}")\n\n\nif __name__ == "__main__":\n    main()\n'


def test_a_probe_rebuilt_each_epoch_with_its_own_optimizer_runs_to_the_end_under_two_ranks(tmp_path):
    # Andrewzh112's SimSiam (batch 46): a linear probe made anew each epoch in another module, its own
    # optimizer stepping over features every rank holds whole. The wrap's hook that starts such
    # weights as rank 0's kept their ids per rank; an id reused by a new probe on one rank only
    # made one rank broadcast while the other went on: a hang after a few epochs.
    from conftest import run_launched

    project(tmp_path, {"probing.py": PROBING, "train.py": PROBED})
    original = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    (tmp_path / "train.py").write_text(convert_file(tmp_path / "train.py").output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    result = run_launched(command, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    last = original.stdout.splitlines()[-1]
    assert last.startswith("epoch 29:") and result.stdout.splitlines()[-1] == last


MODEL = '''import torch.nn as nn


def generate_model(opt):
    model = nn.DataParallel(nn.Linear(2, 1))
    return model, model.parameters()
'''
NO_WRAP_HERE = '''import torch
from model import generate_model

model, params = generate_model(None)
optimizer = torch.optim.SGD(params, lr=0.1)
for i in range(3):
    model(torch.randn(4, 2)).sum().backward()
    optimizer.step()
'''


def test_a_model_wrapped_in_an_imported_module_is_refused_naming_folder_mode(tmp_path):
    # MedicalNet: train.py names no DataParallel; model.py's generate_model wraps
    project(tmp_path, {"model.py": MODEL, "train.py": NO_WRAP_HERE})
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "train.py")])
    assert result.exit_code == 3, result.output
    assert "DDP214" in result.output and f"ddpify convert {tmp_path}" in result.output
    assert (tmp_path / "train.py").read_text() == NO_WRAP_HERE


def test_a_call_in_a_string_or_a_comment_is_not_a_call():
    # (pytorch-unet-segmentation, batch 44: `test_model(...)` in a block disabled by making it a
    # string was named by DDP214 as a call of a project function that wraps)
    from ddpify.project.neighbours import _calls

    source = 'x = 1  # generate_model(opt)\n"""\nmodel = generate_model(None)\n"""\nprint(f"{generate_model}")\n'
    assert not _calls(source, "generate_model")
    assert _calls(source + "net = generate_model(None)\n", "generate_model")


def test_a_package_of_the_project_root_is_found_from_a_script_below_it(tmp_path):
    # DrQA: scripts/reader/train.py imports the `drqa` package installed from the root
    project(tmp_path, {"setup.py": "", "drqa/__init__.py": "", "drqa/model.py": MODEL, "scripts/reader/train.py": NO_WRAP_HERE.replace("from model", "from drqa.model")})
    result = convert_file(tmp_path / "scripts" / "reader" / "train.py")
    assert [d.code for d in result.diagnostics] == ["DDP214"]


def test_a_folder_a_configuration_module_puts_on_sys_path_is_searched(tmp_path):
    # 3DMPPE: main/config.py does `sys.path.insert(0, osp.join(cfg.root_dir, 'common'))`, its
    # root_dir being main/..; train.py's `from base import Trainer` is common/base.py, which wraps
    config = (
        "import os.path as osp\nimport sys\n\n\nclass Config:\n    cur_dir = osp.dirname(osp.abspath(__file__))\n"
        "    root_dir = osp.join(cur_dir, '..')\n\n\ncfg = Config()\nsys.path.insert(0, osp.join(cfg.root_dir, 'common'))\n"
    )
    project(tmp_path, {"main/config.py": config, "common/model.py": MODEL, "main/train.py": "from config import cfg\n" + NO_WRAP_HERE})
    result = convert_file(tmp_path / "main" / "train.py")
    assert [d.code for d in result.diagnostics] == ["DDP214"]


def test_an_evaluation_script_is_not_refused(tmp_path):
    project(tmp_path, {"model.py": MODEL, "eval.py": "import torch\nfrom model import generate_model\nmodel, _ = generate_model(None)\nprint(model(torch.zeros(1, 2)))\n"})
    result = convert_file(tmp_path / "eval.py")
    assert result.output == result.source and not result.diagnostics


WITH_WRITER = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter

model = nn.DataParallel(nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dataset = TensorDataset(torch.randn(8, 2))
loader = DataLoader(dataset, batch_size=4)
writer = SummaryWriter("runs")
args_writer = writer
with SummaryWriter("runs2") as w2:
    for step, (x,) in enumerate(loader):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        w2.add_scalar("loss", loss.item(), step)
        args_writer.add_scalar("loss", loss.item(), step)
'''


def test_a_writer_made_in_a_with_item_is_rank_zero_only(tmp_path):
    # pvcnn: `with tensorboardX.SummaryWriter(save_path) as writer:`
    project(tmp_path, {"train.py": WITH_WRITER})
    output = convert_file(tmp_path / "train.py").output
    assert 'with (SummaryWriter("runs2") if dist.get_rank() == 0 else DdpNoOp()) as w2:' in output
    assert 'writer = SummaryWriter("runs") if dist.get_rank() == 0 else DdpNoOp()' in output


@pytest.mark.parametrize(
    "use, on_every_rank",
    [
        ('args_writer.add_scalar("loss", loss.item(), step)', False),
        ('print(args_writer.file_writer.get_logdir() + "/x")', True),  # FaceX-Zoo: a value taken from the alias
    ],
)
def test_uses_of_an_alias_of_a_stand_in_are_followed(tmp_path, use, on_every_rank):
    project(tmp_path, {"train.py": WITH_WRITER.replace('args_writer.add_scalar("loss", loss.item(), step)', use)})
    output = convert_file(tmp_path / "train.py").output
    # (made on every rank: a real writer, whose files are unseen temporaries off rank 0)
    assert ('writer = ddp_quiet(SummaryWriter, "runs")\n' in output) is on_every_rank


FREEZING_MODEL = '''import torch.nn as nn


class TSN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.head = nn.Linear(2, 1)

    def forward(self, x):
        return self.head(self.body(x))

    def train(self, mode=True):
        super().train(mode)
        for m in self.body.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.weight.requires_grad = False
        return self
'''


def test_a_project_model_that_freezes_in_its_own_train_gets_every_parameter_wrapped(tmp_path):
    # temporal-shift-module: partial BatchNorm freezing in TSN.train(), after the wrap
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "from models import TSN\n").replace(
        "nn.DataParallel(nn.Linear(2, 1))", "nn.DataParallel(TSN())"
    )
    project(tmp_path, {"models.py": FREEZING_MODEL, "train.py": script.split("io = ")[0] + "model = " + script.split("model = ")[1].replace('    io.cprint("epoch %d" % epoch)\n    evaluate_into(model, x, "eval.txt")\n', "")})
    result = convert_file(tmp_path / "train.py")
    assert "model = ddp_wrap_every_parameter(TSN())" in result.output, result.output[-1500:]
    assert "DDP125" in {d.code for d in result.diagnostics}


SELECTOR = '''import torch


class BatchHardTripletSelector(object):
    def __call__(self, embeds, labels):
        dist_mtx = torch.cdist(embeds, embeds)
        lb_eqs = labels == labels.T
        return embeds, embeds[dist_mtx.argmax(1)], embeds[dist_mtx.argmin(1)]
'''


def test_a_project_class_that_mines_the_batch_gets_the_whole_global_batch(tmp_path):
    # triplet-reid: hardest positives and negatives mined across DataParallel's whole batch;
    # the call in the training loop gathers its arguments from every process
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "from selector import BatchHardTripletSelector\n")
    script = script.split("io = ")[0] + "selector = BatchHardTripletSelector()\nmodel = " + script.split("model = ")[1]
    script = script.replace("        loss = ((model(x) - y) ** 2).mean()\n", "        a, p, n = selector(model(x), y)\n        loss = (a - p).pow(2).mean() - (a - n).pow(2).mean()\n")
    project(tmp_path, {"selector.py": SELECTOR, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert not result.error and "a, p, n = ddp_whole_batch(selector, model(x), y)" in result.output, result.diagnostics
    found = [d for d in result.diagnostics if d.code == "DDP117"]
    assert len(found) == 1 and "BatchHardTripletSelector" in found[0].message and found[0].severity.value == "change"


FUNCTION = '''def train(config, train_loader, model, criterion, optimizer, epoch):
    model.train()
    tl = train_loader  # robot-surgery-segmentation iterates an alias
    for i, (x, y) in enumerate(tl):
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(config, val_loader, model, criterion):
    model.eval()
    return sum(criterion(model(x), y).item() for x, y in val_loader)
'''
INIT_PATHS = '''import os.path as osp
import os
import shutil
import sys

this_dir = osp.dirname(__file__)
sys.path.insert(0, osp.join(this_dir, "..", "lib"))
'''
HRNET = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import _init_paths
from core.function import train, validate

model = nn.DataParallel(nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
train_loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4, shuffle=True)
valid_loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
for epoch in range(2):
    train(None, train_loader, model, criterion, optimizer, epoch)
    print(validate(None, valid_loader, model, criterion))
'''


def test_a_loader_handed_to_a_training_function_of_the_project_is_sharded_where_it_is_built(tmp_path):
    # HRNet-Image-Classification: tools/train.py hands its loaders to lib/core/function.py
    project(tmp_path, {"lib/core/__init__.py": "", "lib/core/function.py": FUNCTION, "tools/_init_paths.py": INIT_PATHS, "tools/train.py": HRNET})
    result = convert_file(tmp_path / "tools" / "train.py")
    output = result.output
    assert "sampler=DistributedSampler(train_dataset, shuffle=True)" in output, result.diagnostics
    assert "    train_loader.sampler.set_epoch(epoch)\n    train(None, train_loader" in output
    assert "print(validate(None, valid_loader, model, criterion))" in output  # a loss module is not a printed loss
    assert "valid_loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)" in output


TRAINER = '''class Trainer(object):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def _train_it(self, batch):
        x, y = batch
        loss = ((self.model(x) - y) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def train(self, n_epochs, train_loader, test_loader=None):
        for epoch in range(n_epochs):
            for batch in train_loader:
                self._train_it(batch)
'''
POINTRCNN = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
import train_utils

model = nn.DataParallel(nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train_loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4, shuffle=True)
trainer = train_utils.Trainer(model, optimizer)
trainer.train(3, train_loader)
'''


def test_a_loader_handed_to_a_project_trainer_that_runs_the_epochs_moves_on_each_pass(tmp_path):
    # PointRCNN: trainer.train(..., train_loader, ...) runs every epoch in train_utils.py
    project(tmp_path, {"train_utils.py": TRAINER, "train.py": POINTRCNN})
    result = convert_file(tmp_path / "train.py")
    assert "sampler=DdpNextEpochSampler(train_dataset, shuffle=True)" in result.output, result.diagnostics
    assert "class DdpNextEpochSampler(DistributedSampler):" in result.output


SAVER = '''import torch
import torch.nn as nn


def checkpoint_state(model):
    if isinstance(model, nn.DataParallel):
        return model.module.state_dict()  # DataParallel: \\'module.\\' keys dropped
    return model.state_dict()


def save(model, path):
    torch.save(checkpoint_state(model), path)
'''


def test_a_project_module_that_tests_for_data_parallel_is_named_and_refused(tmp_path):
    # PointRCNN: train_utils unwraps `isinstance(model, nn.DataParallel)` before saving
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "from saver import save\n")
    script = script.split("io = ")[0] + "model = " + script.split("model = ")[1].split("    io.cprint")[0] + 'save(model, "model.pth")\n'
    project(tmp_path, {"saver.py": SAVER, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert result.output == result.source
    assert [d.code for d in result.diagnostics] == ["DDP214"] and "`saver`" in result.diagnostics[0].message


def test_data_parallel_in_a_docstring_of_a_project_module_is_not_a_test(tmp_path):
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "from saver import save\n")
    script = script.split("io = ")[0] + "model = " + script.split("model = ")[1].split("    io.cprint")[0]
    project(tmp_path, {"saver.py": '"""Loads a DataParallel model_state."""\ndef save(model, path):\n    pass\n', "train.py": script})
    assert "ddp_wrap(" in convert_file(tmp_path / "train.py").output


def test_a_submodule_used_inside_another_is_not_idle():
    import ast

    from ddpify.project.neighbours import idle_parts

    source = (
        "import torch.nn as nn\n\n\nclass DGCNN(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.bn1 = nn.BatchNorm2d(64)\n        self.conv1 = nn.Sequential(nn.Conv2d(6, 64, 1), self.bn1)\n"
        "        self.head = nn.Linear(2, 2)\n\n    def forward(self, x):\n        return self.conv1(x)\n"
    )
    assert idle_parts(ast.parse(source)) == {"DGCNN": "self.head is never used"}  # dgcnn's bn1 is used, in conv1


SURGERY_UTILS = '''def train(args, model, criterion, train_loader, valid_loader, init_optimizer, n_epochs=2):
    optimizer = init_optimizer(0.1)
    for epoch in range(n_epochs):
        tl = train_loader
        for x, y, index in tl:
            # (a descriptor: the test's record of each rank's batches, not one of the paths ddp_quiet
            # keeps to rank 0)
            os = __import__("os")
            with open(os.open("seen_%d.txt" % os.getpid(), os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as f:
                f.write(" ".join(str(int(i)) for i in index) + "\\n")
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        sum(criterion(model(x), y).item() for x, y, _ in valid_loader)
'''
SURGERY = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
import utils


def main():
    torch.manual_seed(0)
    model = nn.DataParallel(nn.Linear(2, 1))

    def make_loader(n, shuffle=False, batch_size=1):
        return DataLoader(
            dataset=TensorDataset(torch.randn(n, 2), torch.randn(n, 1), torch.arange(n)),
            shuffle=shuffle,
            batch_size=batch_size,
        )

    train_loader = make_loader(8, shuffle=True, batch_size=4)
    valid_loader = make_loader(6, batch_size=2)
    utils.train(
        init_optimizer=lambda lr: torch.optim.SGD(model.parameters(), lr=lr),
        args=None,
        model=model,
        criterion=nn.MSELoss(),
        train_loader=train_loader,
        valid_loader=valid_loader,
    )


if __name__ == "__main__":
    main()
'''


def test_a_loader_from_a_shared_builder_handed_to_a_project_trainer_is_sharded_in_the_call(tmp_path):
    # robot-surgery-segmentation: a nested make_loader builds the training and the validation
    # loader, and utils.train(train_loader=train_loader, ...) trains out of sight: the builder
    # cannot be changed for both, so the argument is sharded at run time; never left whole
    from conftest import run_launched

    project(tmp_path, {"utils.py": SURGERY_UTILS, "train.py": SURGERY})
    result = convert_file(tmp_path / "train.py")
    assert "train_loader=ddp_shard(train_loader)," in result.output, result.diagnostics
    assert "valid_loader=valid_loader," in result.output
    # its trainer writes a file per batch, out of sight: said, with the way to limit it to rank 0
    assert any(d.code == "DDP616" and "converting the folder" in d.message for d in result.diagnostics)
    (tmp_path / "train.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    for _ in range(3):  # a run lost to gloo's exit abort is repeated: from a clean folder
        for seen in tmp_path.glob("seen_*.txt"):
            seen.unlink()
        launched = run_launched(command, attempts=1, cwd=tmp_path, timeout=240)
        if launched.returncode == 0:
            break
    assert launched.returncode == 0, launched.stderr[-3000:]
    per_rank = [[line.split() for line in seen.read_text().splitlines()] for seen in tmp_path.glob("seen_*.txt")]
    # the global batch of 4 is split 2 + 2: two steps of 2 samples per epoch on each rank
    assert len(per_rank) == 2 and all(len(batches) == 4 and all(len(b) == 2 for b in batches) for batches in per_rank)
    for epoch in range(2):  # each sample once per epoch, on one rank
        drawn = [index for batches in per_rank for index in batches[2 * epoch] + batches[2 * epoch + 1]]
        assert sorted(drawn, key=int) == [str(i) for i in range(8)], per_rank


TRANSUNET_TRAINER = '''import torch
import torch.nn as nn


def trainer_synapse(args, model, snapshot_path):
    model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 2)).sum()
    loss.backward()
    optimizer.step()
'''
TRANSUNET = '''import torch.nn as nn
from trainer import trainer_synapse

net = nn.Linear(2, 1)
trainer = {"Synapse": trainer_synapse}
trainer["Synapse"](None, net, "out")
'''


def test_a_script_that_hands_its_model_to_a_project_trainer_that_wraps_is_refused_naming_folder_mode(tmp_path):
    # TransUNet: train.py trains nothing itself; trainer.py's trainer_synapse wraps and trains
    project(tmp_path, {"trainer.py": TRANSUNET_TRAINER, "train.py": TRANSUNET})
    result = convert_file(tmp_path / "train.py")
    assert [d.code for d in result.diagnostics] == ["DDP214"] and not result.changed
    assert "ddpify convert" in result.diagnostics[0].message


PANNS_UTILS = '''import logging
import os


def create_folder(fd):
    if not os.path.exists(fd):
        os.makedirs(fd)


def create_logging(log_dir, filemode):
    create_folder(log_dir)
    logging.basicConfig(level=logging.DEBUG, filename=os.path.join(log_dir, "0000.log"), filemode=filemode)
    return logging
'''


def test_a_function_that_writes_through_another_writer_of_its_module_runs_on_rank_zero(tmp_path):
    # panns_transfer_to_gtzan: create_logging() makes its folder with create_folder(), then a log file
    from ddpify.project.neighbours import read_neighbours

    script = "from utilities import create_folder, create_logging\ncreate_logging('logs', 'w')\n"
    project(tmp_path, {"utilities.py": PANNS_UTILS, "main.py": script})
    found = read_neighbours(str(tmp_path / "main.py"), script)
    assert {"create_folder", "create_logging"} <= found.writers


SR3_NETWORKS = '''import torch.nn as nn


def define_G(opt):
    return nn.DataParallel(nn.Linear(2, 1))
'''
SR3_MODEL = '''import torch
import model.networks as networks


class DDPM:
    def __init__(self, opt):
        self.netG = networks.define_G(opt)
        self.optG = torch.optim.Adam(self.netG.parameters())

    def optimize_parameters(self, x):
        self.optG.zero_grad()
        self.netG(x).sum().backward()
        self.optG.step()
'''
SR3 = '''import torch
import model as Model

diffusion = Model.create_model(None)
train_loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4)
for train_data in train_loader:
    diffusion.optimize_parameters(train_data)
'''


def test_a_wrap_a_few_imports_down_is_found_and_names_folder_mode(tmp_path):
    # SR3 (Image-Super-Resolution-via-Iterative-Refinement): sr.py -> model/__init__ ->
    # model/model.py -> model/networks.py wraps; sr.py trains through a project object
    init = "def create_model(opt):\n    from .model import DDPM as M\n    return M(opt)\n"
    project(tmp_path, {"model/__init__.py": init, "model/model.py": SR3_MODEL, "model/networks.py": SR3_NETWORKS, "sr.py": SR3})
    result = convert_file(tmp_path / "sr.py")
    assert [d.code for d in result.diagnostics] == ["DDP214"] and not result.changed


LIIF_UTILS = '''import os
import os
import shutil


def ensure_path(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def set_save_path(save_path):
    ensure_path(save_path)
    log_file = os.path.join(save_path, "log.txt")

    def log(text):
        with open(log_file, "a") as f:
            print(text, file=f)

    return log, log_file
'''
LIIF = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
import utils


def main():
    log, log_file = utils.set_save_path("save")
    model = nn.DataParallel(nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    for epoch in range(2):
        for (x,) in loader:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        log("epoch %d" % epoch)


if __name__ == "__main__":
    main()
'''


def test_a_project_function_that_writes_and_returns_its_loggers_runs_on_rank_zero(tmp_path):
    # liif: `log, writer = utils.set_save_path(save_path)` clears and remakes the run folder
    from conftest import run_launched

    project(tmp_path, {"utils.py": LIIF_UTILS, "train.py": LIIF})
    result = convert_file(tmp_path / "train.py")
    assert "if dist.get_rank() == 0 else (DdpNoOp(), DdpNoOp())" in result.output, result.diagnostics
    (tmp_path / "train.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    for run in range(2):  # the second run clears the folder the first one made
        for _ in range(3):  # a run lost to gloo's exit abort is repeated
            launched = run_launched(command, attempts=1, cwd=tmp_path, timeout=240)
            if launched.returncode == 0:
                break
        assert launched.returncode == 0, launched.stderr[-3000:]
        assert (tmp_path / "save" / "log.txt").read_text().splitlines() == ["epoch 0", "epoch 1"]


SCAN_CONFIG = '''import torch
from torch.utils.data import DataLoader, TensorDataset


def get_train_dataloader(p, dataset):
    return DataLoader(TensorDataset(torch.arange(8.0).unsqueeze(1)), batch_size=4, shuffle=True, drop_last=True)
'''
SCAN_TRAIN = '''import io
import os


def scan_train(train_loader, model, optimizer, epoch):
    for i, (x,) in enumerate(train_loader):
        with open(os.open("seen_%d.txt" % os.getpid(), os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as f:  # (each rank's record: a descriptor, not one of ddp_quiet's paths)
            f.write(" ".join(str(int(v)) for v in x.flatten()) + "\\n")
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''
SCAN = '''import torch
import torch.nn as nn
from utils.common_config import get_train_dataloader
from utils.train_utils import scan_train

model = nn.DataParallel(nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
train_dataloader = get_train_dataloader(None, None)
for epoch in range(2):
    scan_train(train_dataloader, model, optimizer, epoch)
'''


def test_a_loader_from_a_project_builder_handed_to_a_project_trainer_is_sharded_in_the_call(tmp_path):
    # Unsupervised-Classification's scan.py: both the builder and the training function are
    # in utils/; the call's argument is sharded at run time (refused with DDP309 before)
    from conftest import run_launched

    project(tmp_path, {"utils/__init__.py": "", "utils/common_config.py": SCAN_CONFIG, "utils/train_utils.py": SCAN_TRAIN, "scan.py": SCAN})
    result = convert_file(tmp_path / "scan.py")
    assert "scan_train, ddp_shard(train_dataloader), model, optimizer, epoch)" in result.output, result.diagnostics
    (tmp_path / "scan.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "scan.py"]
    for _ in range(3):  # a run lost to gloo's exit abort is repeated
        for seen in tmp_path.glob("seen_*.txt"):
            seen.unlink()
        launched = run_launched(command, attempts=1, cwd=tmp_path, timeout=240)
        if launched.returncode == 0:
            break
    assert launched.returncode == 0, launched.stderr[-3000:]
    per_rank = [seen.read_text().splitlines() for seen in tmp_path.glob("seen_*.txt")]
    assert len(per_rank) == 2 and all(len(lines) == 4 for lines in per_rank)  # 2 epochs x 2 steps of 2 samples
    for epoch in range(2):
        drawn = [v for lines in per_rank for line in lines[2 * epoch: 2 * epoch + 2] for v in line.split()]
        assert sorted(drawn, key=int) == [str(i) for i in range(8)]  # each sample once per epoch


def test_an_evaluation_of_the_project_that_compares_samples_is_not_a_batch_mining_loss(tmp_path):
    # Towards-Realtime-MOT: test.test_emb() (a label-equality matrix, under no_grad) in the epoch loop
    evaluation = "import torch\n\n\ndef test_emb(model, x, y):\n    same = y == y.T\n    return same.float().mean()\n"
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "import test\n")
    script = script.split("io = ")[0] + "model = " + script.split("model = ")[1].split("    io.cprint")[0]
    script += "    with torch.no_grad():\n        test.test_emb(model, x, y)\n"
    project(tmp_path, {"test.py": evaluation, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert "DDP117" not in str(result.diagnostics) and result.changed, result.diagnostics


BANK = '''import torch
import torch.nn as nn
from torch.autograd import Function


class LinearAverageOp(Function):
    @staticmethod
    def forward(ctx, x, y, memory):
        ctx.save_for_backward(x, memory, y)
        return torch.mm(x, memory.t())

    @staticmethod
    def backward(ctx, grad_output):
        x, memory, y = ctx.saved_tensors
        memory.index_copy_(0, y, x.detach())
        return torch.mm(grad_output, memory), None, None


class LinearAverage(nn.Module):
    def __init__(self, size, n):
        super().__init__()
        self.register_buffer("memory", torch.randn(n, size))

    def forward(self, x, y):
        return LinearAverageOp.apply(x, y, self.memory)
'''


def test_a_project_memory_bank_updated_while_training_is_named_and_refused(tmp_path):
    # lemniscate.pytorch: the NCE memory bank is updated in a custom backward with each rank's samples
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "from lib.LinearAverage import LinearAverage\n")
    script = script.split("io = ")[0] + "bank = LinearAverage(1, 8)\nmodel = " + script.split("model = ")[1].split("    io.cprint")[0]
    script = script.replace("        loss = ((model(x) - y) ** 2).mean()\n", "        loss = bank(model(x), y.long().flatten()).mean()\n")
    project(tmp_path, {"lib/__init__.py": "", "lib/LinearAverage.py": BANK, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert not result.changed and [d.code for d in result.diagnostics if d.severity.name == "ERROR"] == ["DDP118"], result.diagnostics
    assert "LinearAverage" in str(result.diagnostics)


WEIGHTED_DATA = '''import numpy as np
import torch
from torch.utils.data import Dataset


class Boxes(Dataset):
    def __init__(self, n):
        self.class_weights = np.zeros(3)
        self.counts = np.ones(3)
        for i in range(n):
            self.class_weights[i % 3] = 1.0
        self.x, self.y = torch.randn(n, 1), torch.randn(n, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
'''


def test_a_datasets_numpy_weights_filled_when_it_is_made_are_no_memory_bank(tmp_path):
    # usnistgov's yolov3 (batch 45): class weights counted in the Dataset's __init__ refused the
    # script with DDP118, a memory bank "each rank would keep apart"
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "from boxes import Boxes\n")
    script = script.split("io = ")[0] + "data = Boxes(8)\nmodel = " + script.split("model = ")[1].split("    io.cprint")[0]
    project(tmp_path, {"boxes.py": WEIGHTED_DATA, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert "DDP118" not in {d.code for d in result.diagnostics}, result.diagnostics


LATE_LOGGER = '''import os


class Train_Logger:
    def __init__(self, save_path, name):
        self.path, self.name = save_path, name
        self.rows = []

    def update(self, epoch, log):
        self.rows.append((epoch, log))
        with open(os.path.join(self.path, self.name + ".csv"), "w") as f:
            f.write("\\n".join(str(row) for row in self.rows))
'''


def test_a_project_logger_that_writes_in_its_methods_is_made_on_rank_zero(tmp_path):
    # 3DUNet-Pytorch: Train_Logger writes its CSV on update(), not in its constructor
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "from logger import Train_Logger\n")
    script = script.replace('io = IOStream("run.log")\n', 'log = Train_Logger(".", "train_log")\n')
    script = script.replace('    io.cprint("epoch %d" % epoch)\n', "    log.update(epoch, loss.item())\n")
    project(tmp_path, {"logger.py": LATE_LOGGER, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert 'log = Train_Logger(".", "train_log") if dist.get_rank() == 0 else DdpNoOp()' in result.output, result.diagnostics


def test_a_wrap_with_the_sync_batchnorm_callback_in_an_imported_trainer_names_folder_mode(tmp_path):
    # first-order-model: run.py calls train(), which wraps in DataParallelWithCallback
    trainer = "from sync_batchnorm import DataParallelWithCallback\n\n\ndef train(config, generator, optimizer):\n    generator_full = DataParallelWithCallback(generator)\n    loss = generator_full(1).sum()\n    loss.backward()\n    optimizer.step()\n"
    run = "import torch\nfrom train import train\n\nmodel = torch.nn.Linear(2, 1)\ntrain(None, model, torch.optim.SGD(model.parameters(), lr=0.1))\n"
    project(tmp_path, {"train.py": trainer, "run.py": run})
    result = convert_file(tmp_path / "run.py")
    assert [d.code for d in result.diagnostics] == ["DDP214"] and not result.changed


POSE_UTILS = '''import os


def create_logger(cfg, phase):
    final_output_dir = os.path.join("output", phase)
    os.makedirs(final_output_dir, exist_ok=True)
    log_file = open(os.path.join(final_output_dir, "log.txt"), "a")
    return log_file, final_output_dir
'''


def test_a_project_writer_whose_returned_value_every_rank_uses_is_left_on_every_rank(tmp_path):
    # multiview-human-pose-estimation: `logger, final_output_dir = create_logger(...)`; the
    # folder is a path every rank passes on (a stand-in there crashed rank 1)
    script = LIIF.replace("import utils\n", "import utils\nimport os\n").replace(
        '    log, log_file = utils.set_save_path("save")\n', '    logger, final_output_dir = utils.create_logger(None, "train")\n'
    ).replace('        log("epoch %d" % epoch)\n', '        print(os.path.join(final_output_dir, "x"))\n        logger.write("epoch")\n')
    project(tmp_path, {"utils.py": POSE_UTILS, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert "DdpNoOp(), DdpNoOp()" not in result.output, result.diagnostics


def test_a_project_function_that_runs_the_model_through_another_is_not_a_writer(tmp_path):
    # InsightFace-v2: lfw_test(model) calls evaluate(model) (the model runs there), then writes
    # a figure: under a rank-0 guard DDP's buffer broadcast would wait for the other ranks
    from ddpify.project.neighbours import read_neighbours

    evaluation = (
        "import matplotlib.pyplot as plt\n\n\ndef evaluate(model):\n    return model(1)\n\n\n"
        "def visualize():\n    plt.savefig('theta.png')\n\n\ndef lfw_test(model):\n    evaluate(model)\n    visualize()\n"
    )
    script = "from lfw_eval import lfw_test, visualize\nlfw_test(None)\n"
    project(tmp_path, {"lfw_eval.py": evaluation, "train.py": script})
    found = read_neighbours(str(tmp_path / "train.py"), script)
    assert "visualize" in found.writers and "lfw_test" not in found.writers


def test_a_script_with_its_own_ddp_path_that_hands_its_loader_to_a_project_trainer_takes_that_path(tmp_path):
    # TransGAN: mp.spawn DDP path beside DataParallel; the loader goes to functions.train()
    trainer = "def train(args, model, optimizer, train_loader):\n    for (x,) in train_loader:\n        model(x).mean().backward()\n        optimizer.step()\n"
    script = (Path(__file__).parent.parent / "fixtures" / "existing_ddp" / "spawns.py").read_text().replace(
        "import torch.nn as nn\n", "import torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\nimport functions\n"
    ).replace(
        "    loss = model(torch.randn(4, 2).cuda()).mean()\n    loss.backward()\n    optimizer.step()\n",
        "    train_loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)\n    functions.train(args, model, optimizer, train_loader)\n",
    )
    project(tmp_path, {"functions.py": trainer, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert "DDP007" in {d.code for d in result.diagnostics} and "dist.get_world_size() == 1" not in result.output, result.diagnostics


def test_a_script_that_runs_a_trainer_object_of_a_wrapping_project_names_folder_mode(tmp_path):
    # BERT4Rec-VAE: trainer = trainer_factory(args, model, ...); trainer.train() (the wrap is in the trainer)
    trainers = "import torch.nn as nn\n\n\nclass Trainer:\n    def __init__(self, model):\n        self.model = nn.DataParallel(model)\n\n    def train(self):\n        pass\n\n\ndef trainer_factory(model):\n    return Trainer(model)\n"
    script = "import torch.nn as nn\nfrom trainers import trainer_factory\n\ntrainer = trainer_factory(nn.Linear(2, 1))\ntrainer.train()\n"
    project(tmp_path, {"trainers.py": trainers, "main.py": script})
    result = convert_file(tmp_path / "main.py")
    assert [d.code for d in result.diagnostics] == ["DDP214"] and not result.changed


BALANCED = '''from torch.nn.parallel import DataParallel


class BalancedDataParallel(DataParallel):
    def __init__(self, gpu0_bsz, *args, **kwargs):
        self.gpu0_bsz = gpu0_bsz
        super().__init__(*args, **kwargs)

    def forward(self, *inputs, **kwargs):
        if not self.device_ids:
            return self.module(*inputs, **kwargs)
        inputs, kwargs = self.scatter(inputs, kwargs, self.device_ids)
        replicas = self.replicate(self.module, self.device_ids[:len(inputs)])
        outputs = self.parallel_apply(replicas, self.device_ids, inputs, kwargs)
        return self.gather(outputs, self.output_device)

    def scatter(self, inputs, kwargs, device_ids):
        return super().scatter(inputs, kwargs, device_ids)
'''
GATHERING = '''import torch.nn as nn


class SummingDataParallel(nn.DataParallel):
    def gather(self, outputs, output_device):
        return sum(output.to(output_device) for output in outputs)
'''
BALANCED_TRAIN = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from data_parallel import BalancedDataParallel

model = nn.Linear(4, 1)
if torch.cuda.device_count() > 1:
    model = BalancedDataParallel(2, model, dim=0).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
for epoch in range(2):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def test_a_project_subclass_that_only_scatters_becomes_ddp(tmp_path):
    # CPM's BalancedDataParallel(gpu0_bsz, model): a smaller share of each batch on GPU 0
    project(tmp_path, {"data_parallel.py": BALANCED, "train.py": BALANCED_TRAIN})
    result = convert_file(tmp_path / "train.py")
    assert not result.error, result.error
    assert "    model = ddp_wrap(model.to(ddp_device()))\n" in result.output
    assert "DDP129" in {d.code for d in result.diagnostics}


def test_a_project_subclass_that_gathers_its_own_way_is_refused(tmp_path):
    project(tmp_path, {"data_parallel.py": GATHERING, "train.py": BALANCED_TRAIN.replace(
        "from data_parallel import BalancedDataParallel", "from data_parallel import SummingDataParallel").replace(
        "BalancedDataParallel(2, model, dim=0)", "SummingDataParallel(model)")})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP122" in result.error


BUILDERS = '''import torch.nn as nn


def build_las(size):
    return nn.DataParallel(nn.Linear(size, size))


def build_model(config):
    return build_las(config["size"])
'''
RESUME_WRAP_HERE = '''import torch
import torch.nn as nn
from builders import build_model

if __name__ == "__main__":
    if torch.cuda.is_available() and False:  # resume
        model = nn.DataParallel(torch.load("last.pt"))
    else:
        model = build_model({"size": 2})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in torch.randn(3, 4, 2):
        model(x).sum().backward()
        optimizer.step()
'''


def test_a_script_calling_a_project_builder_that_wraps_two_calls_down_is_refused_naming_folder_mode(tmp_path):
    # end2end-asr / kospeech: the fresh model comes wrapped from the project; only the resume
    # branch wraps here, which alone would have been converted
    project(tmp_path, {"builders.py": BUILDERS, "train.py": RESUME_WRAP_HERE})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP214 `build_model`" in result.error and "ddpify convert DIR" in result.error


GET_ARGS = '''import argparse
import os
import time


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log_dir", default="logs")
    args = parser.parse_args()
    args.log_dir = os.path.join(args.log_dir, "run_%d" % time.time_ns())
    os.makedirs(args.log_dir, exist_ok=False)
    return args
'''
ARGS_TRAIN = '''import os
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from arguments import get_args


def main():
    args = get_args()
    model = nn.DataParallel(nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
    for epoch in range(2):
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    torch.save(model.state_dict(), os.path.join(args.log_dir, "model.pt"))


if __name__ == "__main__":
    main()
'''


def test_a_project_function_that_makes_a_run_folder_runs_once_and_every_rank_gets_its_values(tmp_path):
    # SimSiam's get_args(): a timestamped log folder made with exist_ok=False, its name in args
    from conftest import run_launched

    project(tmp_path, {"arguments.py": GET_ARGS, "train.py": ARGS_TRAIN})
    result = convert_file(tmp_path / "train.py")
    assert "args = ddp_shared_values(get_args() if dist.get_rank() == 0 else None)" in result.output
    assert "DDP617" in {d.code for d in result.diagnostics}
    (tmp_path / "train.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    for _ in range(3):  # a run lost to gloo's exit abort is repeated: from a clean folder
        shutil.rmtree(tmp_path / "logs", ignore_errors=True)
        run = run_launched(command, attempts=1, cwd=tmp_path, timeout=240)
        if run.returncode == 0:
            break
    assert run.returncode == 0, run.stderr[-3000:]
    folders = list((tmp_path / "logs").iterdir())
    assert len(folders) == 1 and (folders[0] / "model.pt").exists()


PENALTY = '''import torch
from torch.autograd import grad


def r1_penalty(real, critic):
    real = real.detach().requires_grad_(True)
    grads = grad(critic(real).sum(), real, create_graph=True)[0]
    penalty = torch.sum(grads * grads)
    return penalty
'''
GAN_STEP = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from losses import r1_penalty

D = nn.DataParallel(nn.Linear(4, 1))
optimizer = torch.optim.SGD(D.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=8)
for epoch in range(2):
    for (real,) in loader:
        d_loss = nn.functional.softplus(-D(real)).mean()
        penalty = r1_penalty(real, D)
        d_loss = d_loss + penalty * 5.0
        optimizer.zero_grad()
        d_loss.backward()
        optimizer.step()
'''


def test_a_penalty_a_project_function_sums_over_the_batch_is_scaled_by_the_world_size(tmp_path):
    # StyleGAN_PyTorch's R1Penalty: `torch.sum(grads * grads)` over the batch, in loss/loss.py
    project(tmp_path, {"losses.py": PENALTY, "train.py": GAN_STEP})
    result = convert_file(tmp_path / "train.py")
    assert "penalty = r1_penalty(real, D) * dist.get_world_size()" in result.output
    assert "DDP116" in {d.code for d in result.diagnostics}


RUNNER = '''import torch
import torch.nn as nn


class Runner:
    def __init__(self, steps):
        self.steps = steps

    def train(self):
        model = nn.DataParallel(nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(self.steps):
            model(torch.randn(4, 2)).sum().backward()
            optimizer.step()
'''


def test_a_script_that_runs_a_project_class_whose_method_wraps_is_refused_naming_folder_mode(tmp_path):
    # ddim's main.py: `runner = Diffusion(args, config); runner.train()`, no DataParallel of its own
    project(tmp_path, {"runner.py": RUNNER, "main.py": "from runner import Runner\n\nif __name__ == '__main__':\n    Runner(3).train()\n"})
    result = convert_file(tmp_path / "main.py")
    assert result.error and "DDP214 `Runner` (its train())" in result.error


HAND_WRITTEN_DP = '''import torch
import torch.nn as nn


def data_parallel_workaround(model, input):
    device_ids = list(range(torch.cuda.device_count()))
    replicas = torch.nn.parallel.replicate(model, device_ids)
    inputs = torch.nn.parallel.scatter(input, device_ids)
    outputs = torch.nn.parallel.parallel_apply(replicas, inputs)
    return torch.nn.parallel.gather(outputs, 0)


model = nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.randn(3, 4, 2):
    data_parallel_workaround(model, x).sum().backward()
    optimizer.step()
'''


def test_dataparallel_written_by_hand_from_its_parts_is_refused_not_passed_through(tmp_path):
    # wavenet_vocoder's data_parallel_workaround: "nothing to convert" before
    project(tmp_path, {"train.py": HAND_WRITTEN_DP})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "replicate()" in result.error and "DDP004" in result.error


HARD_MINING = '''import torch
import torch.nn as nn


class TripletLoss(nn.Module):
    def forward(self, inputs, targets):
        n = inputs.size(0)
        dist = torch.pow(inputs, 2).sum(dim=1, keepdim=True).expand(n, n)
        dist = dist + dist.t()
        dist.addmm_(1, -2, inputs, inputs.t())
        return dist.clamp(min=1e-12).sqrt().mean()


def deep_supervision(criterion, outputs, targets):
    return criterion(outputs, targets)
'''
HARD_MINING_TRAIN = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from losses import TripletLoss, deep_supervision

model = nn.DataParallel(nn.Linear(4, 2))
criterion = TripletLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 4, (16,))), batch_size=8)
for epoch in range(2):
    for x, y in loader:
        loss = deep_supervision(criterion, model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def test_a_hard_mining_loss_handed_to_a_helper_with_the_outputs_gets_the_whole_batch(tmp_path):
    # AlignedReID: `dist.addmm_(1, -2, inputs, inputs.t())`, called through DeepSupervision(criterion, ...)
    project(tmp_path, {"losses.py": HARD_MINING, "train.py": HARD_MINING_TRAIN})
    result = convert_file(tmp_path / "train.py")
    assert not result.error and "loss = ddp_whole_batch(deep_supervision, criterion, model(x), y)" in result.output


def test_a_hard_mining_loss_handed_to_a_helper_without_the_outputs_is_refused(tmp_path):
    # the helper runs the model itself: gathering the batch for it would run the model on all of it
    losses = HARD_MINING + "\n\ndef step(criterion, model, x, targets):\n    return criterion(model(x), targets)\n"
    train = HARD_MINING_TRAIN.replace("loss = deep_supervision(criterion, model(x), y)", "loss = step(criterion, model, x, y)")
    train = train.replace("import TripletLoss, deep_supervision", "import TripletLoss, step")
    project(tmp_path, {"losses.py": losses, "train.py": train})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP117 `TripletLoss`" in result.error and "ddpify convert DIR/" in result.error


def test_writers_of_a_module_imported_from_a_folder_without_init_run_on_rank_zero(tmp_path):
    # CLUE's `from tools import utils` (no tools/__init__.py), then `utils.torch_save_model(model, ...)`
    saver = "import os\nimport torch\n\n\ndef torch_save_model(model, folder):\n    os.makedirs(folder, exist_ok=True)\n" \
        "    torch.save(model.state_dict(), os.path.join(folder, 'best.pth'))\n"
    train = TRAIN.replace("from util import IOStream, save_args, evaluate_into", "from util import IOStream, save_args, evaluate_into\nfrom tools import utils")
    train += "utils.torch_save_model(model, 'checkpoints')\n"
    project(tmp_path, {"util.py": UTIL, "tools/utils.py": saver, "train.py": train})
    output = convert_file(tmp_path / "train.py").output
    assert "if dist.get_rank() == 0:\n    utils.torch_save_model(ddp_alone(model), 'checkpoints')" in output


def test_a_project_class_whose_base_constructor_wraps_refuses_the_script_naming_folder_mode(tmp_path):
    # FewRel: `class Proto(fewshot_re_kit.framework.FewShotREModel)`, whose __init__ wraps the encoder
    framework = "import torch.nn as nn\n\n\nclass FewShotModel(nn.Module):\n    def __init__(self, encoder):\n" \
        "        super().__init__()\n        self.encoder = nn.DataParallel(encoder)\n"
    proto = "import kit.framework\n\n\nclass Proto(kit.framework.FewShotModel):\n    def forward(self, x):\n" \
        "        return self.encoder(x)\n"
    train = "import torch\nfrom models.proto import Proto\nfrom kit.framework import train_model\n\n" \
        "train_model(Proto(torch.nn.Linear(2, 2)))\n"
    framework += "\n\ndef train_model(model):\n    model(torch.randn(4, 2)).sum().backward()\n"
    project(tmp_path, {"kit/__init__.py": "", "kit/framework.py": framework, "models/__init__.py": "", "models/proto.py": proto, "train.py": train})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP214 `Proto`" in result.error


def test_a_module_loaded_with_importlib_is_read_like_an_import(tmp_path):
    # pytorch_stacked_hourglass: `task = importlib.import_module('task.pose')`, then `task.make_network(config)`
    pose = "import torch.nn as nn\n\n\ndef make_network(config):\n    config['net'] = nn.DataParallel(nn.Linear(2, 2))\n"
    train = "import importlib\n\nif __name__ == '__main__':\n    task = importlib.import_module('task.pose')\n" \
        "    config = {}\n    task.make_network(config)\n    print('training')\n"
    project(tmp_path, {"task/__init__.py": "", "task/pose.py": pose, "train.py": train})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP214 `task.make_network`" in result.error


def test_a_script_whose_project_helper_picks_the_cuda_device_is_refused_naming_folder_mode(tmp_path):
    # squad's util.get_available_devices(): `torch.cuda.set_device(cuda:0)` on every rank after set-up
    helper = "import torch\n\n\ndef get_available_devices():\n    device = torch.device('cuda:0')\n" \
        "    torch.cuda.set_device(device)\n    return device\n"
    train = TRAIN.replace("from util import IOStream, save_args, evaluate_into", "from util import IOStream, save_args, evaluate_into\nimport devices")
    train = train.replace("torch.manual_seed(0)\n", "torch.manual_seed(0)\ndevice = devices.get_available_devices()\n")
    project(tmp_path, {"util.py": UTIL, "devices.py": helper, "train.py": train})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP214 `devices.get_available_devices`" in result.error


def test_a_project_function_that_reads_a_checkpoint_waits_for_rank_zero_s_save(tmp_path):
    # MMT: the best model saved on rank 0, then every rank's `load_checkpoint(best)` (a project function)
    serialization = "import torch\n\n\ndef load_checkpoint(path):\n    return torch.load(path)\n"
    train = TRAIN + "torch.save(model.state_dict(), 'best.pth')\nstate = load_checkpoint('best.pth')\n"
    train = train.replace("from util import IOStream, save_args, evaluate_into", "from util import IOStream, save_args, evaluate_into\nfrom serialization import load_checkpoint")
    project(tmp_path, {"util.py": UTIL, "serialization.py": serialization, "train.py": train})
    output = convert_file(tmp_path / "train.py").output
    assert "dist.barrier()\nstate = load_checkpoint('best.pth')" in output


def test_a_script_whose_dataparallel_module_does_not_parse_is_refused_not_passed(tmp_path):
    # chexnet: ChexnetTrainer.py (`.cuda(async=True)`) wraps and trains; Main.py names no DataParallel
    trainer = "import torch\n\n\nclass Trainer:\n    @staticmethod\n    def train(model):\n        model = torch.nn.DataParallel(model)\n" \
        "        x = torch.randn(2, 2).cuda(async=True)\n        model(x).sum().backward()\n"
    project(tmp_path, {"trainer.py": trainer, "main.py": "from trainer import Trainer\n\nTrainer.train(None)\n"})
    result = convert_file(tmp_path / "main.py")
    assert result.error and "DDP214" in result.error


BRANCHING_BLOCK = (
    "import torch.nn as nn\n\n\nclass UpsampleBlock(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.up2 = nn.Linear(8, 1)\n        self.up3 = nn.Linear(8, 1)\n\n"
    "    def forward(self, x, scale):\n        return self.up2(x) if scale == 2 else self.up3(x)\n"
)


def test_a_model_built_from_an_imported_block_with_a_branch_per_argument_looks_for_unused_parameters(tmp_path):
    # CARN: model/carn.py's Net builds ops.UpsampleBlock, which runs one branch per scale
    project(tmp_path, {
        "ops.py": BRANCHING_BLOCK.replace("return self.up2(x) if scale == 2 else self.up3(x)",
                                          "if scale == 2:\n            return self.up2(x)\n        return self.up3(x)"),
        "carn.py": (
            "import torch.nn as nn\nimport ops\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.entry = nn.Linear(4, 8)\n        self.upsample = ops.UpsampleBlock()\n\n"
            "    def forward(self, x, scale):\n        return self.upsample(self.entry(x), scale)\n"
        ),
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom carn import Net\n\n"
            "model = nn.DataParallel(Net())\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
            "for epoch in range(2):\n    for x, y in loader:\n        loss = ((model(x, 2) - y) ** 2).mean()\n"
            "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
        ),
    })
    result = convert_file(tmp_path / "train.py")
    assert "ddp_wrap(Net(), find_unused_parameters=True)" in result.output
    assert "it builds ops.UpsampleBlock" in next(d.message for d in result.diagnostics if d.code == "DDP127")


def test_a_backbone_used_only_through_its_parts_is_idle():
    import ast

    from ddpify.project.neighbours import idle_parts

    source = (
        "import torch.nn as nn\nfrom torchvision import models\n\n\nclass ContextPath(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.features = models.resnet18(pretrained=True)\n"
        "        self.conv1 = self.features.conv1\n\n    def forward(self, x):\n        return self.features.layer1(self.conv1(x))\n"
    )
    assert "only some parts of self.features" in idle_parts(ast.parse(source))["ContextPath"]
    whole = source.replace("return self.features.layer1(self.conv1(x))", "return self.features(x)")
    assert idle_parts(ast.parse(whole)) == {}


def test_a_memory_bank_handed_to_a_trainer_is_refused(tmp_path):
    # ECN: `self.em = nn.Parameter(...)` rows written by labels in a custom backward, the loss
    # re-exported by reid/loss/__init__.py and handed to the project's Trainer
    project(tmp_path, {
        "reid/__init__.py": "",
        "reid/loss/__init__.py": "from .invariance import InvNet\n",
        "reid/loss/invariance.py": (
            "import torch\nimport torch.nn as nn\n\n\nclass InvNet(nn.Module):\n    def __init__(self, n, d):\n"
            "        super().__init__()\n        self.em = nn.Parameter(torch.zeros(n, d))\n\n"
            "    def forward(self, x, y):\n        out = x.mm(self.em.t())\n        for f, t in zip(x, y):\n"
            "            self.em[t] = 0.5 * self.em[t] + 0.5 * f.detach()\n        return out\n"
        ),
        "reid/trainers.py": (
            "class Trainer:\n    def __init__(self, model, model_inv):\n        self.model, self.model_inv = model, model_inv\n\n"
            "    def train(self, epoch, loader, optimizer):\n        for x, y in loader:\n"
            "            loss = self.model_inv(self.model(x), y).mean()\n            optimizer.zero_grad()\n"
            "            loss.backward()\n            optimizer.step()\n"
        ),
        "main.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "from reid.loss import InvNet\nfrom reid.trainers import Trainer\n\n"
            "model = nn.DataParallel(nn.Linear(4, 4))\nmodel_inv = InvNet(10, 4)\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 10, (8,))), batch_size=4)\n"
            "trainer = Trainer(model, model_inv)\nfor epoch in range(2):\n    trainer.train(epoch, loader, optimizer)\n"
        ),
    })
    result = convert_file(tmp_path / "main.py")
    assert result.error and "DDP118" in {d.code for d in result.diagnostics}


def test_a_trainer_that_writes_through_project_helpers_is_reported(tmp_path):
    # ban-vqa: train.train() logs with utils.Logger and saves with utils.save_model
    project(tmp_path, {
        "utils.py": (
            "import torch\n\n\nclass Logger:\n    def __init__(self, path):\n        self.log_file = open(path, 'w')\n\n"
            "    def write(self, msg):\n        self.log_file.write(msg + '\\n')\n\n\n"
            "def save_model(path, model):\n    torch.save(model.state_dict(), path)\n"
        ),
        "train.py": (
            "import utils\n\n\ndef train(model, loader, optimizer, output):\n    logger = utils.Logger(output + '/log.txt')\n"
            "    for epoch in range(2):\n        for x, y in loader:\n            loss = ((model(x) - y) ** 2).mean()\n"
            "            optimizer.zero_grad()\n            loss.backward()\n            optimizer.step()\n"
            "        logger.write(str(loss.item()))\n    utils.save_model(output + '/model.pth', model)\n"
        ),
        "main.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom train import train\n\n"
            "model = nn.DataParallel(nn.Linear(4, 1))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
            "train(model, loader, optimizer, 'out')\n"
        ),
    })
    result = convert_file(tmp_path / "main.py")
    assert "DDP616" in {d.code for d in result.diagnostics}


def test_a_loader_handed_to_a_trainer_class_constructor_is_training_data(tmp_path):
    # CamStyle --camstyle 46: CamStyleTrainer(model, criterion, camstyle_loader) keeps
    # `iter(self.camstyle_loader)` and draws from it with next() in train()
    project(tmp_path, {
        "trainers.py": (
            "class CamStyleTrainer:\n    def __init__(self, model, criterion, camstyle_loader):\n"
            "        self.model, self.criterion = model, criterion\n        self.camstyle_loader = camstyle_loader\n"
            "        self.camstyle_loader_iter = iter(self.camstyle_loader)\n\n"
            "    def train(self, epoch, data_loader, optimizer):\n        for x, y in data_loader:\n"
            "            try:\n                cx, cy = next(self.camstyle_loader_iter)\n            except StopIteration:\n"
            "                self.camstyle_loader_iter = iter(self.camstyle_loader)\n                cx, cy = next(self.camstyle_loader_iter)\n"
            "            loss = self.criterion(self.model(x), y) + self.criterion(self.model(cx), cy)\n"
            "            optimizer.zero_grad()\n            loss.backward()\n            optimizer.step()\n"
        ),
        "main.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom trainers import CamStyleTrainer\n\n\n"
            "def main():\n    train_loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)\n"
            "    camstyle_loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)\n"
            "    model = nn.DataParallel(nn.Linear(4, 1))\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    trainer = CamStyleTrainer(model, nn.MSELoss(), camstyle_loader)\n"
            "    for epoch in range(2):\n        trainer.train(epoch, train_loader, optimizer)\n\n\nmain()\n"
        ),
    })
    result = convert_file(tmp_path / "main.py")
    assert not result.error, result.diagnostics
    assert {d.message.split("'")[1] for d in result.diagnostics if d.code == "DDP301"} == {"train_loader", "camstyle_loader"}


def test_a_project_function_returning_a_logger_it_makes_runs_on_rank_zero_with_a_stand_in(tmp_path):
    # M2Det: `logger = set_logger(args.tensorboard)` makes the log folder and returns a
    # TensorBoard Logger; sent to the other ranks as a value it failed to pickle
    project(tmp_path, {
        "utils/__init__.py": "",
        "utils/core.py": (
            "import os\nimport shutil\n\n\nclass Logger:\n    def __init__(self, path):\n        self.file = open(path + '/events', 'w')\n\n"
            "    def scalar_summary(self, tag, value, step):\n        self.file.write(f'{tag} {value} {step}\\n')\n\n\n"
            "def set_logger(status):\n    if status:\n        log_path = './logs/run'\n        if os.path.exists(log_path):\n"
            "            shutil.rmtree(log_path)\n        os.makedirs(log_path)\n        logger = Logger(log_path)\n    else:\n"
            "        logger = None\n    return logger\n"
        ),
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom utils.core import set_logger\n\n"
            "logger = set_logger(True)\nmodel = nn.DataParallel(nn.Linear(4, 1))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
            "for epoch in range(2):\n    for x, y in loader:\n        loss = ((model(x) - y) ** 2).mean()\n"
            "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
            "        logger.scalar_summary('loss', loss.item(), epoch)\n"
        ),
    })
    result = convert_file(tmp_path / "train.py")
    assert "logger = set_logger(True) if dist.get_rank() == 0 else DdpNoOp()" in result.output
    assert "ddp_shared_values(set_logger" not in result.output


PENET_HELPER = 'import csv\nimport os\n\n\nclass Logger:\n    def __init__(self, folder):\n        if not os.path.exists(folder):\n            os.makedirs(folder)\n        self.csv = os.path.join(folder, "train.csv")\n        self.best = float("inf")\n\n    def save_info(self, loss, epoch):\n        with open(self.csv, "a") as handle:\n            csv.writer(handle).writerow([epoch, loss])\n        return loss\n\n    def save_best(self, loss):\n        is_best = loss < self.best\n        self.best = min(loss, self.best)\n        return is_best\n'
PENET_MAIN = 'import torch\nfrom helper import Logger\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\ndef iterate(loader, model, optimizer, logger, epoch):\n    total = 0.0\n    for x, y in loader:\n        loss = nn.functional.mse_loss(model(x), y)\n        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n        total += loss.item()\n    avg = logger.save_info(total / len(loader), epoch)\n    is_best = logger.save_best(avg)\n    return is_best\n\n\ndef main():\n    torch.manual_seed(0)\n    logger = Logger("results")\n    model = nn.DataParallel(nn.Linear(4, 1))\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)\n    for epoch in range(2):\n        if iterate(loader, model, optimizer, logger, epoch):\n            torch.save(model.state_dict(), "best.pth")\n\n\nif __name__ == "__main__":\n    main()\n'


def test_results_of_a_project_logger_made_on_rank_zero_are_sent_to_every_rank(tmp_path):
    # PENet's helper.logger: made on rank 0 only; `avg = logger.save_info(...)` and
    # `is_best = logger.save_best(avg)` are called by rank 0 and sent to the others
    project(tmp_path, {"helper.py": PENET_HELPER, "main.py": PENET_MAIN})
    result = convert_file(tmp_path / "main.py")
    assert 'logger = Logger("results") if dist.get_rank() == 0 else DdpNoOp()' in result.output
    assert "is_best = ddp_from_rank_zero(logger.save_best(avg) if dist.get_rank() == 0 else None)" in result.output
    (tmp_path / "main.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "main.py"]
    # one run only (a rerun would append its rows): the gloo exit abort comes after the script ended
    run = run_launched(torchrun, attempts=1, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0 or GLOO_EXIT_ABORT in run.stderr, run.stderr
    assert len((tmp_path / "results" / "train.csv").read_text().splitlines()) == 2  # one row per epoch


CYCLING_PACKAGE = {'pkg/__init__.py': '', 'pkg/cb/__init__.py': 'from .callback import Callback\nfrom .history import History\n', 'pkg/cb/callback.py': 'class Callback:\n    pass\n', 'pkg/cb/history.py': 'from pkg.cb import Callback\n\n\nclass History(Callback):\n    pass\n', 'pkg/trainer/__init__.py': 'from .sup import fit\n', 'pkg/trainer/sup.py': 'from pkg.cb import History\n\n\ndef fit(model, opt, loader):\n    h = History()\n    for x, y in loader:\n        loss = model(x).sum()\n        opt.zero_grad(); loss.backward(); opt.step()\n    return h\n', 'setup.py': "from setuptools import setup; setup(name='pkg')\n", 'train.py': 'import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom pkg.trainer import fit\n\nif __name__ == "__main__":\n    torch.manual_seed(0)\n    model = nn.Linear(4, 2)\n    model = nn.DataParallel(model)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    ds = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))\n    loader = DataLoader(ds, batch_size=8, shuffle=True)\n    for x, y in loader:\n        loss = nn.functional.cross_entropy(model(x), y)\n        opt.zero_grad(); loss.backward(); opt.step()\n    print("done")\n'}


def test_a_package_whose_submodule_imports_the_package_back_is_read_once(tmp_path):
    # machine (i-machine-think): callbacks/history.py imports `machine.util.callbacks`, whose
    # __init__ re-exports history: the reader recursed without end (RecursionError)
    project(tmp_path, CYCLING_PACKAGE)
    result = convert_file(tmp_path / "train.py")
    assert result.changed and not result.error


HRNET_UTILS = "import os\nimport logging\nimport time\nfrom pathlib import Path\n\nimport torch\nimport torch.optim as optim\n\n\ndef create_logger(cfg, cfg_name, phase='train'):\n    root_output_dir = Path(cfg['OUTPUT_DIR'])\n    if not root_output_dir.exists():\n        print('=> creating {}'.format(root_output_dir))\n        root_output_dir.mkdir()\n    cfg_name = os.path.basename(cfg_name).split('.')[0]\n    final_output_dir = root_output_dir / 'wflw' / cfg_name\n    final_output_dir.mkdir(parents=True, exist_ok=True)\n    time_str = time.strftime('%Y-%m-%d-%H-%M')\n    log_file = '{}_{}_{}.log'.format(cfg_name, time_str, phase)\n    final_log_file = final_output_dir / log_file\n    head = '%(asctime)-15s %(message)s'\n    logging.basicConfig(filename=str(final_log_file), format=head)\n    logger = logging.getLogger()\n    logger.setLevel(logging.INFO)\n    console = logging.StreamHandler()\n    logging.getLogger('').addHandler(console)\n    tensorboard_log_dir = Path(cfg['LOG_DIR']) / 'wflw' / (cfg_name + '_' + time_str)\n    tensorboard_log_dir.mkdir(parents=True, exist_ok=True)\n    return logger, str(final_output_dir), str(tensorboard_log_dir)\n\n\ndef get_optimizer(cfg, model):\n    return optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.1)\n\n\ndef save_checkpoint(states, predictions, is_best, output_dir, filename='checkpoint.pth'):\n    preds = predictions.cpu().data.numpy()\n    torch.save(states, os.path.join(output_dir, filename))\n    torch.save(preds, os.path.join(output_dir, 'current_pred.pth'))\n    latest_path = os.path.join(output_dir, 'latest.pth')\n    if os.path.islink(latest_path):\n        os.remove(latest_path)\n    os.symlink(os.path.join(output_dir, filename), latest_path)\n    if is_best and 'state_dict' in states.keys():\n        torch.save(states['state_dict'].module, os.path.join(output_dir, 'model_best.pth'))\n"


def test_a_project_logger_returned_with_run_folders_is_made_once_and_sent_to_every_rank(tmp_path):
    # HRNet-Facial-Landmark-Detection: `logger, final_output_dir, tb_log_dir = create_logger(...)`;
    # a stand-in for the call could not be unpacked on the other ranks (ValueError)
    project(tmp_path, {
        "utils.py": HRNET_UTILS,
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nimport utils\n\n\n"
            "def main():\n    logger, final_output_dir, tb_log_dir = utils.create_logger({'OUTPUT_DIR': 'output', 'LOG_DIR': 'log'}, 'x.yaml')\n"
            "    logger.info('start')\n    model = nn.DataParallel(nn.Linear(4, 1))\n    optimizer = utils.get_optimizer(None, model)\n"
            "    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
            "    for epoch in range(2):\n        for x, y in loader:\n            loss = ((model(x) - y) ** 2).mean()\n"
            "            optimizer.zero_grad()\n            loss.backward()\n            optimizer.step()\n"
            "        torch.save(model.state_dict(), final_output_dir + '/model.pth')\n\n\nmain()\n"
        ),
    })
    result = convert_file(tmp_path / "train.py")
    assert "ddp_shared_values(utils.create_logger(" in result.output and "DdpNoOp()" not in result.output.split("def main")[-1]


DATA_PARALLEL_BY_FUNCTION = {'entry_functional.py': 'from pkg.train_fn import train\n\nif __name__ == "__main__":\n    train()\n', 'pkg/__init__.py': '', 'pkg/train_fn.py': 'import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom pkg.utils import dp_workaround\n\n\ndef train(epochs=2):\n    model = nn.Linear(4, 2)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=8, shuffle=True)\n    for ep in range(epochs):\n        for x, y in loader:\n            if torch.cuda.device_count() > 1:\n                out = dp_workaround(model, x)\n            else:\n                out = model(x)\n            loss = nn.functional.mse_loss(out, y)\n            opt.zero_grad(); loss.backward(); opt.step()\n    torch.save(model.state_dict(), "w.pt")\n', 'pkg/utils.py': 'import torch\n\n\ndef dp_workaround(model, *input):\n    device_ids = list(range(torch.cuda.device_count()))\n    replicas = torch.nn.parallel.replicate(model, device_ids)\n    inputs = torch.nn.parallel.scatter(input, device_ids)\n    replicas = replicas[:len(inputs)]\n    outputs = torch.nn.parallel.parallel_apply(replicas, inputs)\n    return torch.nn.parallel.gather(outputs, device_ids[0])\n\n\n', 'pyproject.toml': "[project]\nname='x'\n"}


def test_a_script_whose_project_trains_with_data_parallel_by_function_is_refused_naming_folder_mode(tmp_path):
    # Real-Time-Voice-Cloning: synthesizer_train.py calls train(), which runs replicate and
    # parallel_apply (data_parallel_workaround): "nothing to convert" before
    project(tmp_path, DATA_PARALLEL_BY_FUNCTION)
    result = convert_file(tmp_path / "entry_functional.py")
    assert result.error and "DDP214" in {d.code for d in result.diagnostics}


def test_an_argument_a_project_writer_fills_in_on_rank_zero_is_sent_to_every_rank(tmp_path):
    # FlowFormer: `process_cfg(cfg)` makes the run folder and sets `cfg.log_dir`; run on rank 0
    # only, the other ranks had no log_dir (AttributeError)
    project(tmp_path, {
        "misc.py": (
            "import os\n\n\ndef process_cfg(cfg):\n    log_dir = 'logs/' + cfg.name\n    cfg.log_dir = log_dir\n"
            "    os.makedirs(log_dir)\n"
        ),
        "train.py": (
            "import argparse\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "from misc import process_cfg\n\n\ndef main(cfg):\n    process_cfg(cfg)\n    model = nn.DataParallel(nn.Linear(4, 1))\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
            "    for x, y in loader:\n        loss = ((model(x) - y) ** 2).mean()\n        optimizer.zero_grad()\n"
            "        loss.backward()\n        optimizer.step()\n    torch.save(model.state_dict(), cfg.log_dir + '/final.pth')\n\n\n"
            "if __name__ == '__main__':\n    main(argparse.Namespace(name='run'))\n"
        ),
    })
    result = convert_file(tmp_path / "train.py")
    assert "cfg = ddp_from_rank_zero(cfg if dist.get_rank() == 0 else None)" in result.output


def test_a_relative_sys_path_entry_is_also_read_from_the_folders_above(tmp_path):
    # person-reid-triplet-loss-baseline: script/experiment/train.py does sys.path.insert(0, '.')
    # and is run from the repository root, where its package tri_loss is
    script = '''import sys
sys.path.insert(0, '.')
import torch
import torch.nn as nn
from tri_loss.utils import Logger

log = Logger("log.txt")
model = nn.DataParallel(nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4)
for x in loader:
    loss = model(x).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    log.write(str(loss.item()))
'''
    logger = 'class Logger:\n    def __init__(self, path):\n        self.file = open(path, "w")\n\n    def write(self, text):\n        self.file.write(text)\n'
    project(tmp_path, {"tri_loss/__init__.py": "", "tri_loss/utils.py": logger, "script/experiment/train.py": script})
    result = convert_file(tmp_path / "script" / "experiment" / "train.py")
    assert "Logger" in " ".join(d.message for d in result.diagnostics), result.diagnostics


def test_a_writer_a_package_re_exports_with_a_star_import_is_made_on_rank_zero(tmp_path):
    # Random-Erasing: utils/__init__.py does `from .logger import *`; cifar.py `from utils import Logger`
    script = '''import torch
import torch.nn as nn
from utils import Logger

log = Logger("log.txt")
model = nn.DataParallel(nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4)
for x in loader:
    loss = model(x).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    log.write(str(loss.item()))
'''
    logger = 'class Logger:\n    def __init__(self, path):\n        self.file = open(path, "w")\n\n    def write(self, text):\n        self.file.write(text)\n'
    project(tmp_path, {"utils/__init__.py": "from .logger import *\n", "utils/logger.py": logger, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert any(d.code == "DDP606" and "Logger" in d.message for d in result.diagnostics), result.diagnostics


def test_a_script_calling_the_training_function_of_a_module_whose_imports_wrap_is_refused(tmp_path):
    # score_sde_pytorch: main.py -> run_lib.train() -> models/utils.py's create_model wraps
    run_lib = "from models import utils as mutils\n\n\ndef train(config, workdir):\n    model = mutils.create_model(config)\n    return model\n"
    create = "import torch\n\n\ndef create_model(config):\n    return torch.nn.DataParallel(torch.nn.Linear(2, 1))\n"
    main = "import run_lib\n\n\ndef main(config):\n    run_lib.train(config, '/tmp/work')\n"
    project(tmp_path, {"models/__init__.py": "", "models/utils.py": create, "run_lib.py": run_lib, "main.py": main})
    result = convert_file(tmp_path / "main.py")
    assert [d.code for d in result.diagnostics] == ["DDP214"] and "`run_lib`" in result.diagnostics[0].message


def test_a_dispatcher_method_that_calls_the_wrapping_method_refuses_naming_folder_mode(tmp_path):
    # mcan-vqa's run.py: `execution.run(mode)`, whose run() calls self.train(), which wraps
    runner = RUNNER + "\n    def run(self, mode):\n        if mode == 'train':\n            self.train()\n"
    project(tmp_path, {"runner.py": runner, "main.py": "from runner import Runner\n\nif __name__ == '__main__':\n    Runner(3).run('train')\n"})
    result = convert_file(tmp_path / "main.py")
    assert result.error and "DDP214 `Runner` (its run())" in result.error


def test_a_wrapping_class_a_package_re_exports_by_name_refuses_naming_folder_mode(tmp_path):
    # OpenNRE: `from opennre import framework`, framework/__init__.py `from .sentence_re import
    # SentenceRE`, the script calls `opennre.framework.SentenceRE(...)` and trains through it
    wrapper = "import torch.nn as nn\n\n\nclass SentenceRE:\n    def __init__(self, model):\n        self.parallel_model = nn.DataParallel(model)\n"
    project(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/framework/__init__.py": "from .sentence_re import SentenceRE\n",
        "pkg/framework/sentence_re.py": wrapper,
        "train.py": "import torch\nimport pkg\nfrom pkg import framework\n\nf = pkg.framework.SentenceRE(torch.nn.Linear(2, 1))\nf.train_model()\n",
    })
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP214 `framework.SentenceRE`" in result.error


def test_a_factory_that_imports_its_class_by_a_computed_name_refuses_naming_folder_mode(tmp_path):
    # CUT's models/__init__.py: importlib.import_module("models." + name + "_model"); the
    # package's BaseModel.parallelize() wraps every net in DataParallel
    factory = (
        "import importlib\n\n\ndef find_model_using_name(name):\n    return importlib.import_module('models.' + name + '_model')\n\n\n"
        "def create_model(opt):\n    return find_model_using_name(opt.model).Model(opt)\n"
    )
    base = "import torch\n\n\nclass BaseModel:\n    def parallelize(self):\n        self.net = torch.nn.DataParallel(self.net)\n"
    project(tmp_path, {
        "models/__init__.py": factory,
        "models/base_model.py": base,
        "train.py": "from models import create_model\n\nmodel = create_model(None)\nfor data in range(3):  # train\n    model.optimize_parameters()\n",
    })
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP214 `create_model`" in result.error


@pytest.mark.parametrize("body", [
    "    with h5py.File(path, 'w') as h5f:\n        h5f.create_dataset('x', data=[1])\n",
    "    mlflow.set_experiment('e')\n    mlflow.pytorch.log_model(None, 'final_model')\n",
    # the writers the script's own calls are guarded for, read through the module's imports
    # (STYLER's vocoder_infer: `from scipy.io import wavfile` ... `wavfile.write(path, sr, wav)`)
    "    from scipy.io import wavfile\n    wavfile.write(path, 22050, [0])\n",
    "    sf.write(path, [0], 22050)\n",
    "    plot.savefig(path)\n",
])
def test_project_functions_writing_through_h5py_or_a_tracker_run_on_rank_zero(tmp_path, body):
    # PReNet's prepare_data_RainTrainH (h5py), EEG-LDM's log_mlflow
    util = f"import h5py\nimport mlflow\nimport soundfile as sf\nfrom matplotlib import pyplot as plot\n\n\ndef prepare(path):\n{body}"
    script = (
        "import argparse\nimport torch\nimport torch.nn as nn\nfrom util import prepare\n\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--data', default='RainTrainH')\nargs = parser.parse_args()\n"
        "if args.data.startswith('Rain'):\n    prepare('data.h5')\n"
        "model = nn.DataParallel(nn.Linear(2, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.randn(3, 4, 2):\n    model(x).sum().backward()\n    opt.step()\n"
    )
    project(tmp_path, {"util.py": util, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert "if dist.get_rank() == 0:\n        prepare('data.h5')\n    dist.barrier()" in result.output


EVALUATION = '''import json
import os

import torch


def validate(model, x, output_dir):
    model.eval()
    with torch.no_grad():
        predictions = model(x).flatten().tolist()
    path = os.path.join(output_dir, "results.json")
    with open(path, "w") as f:
        json.dump(predictions, f)
    with open(path) as f:
        return sum(json.load(f))
'''


def test_a_project_evaluation_that_writes_and_reads_back_runs_quietly_on_every_rank(tmp_path):
    # HRNet pose's validate(): a results JSON at a fixed path, written then read back by every rank
    script = (
        "import torch\nimport torch.nn as nn\nfrom function import validate\n\n"
        "model = nn.DataParallel(nn.Linear(2, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.randn(3, 4, 2):\n    model(x).sum().backward()\n    opt.step()\n"
        "    perf = validate(model, x, '.')\n    print(perf)\n"
    )
    project(tmp_path, {"function.py": EVALUATION, "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert "perf = ddp_quiet(validate, model, x, '.')" in result.output
    assert [d.code for d in result.diagnostics if d.code == "DDP616"] == ["DDP616"]


GAN_BASE = '''import torch.nn as nn


class BaseGAN:
    def __init__(self, generator, discriminator):
        self.netG = nn.DataParallel(generator)
        self.netD = nn.DataParallel(discriminator)
'''
GAN_TRAINER = '''import torch.nn as nn
from models.base_gan import BaseGAN


class ProgressiveGANTrainer:
    def __init__(self):
        self.model = BaseGAN(nn.Linear(2, 2), nn.Linear(2, 1))

    def train(self):
        pass
'''
LOAD_BY_EXEC = '''def loadmodule(package, name):
    exec("from " + package + " import " + name)
    return eval(name)
'''


@pytest.mark.parametrize("loads", ["exec", "import_module"])
def test_a_trainer_imported_by_a_computed_name_whose_package_wraps_deeper_is_refused_naming_folder_mode(tmp_path, loads):
    # pytorch_GAN_zoo: train.py picks its trainer by name (a project helper's exec, or
    # importlib in the script); BaseGAN, imported by the trainer, wraps G and D
    if loads == "exec":
        script = "from models.utils import loadmodule\n\ntrainer = loadmodule('models.trainer', 'ProgressiveGANTrainer')()\ntrainer.train()\n"
    else:
        script = "import importlib\nimport sys\n\nname = sys.argv[1]\ntrainer = getattr(importlib.import_module('models.trainer.' + name), 'Trainer')()\ntrainer.train()\n"
    project(tmp_path, {
        "models/__init__.py": "", "models/base_gan.py": GAN_BASE, "models/utils.py": LOAD_BY_EXEC,
        "models/trainer/__init__.py": "", "models/trainer/progressive.py": GAN_TRAINER, "train.py": script,
    })
    result = convert_file(tmp_path / "train.py")
    assert result.error and "DDP214" in result.error and "ddpify convert DIR" in result.error, result.diagnostics
    assert result.output == result.source


HARD_MINING_STEP = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from losses import TripletLoss, deep_supervision


def train(epoch, model, criterion_metric, optimizer, loader):
    for x, y in loader:
        features = model(x)
        loss = deep_supervision(criterion_metric, features, y) + criterion_metric(features, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    model = nn.DataParallel(nn.Linear(4, 2))
    criterion = TripletLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 4, (16,))), batch_size=8)
    for epoch in range(2):
        train(epoch, model, criterion, optimizer, loader)


if __name__ == "__main__":
    main()
'''


def test_a_hard_mining_loss_handed_to_a_step_function_of_the_file_is_gathered_there(tmp_path):
    # AlignedReID: the epoch loop hands criterion_metric to train(), which calls it (and
    # DeepSupervision with it) on the model's features
    project(tmp_path, {"losses.py": HARD_MINING, "train.py": HARD_MINING_STEP})
    result = convert_file(tmp_path / "train.py")
    assert not result.error, result.diagnostics
    assert "loss = ddp_whole_batch(deep_supervision, criterion_metric, features, y) + ddp_whole_batch(criterion_metric, features, y)" in result.output


MULTIBOX = '''import torch.nn as nn
import torch.nn.functional as F


class MultiBoxLoss(nn.Module):
    """Smooth L1 over the positive anchors, divided by how many the batch holds (DSFD's)."""

    def forward(self, predictions, targets):
        pos = targets > 0
        num_pos = pos.long().sum(1, keepdim=True)
        loss_l = F.smooth_l1_loss(predictions[pos], targets[pos], reduction="sum")
        N = num_pos.data.sum().float()
        loss_l /= N
        return loss_l
'''
MULTIBOX_TRAIN = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from multibox import MultiBoxLoss


def main():
    torch.manual_seed(0)
    images = torch.randn(16, 6)
    targets = torch.zeros(16, 3)
    targets[:5] = torch.rand(5, 3) + 0.5  # the first samples hold every positive: one share has none
    loader = DataLoader(TensorDataset(images, targets), batch_size=8)
    net = nn.DataParallel(nn.Linear(6, 3))
    criterion = MultiBoxLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    for epoch in range(2):
        for x, t in loader:
            out = net(x)
            loss = criterion(out, t)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print("weights", [round(v, 6) for v in net.module.weight.detach().flatten().tolist()])


if __name__ == "__main__":
    main()
'''


def test_a_project_loss_that_counts_over_the_batch_keeps_the_batch_whole_and_splits_the_model_s_calls(tmp_path):
    # DSFD's MultiBoxLoss divides by the batch's positive anchors: each rank would count its
    # share's (none in one share here: a division by zero). Every rank draws the whole batch,
    # the model's calls take their share (ddp_scattered): DataParallel's loss, exactly.
    project(tmp_path, {"multibox.py": MULTIBOX, "train.py": MULTIBOX_TRAIN})
    original = subprocess_run([sys.executable, "train.py"], tmp_path)
    result = convert_file(tmp_path / "train.py")
    assert "for x, t in ddp_shard(loader, whole_batches=True):" in result.output
    assert "out = ddp_scattered(net, x)" in result.output
    assert "DistributedSampler(" not in result.output.split("def main")[1]
    assert any(d.code == "DDP314" and "MultiBoxLoss" in d.message for d in result.diagnostics)
    (tmp_path / "train.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(torchrun, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr
    expected = eval(original.stdout.split("weights", 1)[1])
    converted = eval(run.stdout.split("weights", 1)[1])
    assert converted == pytest.approx(expected, abs=1e-5)


SEG_LOSSES = """import torch
import torch.nn as nn
import torch.nn.functional as F


class DiceLoss(nn.Module):
    def forward(self, input, target):
        keep = target.view(-1) != 255
        input = input.permute(0, 2, 3, 1).reshape(-1, input.size(1))[keep].softmax(dim=1)
        one_hot = F.one_hot(target.view(-1)[keep], num_classes=input.shape[1]).float()
        intersection = (input * one_hot).sum(dim=0)
        union = input.sum(dim=0) + one_hot.sum(dim=0)
        return (1 - (2. * intersection + 1.0) / (union + 1.0)).mean()


class HybridLoss(nn.Module):
    def __init__(self, alpha=0.5):
        super().__init__()
        self.alpha = alpha
        self.focal = nn.CrossEntropyLoss(ignore_index=255)
        self.dice = DiceLoss()

    def forward(self, input, target):
        return self.alpha * self.focal(input, target) + (1 - self.alpha) * self.dice(input, target)
"""
SEG_TRAIN = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from losses import HybridLoss

criterion = HybridLoss(alpha=0.3)


def SegLoss(output, target, criterion, alpha=1.0):
    return criterion(output.float(), target)


def train(model, loader, optimizer, criterion):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = SegLoss(model(x), y, criterion)
        loss.backward()
        optimizer.step()


def main():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 5, (16, 4, 4), generator=g)
    y[torch.rand(16, 4, 4, generator=g) < 0.3] = 255
    loader = DataLoader(TensorDataset(torch.randn(16, 3, 4, 4, generator=g), y), batch_size=8)
    torch.manual_seed(1)
    model = nn.DataParallel(nn.Conv2d(3, 5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for epoch in range(3):
        train(model, loader, opt, criterion)
    print("weights", [round(v, 6) for v in model.module.weight.detach().flatten().tolist()])


if __name__ == "__main__":
    main()
"""


def test_a_batch_coupled_loss_handed_to_a_helper_of_the_script_takes_the_whole_batch(tmp_path):
    # FedeBaldi-28/Sem_Seg_25: a per-class Dice of totals over the batch's pixels (`sum(dim=0)`),
    # inside a hybrid loss of losses.py, handed to the script's `SegLoss(output, target,
    # criterion)`: each rank took the Dice of its half-batch (1.1e-3 off; 4.3e-2 for Dice alone)
    project(tmp_path, {"losses.py": SEG_LOSSES, "train.py": SEG_TRAIN})
    original = subprocess_run([sys.executable, "train.py"], tmp_path)
    result = convert_file(tmp_path / "train.py")
    assert "loss = SegLoss(ddp_scattered(model, x), y, criterion)" in result.output
    assert any(d.code == "DDP314" and "HybridLoss" in d.message for d in result.diagnostics)
    (tmp_path / "train.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(torchrun, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr
    expected = eval(original.stdout.split("weights", 1)[1])
    assert eval(run.stdout.split("weights", 1)[1]) == pytest.approx(expected, abs=1e-5)


SELECTED_COUNT_LOSS = """import torch.nn as nn
import torch.nn.functional as F


class MultiboxLoss(nn.Module):
    def forward(self, predicted, labels, gt):
        pos_mask = labels > 0
        predicted = predicted[pos_mask, :].reshape(-1, 2)
        gt = gt[pos_mask, :].reshape(-1, 2)
        num_pos = gt.size(0)
        return F.smooth_l1_loss(predicted, gt, reduction='sum') / num_pos
"""


def test_a_project_loss_divided_by_the_length_of_what_a_mask_picks_keeps_the_batch_whole(tmp_path):
    # ULFD's MultiboxLoss: `num_pos = gt_locations.size(0)` of `gt_locations[pos_mask, :]`, a count
    # of the batch's positives (each rank would divide by its share's: 4.7e-3 off after 4 steps)
    train = MULTIBOX_TRAIN.replace("from multibox import MultiBoxLoss", "from multibox import MultiboxLoss as MultiBoxLoss")
    project(tmp_path, {"multibox.py": SELECTED_COUNT_LOSS, "train.py": train})
    result = convert_file(tmp_path / "train.py")
    assert any(d.code == "DDP314" for d in result.diagnostics), result.diagnostics


STEREO_LOSS = '''import torch.nn.functional as F


def model_loss(disp_ests, disp_gt, mask):
    weights = [0.5, 1.0]
    all_losses = []
    for disp_est, weight in zip(disp_ests, weights):
        all_losses.append(weight * F.smooth_l1_loss(disp_est[mask], disp_gt[mask], size_average=True))
    return sum(all_losses)
'''
STEREO_TRAIN = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from models.loss import model_loss

torch.manual_seed(1)
model = nn.DataParallel(nn.Linear(4, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
depth = torch.rand(16, 4) * (torch.rand(16, 4) > torch.linspace(0.05, 0.95, 16)[:, None])  # sparse: few valid pixels late
loader = DataLoader(TensorDataset(torch.randn(16, 4), depth), batch_size=8)


def train_sample(imgL, disp_gt):
    out = model(imgL)
    mask = (disp_gt < 0.9) & (disp_gt > 0)
    loss = model_loss([out, out * 2], disp_gt, mask)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


for epoch in range(2):
    for imgL, disp_gt in loader:
        train_sample(imgL, disp_gt)
print("weights", [round(v, 6) for v in model.module.weight.detach().flatten().tolist()])
'''


def test_a_project_loss_averaging_over_what_its_mask_parameter_selects_is_weighted_at_the_call(tmp_path):
    # GwcNet's models/loss.py: model_loss(disp_ests, disp_gt, mask) averages over the valid pixels
    # of its mask, called in the step function train_sample. Each rank's mean over its own valid
    # pixels, averaged by DDP, is not DataParallel's mean over every valid pixel of the batch.
    project(tmp_path, {"models/__init__.py": "", "models/loss.py": STEREO_LOSS, "train.py": STEREO_TRAIN})
    original = subprocess_run([sys.executable, "train.py"], tmp_path)
    result = convert_file(tmp_path / "train.py")
    assert "loss = ddp_selected_mean(model_loss([out, out * 2], disp_gt, mask), mask)" in result.output
    assert any(d.code == "DDP135" for d in result.diagnostics)
    (tmp_path / "train.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(torchrun, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr
    expected = eval(original.stdout.split("weights", 1)[1])
    converted = eval(run.stdout.split("weights", 1)[1])
    assert converted == pytest.approx(expected, abs=1e-5)


OHEM = '''import torch
import torch.nn as nn


class OhemCELoss(nn.Module):
    """CoinCheung's: the cross-entropy of the hardest pixels of the batch, at least n_min."""

    def __init__(self, thresh, n_min):
        super().__init__()
        self.thresh, self.n_min = thresh, n_min
        self.criteria = nn.CrossEntropyLoss(reduction="none")

    def forward(self, logits, labels):
        loss = self.criteria(logits, labels).view(-1)
        loss, _ = torch.sort(loss, descending=True)
        if loss[self.n_min] > self.thresh:
            loss = loss[loss > self.thresh]
        else:
            loss = loss[:self.n_min]
        return torch.mean(loss)
'''


def test_a_project_loss_that_keeps_the_batch_s_hardest_elements_keeps_the_batch_whole(tmp_path):
    # CoinCheung's Deeplab-Large-FOV: OhemCELoss ranks every pixel of the batch and keeps the
    # hardest (n_min from the global batch size): each rank would rank its own share's.
    train = MULTIBOX_TRAIN.replace("from multibox import MultiBoxLoss", "from ohem import OhemCELoss").replace(
        "criterion = MultiBoxLoss()", "criterion = OhemCELoss(0.7, 5)"
    ).replace("targets = torch.zeros(16, 3)\n", "targets = torch.arange(16) % 3\n").replace(
        "    targets[:5] = torch.rand(5, 3) + 0.5  # the first samples hold every positive: one share has none\n", ""
    )
    project(tmp_path, {"ohem.py": OHEM, "train.py": train})
    original = subprocess_run([sys.executable, "train.py"], tmp_path)
    result = convert_file(tmp_path / "train.py")
    assert "for x, t in ddp_shard(loader, whole_batches=True):" in result.output
    assert any(d.code == "DDP314" and "OhemCELoss" in d.message and "hardest" in d.message for d in result.diagnostics)
    (tmp_path / "train.py").write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(torchrun, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr
    expected = eval(original.stdout.split("weights", 1)[1])
    converted = eval(run.stdout.split("weights", 1)[1])
    assert converted == pytest.approx(expected, abs=1e-5)


def subprocess_run(command: list[str], cwd: Path):
    import subprocess

    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    return result


def test_a_project_writer_rank_zero_runs_alone_gets_the_module_it_hands_on_to_the_model(tmp_path):
    # InsightFace-PyTorch: `megaface_acc = megaface_test(model)` on rank 0 (DDP617); the model runs
    # two calls down (`gen_feature(path, model)` in a second module): DDP's forward there waited
    # for the other ranks (a collective mismatch at the first evaluation)
    project(tmp_path, {
        "megaface_utils.py": "def gen_feature(model, x):\n    return model(x)\n",
        "megaface.py": (
            "import json\n\nfrom megaface_utils import gen_feature\n\n\ndef megaface_test(model):\n    import torch\n"
            "    feats = gen_feature(model, torch.ones(2, 3))\n    with open('megaface.json', 'w') as f:\n"
            "        json.dump(feats.tolist(), f)\n    return float(feats.sum())\n"
        ),
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom megaface import megaface_test\n\n\n"
            "def main():\n    model = nn.DataParallel(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))\n"
            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    loader = DataLoader(TensorDataset(torch.randn(16, 3)), batch_size=4)\n    for epoch in range(2):\n"
            "        for (x,) in loader:\n            loss = model(x).pow(2).mean()\n            optimizer.zero_grad()\n"
            "            loss.backward()\n            optimizer.step()\n        acc = megaface_test(model)\n"
            "        print('megaface', acc)\n\n\nif __name__ == '__main__':\n    main()\n"
        ),
    })
    result = convert_file(tmp_path / "train.py")
    assert "acc = ddp_shared_values(megaface_test(ddp_alone(model)) if dist.get_rank() == 0 else None)" in result.output
    assert any(d.code == "DDP614" and "megaface_test" in d.message for d in result.diagnostics)


EVALUATOR_MODULE = 'import torch\n\n\ndef write_submission(values, path):\n    f = open(path, "w")\n    for v in values:\n        f.write(f"{v}\\n")\n    f.close()\n\n\ndef forward(model, x):\n    with torch.no_grad():\n        return model(x)\n\n\nclass Evaluator:\n    def __init__(self, model):\n        self.model = model\n\n    def evaluate(self, x, path):\n        out = forward(self.model, x)\n        write_submission(out.flatten().tolist(), path)\n        return len(open(path).read().splitlines())\n'
EVALUATOR_MAIN = 'import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom evaluate import Evaluator\n\n\ndef main():\n    model = nn.DataParallel(nn.Linear(3, 1))\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    loader = DataLoader(TensorDataset(torch.randn(16, 3)), batch_size=4)\n    evaluator = Evaluator(model=model)\n    for (x,) in loader:\n        loss = model(x).mean()\n        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n    lines = evaluator.evaluate(torch.ones(5, 3), "_submission.csv")\n    print("lines", lines)\n\n\nif __name__ == "__main__":\n    main()\n'


def test_a_project_evaluator_object_that_writes_and_reads_back_runs_quietly_on_the_other_ranks(tmp_path):
    # dcase2017's `evaluator.evaluate(...)` (a method of a project class) writes a submission CSV
    # and reads it back: every rank wrote and read the same file
    project(tmp_path, {"evaluate.py": EVALUATOR_MODULE, "main.py": EVALUATOR_MAIN})
    result = convert_file(tmp_path / "main.py")
    assert 'lines = ddp_quiet(evaluator.evaluate, torch.ones(5, 3), "_submission.csv")' in result.output
    assert any(d.code == "DDP616" and "evaluator.evaluate" in d.message for d in result.diagnostics)


def test_a_script_inside_the_package_it_imports_finds_the_wrap_without_a_marker_file(tmp_path):
    # 3DUnetCNN downloaded as a zip (no .git): unet3d/scripts/train.py imports `unet3d.*`, whose
    # models wrap in DataParallel; without a root marker the script was "nothing to convert"
    project(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/models/__init__.py": "",
        "pkg/models/build.py": "import torch.nn as nn\n\n\ndef build_model():\n    return nn.DataParallel(nn.Linear(3, 1))\n",
        "pkg/scripts/train.py": (
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom pkg.models.build import build_model\n\n"
            "model = build_model()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for (x,) in DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4):\n    loss = model(x).mean()\n"
            "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n"
        ),
    })
    result = convert_file(tmp_path / "pkg" / "scripts" / "train.py")
    refusal = next(d for d in result.diagnostics if d.code == "DDP214")
    assert f"`ddpify convert {tmp_path}`" in refusal.message  # the folder `pkg.` is imported from


def test_a_model_class_re_exported_by_its_package_keeps_its_idle_parts(tmp_path):
    # ERFNet-CULane: `import models; models.ERFNet()` (models/__init__.py: `from .erfnet import
    # ERFNet`); its output_conv runs only under `predict`: DDP stopped at iteration 2
    project(tmp_path, {"models/__init__.py": "from .erfnet import ERFNet\n", "models/erfnet.py": 'import torch.nn as nn\n\n\nclass ERFNet(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.encoder = nn.Linear(3, 3)\n        self.output_conv = nn.Linear(3, 2)\n\n    def forward(self, x, predict=False):\n        out = self.encoder(x)\n        if predict:\n            return self.output_conv(out)\n        return out\n', "train.py": 'import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nimport models\n\nmodel = nn.DataParallel(models.ERFNet())\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nfor (x,) in DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4):\n    loss = model(x).mean()\n    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n'})
    result = convert_file(tmp_path / "train.py")
    assert "model = ddp_wrap(models.ERFNet(), find_unused_parameters=True)" in result.output



def test_a_script_that_reaches_a_wrapping_package_out_of_sight_is_refused_naming_folder_mode(tmp_path):
    # AS-GCN's main.py: `import_class('processor.recognition.REC_Processor')`, whose base class in
    # processor/io.py wraps the model in DataParallel. "Nothing to convert" would have launched
    # N DataParallel jobs.
    project(tmp_path, {
        "processor/__init__.py": "",
        "processor/io.py": "import torch.nn as nn\n\n\nclass IO:\n    def gpu(self):\n        self.model = nn.DataParallel(self.model)\n",
        "processor/recognition.py": "from .io import IO\n\n\nclass REC_Processor(IO):\n    def train(self):\n        pass\n",
        "main.py": (
            "import sys\nfrom torchlight import import_class\n\nif __name__ == '__main__':\n"
            "    Processor = import_class('processor.recognition.REC_Processor')\n    Processor(sys.argv[2:]).start()  # train\n"
        ),
        "plain/__init__.py": "",
        "plain/nets.py": "import torch.nn as nn\n\nNet = nn.Linear\n",
        "other.py": "from plain.nets import Net\n\nif __name__ == '__main__':\n    Net(2, 2).train()\n",
    })
    result = convert_file(tmp_path / "main.py")
    assert result.output == result.source
    assert [d.code for d in result.diagnostics] == ["DDP214"]
    assert "processor/io.py" in result.diagnostics[0].message and "ddpify convert" in result.diagnostics[0].message
    untouched = convert_file(tmp_path / "other.py")
    assert untouched.output == untouched.source and not untouched.diagnostics


EARLY_STOPPING = '''import numpy as np
import torch


class EarlyStopping:
    def __init__(self, patience=2, path="checkpoint.pt"):
        self.patience, self.path, self.counter, self.best, self.early_stop = patience, path, 0, None, False

    def __call__(self, val_loss, model):
        if self.best is None or val_loss < self.best - 1e-3:
            self.best, self.counter = val_loss, 0
            torch.save(model.state_dict(), self.path)
        else:
            self.counter += 1
            with open("stopping.log", "a") as f:
                f.write(f"counter {self.counter} of {self.patience}\\n")
            self.early_stop = self.counter >= self.patience
'''
STOPPED_EARLY = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from pytorchtools import EarlyStopping

torch.manual_seed(0)
train = DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=4)
val_x, val_y = torch.randn(8, 2), torch.randn(8, 1)
model = nn.DataParallel(nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
early_stopping = EarlyStopping(patience=2)
for epoch in range(30):
    for x, y in train:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        val_loss = ((model(val_x) - val_y) ** 2).mean().item()
    early_stopping(val_loss, model)
    if early_stopping.early_stop:
        print("Early stopping at", epoch)
        break
print("done", epoch)
'''


def test_an_early_stopping_object_of_the_project_steers_every_rank_and_writes_once(tmp_path):
    # (Dynamic-Graph's pytorchtools.EarlyStopping: on rank 0 only, a stand-in elsewhere whose
    # `early_stop` was always false; rank 0 left the epoch loop and the others waited: a hang)
    project(tmp_path, {"pytorchtools.py": EARLY_STOPPING, "train.py": STOPPED_EARLY})
    original = run_launched([sys.executable, "train.py"], cwd=tmp_path, timeout=120)
    assert original.returncode == 0, original.stderr[-2000:]
    expected_log = (tmp_path / "stopping.log").read_text()
    assert "counter 2 of 2" in expected_log
    result = convert_file(tmp_path / "train.py")
    assert "early_stopping = ddp_quiet(EarlyStopping, patience=2)" in result.output, result.diagnostics
    (tmp_path / "train.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    for _ in range(5):  # a run lost to gloo's exit abort is repeated, from a fresh log
        (tmp_path / "stopping.log").unlink(missing_ok=True)
        launched = run_launched(command, attempts=1, cwd=tmp_path, timeout=180)
        if launched.returncode == 0:
            break
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert (tmp_path / "stopping.log").read_text() == expected_log  # written by rank 0 alone
    assert launched.stdout.count("done") == 1 and "Early stopping" in launched.stdout


def test_a_project_batch_loss_used_only_as_a_metric_leaves_the_loader_sharded(tmp_path):
    # Taylor_pruning: `prec1 = accuracy(output, target)` of a counting project function feeds
    # a meter, never backward(): the loader is sharded as usual, no whole batch on every rank
    metric_train = MULTIBOX_TRAIN.replace("criterion = MultiBoxLoss()\n", "criterion = nn.MSELoss()\n    counted = MultiBoxLoss()\n")
    metric_train = metric_train.replace("            loss = criterion(out, t)\n", "            loss = criterion(out, t)\n            hits = counted(out, t)\n")
    project(tmp_path, {"multibox.py": MULTIBOX, "train.py": metric_train})
    result = convert_file(tmp_path / "train.py")
    assert "whole_batches=True" not in result.output and "ddp_scattered" not in result.output, result.diagnostics
    assert not any(d.code == "DDP314" for d in result.diagnostics)


SAVING_MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(2, 1)

    def forward(self, x, y):
        return ((self.net(x) - y) ** 2).mean()

    def save(self, folder, step):
        path = f"{folder}/model-{step}.pth"
        torch.save(self.state_dict(), path)
        return path
'''
SAVED_BY_METHOD = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from model import Model

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
model = nn.DataParallel(Model())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss = model.train().forward(x, y).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    path = model.module.save(".", step)
    print("saved", path)
'''


def test_a_model_method_whose_value_never_reaches_backward_is_not_run_through_ddp(tmp_path):
    # easy-faster-rcnn: `path_to_checkpoint = model.module.save(...)` in the loop writes a
    # checkpoint; it computes no loss, so it is not sent through DDP's forward (DDP133)
    project(tmp_path, {"model.py": SAVING_MODEL, "train.py": SAVED_BY_METHOD})
    result = convert_file(tmp_path / "train.py")
    assert "ddp_through" not in result.output and not any(d.code == "DDP133" for d in result.diagnostics), result.diagnostics


def test_a_device_from_the_project_settings_becomes_this_process_s(tmp_path):
    # GST-Tacotron: `device = 'cuda:0'` in the hyperparameters module, `model.to(hp.device)`
    script = TRAIN.replace("from util import IOStream, save_args, evaluate_into\n", "import hyperparams as hp\nfrom config import device\n")
    script = script.replace('io = IOStream("run.log")\nsave_args(args, "exp")\n', "")
    script = script.replace("    io.cprint(\"epoch %d\" % epoch)\n    evaluate_into(model, x, \"eval.txt\")\n", "")
    script = script.replace("model = nn.DataParallel(nn.Linear(2, 1))\n", "model = nn.DataParallel(nn.Linear(2, 1)).to(hp.device)\nmodel.to(device)\nx0 = torch.zeros(1).to(args.device if hasattr(args, 'device') else 'cpu')\n")
    project(tmp_path, {"hyperparams.py": "device = 'cuda:0'\n", "config.py": "device = 'cuda:0'\n", "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert ".to(ddp_here(hp.device))" in result.output and "model.to(ddp_here(device))" in result.output, result.diagnostics
    assert sum(d.code == "DDP707" for d in result.diagnostics) == 2


def test_torchs_data_loader_taken_through_a_project_module_is_torchs(tmp_path):
    # Tacotron-pytorch: `from data import DataLoader`, which data.py imports from torch; the
    # batch-sized buffers of the loop follow the loader's share (DDP409), as with torch's name
    script = (
        "import numpy as np\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import TensorDataset\n"
        "from data import DataLoader\n\nbatch_size = 4\n"
        "loader = DataLoader(TensorDataset(torch.randn(16, 2), torch.randn(16, 1)), batch_size=batch_size, drop_last=True)\n"
        "model = nn.DataParallel(nn.Linear(2, 1))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(2):\n    for x, y in loader:\n        go = np.zeros([batch_size, 1])\n"
        "        loss = ((model(x) + torch.from_numpy(go).float() - y) ** 2).mean()\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
    )
    project(tmp_path, {"data.py": "from torch.utils.data import Dataset, DataLoader\n", "train.py": script})
    result = convert_file(tmp_path / "train.py")
    assert "sampler=DistributedSampler(" in result.output and "np.zeros([ddp_local_batch_size(batch_size), 1])" in result.output
    assert not any(d.code == "DDP312" for d in result.diagnostics)


JOINT_LOSS = '''import torch


def mutual_information_loss(x_out, x_tf_out):
    p_i_j = compute_joint(x_out, x_tf_out)
    p_i = p_i_j.sum(dim=1, keepdim=True)
    p_j = p_i_j.sum(dim=0, keepdim=True)
    return -(p_i_j * (torch.log(p_i_j) - torch.log(p_i) - torch.log(p_j))).sum()


def compute_joint(x_out, x_tf_out):
    p_i_j = (x_out.unsqueeze(2) * x_tf_out.unsqueeze(1)).sum(dim=0)
    p_i_j = (p_i_j + p_i_j.t()) / 2.0
    return p_i_j / p_i_j.sum()
'''

PAIRED_TRAINING = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from iid import mutual_information_loss

torch.manual_seed(0)
images = torch.rand(32, 6)
dataloaders = [DataLoader(TensorDataset(images), batch_size=8),
               DataLoader(TensorDataset(images + 0.05 * torch.rand(32, 6)), batch_size=8)]
net = nn.DataParallel(nn.Sequential(nn.Linear(6, 4), nn.Softmax(dim=1)))
optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
for epoch in range(2):
    iterators = (d for d in dataloaders)
    for tup in zip(*iterators):
        loss = mutual_information_loss(net(tup[0][0]), net(tup[1][0]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("epoch %d loss %.6f" % (epoch, loss.item()))
torch.save(net.module.state_dict(), "net.pt")
'''


def test_a_project_loss_that_normalises_the_batch_s_joint_in_a_helper_trains_as_the_original(tmp_path):
    # IIC: `IID_loss` calls `compute_joint`, which divides the batch's joint distribution by its
    # own total: the loss is the whole batch's, through the helper; `zip(*iterators)` of
    # unshuffled loaders is drawn whole and alike on every rank, the model's calls split
    torch = pytest.importorskip("torch")
    project(tmp_path, {"iid.py": JOINT_LOSS, "train.py": PAIRED_TRAINING, "orig/iid.py": JOINT_LOSS, "orig/train.py": PAIRED_TRAINING})
    result = convert_file(tmp_path / "train.py")
    assert not result.error and "DDP314" in {d.code for d in result.diagnostics}, result.diagnostics
    (tmp_path / "train.py").write_text(result.output)
    original = subprocess.run([sys.executable, "train.py"], cwd=tmp_path / "orig", capture_output=True, text=True, timeout=240)
    assert original.returncode == 0, original.stderr[-2000:]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    converted = run_launched(command, cwd=tmp_path, timeout=240)
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert converted.stdout.splitlines()[-2:] == original.stdout.splitlines()[-2:]
    ours, theirs = torch.load(tmp_path / "net.pt"), torch.load(tmp_path / "orig" / "net.pt")
    assert all(torch.allclose(ours[key], theirs[key], atol=1e-6) for key in theirs)


FUNCTIONAL_BASE = '''import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Linear(4, 2)

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            return nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        return self.main(input)
'''


def test_a_model_picked_by_a_computed_name_that_splits_in_its_forward_is_refused_naming_folder_mode(tmp_path):
    # AGE: `m = importlib.import_module('models.' + name)`; the models split each batch with
    # data_parallel() in their forward: "nothing to convert" would launch N DataParallel jobs
    script = (
        "import importlib\nimport sys\nimport torch\n\nm = importlib.import_module('models.' + sys.argv[1])\n"
        "netE = m.Encoder(2)\nopt = torch.optim.Adam(netE.parameters())\nfor x in torch.randn(4, 8, 4):\n"
        "    loss = netE(x).pow(2).mean()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n    print('train')\n"
    )
    project(tmp_path, {"models/__init__.py": "", "models/base.py": FUNCTIONAL_BASE, "age.py": script})
    result = convert_file(tmp_path / "age.py")
    assert result.error and "DDP214" in result.error and "ddpify convert DIR" in result.error, result.diagnostics
    assert result.output == result.source


DICE = '''import torch.nn as nn


class DiceLoss(nn.Module):
    def forward(self, inputs, targets, smooth=1):
        inputs, targets = inputs.sigmoid().view(-1), targets.view(-1)
        intersection = (inputs * targets).sum()
        return 1 - (2.0 * intersection + smooth) / (inputs.sum() + targets.sum() + smooth)


loss_func = DiceLoss()
'''

DICE_SCRIPT = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from losses import loss_func

model = nn.DataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4), (torch.randn(16, 1) > 0).float()), batch_size=8)
for epoch in range(2):
    for x, y in loader:
        loss = loss_func(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_a_module_level_instance_of_a_batch_coupled_loss_takes_the_whole_batch(tmp_path):
    # a SenNet kidney-vessel project: utils/loss.py's `loss_func = DiceLoss()`, a Dice over the
    # whole batch, imported and called by the script; the class was followed, its instance was not:
    # each rank took the Dice of its half-batch (weights 1.3e-3 from the original's)
    project(tmp_path, {"losses.py": DICE, "train.py": DICE_SCRIPT})
    result = convert_file(tmp_path / "train.py")
    assert not result.error, result.diagnostics
    assert "DDP314" in {d.code for d in result.diagnostics}
    assert "whole_batches=True" in result.output and "ddp_scattered(model, x)" in result.output


RRET_EVALUATE = "import os, shutil, torch\nfrom detect import im_detect\ndef evaluate(model=None, out_root=None, device=None):\n    out_dir = os.path.join(out_root, 'detection-results')\n    if os.path.exists(out_dir):\n        shutil.rmtree(out_dir)\n    os.makedirs(out_dir)\n    for i in range(3):\n        dets = im_detect(model, torch.randn(1, 4), device=device)\n        with open(os.path.join(out_dir, f'{i}.txt'), 'w') as f:\n            f.write(str(dets.tolist()))\n    mAP = float(len(os.listdir(out_dir)))\n    print('mAP', mAP)\n    return mAP, 0.5, 0.5\n"
RRET_DETECT = 'import torch\ndef im_detect(model, x, device=None):\n    with torch.no_grad():\n        return model(x)\n'
RRET_TRAIN = "import os, torch, torch.nn as nn\nfrom evaluate_mod import evaluate\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(4, 4); self.bn = nn.BatchNorm1d(4); self.out = nn.Linear(4, 1)\n    def forward(self, x, y=None):\n        h = self.out(self.bn(self.fc(x)))\n        if self.training:\n            return ((h - y) ** 2).mean().unsqueeze(0)\n        return h\n\ndef train(params):\n    device_list = params['device']\n    ds = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n    loader = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, drop_last=True)\n    model = Net()\n    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\n    if len(device_list) == 1:\n        model = model\n    else:\n        model = nn.DataParallel(model)\n    best_fitness = 0\n    fitness = 0\n    for epoch in range(2):\n        model.train()\n        for x, y in loader:\n            optimizer.zero_grad()\n            loss = model(x, y).mean()\n            loss.backward()\n            optimizer.step()\n        chkpt = {'model': model.state_dict()}\n        if epoch >= params['evaluation_val_start']:\n            model.eval()\n            val_mAP, p, r = evaluate(model=model, out_root='out', device='cpu')\n            fitness = val_mAP\n            if fitness > best_fitness:\n                best_fitness = fitness\n        if best_fitness == fitness:\n            torch.save(chkpt, 'best.pth')\n    print('done')\n\nif __name__ == '__main__':\n    train({'device': [0, 1], 'evaluation_val_start': 0})\n"


def test_a_rank_zero_evaluation_handed_the_model_by_keyword_gets_the_module_alone(tmp_path):
    # HsLOL/Rotation-RetinaNet-PyTorch: `evaluate(model=model, ...)` writes result files (rank 0's),
    # and two modules down calls the model; DDP's forward on rank 0 alone broadcast buffers the
    # other ranks never received (gloo: "collective mismatch"). Handed by keyword as by position.
    project(tmp_path, {"evaluate_mod.py": RRET_EVALUATE, "detect.py": RRET_DETECT, "train.py": RRET_TRAIN})
    result = convert_file(tmp_path / "train.py")
    assert not result.error, result.diagnostics
    assert "evaluate(model=ddp_alone(model), out_root='out', device='cpu')" in result.output
    assert "DDP614" in {d.code for d in result.diagnostics}


AGENT_PROJECT = {
    "ddpg.py": (
        "import torch\nimport torch.nn as nn\n\n\nclass DDPG(object):\n    def __init__(self):\n        self.actor = nn.Linear(3, 1)\n"
        "        self.optimizer = torch.optim.SGD(self.actor.parameters(), lr=0.1)\n\n"
        "    def data_parallel(self):\n        self.actor = nn.DataParallel(self.actor)\n\n"
        "    def update_policy(self, batch):\n        loss = self.actor(batch).mean()\n        loss.backward()\n"
        "        self.optimizer.step()\n"
    ),
    "agent.py": "from ddpg import DDPG\n\n\nclass Agent(DDPG):\n    pass\n",
    "train_test.py": "import torch\n\n\ndef train(agent, steps):\n    for i in range(steps):\n        agent.update_policy(torch.randn(4, 3))\n",
    "main.py": (
        "from train_test import train\n\nif __name__ == '__main__':\n    from agent import Agent\n    agent = Agent()\n"
        "    agent.data_parallel()\n    train(agent=agent, steps=3)\n"
    ),
}


def test_a_script_that_calls_an_imported_training_function_of_its_project_is_sent_to_folder_mode(tmp_path):
    # ChangyWen/wolpertinger_ddpg: main.py names no DataParallel and no backward(); it builds the agent,
    # whose inherited method wraps its networks, and calls train() of train_test.py: "nothing to
    # convert" was said, and the script launched N DataParallel jobs
    project(tmp_path, AGENT_PROJECT)
    result = convert_file(tmp_path / "main.py")
    assert result.error and "DDP214" in {d.code for d in result.diagnostics}
    assert result.output == result.source


NT_XENT = '''import torch
import torch.nn as nn


class SimCLR_Loss(nn.Module):
    def __init__(self, batch_size, temperature):
        super().__init__()
        self.batch_size, self.temperature = batch_size, temperature
        self.mask = self.mask_correlated_samples(batch_size)

    def mask_correlated_samples(self, batch_size):
        n = 2 * batch_size
        mask = torch.ones((n, n), dtype=bool)
        mask = mask.fill_diagonal_(0)
        for i in range(batch_size):
            mask[i, batch_size + i] = 0
            mask[batch_size + i, i] = 0
        return mask

    def forward(self, z_i, z_j):
        n = 2 * self.batch_size
        z = torch.cat((z_i, z_j), dim=0)
        sim = nn.functional.cosine_similarity(z.unsqueeze(1), z.unsqueeze(0), dim=2) / self.temperature
        positives = torch.cat((torch.diag(sim, self.batch_size), torch.diag(sim, -self.batch_size)), dim=0).reshape(n, 1)
        negatives = sim[self.mask].reshape(n, -1)
        logits = torch.cat((positives, negatives), dim=1)
        return nn.functional.cross_entropy(logits, torch.zeros(n, dtype=torch.long))
'''

NT_XENT_SCRIPT = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from losses import SimCLR_Loss

model = nn.DataParallel(nn.Linear(4, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = SimCLR_Loss(batch_size=8, temperature=0.5)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 4)), batch_size=8)
for epoch in range(2):
    for x_i, x_j in loader:
        loss = criterion(model(x_i), model(x_j))
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def test_a_loss_class_made_for_one_batch_size_gets_the_whole_batch(tmp_path):
    # varun1423/thesis_SIMCLR: NT-Xent built with the batch size lays the batch's samples out against
    # each other (its mask, `torch.diag(sim, self.batch_size)`); fed each rank's share it crashed at the
    # first loss, and fed the share's size it would train on fewer negatives
    project(tmp_path, {"losses.py": NT_XENT, "train.py": NT_XENT_SCRIPT})
    result = convert_file(tmp_path / "train.py")
    assert not result.error, result.diagnostics
    assert "DDP117" in {d.code for d in result.diagnostics}
    assert "loss = ddp_whole_batch(criterion, model(x_i), model(x_j))" in result.output


CAM_UTIL = '''class Explainer:  # GradCAM's shape: it runs the model forward and backward
    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        x = x.clone().requires_grad_(True)
        self.model(x).sum().backward()
        self.model.zero_grad()
        return x.grad.abs().sum().item()


class CamSaver:
    def __init__(self, cam, path):
        self.cam = cam
        self.out = open(path, "a")

    def save(self, x):
        self.out.write("%.6f\\n" % self.cam(x))
        self.out.flush()
'''

CAM_TRAIN = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from util import CamSaver, Explainer

torch.manual_seed(0)
model = nn.DataParallel(nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
explainer = Explainer(model=model)
saver = CamSaver(cam=explainer, path="cams.txt")
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
probe = torch.randn(2, 2)
for epoch in range(2):
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    saver.save(probe)
    print("epoch", epoch)
'''


def test_an_object_that_holds_the_wrapped_model_is_made_on_every_rank(tmp_path):
    """OCT-WSSS: a CAM saver (a writer class of the project) built around a GradCAM built around
    the wrapped model was made on rank 0 alone, its method run there alone: GradCAM's backward
    through DDP waited for the other ranks (a hang). Holding the model, even one object deep,
    it is made on every rank (its files private copies on the others), as its calls run."""
    project(tmp_path, {"util.py": CAM_UTIL, "train.py": CAM_TRAIN})
    result = convert_file(tmp_path / "train.py")
    assert 'saver = ddp_quiet(CamSaver, cam=explainer, path="cams.txt")' in result.output, result.output
    assert "DdpNoOp" not in result.output and "ddp_from_rank_zero(saver" not in result.output
    (tmp_path / "train.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    run = run_launched(command, cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len((tmp_path / "cams.txt").read_text().splitlines()) == 2 * run.attempts


COMBINED_LOSS = '''import torch.nn as nn
from losses import TripletLoss


class Loss(nn.Module):  # MGN's loss.Loss: its terms picked from a setting, kept in a list
    def __init__(self, spec):
        super().__init__()
        self.loss = []
        for part in spec.split("+"):
            weight, kind = part.split("*")
            function = TripletLoss() if kind == "Triplet" else nn.CrossEntropyLoss()
            self.loss.append({"weight": float(weight), "function": function})

    def forward(self, outputs, labels):
        return sum(term["weight"] * term["function"](outputs, labels) for term in self.loss)
'''


def test_a_loss_that_builds_a_batch_coupled_loss_is_batch_coupled(tmp_path):
    """MGN-pytorch: the training calls loss.Loss, which builds its terms (a batch-hard triplet
    loss among them) from a setting: each rank mined only its own share of the batch."""
    train = HARD_MINING_TRAIN.replace("from losses import TripletLoss, deep_supervision", "from combined import Loss")
    train = train.replace("criterion = TripletLoss()", 'criterion = Loss("1*Triplet")').replace(
        "deep_supervision(criterion, model(x), y)", "criterion(model(x), y)")
    project(tmp_path, {"losses.py": HARD_MINING, "combined.py": COMBINED_LOSS, "train.py": train})
    result = convert_file(tmp_path / "train.py")
    assert not result.error and "loss = ddp_whole_batch(criterion, model(x), y)" in result.output, result.diagnostics


SOLVER = '''class Solver:
    def __init__(self, model, data, optimizer):
        self.model, self.data, self.optimizer = model, data, optimizer

    def train(self, epochs):
        for epoch in range(epochs):
            for x, y in self.data["train"]:
                self.optimizer.zero_grad()
                ((self.model(x) - y) ** 2).mean().backward()
                self.optimizer.step()
'''
SOLVER_TRAIN = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from solver import Solver

model = nn.DataParallel(nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = {"train": DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)}
solver = Solver(model, data, optimizer)
solver.train(2)
'''


def test_training_in_a_project_class_s_method_names_folder_mode_as_the_way(tmp_path):
    """woo-music's and ML_ISLES2017's Solver: the loop over data runs in a method of an imported
    class; the refusal said "shard it by hand" where converting the folder converts it."""
    project(tmp_path, {"solver.py": SOLVER, "train.py": SOLVER_TRAIN})
    result = convert_file(tmp_path / "train.py")
    assert result.error and "convert the folder" in result.error and "`solver`" in result.error, result.error


def test_an_import_of_a_module_that_downloads_at_import_time_is_warned(tmp_path):
    """ML-begin's data.py builds CIFAR10(download=True) at its top level: `from data import
    trainloader` runs it on every rank at once, before any process group exists."""
    data = (
        "import torch\nimport torchvision\n\n"
        "trainset = torchvision.datasets.CIFAR10(root='./data', train=True, download=True)\n"
        "trainloader = torch.utils.data.DataLoader(trainset, batch_size=4, shuffle=True)\n"
    )
    train = (
        "import torch\nimport torch.nn as nn\nfrom data import trainloader\n\n"
        "net = nn.DataParallel(nn.Linear(4, 2))\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x, y in trainloader:\n    loss = ((net(x) - y) ** 2).mean()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    project(tmp_path, {"data.py": data, "train.py": train})
    result = convert_file(tmp_path / "train.py")
    warned = [d for d in result.diagnostics if d.code == "DDP607"]
    assert not result.error and len(warned) == 1 and warned[0].line == 3 and "`data` downloads" in warned[0].message


def test_a_loss_module_the_script_reaches_through_a_computed_sys_path_is_read(tmp_path: Path) -> None:
    # (Fine-grained-Re-Identification: `parentdir = os.path.dirname(os.getcwd())`, appended to
    # sys.path; its triplet loss in ../loss was taken for a library's: each rank mined its share)
    (tmp_path / "loss").mkdir()
    (tmp_path / "loss" / "__init__.py").write_text("from .triplet import TripletLoss\n")
    (tmp_path / "loss" / "triplet.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass TripletLoss(nn.Module):\n    def forward(self, x, y):\n"
        "        d = torch.cdist(x, x)\n        return d.mean()\n"
    )
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "train.py"
    script.write_text(
        "import os, sys\ncurrentdir = os.getcwd()\nparentdir = os.path.dirname(currentdir)\nsys.path.append(parentdir)\n"
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom loss import TripletLoss\n\n"
        "model = nn.DataParallel(nn.Linear(4, 3))\ncriterion = TripletLoss()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(TensorDataset(torch.randn(8, 4), torch.arange(8)), batch_size=4):\n"
        "    loss = criterion(model(x), y)\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    )
    result = convert_file(script)
    assert "DDP117" in {d.code for d in result.diagnostics}
    assert "ddp_whole_batch(criterion, model(x), y)" in result.output


METRIC_LOSSES = '''import torch
import torch.nn as nn


class Contrastive(nn.Module):
    def forward(self, feats, labels):
        sim = feats @ feats.t()  # every pair of the batch
        same = (labels[:, None] == labels[None, :]).float()
        return ((sim - same) ** 2).mean()


def create(name):
    return {"contrastive": Contrastive}[name]()
'''
METRIC_TRAINER = '''def train(epoch, model, criterion, optimizer, loader):
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''
METRIC = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
import losses
from trainer import train

torch.manual_seed(0)
model = nn.DataParallel(nn.Linear(4, 3))
criterion = losses.create("contrastive")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.arange(16) % 4), batch_size=8)
for epoch in range(2):
    train(epoch, model, criterion, optimizer, loader)
torch.save(model.module.state_dict(), "weights.pt")
'''


def test_a_loss_handed_to_a_project_trainer_gets_the_whole_global_batch(tmp_path):
    torch = pytest.importorskip("torch")
    # Deep_Metric (batch 47): train.py builds a pairwise loss with a project factory and hands it
    # to trainer.py's train(); converted alone, each rank compared its half batch (0.09 off)
    from conftest import run_launched

    project(tmp_path, {"losses.py": METRIC_LOSSES, "trainer.py": METRIC_TRAINER, "train.py": METRIC})
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, check=True, timeout=120)
    original = torch.load(tmp_path / "weights.pt")
    result = convert_file(tmp_path / "train.py")
    assert "train(epoch, model, DdpWholeBatchLoss(criterion), optimizer, loader)" in result.output, result.diagnostics
    (tmp_path / "train.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    launched = run_launched(command, cwd=tmp_path, timeout=240)
    assert launched.returncode == 0, launched.stderr[-3000:]
    converted = torch.load(tmp_path / "weights.pt")
    assert all(torch.allclose(original[key], converted[key], atol=1e-6) for key in original)


def test_a_masked_loss_class_of_another_module_refuses_the_file_alone_naming_folder_mode(tmp_path):
    # FastSpeech2 (batch 47): model/loss.py's masked means, read only in single-file mode, were
    # averaged per rank (7% off); the folder converts them (projects/masked_loss_class)
    from conftest import FIXTURES

    source = FIXTURES / "projects" / "masked_loss_class"
    project(tmp_path, {name: (source / name).read_text() for name in ("loss.py", "train.py")})
    result = convert_file(tmp_path / "train.py")
    assert result.error and any(d.code == "DDP146" and "ddpify convert DIR" in d.message for d in result.diagnostics)


METRIC_TRAINER_CLASS = '''class Trainer:
    def __init__(self, model, criterion):
        self.model, self.criterion = model, criterion

    def train(self, epoch, loader, optimizer):
        for x, y in loader:
            out = self.model(x)
            loss = self.criterion[0](out, y) + self.criterion[1](out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
'''
METRIC_BY_OBJECT = METRIC.replace("from trainer import train\n", "from trainer import Trainer\n").replace(
    'criterion = losses.create("contrastive")\n',
    'criterion_pair = losses.create("contrastive")\ncriterion_mse = losses.create("contrastive")\n'
    "criterion = [criterion_pair, criterion_mse]\ntrainer = Trainer(model, criterion)\n",
).replace("    train(epoch, model, criterion, optimizer, loader)\n", "    trainer.train(epoch, loader, optimizer)\n")


def test_losses_handed_to_a_project_trainer_object_in_a_list_get_the_whole_global_batch(tmp_path):
    # RAGA's open-reid trainer (batch 48): `ImgTrainer(model, [criterion_cls, criterion_tri], ...)`,
    # its train() calling self.criterion[1] on each rank's half batch (5.4e-4 off; 3.4e-8 now)
    torch = pytest.importorskip("torch")
    from conftest import run_launched

    assert "trainer.train(epoch, loader, optimizer)" in METRIC_BY_OBJECT
    project(tmp_path, {"losses.py": METRIC_LOSSES, "trainer.py": METRIC_TRAINER_CLASS, "train.py": METRIC_BY_OBJECT})
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, check=True, timeout=120)
    original = torch.load(tmp_path / "weights.pt")
    result = convert_file(tmp_path / "train.py")
    assert "criterion = [DdpWholeBatchLoss(criterion_pair), DdpWholeBatchLoss(criterion_mse)]" in result.output, result.diagnostics
    (tmp_path / "train.py").write_text(result.output)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"]
    launched = run_launched(command, cwd=tmp_path, timeout=240)
    assert launched.returncode == 0, launched.stderr[-3000:]
    converted = torch.load(tmp_path / "weights.pt")
    assert all(torch.allclose(original[key], converted[key], atol=1e-5) for key in original), {
        key: (original[key] - converted[key]).abs().max().item() for key in original
    }


def test_a_part_made_under_the_setting_its_use_tests_through_a_kept_copy_is_not_idle():
    # DBE: `self.cond = config["ct_cond"]`, the layer made under `if config["ct_cond"]:` and used
    # under `if self.cond:`: it exists only where it trains (find_unused_parameters was set for it)
    import ast

    from ddpify.project.neighbours import idle_parts

    source = (
        "import torch.nn as nn\n\n\nclass DBE(nn.Module):\n    def __init__(self, config):\n        super().__init__()\n"
        "        self.cond = config['ct_cond']\n        self.enc = nn.Linear(4, 4)\n        if config['ct_cond']:\n"
        "            self.ct_cond = nn.Linear(4, 4)\n\n    def forward(self, x):\n        x = self.enc(x)\n"
        "        if self.cond:\n            x = x + self.ct_cond(x)\n        return x\n"
    )
    assert idle_parts(ast.parse(source)) == {}
    assert "DBE" in idle_parts(ast.parse(source.replace("        if config['ct_cond']:\n            self.ct_cond", "        if True:\n            self.ct_cond")))


def test_a_training_loop_in_a_module_left_as_it_is_is_named_for_its_rank_zero_prints(tmp_path):
    # Conv_AutoEncoder: main.py hands its loader to train.py's `train(...)`, which prints the loss;
    # single-file mode shards the loader here, and says that the prints there are rank 0's share
    trainer = (
        "import torch.nn.functional as F\n\n\ndef train(epoch, loader, optimizer, model):\n"
        "    for i, (x, y) in enumerate(loader):\n        loss = F.mse_loss(model(x), y)\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
        "        if i % 10 == 0:\n            print('loss:', loss.item())\n"
    )
    main = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom train import train\n\n"
        "model = nn.DataParallel(nn.Linear(3, 1))\noptimizer = torch.optim.Adam(model.parameters())\n"
        "loader = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=8)\n"
        "for epoch in range(2):\n    train(epoch, loader, optimizer, model)\n"
    )
    project(tmp_path, {"train.py": trainer, "main.py": main})
    result = convert_file(tmp_path / "main.py")
    assert not result.error, result.diagnostics
    assert "sampler=DistributedSampler(" in result.output
    assert [d.code for d in result.diagnostics if d.code == "DDP626"] == ["DDP626"]
