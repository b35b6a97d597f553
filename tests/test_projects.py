"""Project mode: fixtures/projects/<name>/ is a whole DataParallel project (entry script,
models, data, utils); fixtures/projects/<name>.ddp/ holds what `ddpify convert <name>/`
makes of it: the files it changes, and report.txt (every file's diagnostics, refusals and
the launch line). `pytest tests/test_projects.py --update-golden` rewrites them.

The end-to-end tests run the original project as one process and the converted one under
torchrun with 2 gloo ranks (and as plain `python`), under the probe, and compare.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import FIXTURES, run_launched
from ddpify.api import convert_project
from ddpify.diagnostics import FileResult

# One worker runs this file whole: its module-scoped fixtures are shared by its tests.
pytestmark = pytest.mark.xdist_group("test_projects")

PROJECTS = sorted(p for p in (FIXTURES / "projects").iterdir() if p.is_dir() and not p.name.endswith(".ddp"))


def convert_tree(root: Path) -> dict[str, FileResult]:
    files = sorted(root.rglob("*.py"))
    return {str(Path(r.path).relative_to(root)): r for r in convert_project(root, files)}


def render_report(results: dict[str, FileResult]) -> str:
    lines = []
    for name, result in sorted(results.items()):
        state = "refused" if result.error else "converted" if result.changed else "unchanged"
        lines.append(f"{name}: {state}")
        lines += [f"  {d.line}:{d.col}: {d.code} {d.message} [{d.severity.value}]" for d in result.diagnostics]
        if result.launch_command:
            lines.append(f"  launch: {result.launch_command.replace(str(Path(result.path).parent), '.')}")
    return "".join(f"{line}\n" for line in lines)


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_project_golden(project: Path, update_golden: bool) -> None:
    results = convert_tree(project)
    expected = project.with_name(project.name + ".ddp")
    if update_golden:
        shutil.rmtree(expected, ignore_errors=True)
        for name, result in results.items():
            if result.changed:
                (expected / name).parent.mkdir(parents=True, exist_ok=True)
                (expected / name).write_text(result.output, encoding="utf-8")
        expected.mkdir(exist_ok=True)
        (expected / "report.txt").write_text(render_report(results), encoding="utf-8")
    assert render_report(results) == (expected / "report.txt").read_text(encoding="utf-8")
    for name, result in results.items():
        golden = expected / name
        assert result.output == (golden.read_text(encoding="utf-8") if golden.exists() else result.source), name
        compile(result.output, name, "exec")
        if not result.changed:
            assert result.output == result.source, "files that do not change stay byte-identical"


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_converting_a_converted_project_changes_nothing(project: Path, tmp_path: Path) -> None:
    converted = tmp_path / project.name
    shutil.copytree(project, converted)
    first = convert_tree(converted)
    for name, result in first.items():
        (converted / name).write_text(result.output, encoding="utf-8")
    again = convert_tree(converted)
    assert not [name for name, result in again.items() if result.changed]
    if not any(result.error for result in first.values()):
        # ddpify's own output is "nothing to convert" (exit 0), as for a single file
        assert not [name for name, result in again.items() if result.error], again


def test_cli_converts_a_folder_as_one_project(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ddpify.cli import app

    project = tmp_path / "factory"
    shutil.copytree(FIXTURES / "projects" / "factory", project)
    before = {p: p.read_bytes() for p in project.rglob("*.py")}
    diff = CliRunner().invoke(app, ["convert", str(project), "--diff"])
    assert diff.exit_code == 1 and diff.stdout.count("+++ ") == 4  # one patch: four files change
    assert {p: p.read_bytes() for p in project.rglob("*.py")} == before
    result = CliRunner().invoke(app, ["convert", str(project)])
    assert result.exit_code == 0, result.output
    assert f"--standalone --nproc-per-node=gpu {project / 'train.py'}" in result.stdout  # the line for GPUs
    assert f"{project / 'models' / '__init__.py'}: converted" in result.stdout
    assert (project / "models" / "tiny.py").read_bytes() == before[project / "models" / "tiny.py"]


def test_a_refused_module_leaves_the_whole_project_untouched(tmp_path: Path) -> None:
    project = tmp_path / "factory"
    shutil.copytree(FIXTURES / "projects" / "factory", project)
    factory = project / "models" / "__init__.py"
    # A gradient penalty with a backward of its own in the factory's module: refused (DDP111),
    # so nothing may change.
    penalty = "\n\ndef penalty(d, x):\n    g = torch.autograd.grad(d(x).sum(), x, create_graph=True)[0]\n    g.pow(2).mean().backward()\n"
    factory.write_text(factory.read_text() + penalty)
    results = convert_tree(project)
    assert all(not r.changed for r in results.values())
    assert results["train.py"].error and "DDP210" in {d.code for d in results["train.py"].diagnostics}


def test_a_loader_builder_whose_loader_cannot_be_traced_refuses_the_project(tmp_path: Path) -> None:
    project = tmp_path / "factory"
    shutil.copytree(FIXTURES / "projects" / "factory", project)
    loaders = project / "data" / "loaders.py"
    # The builder hands back a loader made by a class of its own: nothing ddpify can shard.
    loaders.write_text(loaders.read_text().replace("return train_loader, val_loader", "return Wrapped(train_loader), val_loader")
                       + "\n\nclass Wrapped:\n    def __init__(self, loader):\n        self.loader = loader\n")
    results = convert_tree(project)
    assert all(not r.changed for r in results.values())
    assert "DDP308" in {d.code for d in results["data/loaders.py"].diagnostics}


def write_project(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_wrapping_module_no_script_imports_is_refused_without_a_traceback(tmp_path: Path) -> None:
    write_project(tmp_path, {"factory.py": "import torch.nn as nn\n\ndef build(model):\n    return nn.DataParallel(model)\n"})
    result = convert_tree(tmp_path)["factory.py"]
    assert result.error and not result.changed
    assert [d.code for d in result.diagnostics] == ["DDP202"]
    # (folder mode never tells the user to run folder mode: Progressive-GAN, reid)
    assert "ddpify convert DIR" not in result.diagnostics[0].message and "no script of this folder" in result.diagnostics[0].message


def test_a_script_imports_a_module_of_its_own_folder_by_its_bare_name() -> None:
    # (DDP216 must not take scripts/utils.py for a copy no one runs: scripts/ is on sys.path)
    from ddpify.project.verdicts import _imports

    assert _imports("import utils\n", "scripts.train", "scripts.utils")
    assert _imports("from utils import build\n", "scripts.train", "scripts.utils")
    assert _imports("from .utils import build\n", "scripts.train", "scripts.utils")
    assert not _imports("import utils\n", "scripts.train", "temp.utils")
    assert not _imports("from . import other\n", "scripts.train", "scripts.utils")


def test_a_folder_its_own_files_import_by_its_name_is_followed(tmp_path: Path) -> None:
    # cv_practise: super_resolution/main.py puts ../ on sys.path and imports `super_resolution.solver`;
    # converting super_resolution/ must see that module trains, not say "trains nothing"
    root = tmp_path / "pkg2"
    write_project(root, {
        "__init__.py": "",
        "solver.py": (
            "import torch\n\n\nclass ATrainer:\n    def __init__(self, model, loader):\n"
            "        self.model, self.loader = model, loader\n"
            "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n"
            "    def run(self):\n        for x, y in self.loader:\n"
            "            loss = (self.model(x) - y).pow(2).mean()\n"
            "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
        ),
        "main.py": (
            "import os\nimport sys\nsys.path.insert(0, os.path.abspath('../'))\nimport torch\nimport torch.nn as nn\n"
            "from torch.utils.data import DataLoader, TensorDataset\nfrom pkg2.solver import ATrainer\n\n\n"
            "import torch.distributed as dist\nfrom options import args\n\n\n"
            "def main():\n    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)\n"
            "    if args.distributed:\n        dist.init_process_group('nccl')\n"
            "        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))\n"
            "    else:\n        model = nn.DataParallel(nn.Linear(4, 1))\n"
            "    ATrainer(model, loader).run()\n\n\n"
            "if __name__ == '__main__':\n    main()\n"
        ),
    })
    (root / "options.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--distributed', action='store_true')\nargs = p.parse_args()\n")
    result = convert_tree(root)["main.py"]
    assert "DDP212" not in [d.code for d in result.diagnostics], result.diagnostics
    assert result.error and "`args.distributed`" in result.diagnostics[0].message


def test_a_call_through_a_subscript_in_a_project_module_converts(tmp_path: Path) -> None:
    # EDSR's trainer: the loss function is looked up in a dict, `l['function'](output, target)`.
    write_project(tmp_path, {
        "helpers.py": "def fmt(x):\n    return '%.4f' % float(x)\n",
        "utils.py": (
            "import helpers\n\n\ndef calc_loss(losses, output, target):\n    total = 0\n"
            "    for l in losses:\n        total = total + l['weight'] * l['function'](output, target)\n"
            "    print('loss', helpers.fmt(total))\n    return total\n"
        ),
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nimport utils\n\n\n"
            "def main():\n    model = nn.DataParallel(nn.Linear(4, 2))\n"
            "    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8, shuffle=True)\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    losses = [{'weight': 1.0, 'function': nn.L1Loss()}]\n"
            "    for epoch in range(2):\n        for x, y in loader:\n"
            "            loss = utils.calc_loss(losses, model(x), y)\n"
            "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n\n\n"
            "if __name__ == '__main__':\n    main()\n"
        ),
    })
    results = convert_tree(tmp_path)
    assert results["train.py"].changed and not results["train.py"].error


def test_a_backward_serving_a_forward_is_not_a_loop_over_data(tmp_path: Path) -> None:
    # CCT's VAT decoder: get_r_adv() runs a power iteration with its own backward(), called from a
    # module's forward; not a training loop that draws batches (DDP304 refused the folder)
    write_project(tmp_path, {
        "decoders.py": (
            "import torch\nimport torch.nn as nn\n\n\ndef get_r_adv(x, decoder, it=1):\n"
            "    d = torch.rand_like(x).requires_grad_()\n    for _ in range(it):\n"
            "        decoder(x + d).sum().backward()\n        d = d.grad.detach().requires_grad_()\n"
            "    return d.detach()\n\n\nclass VATDecoder(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.up = nn.Linear(4, 2)\n\n    def forward(self, x):\n"
            "        return self.up(x + get_r_adv(x, self.up))\n"
        ),
        "train.py": TRAIN_WITH.format(imports="from decoders import VATDecoder", setup="", after="").replace(
            "torch.nn.DataParallel(torch.nn.Linear(4, 2))", "torch.nn.DataParallel(VATDecoder())"
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values()), {name: result.error for name, result in results.items()}
    assert results["train.py"].changed


def test_micro_batches_of_a_fed_batch_in_a_project_solver_are_not_a_loop_over_data(tmp_path: Path) -> None:
    # SRFBN's SRSolver.train_step(): `for i in range(self.split_batch)` cuts the batch the entry's
    # loop fed it (`self.LR.narrow(0, i * sub, sub)`), a backward() per piece, one step
    write_project(tmp_path, {
        "solver.py": (
            "import torch\nimport torch.nn as nn\n\n\nclass Solver:\n    def __init__(self):\n"
            "        self.model = nn.DataParallel(nn.Linear(4, 2))\n"
            "        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        self.split_batch = 2\n        self.last_epoch_loss = 1e8\n\n"
            "    def feed_data(self, batch):\n        self.LR, self.HR = batch\n\n    def train_step(self):\n"
            "        self.opt.zero_grad()\n        loss_batch = 0.0\n        sub = self.LR.size(0) // self.split_batch\n"
            "        for i in range(self.split_batch):\n"
            "            out = self.model(self.LR.narrow(0, i * sub, sub))\n"
            "            loss = ((out - self.HR.narrow(0, i * sub, sub)) ** 2).mean() / self.split_batch\n"
            "            loss.backward()\n            loss_batch += loss.item()\n"
            # (SRFBN skips a step on a loss spike: decided on the mean losses, every rank alike)
            "        if loss_batch < 10 * self.last_epoch_loss:\n            self.opt.step()\n            self.last_epoch_loss = loss_batch\n"
        ),
        # (its create_dataloader() builds the validation loader too: sharded where the training
        # loop draws, the builder left whole; the loop feeds the solver, another method trains)
        "data.py": (
            "import torch\n\n\ndef create_dataloader(dataset, phase):\n    if phase == 'train':\n"
            "        batch_size, shuffle = 8, True\n    else:\n        batch_size, shuffle = 1, False\n"
            "    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)\n"
        ),
        "train.py": (
            "import torch\nfrom torch.utils.data import TensorDataset\nfrom data import create_dataloader\nfrom solver import Solver\n\n\n"
            "def main():\n    solver = Solver()\n"
            "    loader = create_dataloader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), 'train')\n"
            "    val_loader = create_dataloader(TensorDataset(torch.randn(8, 4), torch.randn(8, 2)), 'val')\n"
            "    for epoch in range(2):\n        for batch in loader:\n            solver.feed_data(batch)\n"
            "            solver.train_step()\n        for batch in val_loader:\n            solver.feed_data(batch)\n"
            "\n\nif __name__ == '__main__':\n    main()\n"
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values()), {name: result.error for name, result in results.items()}
    assert "in ddp_shard(loader):" in results["train.py"].output and "in val_loader:" in results["train.py"].output
    assert not results["data.py"].changed
    assert "if ddp_mean(loss_batch) < 10 * ddp_mean(self.last_epoch_loss):" in results["solver.py"].output


def test_a_builder_handed_the_phase_it_picks_its_loader_by_stays_whole(tmp_path: Path) -> None:
    # SR3's sample.py: `if phase == 'train': train_loader = Data.create_dataloader(train_set, opt, phase)`;
    # the builder returns the validation loader for another phase: sharded there, sr.py's
    # validation would run on a shard
    write_project(tmp_path, {
        "data.py": (
            "import torch\n\n\ndef create_dataloader(dataset, phase):\n    if phase == 'train':\n"
            "        return torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=True)\n"
            "    return torch.utils.data.DataLoader(dataset, batch_size=1, shuffle=False)\n"
        ),
        "train.py": TRAIN_WITH.format(
            imports="from data import create_dataloader", setup="", after=""
        ).replace(
            "    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8, shuffle=True)\n",
            "    for phase in ['train']:\n        if phase == 'train':\n"
            "            loader = create_dataloader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), phase)\n",
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values()), {name: result.error for name, result in results.items()}
    assert "in ddp_shard(loader):" in results["train.py"].output and not results["data.py"].changed


TRAIN_WITH = (
    "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n{imports}\n\n\ndef main():\n{setup}"
    "    model = torch.nn.DataParallel(torch.nn.Linear(4, 2))\n"
    "    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8, shuffle=True)\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    for epoch in range(2):\n        for x, y in loader:\n"
    "            loss = ((model(x) - y) ** 2).mean()\n"
    "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n{after}\n\n"
    "if __name__ == '__main__':\n    main()\n"
)


def test_a_project_logger_s_file_is_the_null_device_on_the_other_ranks(tmp_path: Path) -> None:
    # MMT's Logger: `self.file = open(fpath, 'w')`, and `os.fsync(self.file.fileno())` on flush
    write_project(tmp_path, {
        "utils/__init__.py": "",
        "utils/logging.py": (
            "import os\nimport sys\n\n\nclass Logger(object):\n    def __init__(self, fpath):\n"
            "        self.console = sys.stdout\n        self.file = open(fpath, 'w')\n\n"
            "    def write(self, msg):\n        self.console.write(msg)\n        self.file.write(msg)\n\n"
            "    def flush(self):\n        self.file.flush()\n        os.fsync(self.file.fileno())\n"
        ),
        "train.py": TRAIN_WITH.format(
            imports="import sys\nfrom utils.logging import Logger", setup="    sys.stdout = Logger('log.txt')\n", after=""
        ),
    })
    logging = convert_tree(tmp_path)["utils/logging.py"]
    assert "self.file = open(fpath, 'w') if ddp_rank() == 0 else open(os.devnull, 'w')" in logging.output
    assert "DDP609" in {d.code for d in logging.diagnostics}


def test_a_project_function_that_makes_the_run_folder_runs_once_in_folder_mode_too(tmp_path: Path) -> None:
    # SimSiam's get_args(): a timestamped log folder with exist_ok=False, its name in the args
    write_project(tmp_path, {
        "arguments.py": (
            "import argparse\nimport os\nimport time\n\n\ndef get_args():\n    args = argparse.Namespace(log_dir='logs')\n"
            "    args.log_dir = os.path.join(args.log_dir, str(time.time_ns()))\n    os.makedirs(args.log_dir, exist_ok=False)\n"
            "    return args\n"
        ),
        "train.py": TRAIN_WITH.format(imports="from arguments import get_args", setup="    args = get_args()\n", after="    print(args.log_dir)"),
    })
    train = convert_tree(tmp_path)["train.py"]
    assert "args = ddp_shared_values(get_args() if dist.get_rank() == 0 else None)" in train.output


def test_a_flat_script_that_hands_its_wrapped_model_to_a_project_trainer_object_converts(tmp_path: Path) -> None:
    # Cold-Diffusion: `model = DataParallel(...)` at the top level, `trainer = Trainer(model, ...)`,
    # `trainer.train()`; the trainer draws `next(self.dl)` from `self.dl = cycle(DataLoader(...))`
    write_project(tmp_path, {
        "pkg/__init__.py": "from pkg.core import Trainer\n",
        "pkg/core.py": (
            "import torch\nfrom torch.utils import data\n\n\ndef cycle(dl):\n    while True:\n        for d in dl:\n            yield d\n\n\n"
            "class Trainer(object):\n    def __init__(self, model, steps=4):\n        self.model = model\n"
            "        self.dl = cycle(data.DataLoader(data.TensorDataset(torch.randn(32, 4)), batch_size=8, shuffle=True))\n"
            "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n        self.steps = steps\n\n"
            "    def train(self):\n        for step in range(self.steps):\n            x = next(self.dl)[0]\n"
            "            self.model(x).pow(2).mean().backward()\n            self.opt.step()\n            self.opt.zero_grad()\n"
        ),
        "train.py": "import torch\nfrom pkg import Trainer\n\nmodel = torch.nn.DataParallel(torch.nn.Linear(4, 4))\n"
        "trainer = Trainer(model)\ntrainer.train()\n",
    })
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), [r.error for r in results.values() if r.error]
    assert "x = next(ddp_shard(self.dl))[0]" in results["pkg/core.py"].output
    assert "model = ddp_wrap(torch.nn.Linear(4, 4))" in results["train.py"].output


def test_a_summary_writer_made_in_a_helper_module_is_made_on_rank_zero_only(tmp_path: Path) -> None:
    # pytorch-deeplab-xception's utils/summaries.py: the writer is built by a project helper.
    write_project(tmp_path, {
        "utils/__init__.py": "",
        "utils/summaries.py": (
            "from tensorboardX import SummaryWriter\n\n\nclass TensorboardSummary(object):\n"
            "    def __init__(self, directory):\n        self.directory = directory\n\n"
            "    def create_summary(self):\n        writer = SummaryWriter(logdir=self.directory)\n        return writer\n"
        ),
        "train.py": TRAIN_WITH.format(
            imports="from utils.summaries import TensorboardSummary",
            setup="    writer = TensorboardSummary('runs').create_summary()\n",
            after="    writer.close()",
        ),
    })
    results = convert_tree(tmp_path)
    assert "SummaryWriter(logdir=self.directory) if ddp_rank() == 0 else DdpNoOp()" in results["utils/summaries.py"].output
    assert results["train.py"].changed and not any(r.error for r in results.values())


def test_a_helper_with_a_self_test_main_block_is_converted_as_the_scripts_library(tmp_path: Path) -> None:
    # FastSpeech's dataset.py shape: the helper runs a self-test when started on its own.
    write_project(tmp_path, {
        "utils.py": (
            "import torch\n\n\ndef save_checkpoint(state, path):\n    torch.save(state, path)\n    print('saved', path)\n\n\n"
            "if __name__ == '__main__':\n    save_checkpoint({'x': 1}, '/tmp/selftest.pth')\n"
        ),
        "train.py": TRAIN_WITH.format(imports="from utils import save_checkpoint", setup="",
                                      after="        save_checkpoint({'model': model.state_dict()}, 'checkpoint.pth')"),
    })
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values())
    assert "    if ddp_rank() == 0:\n        torch.save(state, path)" in results["utils.py"].output
    assert "ddp_setup()" not in results["utils.py"].output


def test_torchs_dataloader_passed_on_by_a_project_module_is_sharded(tmp_path: Path) -> None:
    # FastSpeech: `from dataset import BufferDataset, DataLoader`, dataset.py imports torch's.
    write_project(tmp_path, {
        "dataset.py": (
            "from torch.utils.data import Dataset, DataLoader\n\n\nclass BufferDataset(Dataset):\n"
            "    def __init__(self, buffer):\n        self.buffer = buffer\n\n"
            "    def __len__(self):\n        return len(self.buffer)\n\n"
            "    def __getitem__(self, idx):\n        return self.buffer[idx]\n"
        ),
        "train.py": TRAIN_WITH.format(imports="from dataset import BufferDataset, DataLoader", setup="", after="")
        .replace("from torch.utils.data import DataLoader, TensorDataset", "from torch.utils.data import TensorDataset"),
    })
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values())
    assert "sampler=DistributedSampler(" in results["train.py"].output


def test_a_step_function_of_another_module_makes_the_loop_around_its_call_a_training_loop(tmp_path: Path) -> None:
    write_project(tmp_path, {
        "steps.py": (
            "def train_step(model, x, y, optimizer):\n    loss = ((model(x) - y) ** 2).mean()\n"
            "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n    return loss\n"
        ),
        "optim.py": (  # FastSpeech's ScheduledOptim: a step outside any loop, no data of its own
            "class ScheduledOptim:\n    def __init__(self, optimizer):\n        self._optimizer = optimizer\n\n"
            "    def step_and_update_lr(self):\n        self._optimizer.step()\n"
        ),
        "train.py": TRAIN_WITH.format(imports="from steps import train_step\nfrom optim import ScheduledOptim", setup="", after="")
        .replace(
            "            loss = ((model(x) - y) ** 2).mean()\n            opt.zero_grad()\n            loss.backward()\n            opt.step()\n",
            "            loss = train_step(model, x, y, opt)\n            ScheduledOptim(opt).step_and_update_lr()\n",
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), [r.diagnostics for r in results.values()]
    assert "sampler=DistributedSampler(" in results["train.py"].output
    assert "loader.sampler.set_epoch(epoch)" in results["train.py"].output



def test_a_count_normalised_loss_inside_the_wrapped_model_is_sharded_plainly(tmp_path: Path) -> None:
    # rebar_detection's YOLOv3: Darknet's YOLO layers divide by the boxes' count inside forward,
    # and the targets are one row per box: a scatter by rows paired boxes with another rank's images
    write_project(tmp_path, {
        "detmodel.py": (
            "import torch\nimport torch.nn as nn\n\n\nclass Det(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.conv = nn.Conv2d(1, 1, 1)\n\n"
            "    def forward(self, x, targets):\n        out = self.conv(x)[:, 0]\n"
            "        obj = torch.zeros_like(out, dtype=torch.bool)\n"
            "        obj[targets[:, 0].long(), targets[:, 1].long(), targets[:, 2].long()] = True\n"
            "        return (out ** 2 * obj).sum() / obj.sum(), out\n"
        ),
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader\nfrom detmodel import Det\n\n"
            "loader = DataLoader([(torch.randn(1, 4, 4), torch.zeros(2, 3))] * 16, batch_size=8, shuffle=True)\n"
            "model = Det()\nmodel = nn.DataParallel(model)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for epoch in range(2):\n    for imgs, targets in loader:\n        loss, _ = model(imgs, targets)\n"
            "        opt.zero_grad()\n        loss.mean().backward()\n        opt.step()\n"
        ),
    })
    train = convert_tree(tmp_path)["train.py"]
    assert not train.error and "ddp_scattered" not in train.output and "DDP314" not in {d.code for d in train.diagnostics}
    assert "sampler=DistributedSampler(" in train.output


@pytest.mark.parametrize("bound_first", [False, True])
def test_a_model_module_imported_by_a_computed_name_is_followed_however_the_name_is_spelled(tmp_path: Path, bound_first: bool) -> None:
    # BicycleGAN's models/__init__.py binds `model_filename = "models." + name + "_model"` first;
    # CUT's passes the sum inline: either way the wrapping package is in reach (never "trains nothing")
    imported = (
        '    model_filename = "models." + name + "_model"\n    lib = importlib.import_module(model_filename)\n'
        if bound_first else '    lib = importlib.import_module("models." + name + "_model")\n'
    )
    write_project(tmp_path, {
        "models/__init__.py": f"import importlib\n\n\ndef create_model(name):\n{imported}    return lib.Model()\n",
        "models/net.py": "import torch\n\n\ndef init_net(net):\n    return torch.nn.DataParallel(net)\n",
        "models/tiny_model.py": (
            "import torch\nfrom models.net import init_net\n\n\nclass Model:\n    def __init__(self):\n"
            "        self.net = init_net(torch.nn.Linear(4, 1))\n        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)\n\n"
            "    def optimize_parameters(self, x, y):\n        self.opt.zero_grad()\n"
            "        ((self.net(x) - y) ** 2).mean().backward()\n        self.opt.step()\n"
        ),
        "train.py": (
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom models import create_model\n\n"
            "if __name__ == '__main__':\n    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)\n"
            "    model = create_model('tiny')\n    for x, y in loader:\n        model.optimize_parameters(x, y)\n"
        ),
    })
    codes = {d.code for r in convert_tree(tmp_path).values() for d in r.diagnostics}
    assert "DDP212" not in codes and "DDP211" in codes


@pytest.mark.parametrize("made_a_mean", [False, True])
def test_a_summed_loss_returned_in_a_tuple_is_scaled_unless_made_a_mean_first(tmp_path: Path, made_a_mean: bool) -> None:
    # hs-math-nlp's compute_performance sums; a helper that then does `loss /= gold.numel()` returns a mean
    source = FIXTURES / "projects" / "summed_loss_in_a_tuple"
    files = {path.name: path.read_text() for path in source.glob("*.py")}
    if made_a_mean:
        files["loss.py"] = files["loss.py"].replace('reduction="sum")\n', 'reduction="sum")\n    loss /= gold.numel()\n')
    write_project(tmp_path, files)
    step = convert_tree(tmp_path)["model_process.py"]
    assert ("(loss * ddp_world_size()).backward()" in step.output) is not made_a_mean

REPLICATE = (  # vacancy/Synchronized-BatchNorm-PyTorch's replicate.py, vendored by many projects
    "import functools\nfrom torch.nn.parallel.data_parallel import DataParallel\n\n\n"
    "class DataParallelWithCallback(DataParallel):\n    def replicate(self, module, device_ids):\n"
    "        modules = super(DataParallelWithCallback, self).replicate(module, device_ids)\n"
    "        execute_replication_callbacks(modules)\n        return modules\n\n\n"
    "def patch_replication_callback(data_parallel):\n    assert isinstance(data_parallel, DataParallel)\n"
)


@pytest.mark.parametrize("used", [False, True])
def test_a_vendored_dataparallel_subclass_converts_whether_used_or_not(tmp_path: Path, used: bool) -> None:
    # (used: DDP with torch's SyncBatchNorm, DDP129; it was refused before the sync-BN plan)
    write_project(tmp_path, {
        "sync_batchnorm/__init__.py": "from .replicate import DataParallelWithCallback, patch_replication_callback\n",
        "sync_batchnorm/replicate.py": REPLICATE,
        "train.py": TRAIN_WITH.format(
            imports="from sync_batchnorm import DataParallelWithCallback, patch_replication_callback", setup="", after=""
        ).replace(
            "    model = torch.nn.DataParallel(torch.nn.Linear(4, 2))\n",
            "    model = DataParallelWithCallback(torch.nn.Linear(4, 2))\n" if used
            else "    model = torch.nn.DataParallel(torch.nn.Linear(4, 2))\n    patch_replication_callback(model)\n",
        ),
    })
    results = convert_tree(tmp_path)
    replicate = results["sync_batchnorm/replicate.py"]
    assert not replicate.error and "class DataParallelWithCallback(DataParallel):" in replicate.output
    assert "convert_sync_batchnorm" in results["train.py"].output and not results["train.py"].error
    assert ("DDP129" in {d.code for d in results["train.py"].diagnostics}) is used


def test_a_script_whose_trainer_method_trains_through_another_method_is_not_taken_for_evaluation(tmp_path: Path) -> None:
    # CenterNet: main.py calls trainer.train(epoch, train_loader); train() calls run_epoch(),
    # which calls backward(). The loader goes into a method: sharded where run_epoch() draws it.
    write_project(tmp_path, {
        "trainer.py": (
            "class Trainer:\n    def __init__(self, model, optimizer):\n        self.model, self.optimizer = model, optimizer\n\n"
            "    def run_epoch(self, phase, loader):\n        for x, y in loader:\n"
            "            loss = ((self.model(x) - y) ** 2).mean()\n            self.optimizer.zero_grad()\n"
            "            loss.backward()\n            self.optimizer.step()\n\n"
            "    def train(self, epoch, loader):\n        return self.run_epoch('train', loader)\n"
        ),
        "main.py": TRAIN_WITH.format(imports="from trainer import Trainer", setup="", after="")
        .replace(
            "        for x, y in loader:\n            loss = ((model(x) - y) ** 2).mean()\n            opt.zero_grad()\n"
            "            loss.backward()\n            opt.step()\n",
            "        trainer.train(epoch, loader)\n",
        )
        .replace("    for epoch in range(2):", "    trainer = Trainer(model, opt)\n    for epoch in range(2):"),
    })
    results = convert_tree(tmp_path)
    assert "DDP212" not in {d.code for d in results["main.py"].diagnostics}
    assert not any(r.error for r in results.values()) and "ddp_setup()" in results["main.py"].output
    assert "for x, y in ddp_shard(loader):" in results["trainer.py"].output


def test_a_script_whose_loop_sits_in_a_top_level_if_is_an_entry(tmp_path: Path) -> None:
    # EDSR's main.py: `if checkpoint.ok: while not t.terminate(): t.train()`, no __main__ block.
    write_project(tmp_path, {
        "trainer.py": (
            "class Trainer:\n    def __init__(self, model, loader, optimizer):\n"
            "        self.model, self.loader, self.optimizer = model, loader, optimizer\n        self.epoch = 0\n\n"
            "    def train(self):\n        self.epoch += 1\n        for x, y in self.loader:\n"
            "            loss = ((self.model(x) - y) ** 2).mean()\n            self.optimizer.zero_grad()\n"
            "            loss.backward()\n            self.optimizer.step()\n\n"
            "    def terminate(self):\n        return self.epoch >= 2\n"
        ),
        "models.py": "import torch.nn as nn\n\n\ndef get_model():\n    return nn.DataParallel(nn.Linear(4, 2))\n",
        "main.py": (
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\nfrom models import get_model\n"
            "from trainer import Trainer\n\nok = True\nif ok:\n    model = get_model()\n"
            "    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8)\n"
            "    t = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.1))\n"
            "    while not t.terminate():\n        t.train()\n"
        ),
    })
    results = convert_tree(tmp_path)
    codes = {d.code for r in results.values() for d in r.diagnostics}
    assert "DDP202" not in codes  # the entry is found; the loader handed to another module's class is
    assert "for x, y in ddp_shard(self.loader):" in results["trainer.py"].output  # sharded where it is drawn
    assert not any(r.error for r in results.values())


CLASS_WEIGHTS_PROJECT = {'dataloaders/__init__.py': 'import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\ndef make_data_loader(batch_size):\n    g = torch.Generator().manual_seed(0)\n    x = torch.randn(64, 4, generator=g)\n    y = torch.randint(0, 3, (64,), generator=g)\n    train_set = TensorDataset(x, y)\n    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True)\n    return train_loader, 3\n', 'train.py': 'import torch\nimport torch.nn as nn\nfrom dataloaders import make_data_loader\nfrom utils.calculate_weights import calculate_weigths_labels\n\n\nclass Trainer(object):\n    def __init__(self):\n        self.train_loader, self.nclass = make_data_loader(8)\n        weight = torch.from_numpy(calculate_weigths_labels(self.train_loader, self.nclass))\n        print("class weights", weight)\n        self.criterion = nn.CrossEntropyLoss(weight=weight)\n        self.model = nn.DataParallel(nn.Linear(4, self.nclass))\n        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n\n    def training(self, epoch):\n        for x, y in self.train_loader:\n            loss = self.criterion(self.model(x), y)\n            self.optimizer.zero_grad()\n            loss.backward()\n            self.optimizer.step()\n\n\ndef main():\n    torch.manual_seed(0)\n    trainer = Trainer()\n    for epoch in range(2):\n        trainer.training(epoch)\n\n\nif __name__ == "__main__":\n    main()\n', 'utils/__init__.py': '', 'utils/calculate_weights.py': 'import numpy as np\n\n\ndef calculate_weigths_labels(dataloader, num_classes):\n    z = np.zeros((num_classes,))\n    for _, y in dataloader:\n        z += np.bincount(y.numpy(), minlength=num_classes)\n    total = z.sum()\n    return np.array([1 / np.log(1.02 + c / total) for c in z], dtype=np.float32)\n'}


def test_a_class_weight_pass_over_a_loader_built_in_another_module_is_reported(tmp_path: Path) -> None:
    # pytorch-deeplab-xception --use-balanced-weights: the weights are counted on one shard
    write_project(tmp_path, CLASS_WEIGHTS_PROJECT)
    results = convert_tree(tmp_path)
    assert "DDP311" in {d.code for d in results["train.py"].diagnostics}
    assert results["train.py"].changed and not results["train.py"].error


def test_a_project_whose_step_batches_are_cut_from_loader_items_counts_as_sharded(tmp_path: Path) -> None:
    # FastSpeech2 (batch 47): whole loader batches drawn alike, each step's batch split (DDP406) is
    # a sharded training loader; folder mode refused it (DDP211) while the file alone converted
    script = (FIXTURES / "loaders" / "regrouped_batches.py").read_text()
    model = "import torch.nn as nn\n\n\ndef build_model():\n    return nn.Linear(3, 1)\n"
    write_project(tmp_path, {
        "model.py": model,
        "train.py": script.replace("import torch.nn as nn\n", "import torch.nn as nn\nfrom model import build_model\n", 1)
        .replace("nn.DataParallel(nn.Linear(3, 1))", "nn.DataParallel(build_model())"),
    })
    results = convert_tree(tmp_path)
    assert not results["train.py"].error, results["train.py"].diagnostics
    assert "DDP406" in {d.code for d in results["train.py"].diagnostics}


INFERENCE_HELPER = {
    "models.py": "import torch.nn as nn\n\n\ndef create():\n    return nn.Linear(4, 2)\n",
    "train.py": (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nimport models\n\n\n"
        "def main():\n    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))\n"
        "    loader = DataLoader(data, batch_size=4)\n    model = nn.DataParallel(models.create())\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(2):\n"
        "        for x, y in loader:\n            loss = ((model(x) - y) ** 2).mean()\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n"
        "    torch.save(model.module.state_dict(), 'w.pt')\n\n\nif __name__ == '__main__':\n    main()\n"
    ),
    # (Deep_Metric's Model2Feature.py: a model wrapped to extract features, for test.py only)
    "features.py": (
        "import torch\nimport models\nfrom evaluations import extract_features\n\n\ndef features(checkpoint, x):\n"
        "    model = models.create()\n    model.load_state_dict(checkpoint)\n    model = torch.nn.DataParallel(model)\n"
        "    return extract_features(model, x)\n"
    ),
    "evaluations/__init__.py": "from .cnn import extract_features\n",
    "evaluations/cnn.py": "def extract_features(model, x):\n    model.eval()\n    return model(x)\n",
    # (a script with no `__main__` block: its top-level code evaluates)
    "test.py": "import torch\nfrom features import features\n\nprint(features(torch.load('w.pt'), torch.randn(3, 4)))\n",
}


def test_a_refused_module_no_training_script_reaches_holds_nothing_back(tmp_path: Path) -> None:
    # Deep_Metric (batch 47): an inference helper imported by an evaluation script alone refused
    # the whole project (DDP202, then DDP210 for train.py and everything it imports)
    write_project(tmp_path, INFERENCE_HELPER)
    results = convert_tree(tmp_path)
    assert "DDP217" in {d.code for d in results["features.py"].diagnostics}
    assert not results["features.py"].changed and not results["features.py"].error
    assert results["train.py"].changed and not results["train.py"].error, results["train.py"].diagnostics
    assert not results["test.py"].changed


PREPARING_TRAINER = {
    "dataset.py": (
        "import numpy as np\nimport torch\nfrom torch.utils.data import Dataset\n\n\nclass Clips(Dataset):\n"
        "    def __init__(self):\n        self.preprocessing()\n\n"
        "    def preprocessing(self):\n        for i in range(8):\n            np.save(f'clip_{i}.npy', np.ones(4))\n\n"
        "    def __getitem__(self, i):\n        return torch.from_numpy(np.load(f'clip_{i}.npy')).float()\n\n"
        "    def __len__(self):\n        return 8\n"
    ),
    "train.py": (
        "import torch\nfrom torch.utils.data import DataLoader\nfrom dataset import Clips\n\n\ndef train(config):\n"
        "    loader = DataLoader(Clips(), batch_size=4)\n    model = torch.nn.DataParallel(torch.nn.Linear(4, 1))\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x in loader:\n        loss = model(x).pow(2).mean()\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
    ),
    "main.py": "from train import train\n\n\nif __name__ == '__main__':\n    train({})\n",
}


def test_a_dataset_that_writes_its_files_is_made_by_rank_zero_first_but_not_the_training_around_it(tmp_path: Path) -> None:
    # DiffASD (batch 49): the dataset's constructor writes the features every rank reads: made
    # by rank 0 first; `train(config)`, which makes one and trains, is never "rank 0 first" (a hang)
    write_project(tmp_path, PREPARING_TRAINER)
    results = convert_tree(tmp_path)
    assert "DDP607" in {d.code for d in results["train.py"].diagnostics}
    assert "DDP607" not in {d.code for d in results["main.py"].diagnostics}, results["main.py"].diagnostics
    assert "if dist.get_rank() == 0:\n            for i in range(8):" in results["dataset.py"].output.replace("ddp_rank()", "dist.get_rank()")


CALLED_TRAINER = {
    "training.py": (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\nclass Trainer:\n"
        "    def __init__(self, batch_size):\n"
        "        self.loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=batch_size)\n\n"
        "    def __call__(self, model, epoch):\n        model = torch.nn.DataParallel(model)\n"
        "        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "        for x, y in self.loader:\n            loss = ((model(x) - y) ** 2).mean()\n"
        "            optimizer.zero_grad()\n            loss.backward()\n            optimizer.step()\n"
    ),
    "main.py": (
        "import torch.nn as nn\nfrom training import Trainer\n\n\nif __name__ == '__main__':\n"
        "    model = nn.Linear(4, 2)\n    trainer = Trainer(8)\n"
        "    for epoch in range(2):\n        trainer(model, epoch)\n"
    ),
}


def test_a_trainer_object_called_like_a_function_trains_through_its_call_method(tmp_path: Path) -> None:
    # Lipreading-DenseNet3D (batch 48): `trainer(model, epoch)` runs Trainer.__call__, which
    # trains: main.py was said to train nothing (DDP212) and training.py refused (DDP202)
    write_project(tmp_path, CALLED_TRAINER)
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), {n: r.diagnostics for n, r in results.items()}
    assert "ddp_setup()" in results["main.py"].output
    assert "DistributedSampler(" in results["training.py"].output


TEXTBOOK_TRAIN = (
    "import torch\nfrom data import build_loaders\nfrom models import build_model\n\n\ndef main():\n"
    "    model = build_model()\n    train_loader, val_loader = build_loaders(8)\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(2):\n"
    "        for x, y in {loader}:\n            loss = ((model(x) - y) ** 2).mean()\n"
    "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n"
    "        print('epoch', epoch, loss.item())\n\n\nif __name__ == '__main__':\n    main()\n"
)
TEXTBOOK = {
    "data.py": (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\ndef build_loaders(batch_size):\n"
        "    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 2))\n"
        "    train_loader = DataLoader(data, batch_size=batch_size, shuffle=True)\n"
        "    val_loader = DataLoader(data, batch_size=batch_size)\n    return train_loader, val_loader\n"
    ),
    "models.py": "import torch.nn as nn\n\n\ndef build_model():\n    return nn.DataParallel(nn.Linear(4, 2))\n",
    "train.py": TEXTBOOK_TRAIN.format(loader="train_loader"),
    "train2.py": TEXTBOOK_TRAIN.format(loader="train_loader"),
}


def test_two_training_scripts_sharing_one_loader_module_convert(tmp_path: Path) -> None:
    # train.py + train2.py + data.py + models.py: was a KeyError on data.py in project mode
    write_project(tmp_path, TEXTBOOK)
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), {n: r.error for n, r in results.items()}
    assert all(results[name].changed for name in TEXTBOOK)
    assert results["data.py"].output.count("DistributedSampler(") == 1  # the training loader only
    for entry in ("train.py", "train2.py"):
        assert "ddp_setup()" in results[entry].output and "set_epoch(epoch)" in results[entry].output


def test_a_loader_builder_shards_what_any_of_its_scripts_trains_on(tmp_path: Path) -> None:
    # train2.py trains on the builder's second loader: the one data.py serves both
    write_project(tmp_path, {**TEXTBOOK, "train2.py": TEXTBOOK_TRAIN.format(loader="val_loader")})
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values())
    assert results["data.py"].output.count("DistributedSampler(") == 2


def count_work(monkeypatch) -> dict[str, Counter]:
    """How often each file is parsed, walked (analysed) and rewritten, in this process."""
    from ddpify import analysis, engine

    counts = {"parsed": Counter(), "walked": Counter(), "rewritten": Counter()}
    for owner, name, kind, path_of in (
        (engine.FileConversion, "__init__", "parsed", lambda args: args[1]),
        (engine.FileConversion, "_rewrite", "rewritten", lambda args: args[0].path),
    ):
        original = getattr(owner, name)

        def counted(*args, original=original, kind=kind, path_of=path_of, **kwargs):
            counts[kind][Path(path_of(args)).name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    walk = analysis.Analysis.__init__

    def walked(self, wrapper, *args, **kwargs):
        counts["walked"][wrapper.module] += 1
        return walk(self, wrapper, *args, **kwargs)

    monkeypatch.setattr(analysis.Analysis, "__init__", walked)
    return counts


def test_each_file_of_a_project_is_parsed_analysed_and_rewritten_once(monkeypatch) -> None:
    """Three training scripts share the data, model, engine and utility modules: each module
    is converted once, not once per script that imports it."""
    counts = count_work(monkeypatch)
    project = FIXTURES / "projects" / "shared_library"
    results = convert_project(project, sorted(project.rglob("*.py")), jobs=1)
    converted = {Path(r.path).name for r in results if r.changed}
    # (engine.py's train_one_epoch() takes its criterion from the scripts: out of its sight, the
    # loss gets the whole global batch there, DDP117)
    assert converted == {"data.py", "engine.py", "models.py", "utils.py", "train.py", "finetune.py", "train_small.py"}
    assert set(counts["parsed"].values()) == {1} and converted <= set(counts["parsed"])
    assert set(counts["walked"].values()) == {1} and len(counts["walked"]) == len(counts["parsed"])
    assert set(counts["rewritten"].values()) == {1} and converted <= set(counts["rewritten"])


@pytest.mark.parametrize("project", PROJECTS, ids=[p.name for p in PROJECTS])
def test_groups_routed_together_convert_as_groups_converted_one_after_the_other(project: Path, monkeypatch) -> None:
    """Every group is routed before any is rewritten (the rewrites then run together); group
    by group, as the fallback does, gives the same project."""
    from ddpify.project import groups

    files = sorted(project.rglob("*.py"))
    together = convert_project(project, files, jobs=1)
    monkeypatch.setattr(groups.ProjectConversion, "convert_groups", groups.ProjectConversion._one_after_the_other)
    assert convert_project(project, files, jobs=1) == together


def test_worker_processes_convert_a_project_as_one_process_does() -> None:
    project = FIXTURES / "projects" / "shared_library"
    files = sorted(project.rglob("*.py"))
    assert convert_project(project, files, jobs=2) == convert_project(project, files, jobs=1)


# -- end to end ---------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
# Each training script of a project is run (train.py unless named here).
ENTRIES = {"shared_library": ("train.py", "finetune.py", "train_small.py")}
RUNNABLE = [
    (project, entry)
    for project in PROJECTS
    if (project / "train.py").exists() and "e2e: refused" not in (project / "train.py").read_text()
    for entry in ENTRIES.get(project.name, ("train.py",))
]
EVALUATING = [project for project, entry in RUNNABLE if entry == "train.py" and (project / "evaluate.py").exists()]


def run(command: list[str], cwd: Path, probe_dir: Path) -> subprocess.CompletedProcess:
    probe_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DDPIFY_PROBE_DIR": str(probe_dir), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        env.pop(name, None)
    result = run_launched(command, cwd=cwd, env=env, timeout=300)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def convert_copies(project: Path, work: Path) -> tuple[Path, Path]:
    """The project as it is (work/original) and converted (work/converted)."""
    original, converted = work / "original", work / "converted"
    shutil.copytree(project, original)
    shutil.copytree(project, converted)
    for name, result in convert_tree(converted).items():
        assert not result.error, result.error
        (converted / name).write_text(result.output, encoding="utf-8")
    return original, converted


@pytest.fixture(
    scope="module",
    params=RUNNABLE,
    ids=[project.name if entry == "train.py" else f"{project.name}-{entry[:-3]}" for project, entry in RUNNABLE],
)
def runs(request, tmp_path_factory):
    project, entry = request.param
    work = tmp_path_factory.mktemp(f"{project.name}-{entry[:-3]}")
    original, converted = convert_copies(project, work)
    probe = [sys.executable, "-m", "ddpify.verify.probe", entry]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    return {
        "work": work,
        "original": run(probe, original, work / "p-original"),
        "ddp": run([*torchrun, "-m", "ddpify.verify.probe", entry], converted, work / "p-ddp"),
        "single": run(probe, converted, work / "p-single"),
    }


def params(probe_dir: Path, rank: int = 0) -> list:
    return torch.load(probe_dir / f"rank{rank}.pt")["params"]


def record(probe_dir: Path, rank: int) -> dict:
    return json.loads((probe_dir / f"rank{rank}.json").read_text())


def assert_same(left: list, right: list, exact: bool = False) -> None:
    assert len(left) == len(right) and left
    for group_a, group_b in zip(left, right):
        assert len(group_a) == len(group_b)
        for a, b in zip(group_a, group_b):
            assert torch.equal(a, b) if exact else torch.allclose(a, b, **TOLERANCE), (a - b).abs().max()


def test_two_ranks_train_one_model(runs):
    assert_same(params(runs["work"] / "p-ddp", 0), params(runs["work"] / "p-ddp", 1), exact=True)


def test_two_ranks_end_with_the_original_weights(runs):
    assert_same(params(runs["work"] / "p-ddp"), params(runs["work"] / "p-original"))
    assert_same(params(runs["work"] / "p-single"), params(runs["work"] / "p-original"))


def test_every_rank_sees_its_shard_each_epoch(runs):
    for rank in (0, 1):
        data = record(runs["work"] / "p-ddp", rank)
        # (a loader sharded at run time, ddp_shard, moves to the next epoch on each pass itself)
        shards = [p["epoch"] for p in data["samplers"] if p["kind"] == "DdpShard"]
        if shards and not data["set_epoch_calls"]:
            assert shards == list(range(len(shards))) and len(shards) >= 2, shards
            continue
        assert data["set_epoch_calls"] == list(range(len(data["set_epoch_calls"]))) and len(data["set_epoch_calls"]) >= 2


def test_each_line_is_printed_once(runs):
    converted = sorted(line for line in runs["ddp"].stdout.splitlines() if line.strip())
    original = sorted(line for line in runs["original"].stdout.splitlines() if line.strip())
    # The same lines, as often as the original printed them (losses may differ in the last digit).
    mask = lambda lines: sorted(line.split(":")[0] for line in lines)  # noqa: E731
    assert mask(converted) == mask(original)


def test_each_checkpoint_is_written_once(runs):
    saves = [save["path"] for rank in (0, 1) for save in record(runs["work"] / "p-ddp", rank)["saves"]]
    original = [save["path"] for save in record(runs["work"] / "p-original", 0)["saves"]]
    assert len(saves) == len(original) >= 1


@pytest.mark.parametrize("project", EVALUATING, ids=[p.name for p in EVALUATING])
def test_a_script_that_only_evaluates_still_runs_as_one_process(project: Path, tmp_path: Path):
    """evaluate.py trains nothing and is left as it is (DDP212); the modules converted for
    train.py must still work in its process, which sets up no process group."""
    original, converted = convert_copies(project, tmp_path)
    assert (converted / "evaluate.py").read_bytes() == (original / "evaluate.py").read_bytes()
    command = [sys.executable, "evaluate.py"]
    env = {name: value for name, value in os.environ.items() if name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    before = subprocess.run(command, cwd=original, env=env, capture_output=True, text=True, timeout=120)
    after = subprocess.run(command, cwd=converted, env=env, capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after.stderr
    assert after.stdout == before.stdout and "evaluated 96 samples" in after.stdout


def test_a_loop_over_a_loader_parameter_no_caller_feeds_shards_what_it_draws(tmp_path: Path) -> None:
    project = tmp_path / "engine"
    shutil.copytree(FIXTURES / "projects" / "engine", project)
    train = project / "train.py"
    # Called through another name: the loader it gets cannot be followed to its DataLoader, so
    # the loop shards what it draws at run time, as a single file's does (it was refused, DDP309)
    train.write_text(train.read_text().replace(
        "        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch)",
        "        step = train_one_epoch\n        step(model, criterion, optimizer, data_loader, device, epoch)",
    ))
    results = convert_tree(project)
    assert not any(r.error for r in results.values()), {k: r.diagnostics for k, r in results.items()}
    assert "DDP312" in {d.code for d in results["engine.py"].diagnostics}
    assert "ddp_shard(data_loader)" in results["engine.py"].output


def test_a_passed_loader_that_cannot_be_traced_refuses_the_project(tmp_path: Path) -> None:
    project = tmp_path / "engine"
    shutil.copytree(FIXTURES / "projects" / "engine", project)
    train = project / "train.py"
    train.write_text(train.read_text().replace(
        "train_one_epoch(model, criterion, optimizer, data_loader, device, epoch)",
        "train_one_epoch(model, criterion, optimizer, make_batches(dataset), device, epoch)",
    ) + "\n\ndef make_batches(dataset):\n    return [dataset[i : i + 8] for i in range(0, len(dataset), 8)]\n")
    results = convert_tree(project)
    assert all(not r.changed for r in results.values())
    assert "DDP309" in {d.code for d in results["train.py"].diagnostics}


def test_a_tools_and_lib_layout_trains_the_original_model_under_torchrun(tmp_path: Path) -> None:
    # HRNet's layout: tools/train.py puts lib/ on sys.path at run time (_init_paths).
    original, converted = tmp_path / "original", tmp_path / "converted"
    shutil.copytree(FIXTURES / "projects" / "tools_layout", original)
    shutil.copytree(FIXTURES / "projects" / "tools_layout", converted)
    results = convert_project(converted, sorted(converted.rglob("*.py")))
    for result in results:
        Path(result.path).write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    before = subprocess.run([sys.executable, "tools/train.py"], cwd=original, env=env, capture_output=True, text=True, timeout=120)
    assert before.returncode == 0, before.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "tools/train.py"]
    after = run_launched(torchrun, cwd=converted, env=env, timeout=300)
    assert after.returncode == 0, after.stderr
    expected, got = torch.load(original / "final.pth"), torch.load(converted / "final.pth")
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, **TOLERANCE)
    assert after.stdout.count("val ") == before.stdout.count("val ") == 2
    evaluation = subprocess.run([sys.executable, "tools/test.py"], cwd=converted, env=env, capture_output=True, text=True, timeout=120)
    assert evaluation.returncode == 0 and "val " in evaluation.stdout, evaluation.stderr


TRAIN_OR_EVAL_PROJECT = {
    "trainer.py": (
        "import torch\nimport torch.nn as nn\n\n\nclass Trainer:\n"
        "    def __init__(self, model, data_iter, optimizer):\n"
        "        self.model, self.data_iter, self.optimizer = model, data_iter, optimizer\n\n"
        "    def train(self, epochs):\n        model = nn.DataParallel(self.model)\n"
        "        for e in range(epochs):\n            for x, y in self.data_iter:\n"
        "                loss = nn.functional.cross_entropy(model(x), y)\n"
        "                self.optimizer.zero_grad()\n                loss.backward()\n                self.optimizer.step()\n"
        "        torch.save(self.model.state_dict(), 'final.pt')\n\n"
        "    def eval(self):\n        model = nn.DataParallel(self.model)\n        model.eval()\n        results = []\n"
        "        for x, y in self.data_iter:\n            with torch.no_grad():\n"
        "                results.append((model(x).argmax(1) == y).float())\n"
        "        print('accuracy', torch.cat(results).mean().item(), 'over', len(torch.cat(results)))\n"
    ),
    "classify.py": (
        "import sys\n\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "from trainer import Trainer\n\n\ndef main(mode):\n    torch.manual_seed(0)\n"
        "    dataset = TensorDataset(torch.randn(36, 4), torch.randint(0, 3, (36,)))\n"
        "    data_iter = DataLoader(dataset, batch_size=8)\n    model = nn.Linear(4, 3)\n"
        "    trainer = Trainer(model, data_iter, torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "    if mode == 'train':\n        trainer.train(2)\n    else:\n        trainer.eval()\n\n\n"
        "if __name__ == '__main__':\n    main(sys.argv[1])\n"
    ),
}


def test_a_loader_a_trainer_evaluates_as_well_stays_whole_for_evaluation(tmp_path: Path) -> None:
    # pytorchic-bert: classify.py builds one loader and hands it to train.Trainer, whose train()
    # trains on self.data_iter and eval() (`--mode eval`) evaluates it: sharded where it is built,
    # every rank evaluated half the set. It is sharded where the training loop draws from it.
    original, converted = tmp_path / "original", tmp_path / "converted"
    write_project(original, TRAIN_OR_EVAL_PROJECT)
    write_project(converted, TRAIN_OR_EVAL_PROJECT)
    for name, result in convert_tree(converted).items():
        assert not result.error, result.error
        (converted / name).write_text(result.output)
    assert "DistributedSampler(" not in (converted / "classify.py").read_text()
    assert "for x, y in ddp_shard(self.data_iter):" in (converted / "trainer.py").read_text()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "classify.py"]
    for mode in ("train", "eval"):
        before = subprocess.run([sys.executable, "classify.py", mode], cwd=original, env=env, capture_output=True, text=True, timeout=120)
        assert before.returncode == 0, before.stderr
        after = run_launched([*torchrun, mode], cwd=converted, env=env, timeout=300)
        assert after.returncode == 0, after.stderr
        if mode == "eval":
            assert after.stdout.strip() == before.stdout.strip() == after.stdout.strip().splitlines()[-1]
            assert "over 36" in after.stdout
    for name, tensor in torch.load(original / "final.pt").items():
        torch.testing.assert_close(torch.load(converted / "final.pt")[name], tensor, **TOLERANCE)


def test_a_configuration_module_that_calls_its_own_helpers_at_import_is_not_refused(tmp_path: Path) -> None:
    # FLAVR's config.py: `learn_arg = add_argument_group('Learning')` at import time is
    # configuration, not training; DDP206 refused the whole folder for it.
    write_project(tmp_path, {
        "config.py": (
            "import argparse\nparser = argparse.ArgumentParser()\n\n\ndef add_argument_group(name):\n"
            "    return parser.add_argument_group(name)\n\n\nlearn_arg = add_argument_group('Learning')\n"
            "learn_arg.add_argument('--lr', type=float, default=0.1)\n\n\ndef get_args():\n"
            "    args, unparsed = parser.parse_known_args()\n    if unparsed:\n        print(unparsed)\n    return args, unparsed\n"
        ),
        "main.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nimport config\n\n"
            "args, _ = config.get_args()\nmodel = nn.DataParallel(nn.Linear(4, 1))\n"
            "opt = torch.optim.SGD(model.parameters(), lr=args.lr)\n"
            "loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)\n"
            "for epoch in range(2):\n    for x, y in loader:\n        opt.zero_grad()\n"
            "        nn.functional.mse_loss(model(x), y).backward()\n        opt.step()\n"
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values())
    assert results["main.py"].changed and not results["config.py"].changed
    trains_at_import = dict(TRAIN_OR_EVAL_PROJECT, **{"trainer.py": TRAIN_OR_EVAL_PROJECT["trainer.py"] + "\n\nTrainer(None, [], None).train(1)\n"})
    write_project(tmp_path / "again", trains_at_import)
    assert "DDP206" in {d.code for r in convert_tree(tmp_path / "again").values() for d in r.diagnostics}


ATTGAN_PROJECT = {
    "attgan.py": (
        "import torch\nimport torch.nn as nn\nfrom torch import autograd\n\n\nclass AttGAN:\n"
        "    def __init__(self, multi_gpu=False):\n        self.G = nn.Linear(4, 4)\n        self.D = nn.Linear(4, 1)\n"
        "        if multi_gpu:\n            self.G = nn.DataParallel(self.G)\n            self.D = nn.DataParallel(self.D)\n"
        "        self.optim_D = torch.optim.SGD(self.D.parameters(), lr=0.1)\n\n"
        "    def trainD(self, img_a):\n        img_fake = self.G(img_a).detach()\n        d_real, d_fake = self.D(img_a), self.D(img_fake)\n\n"
        "        def gradient_penalty(f, real):\n            x = real.clone().requires_grad_(True)\n            pred = f(x)\n"
        "            grad = autograd.grad(outputs=pred, inputs=x, grad_outputs=torch.ones_like(pred), create_graph=True)[0]\n"
        "            return ((grad.norm(2, dim=1) - 1.0) ** 2).mean()\n\n"
        "        df_loss = d_fake.mean() - d_real.mean()\n        df_gp = gradient_penalty(self.D, img_a)\n"
        "        d_loss = df_loss + 10.0 * df_gp\n        self.optim_D.zero_grad()\n        d_loss.backward()\n        self.optim_D.step()\n"
        "        return d_loss.item()\n\n\n"
        "if __name__ == '__main__':\n    attgan = AttGAN()\n    print(attgan.G)\n"
    ),
    "train.py": (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom attgan import AttGAN\n\n"
        "attgan = AttGAN(multi_gpu=True)\nloader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4, shuffle=True)\n"
        "for epoch in range(2):\n    for (img_a,) in loader:\n        attgan.trainD(img_a)\n"
    ),
    "test.py": (
        "import torch\nfrom attgan import AttGAN\n\nattgan = AttGAN(multi_gpu=True)\nwith torch.no_grad():\n"
        "    print(attgan.G(torch.randn(2, 4)))\n"
    ),
}


def test_a_model_module_with_a_self_test_and_a_summed_gradient_penalty_converts_with_its_trainer(tmp_path: Path) -> None:
    # AttGAN: attgan.py's `__main__` block only builds the model (its importers' library), its
    # penalty is added to d_loss with one backward (DDP111 warns, not refuses); test.py only
    # evaluates with the model, and is left as it is
    write_project(tmp_path, ATTGAN_PROJECT)
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), {n: r.error for n, r in results.items()}
    assert results["attgan.py"].changed and results["train.py"].changed and not results["test.py"].changed
    assert "ddp_shard(loader)" in results["train.py"].output or "DistributedSampler(" in results["train.py"].output


TABLE_TRAINER = '''import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class UNetTrainer:
    def __init__(self, args, data_loader):
        self.generator = nn.Linear(4, 1)
        if torch.cuda.device_count() > 1:
            self.generator = nn.DataParallel(self.generator)
        self.data_loader = data_loader
        self.optimizer = torch.optim.SGD(self.generator.parameters(), lr=0.1)

    def train(self, last_iteration):
        for i, (x, y) in enumerate(self.data_loader, last_iteration):
            self._update(x, y)
        return i

    def _update(self, x, y):
        loss = ((self.generator(x) - y) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def validate(self, dataset, epoch):
        for x, y in dataset:
            print(epoch, ((self.generator(x) - y) ** 2).mean().item())
'''

TABLE_ENTRY = '''import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import UNetTrainer

TRAINER_MAP = {"unet": UNetTrainer}


def main():
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    trainer = TRAINER_MAP.get("unet", None)
    trainer = trainer(None, loader)
    last = 0
    for epoch in range(2):
        last = trainer.train(last)


if __name__ == "__main__":
    main()
'''


def test_a_trainer_picked_from_a_table_trains_and_its_evaluation_parameter_routes_nothing(tmp_path: Path) -> None:
    # AttentionedDeepPaint: `trainer = TRIANER_MAP.get(args.model)`, then `trainer = trainer(args, ...)`
    # and `trainer.train(last_iter)`; the class's validate(self, dataset, ...) iterates the data it is
    # given, and train() draws `enumerate(self.data_loader, last_iteration)`: the script trains
    write_project(tmp_path, {"trainer.py": TABLE_TRAINER, "train.py": TABLE_ENTRY})
    results = convert_tree(tmp_path)
    assert "DDP212" not in {d.code for d in results["train.py"].diagnostics}, results["train.py"].diagnostics
    assert not any(r.error for r in results.values()) and "ddp_setup()" in results["train.py"].output
    assert "ddp_shard(self.data_loader)" in results["trainer.py"].output


def test_a_module_imported_through_a_shell_set_python_path_is_found_by_what_it_defines(tmp_path: Path) -> None:
    # X-Punctuator: src/bin/train.py does `from solver import Solver`, found at run time through the
    # PYTHONPATH its path.sh sets (src/solver/solver.py): the one module so named that defines Solver
    solver = TABLE_TRAINER.replace("class UNetTrainer:", "class Solver:").replace(
        "        if torch.cuda.device_count() > 1:\n            self.generator = nn.DataParallel(self.generator)\n", ""
    )
    entry = TABLE_ENTRY.replace("from trainer import UNetTrainer\n", "from solver import Solver\n").replace(
        'TRAINER_MAP = {"unet": UNetTrainer}\n', ""
    ).replace(
        '    trainer = TRAINER_MAP.get("unet", None)\n    trainer = trainer(None, loader)\n',
        "    trainer = Solver(None, loader)\n    trainer.generator = torch.nn.DataParallel(trainer.generator)\n",
    )
    write_project(tmp_path, {"src/solver/solver.py": solver, "src/bin/train.py": entry})
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), {k: r.diagnostics for k, r in results.items()}
    assert "sampler=DistributedSampler(" in results["src/bin/train.py"].output
    # (linked: the solver's pass moves the sampler the entry gave its loader to the next epoch)
    assert "DDP503" in {d.code for d in results["src/solver/solver.py"].diagnostics}


MEMORY_LOSS = '''import torch
from torch import nn, autograd


class Exclusive(autograd.Function):
    def __init__(self, V):
        super(Exclusive, self).__init__()
        self.V = V

    def forward(self, inputs, targets):
        self.save_for_backward(inputs, targets)
        return inputs.mm(self.V.t())

    def backward(self, grad_outputs):
        inputs, targets = self.saved_tensors
        for x, y in zip(inputs, targets):
            self.V[y] = (self.V[y] + x) / 2
        return grad_outputs.mm(self.V), None


class ExLoss(nn.Module):
    def __init__(self, num_features, num_classes):
        super().__init__()
        self.register_buffer("V", torch.zeros(num_classes, num_features))

    def forward(self, inputs, targets):
        return nn.functional.cross_entropy(Exclusive(self.V)(inputs, targets), targets)
'''


def test_a_memory_bank_made_beside_the_wrap_and_trained_in_another_module_refuses_the_project(tmp_path: Path) -> None:
    # Bottom-up-Clustering: bottom_up.py wraps the model and makes `ExLoss`, whose buffer V each
    # custom backward writes with the batch; reid/trainers.py runs the loop. Each rank would keep
    # its own V: refused, naming it (DDP118), never converted as if nothing were there
    trainer = TABLE_TRAINER.replace("class UNetTrainer:", "class Trainer:").replace(
        "    def __init__(self, args, data_loader):\n        self.generator = nn.Linear(4, 1)\n"
        "        if torch.cuda.device_count() > 1:\n            self.generator = nn.DataParallel(self.generator)\n",
        "    def __init__(self, generator, criterion, data_loader):\n        self.generator, self.criterion = generator, criterion\n",
    )
    model = (
        "import torch.nn as nn\nfrom exclusive_loss import ExLoss\nfrom trainers import Trainer\n\n\n"
        "def build(loader):\n    model = nn.DataParallel(nn.Linear(4, 3))\n    criterion = ExLoss(3, 5)\n"
        "    return Trainer(model, criterion, loader)\n"
    )
    entry = TABLE_ENTRY.replace("from trainer import UNetTrainer\n", "from bottom_up import build\n").replace(
        'TRAINER_MAP = {"unet": UNetTrainer}\n', ""
    ).replace('    trainer = TRAINER_MAP.get("unet", None)\n    trainer = trainer(None, loader)\n', "    trainer = build(loader)\n")
    write_project(tmp_path, {"exclusive_loss.py": MEMORY_LOSS, "trainers.py": trainer, "bottom_up.py": model, "run.py": entry})
    results = convert_tree(tmp_path)
    refused = results["bottom_up.py"]
    assert refused.error and "DDP118" in {d.code for d in refused.diagnostics} and "ExLoss" in str(refused.diagnostics)
    assert all(r.output == r.source for r in results.values())


SHARED_BUILDER = '''from torch.utils.data import DataLoader


def dataset2dataloader(dataset, batch_size, shuffle=True):
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
'''

VALIDATION = '''import torch
from helpers import dataset2dataloader


def validate(model, dataset):
    loader = dataset2dataloader(dataset, 4, shuffle=False)
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += ((model(x) - y).abs() < 0.5).sum().item()
    return correct / len(dataset)
'''

SHARED_TRAINING = '''import torch
import torch.nn as nn
from torch.utils.data import TensorDataset
from helpers import dataset2dataloader
from validation import validate


def main():
    dataset = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    model = nn.DataParallel(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = dataset2dataloader(dataset, 4)
    for epoch in range(2):
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print("accuracy", validate(model, dataset))


if __name__ == "__main__":
    main()
'''


def test_a_loader_builder_the_validation_module_calls_too_stays_whole(tmp_path: Path) -> None:
    # loqui: helpers.dataset2dataloader() builds the training loader (model_train.py) and the
    # validation loader (model_validation.py): sharded in the builder, validation ran on rank 0's
    # share; the training loop shards what it draws instead
    write_project(tmp_path, {"helpers.py": SHARED_BUILDER, "validation.py": VALIDATION, "train.py": SHARED_TRAINING})
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), {k: r.diagnostics for k, r in results.items()}
    assert "DistributedSampler" not in results["helpers.py"].output
    assert "for x, y in ddp_shard(loader):" in results["train.py"].output


STAR_MODEL = '''import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)


class CountedLoss(nn.Module):
    """The squared error of the positive targets, over how many the batch holds."""

    def forward(self, prediction, target):
        positive = (target > 0).float()
        return ((prediction - target) ** 2 * positive).sum() / positive.sum().clamp(min=1)
'''

STAR_EXPERIMENT = '''import torch
from torch.utils.data import DataLoader, TensorDataset

from model import *


class Experiment(object):
    def __init__(self, option):
        self.model = Net()
        if option.ngpu > 1:
            self.model = nn.DataParallel(self.model, list(range(option.ngpu)))
        self.criterion = CountedLoss()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_on_epoch(self, loader):
        for x, y in loader:
            loss = self.criterion(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def train(self, epochs):
        data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        loader = DataLoader(data, batch_size=8, shuffle=False, drop_last=True)
        for epoch in range(epochs):
            self.train_on_epoch(loader)
        torch.save(self.model.state_dict(), "final.pth")
'''

STAR_RUN = '''import argparse

import torch

from experiment import Experiment

parser = argparse.ArgumentParser()
parser.add_argument("--ngpu", type=int, default=1)

if __name__ == "__main__":
    torch.manual_seed(0)
    Experiment(parser.parse_args()).train(2)
'''


@pytest.mark.parametrize("imported", ["from model import *", "from model import CountedLoss, Net, nn"])
def test_torch_names_a_project_module_passes_on_wrap_and_a_whole_batch_loss_trains_the_original_model(
    tmp_path: Path, imported: str
) -> None:
    # theonegis/rsfn: experiment.py takes `nn` from model.py (`from model import *`), whose loss
    # couples the batch. The whole-batch path (DDP314) was taken for "no loader sharded" (DDP211,
    # the project refused); with `nn` imported by name, `model.nn.DataParallel` was not seen as
    # torch's and both wraps were left in place while the loaders were sharded, reported "converted"
    files = {"model.py": STAR_MODEL, "experiment.py": STAR_EXPERIMENT.replace("from model import *", imported), "run.py": STAR_RUN}
    write_project(tmp_path / "original", files)
    write_project(tmp_path / "converted", files)
    results = convert_tree(tmp_path / "converted")
    assert not any(r.error for r in results.values()), {k: r.error for k, r in results.items()}
    codes = {d.code for d in results["experiment.py"].diagnostics}
    assert {"DDP101", "DDP314"} <= codes and "nn.DataParallel(" not in results["experiment.py"].output
    for name, result in results.items():
        (tmp_path / "converted" / name).write_text(result.output)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    before = subprocess.run([sys.executable, "run.py"], cwd=tmp_path / "original", env=env, capture_output=True, text=True, timeout=120)
    assert before.returncode == 0, before.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "run.py"]
    after = run_launched(torchrun, cwd=tmp_path / "converted", env=env, timeout=300)
    assert after.returncode == 0, after.stderr
    expected, got = torch.load(tmp_path / "original" / "final.pth"), torch.load(tmp_path / "converted" / "final.pth")
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, **TOLERANCE)


def test_a_project_whose_batches_come_from_no_data_loader_is_refused_saying_so(tmp_path: Path) -> None:
    # ChangyWen/wolpertinger_ddpg (folder mode): batches from a replay buffer the agent fills; DDP211
    # spoke of a DataLoader it could not find, where none exists
    from test_neighbours import AGENT_PROJECT

    write_project(tmp_path, AGENT_PROJECT)
    results = convert_tree(tmp_path)
    refused = results["main.py"]
    assert refused.error and "no DataLoader appears" in refused.error and "replay buffer" in refused.error
    assert all(result.output == result.source for result in results.values())


STAR_TRAINER = {
    "models/__init__.py": "from .trainer import Trainer\n",
    "models/nets.py": "import torch\nimport torch.nn as nn\n",
    "utils/__init__.py": "import os\nimport cv2\n",
    "models/trainer.py": '''from .nets import *
from utils import *


class Trainer(object):
    def __init__(self):
        self.model = nn.DataParallel(nn.Linear(4, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=2)

    def train(self):
        for epoch in range(2):
            for x, y in self.loader:
                loss = ((self.model(x) - y) ** 2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            cv2.imwrite("sample_%d.png" % epoch, x.numpy() * 255.0)
            torch.save(self.model.state_dict(), os.path.join(".", "ck_%d.pt" % epoch))
''',
    "train.py": "from models import Trainer\n\nif __name__ == '__main__':\n    Trainer().train()\n",
}


def test_library_writes_reached_through_star_imports_run_on_rank_zero(tmp_path: Path) -> None:
    """photo2cartoon's trainer module has `cv2`, `torch` and `os` only through `from .networks
    import *` and `from utils import *`: its writes read as unknown project calls that may run
    the model (DDP602), and every rank wrote the checkpoints and sample images."""
    write_project(tmp_path, STAR_TRAINER)
    results = convert_tree(tmp_path)
    codes = [(d.code, d.message.split(" ")[0]) for d in results["models/trainer.py"].diagnostics]
    assert ("DDP601", "cv2.imwrite()") in codes and ("DDP601", "torch.save()") in codes, codes
    assert "DDP602" not in {code for code, _ in codes}


DRUGEX_MODEL = """import torch
import torch.nn as nn


class Gen(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 1)

    def forward(self, x):
        return self.l(x)

    def fit(self, loader):
        net = nn.DataParallel(self)
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        for x, y in loader:
            opt.zero_grad()
            ((net(x) - y) ** 2).mean().backward()
            opt.step()
"""
DRUGEX_TRAIN = """import torch
from torch.utils.data import DataLoader, TensorDataset
from pkg.model import Gen


def make_loader():
    return DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)


if __name__ == "__main__":
    torch.manual_seed(0)
    g = Gen()
    g.fit(make_loader())
    torch.save(g.state_dict(), "g.pt")
"""
DRUGEX_OTHER = """import sys
import torch
from pkg.model import Gen
from pkg.train import make_loader

if __name__ == "__main__":
    g = Gen()
    if "--warm" in sys.argv:
        g.fit(make_loader())
    print(g(torch.randn(2, 4)))
"""


@pytest.mark.parametrize("other", ["generate.py", "zz_generate.py"])
def test_an_entry_another_entry_imports_converts_as_an_entry_whatever_the_file_order(tmp_path: Path, other: str) -> None:
    # DrugEx: generate.py imports train.py's loader builder; planned first (its name sorts
    # first), its group took train.py as a library, with no set-up: DDP210 for the project,
    # which converted once generate.py was renamed. train.py is an entry of its own either way.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, text in {"__init__.py": "", "model.py": DRUGEX_MODEL, "train.py": DRUGEX_TRAIN, other: DRUGEX_OTHER}.items():
        (pkg / name).write_text(text)
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values()), render_report(results)
    train = results["pkg/train.py"].output
    assert train.index('if __name__ == "__main__":') < train.rindex("ddp_setup()")
    for name, result in results.items():
        (tmp_path / name).write_text(result.output)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    run = run_launched([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "pkg.train"], cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "g.pt").exists()


def test_a_module_that_wraps_for_evaluation_scripts_only_stays_as_it_is(tmp_path: Path) -> None:
    # reid-strong-baseline: engine/inference.py wraps the model in DataParallel for its
    # evaluator, and only tools/test.py (which trains nothing) imports it. It was converted
    # alone, as a script with no entry point (DDP202), which refused the whole project.
    (tmp_path / "inference.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\ndef inference(model, loader):\n"
        "    model = nn.DataParallel(model)\n    with torch.no_grad():\n"
        "        return [model(x).argmax(1) for x, in loader]\n"
    )
    (tmp_path / "test.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom inference import inference\n\n"
        "def main():\n    print(inference(torch.nn.Linear(4, 2), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)))\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        "model = nn.DataParallel(nn.Linear(4, 2))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4):\n"
        "    optimizer.zero_grad()\n    nn.functional.cross_entropy(model(x), y).backward()\n    optimizer.step()\n"
    )
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values()), render_report(results)
    assert not results["inference.py"].changed and "DDP212" in {d.code for d in results["inference.py"].diagnostics}
    assert "ddp_wrap(" in results["train.py"].output


def test_a_data_module_that_downloads_is_converted_and_runs_without_a_group(tmp_path: Path) -> None:
    # ncsnv2: datasets/__init__.py builds CIFAR10(download=True) for the runner; a module with
    # nothing else to convert was left as it was, and every rank downloaded into the same
    # folder at once. Its barriers must also let a process with no group through (a script of
    # the project left as it was imports the same module).
    (tmp_path / "data.py").write_text(
        "import os\n\n\ndef fetch(root, download=False):\n    os.makedirs(root, exist_ok=True)\n    return [root]\n\n\n"
        "def get_dataset(root):\n    dataset = fetch(root, download=True)\n    return dataset\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom data import get_dataset\n\n"
        "get_dataset('downloaded')\nmodel = nn.DataParallel(nn.Linear(4, 2))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)\n"
        "for x, y in loader:\n    optimizer.zero_grad()\n    nn.functional.cross_entropy(model(x), y).backward()\n    optimizer.step()\n"
    )
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values()), render_report(results)
    data = results["data.py"]
    assert "DDP607" in {d.code for d in data.diagnostics}
    (tmp_path / "data.py").write_text(data.output)
    alone = subprocess.run([sys.executable, "-c", "import data; print(data.get_dataset('d'))"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0 and "['d']" in alone.stdout, alone.stderr[-2000:]


def test_a_counted_loop_that_repeats_a_step_on_the_batch_in_hand_is_not_a_data_loop(tmp_path: Path) -> None:
    # DeblurGAN: the model's optimize_parameters() runs `for iter_d in range(self.criticUpdates)`
    # around the critic's step, on the batch train.py's loop handed in with set_input(): that
    # counted loop was read as a training loop that draws nothing (DDP304), refusing the project.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    files = {
        "pkg/__init__.py": "",
        "pkg/nets.py": (
            "import torch.nn as nn\n\n\nclass Gen(nn.Module):\n    def __init__(self, gpu_ids):\n        super().__init__()\n"
            "        self.gpu_ids = gpu_ids\n        self.model = nn.Linear(4, 4)\n\n    def forward(self, x):\n"
            "        if self.gpu_ids and x.is_cuda:\n            return nn.parallel.data_parallel(self.model, x, self.gpu_ids)\n"
            "        return self.model(x)\n\n\ndef define_G(gpu_ids):\n    netG = Gen(gpu_ids)\n    return netG\n"
        ),
        "pkg/gan_model.py": (
            "import torch\nfrom . import nets\n\n\nclass GANModel:\n    def __init__(self, opt):\n"
            "        self.netG = nets.define_G(opt.gpu_ids)\n        self.critic_updates = 2\n"
            "        self.opt_G = torch.optim.SGD(self.netG.parameters(), lr=0.1)\n\n    def set_input(self, data):\n"
            "        self.x, self.y = data\n\n    def optimize_parameters(self):\n        for _ in range(self.critic_updates):\n"
            "            self.opt_G.zero_grad()\n            loss = ((self.netG(self.x) - self.y) ** 2).mean()\n"
            "            loss.backward()\n            self.opt_G.step()\n"
        ),
        "train.py": (
            "import argparse\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom pkg.gan_model import GANModel\n\n\n"
            "def train(loader, model):\n    for epoch in range(2):\n        for data in loader:\n            model.set_input(data)\n"
            "            model.optimize_parameters()\n\n\nif __name__ == '__main__':\n"
            "    opt = argparse.Namespace(gpu_ids=[0, 1] if torch.cuda.device_count() > 1 else [])\n    torch.manual_seed(0)\n"
            "    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 4)), batch_size=8, shuffle=False)\n"
            "    model = GANModel(opt)\n    train(loader, model)\n    torch.save(model.netG.state_dict(), 'g.pt')\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, check=True, timeout=300)
    (tmp_path / "g.pt").rename(tmp_path / "original.pt")
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values()), render_report(results)
    for name, result in results.items():
        (tmp_path / name).write_text(result.output)
    run = run_launched([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"], cwd=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    torch = pytest.importorskip("torch")
    original, converted = torch.load(tmp_path / "original.pt"), torch.load(tmp_path / "g.pt")
    assert all(torch.allclose(original[key], converted[key], atol=1e-6) for key in original)


def _trains_alike(root: Path, files: dict[str, str], entry: str, weights: str) -> None:
    """Write the project, run the original as one process, convert it, run it under 2 gloo
    ranks: the converted project converts without a refusal and ends at the original's weights."""
    torch = pytest.importorskip("torch")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    subprocess.run([sys.executable, entry], cwd=root, env=env, check=True, timeout=300, capture_output=True)
    original = torch.load(root / weights)
    results = convert_tree(root)
    assert not any(result.error for result in results.values()), render_report(results)
    for name, result in results.items():
        (root / name).write_text(result.output)
    run = run_launched([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", entry], cwd=root, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    converted = torch.load(root / weights)
    assert all(torch.allclose(original[key], converted[key], atol=1e-6) for key in original), (original, converted)


def test_a_loss_made_out_of_sight_is_computed_on_the_whole_batch(tmp_path: Path) -> None:
    # pytorch-semseg: `loss_fn = get_loss_function(cfg)`, a functools.partial of the project's
    # cross_entropy2d whose reduction the config decides (a sum): each rank summed its share and
    # DDP averaged, every step 1/N of the original's gradient. Out of sight, the loss gets the
    # whole global batch (ddp_whole_batch), which is the original's whatever it computes.
    files = {
        "losses.py": (
            "import functools\nimport torch.nn.functional as F\n\n\ndef cross_entropy2d(input, target, size_average=True):\n"
            "    return F.cross_entropy(input, target, reduction='mean' if size_average else 'sum')\n\n\n"
            "def get_loss_function(cfg):\n    return functools.partial(cross_entropy2d, size_average=cfg['size_average'])\n"
        ),
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom losses import get_loss_function\n\n"
            "torch.manual_seed(0)\nmodel = nn.DataParallel(nn.Linear(4, 3))\noptimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
            "loss_fn = get_loss_function({'size_average': False})\n"
            "loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,))), batch_size=8)\n"
            "for epoch in range(3):\n    for x, y in loader:\n        optimizer.zero_grad()\n"
            "        loss = loss_fn(input=model(x), target=y)\n        loss.backward()\n        optimizer.step()\n"
            "torch.save(model.module.state_dict(), 'w.pt')\n"
        ),
    }
    _trains_alike(tmp_path, files, "train.py", "w.pt")
    assert "ddp_whole_batch(loss_fn" in (tmp_path / "train.py").read_text()


def test_a_loss_handed_in_by_callers_out_of_sight_is_computed_on_the_whole_batch(tmp_path: Path) -> None:
    # reid-strong-baseline: the trainer's step calls `loss_fn(score, feat, target)`, a parameter
    # train.py fills with a loss that mines the batch (its samples compared with each other):
    # per rank it saw half the batch. Whatever the loss is, on the whole global batch it is the original's.
    files = {
        "losses.py": (
            "def make_loss():\n    def loss(out, y):\n        spread = ((out - out.mean(0)) ** 2).mean()  # every sample against the batch\n"
            "        return ((out - y) ** 2).mean() + 0.5 * spread\n\n    return loss\n"
        ),
        "trainer.py": (
            "import torch.nn as nn\n\n\ndef do_train(model, optimizer, loader, loss_fn, epochs):\n    model = nn.DataParallel(model)\n"
            "    for epoch in range(epochs):\n        for x, y in loader:\n            optimizer.zero_grad()\n"
            "            loss = loss_fn(model(x), y)\n            loss.backward()\n            optimizer.step()\n"
        ),
        "train.py": (
            "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom losses import make_loss\n"
            "from trainer import do_train\n\n\ndef main():\n    torch.manual_seed(0)\n    net = nn.Linear(4, 2)\n"
            "    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)\n"
            "    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=8)\n"
            "    do_train(net, optimizer, loader, make_loss(), 3)\n    torch.save(net.state_dict(), 'w.pt')\n\n\n"
            "if __name__ == '__main__':\n    main()\n"
        ),
    }
    _trains_alike(tmp_path, files, "train.py", "w.pt")
    assert "ddp_whole_batch(loss_fn" in (tmp_path / "trainer.py").read_text()


def test_a_data_loader_built_in_the_call_to_a_project_trainer_is_sharded_there(tmp_path: Path) -> None:
    # (refused before, DDP309: "what this call passes could not be traced to a DataLoader")
    write_project(tmp_path, {
        "trainer.py": (
            "def train(net, loader, opt):\n    for x, y in loader:\n        opt.zero_grad()\n"
            "        ((net(x) - y) ** 2).mean().backward()\n        opt.step()\n"
        ),
        "train.py": (
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom trainer import train\n\n"
            "net = torch.nn.DataParallel(torch.nn.Linear(4, 1))\n"
            "train(net, DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4), torch.optim.SGD(net.parameters(), 0.1))\n"
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), render_report(results)
    assert "train(net, ddp_shard(DataLoader(TensorDataset(" in results["train.py"].output


def test_a_main_block_that_calls_a_project_function_which_wraps_and_trains_is_the_entry(tmp_path: Path) -> None:
    # optml_gan: run.py's `__main__` calls `run_experiment(...)` of src/, which builds the wrapped
    # model and trains; read as a self-test, folder mode found no entry (DDP202)
    write_project(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/exp.py": (
            "import torch\n\n\ndef run_experiment(data):\n    net = torch.nn.DataParallel(torch.nn.Linear(4, 1))\n"
            "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
            "    for x, y in torch.utils.data.DataLoader(data, batch_size=4):\n        opt.zero_grad()\n"
            "        torch.nn.functional.mse_loss(net(x), y).backward()\n        opt.step()\n"
        ),
        "main.py": (
            "import torch\nfrom pkg.exp import run_experiment\n\nif __name__ == '__main__':\n"
            "    run_experiment(torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1)))\n"
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), render_report(results)
    assert any(d.code == "DDP204" for d in results["main.py"].diagnostics)


def test_a_training_script_that_does_not_parse_is_named_with_its_parse_error(tmp_path: Path) -> None:
    # (pytorch-PersonReID: merge-conflict markers in train.py; folder mode said it trained nothing)
    script = (
        "import torch\nfrom models import build\n<<<<<<< HEAD\nlr = 0.1\n=======\nlr = 0.2\n>>>>>>> other\n\n"
        "def main():\n    model = build()\n    opt = torch.optim.SGD(model.parameters(), lr)\n"
        "    model(torch.ones(1, 2)).sum().backward()\n    opt.step()\n\n\nif __name__ == '__main__':\n    main()\n"
    )
    models = "import torch.nn as nn\n\ndef build():\n    return nn.DataParallel(nn.Linear(2, 2))\n"
    write_project(tmp_path, {"train.py": script, "models.py": models, "tools/py2.py": "print 'x'\nif __name__ == '__main__':\n    pass\n"})
    results = convert_tree(tmp_path)
    assert [(d.code, d.line) for d in results["train.py"].diagnostics] == [("DDP001", 3)]
    assert [d.code for d in results["models.py"].diagnostics] == ["DDP210"]
    assert "train.py does not parse" in results["models.py"].diagnostics[0].message
    assert not any(result.changed for result in results.values())
    assert not results["tools/py2.py"].diagnostics  # a script ddpify has no business with is passed over


def test_a_project_start_up_helper_whose_group_is_a_value_refuses_the_project(tmp_path: Path) -> None:
    # (its own init_process_group cannot keep its place under an is_initialized() test: DDP209)
    write_project(tmp_path, {
        "train.py": TRAIN_WITH.format(imports="from dist_utils import setup", setup="    setup()\n", after=""),
        "dist_utils.py": "import torch.distributed as dist\n\ndef setup():\n    return dist.init_process_group('gloo')\n",
    })
    results = convert_tree(tmp_path)
    assert "DDP209" in {d.code for d in results["dist_utils.py"].diagnostics} and results["dist_utils.py"].error
    assert not any(result.changed for result in results.values())


def test_a_library_whose_own_main_block_trains_nothing_is_the_scripts_library(tmp_path: Path) -> None:
    # (pytorch-unet-segmentation, batch 44: modules.py trains and wraps in its functions, and
    # its `__main__` block only measures a loss; it was taken for a script of its own and
    # main.py's loader, handed to its train_model(), was "not found sharded": DDP211)
    modules = (
        "import torch\n\n\ndef train_model(model, data_train, criterion, optimizer):\n"
        "    for x, y in data_train:\n        loss = criterion(model(x), y)\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n\n\n"
        "def loss_of(model, data, criterion):\n    return sum(criterion(model(x), y).item() for x, y in data)\n\n\n"
        "def test_model(model):\n    return torch.nn.DataParallel(model)\n\n\n"
        "if __name__ == '__main__':\n    print(loss_of(torch.nn.Linear(4, 2), [], None))\n"
    )
    main = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom modules import train_model\n\n"
        "if __name__ == '__main__':\n    model = torch.nn.DataParallel(torch.nn.Linear(4, 2))\n"
        "    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=8)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        train_model(model, loader, torch.nn.MSELoss(), optimizer)\n"
    )
    write_project(tmp_path, {"main.py": main, "modules.py": modules})
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), render_report(results)
    assert "DistributedSampler(" in results["main.py"].output
    assert "DDP201" not in {d.code for d in results["modules.py"].diagnostics}  # no set-up of its own


def test_a_script_whose_main_block_hands_its_main_to_a_dispatcher_is_an_entry(tmp_path: Path) -> None:
    # (pytorchic-bert, batch 45: `if __name__ == '__main__': fire.Fire(main)` was read as a
    # self-test, and train.py's wrap left with no script: DDP202)
    trainer = (
        "import torch\n\n\nclass Trainer:\n    def __init__(self, model, loader):\n        self.model, self.loader = model, loader\n\n"
        "    def train(self):\n        model = torch.nn.DataParallel(self.model)\n"
        "        opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "        for x, y in self.loader:\n            opt.zero_grad()\n"
        "            ((model(x) - y) ** 2).mean().backward()\n            opt.step()\n"
    )
    script = (
        "import fire\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\nimport train\n\n\n"
        "def main(batch_size=8):\n    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 2)), batch_size=batch_size)\n"
        "    train.Trainer(torch.nn.Linear(4, 2), loader).train()\n\n\n"
        "if __name__ == '__main__':\n    fire.Fire(main)\n"
    )
    write_project(tmp_path, {"classify.py": script, "train.py": trainer})
    results = convert_tree(tmp_path)
    assert not any(r.error for r in results.values()), render_report(results)
    assert results["classify.py"].changed and results["train.py"].changed


def test_a_library_alias_a_star_import_passes_on_is_the_library(tmp_path: Path) -> None:
    # (Transformer-TTS, batch 45: `from network import *` passing on module.py's `import torch as
    # t`; `t.save(...)` was taken for project code that may run the model, left on every rank)
    lib = "import torch as t\n\n\ndef helper():\n    return 1\n"
    script = (
        "import torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom lib import *\nfrom lib import helper\n\n"
        "model = nn.DataParallel(nn.Linear(4, 2))\n"
        "loader = DataLoader(TensorDataset(t.randn(16, 4), t.randn(16, 2)), batch_size=4)\n"
        "opt = t.optim.SGD(model.parameters(), lr=0.1)\nfor epoch in range(2):\n    for x, y in loader:\n"
        "        opt.zero_grad()\n        ((model(x) - y) ** 2).mean().backward()\n        opt.step()\n"
        "    t.save(model.state_dict(), 'm.pt')\n"
    )
    write_project(tmp_path, {"lib.py": lib, "train.py": script})
    codes = {d.code for d in convert_tree(tmp_path)["train.py"].diagnostics}
    assert "DDP601" in codes and "DDP602" not in codes


def test_an_unreadable_copy_nothing_imports_does_not_hold_back_a_training_script(tmp_path: Path) -> None:
    # (DTDN, batch 44: baseline_office.py, a copy with merge-conflict markers, refused
    # baseline.py's conversion with DDP210; it cannot run as it is)
    copy = TRAIN_WITH.format(imports="from report import show\n<<<<<<< HEAD\nlr = 0.1\n=======\nlr = 0.2\n>>>>>>> other", setup="", after="")
    write_project(tmp_path, {
        "train.py": TRAIN_WITH.format(imports="from report import show", setup="", after="        show(epoch)"),
        "train_office.py": copy,
        "report.py": "def show(epoch):\n    print('epoch', epoch)\n",
    })
    results = convert_tree(tmp_path)
    assert [d.code for d in results["train_office.py"].diagnostics] == ["DDP001"] and results["train_office.py"].error
    assert results["train.py"].changed and not results["train.py"].error, render_report(results)


def test_a_script_whose_main_call_sits_outside_its_main_block_is_an_entry(tmp_path: Path) -> None:
    # (reid: `main(parser.parse_args())` below a `__main__` block that only parses the arguments;
    # folder mode read the script as a library and refused the project with DDP304)
    helpers = (
        "import torch\n\n\ndef train(loader, model, opt):\n    for x, y in loader:\n"
        "        loss = torch.nn.functional.mse_loss(model(x), y)\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
    )
    script = (
        "import argparse\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from helpers import *\n\n\ndef main(args):\n    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))\n"
        "    loader = DataLoader(data, batch_size=8, shuffle=True)\n    model = nn.DataParallel(nn.Linear(4, 1))\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(args.epochs):\n"
        "        train(loader, model, opt)\n\n\nif __name__ == '__main__':\n    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--epochs', type=int, default=2)\n\nmain(parser.parse_args())\n"
    )
    write_project(tmp_path, {"helpers.py": helpers, "train.py": script})
    result = convert_tree(tmp_path)["train.py"]
    assert result.changed and not result.error
    assert {"DDP101", "DDP301", "DDP501"} <= {d.code for d in result.diagnostics}


def test_a_vendored_data_parallel_with_callback_becomes_ddp_with_torch_sync_batchnorm(tmp_path: Path) -> None:
    # (TFPnP, SPADE: Synchronized-BatchNorm-PyTorch's DataParallelWithCallback, imported through
    # its package's __init__, or bound to another name after a star import)
    replicate = (
        "from torch.nn.parallel.data_parallel import DataParallel\n\n\ndef execute_replication_callbacks(modules):\n"
        "    for module in modules:\n        pass\n\n\nclass DataParallelWithCallback(DataParallel):\n"
        "    def replicate(self, module, device_ids):\n        modules = super(DataParallelWithCallback, self).replicate(module, device_ids)\n"
        "        execute_replication_callbacks(modules)\n        return modules\n"
    )
    script = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom nets import *\n"
        "from sync_batchnorm import DataParallelWithCallback\n\nDataParallel = DataParallelWithCallback\n\n\ndef main():\n"
        "    net = DataParallel(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8)))\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    for x, y in DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 8)), batch_size=8):\n"
        "        loss = ((net(x) - y) ** 2).mean()\n        opt.zero_grad()\n        loss.backward()\n        opt.step()\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    write_project(tmp_path, {
        "sync_batchnorm/__init__.py": "from .replicate import DataParallelWithCallback\n",
        "sync_batchnorm/replicate.py": replicate, "nets.py": "import torch\n", "train.py": script,
    })
    results = convert_tree(tmp_path)
    result = results["train.py"]
    assert result.changed and not result.error, [d.message for d in result.diagnostics]
    assert "DDP129" in {d.code for d in result.diagnostics}
    assert "ddp_wrap(torch.nn.SyncBatchNorm.convert_sync_batchnorm(" in result.output
    assert not any(r.error for r in results.values())


def test_a_trainer_imported_by_a_name_read_from_a_configuration_is_linked_to_its_script(tmp_path: Path) -> None:
    # (the speech-enhancement CRN: `importlib.import_module(cfg["module"])` in util/utils.py picks
    # the trainer; folder mode never linked train.py to trainer/, and refused the wrap with DDP202)
    write_project(tmp_path, {
        "util/__init__.py": "",
        "util/utils.py": (
            "import importlib\n\n\ndef initialize_config(cfg, pass_args=True):\n"
            "    cls = getattr(importlib.import_module(cfg['module']), cfg['main'])\n"
            "    return cls(**cfg.get('args', {})) if pass_args else cls\n"
        ),
        "trainer/__init__.py": "",
        "trainer/base.py": (
            "import torch\n\n\nclass BaseTrainer:\n    def __init__(self, model, optimizer):\n        self.model = model\n"
            "        if torch.cuda.device_count() > 1:\n            self.model = torch.nn.DataParallel(self.model)\n"
            "        self.optimizer = optimizer\n\n    def train(self):\n        for epoch in range(2):\n"
            "            self._train_epoch(epoch)\n"
        ),
        "trainer/t.py": (
            "import torch\nfrom trainer.base import BaseTrainer\n\n\nclass Trainer(BaseTrainer):\n"
            "    def __init__(self, model, optimizer, loader):\n        super().__init__(model, optimizer)\n        self.loader = loader\n\n"
            "    def _train_epoch(self, epoch):\n        for x, y in self.loader:\n            self.optimizer.zero_grad()\n"
            "            loss = torch.nn.functional.mse_loss(self.model(x), y)\n            loss.backward()\n            self.optimizer.step()\n"
        ),
        "train.py": (
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom util.utils import initialize_config\n\n\n"
            "def main(config):\n    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)\n"
            "    model = torch.nn.Linear(4, 1)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    trainer_class = initialize_config(config['trainer'], pass_args=False)\n"
            "    trainer_class(model=model, optimizer=opt, loader=loader).train()\n\n\n"
            "if __name__ == '__main__':\n    main({'trainer': {'module': 'trainer.t', 'main': 'Trainer'}})\n"
        ),
    })
    results = convert_tree(tmp_path)
    assert not any(result.error for result in results.values())
    assert results["train.py"].changed and results["trainer/base.py"].changed
    assert "DDP101" in {d.code for d in results["trainer/base.py"].diagnostics}


NAMESPACE_PACKAGE = {
    "python/training/dataset.py": (
        "import urllib.request\nimport torch\nfrom torch.utils.data import Dataset\n\n\n"
        "def download_labels(folder):\n    urllib.request.urlretrieve('http://example.org/labels.zip', folder + '/labels.zip')\n\n\n"
        "class Scans(Dataset):\n    def __init__(self):\n        download_labels('labels')\n\n"
        "    def __getitem__(self, i):\n        return torch.ones(4)\n\n    def __len__(self):\n        return 8\n"
    ),
    "python/training/train.py": (
        "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).resolve().parents[2]))\n\n"
        "import torch\nfrom torch.utils.data import DataLoader\nfrom python.training.dataset import Scans\n\n\n"
        "def main():\n    loader = DataLoader(Scans(), batch_size=4)\n    model = torch.nn.DataParallel(torch.nn.Linear(4, 1))\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    for x in loader:\n"
        "        loss = model(x).pow(2).mean()\n        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    ),
}


def test_modules_of_a_namespace_package_are_read_in_both_modes(tmp_path: Path) -> None:
    # visionmap (batch 50): `from python.training.dataset import ...`, no __init__.py anywhere: the
    # dataset's label download was not seen, every rank downloaded and unzipped at once
    from ddpify.api import convert_file

    write_project(tmp_path, NAMESPACE_PACKAGE)
    alone = convert_file(tmp_path / "python/training/train.py")
    assert "DDP607" in {d.code for d in alone.diagnostics}, alone.diagnostics
    results = convert_tree(tmp_path)
    assert "DDP607" in {d.code for d in results["python/training/train.py"].diagnostics}
