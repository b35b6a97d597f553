"""Generate a DataParallel project for the project-mode bench (bench/bench_project.py).

    .venv/bin/python bench/gen_project.py OUT_DIR [--entries 30]

The shape of a research repository: a library (`lib/`: a model factory that wraps in
DataParallel, layer and block modules, datasets and a loader builder, a trainer with a
loop over a loader parameter, logging and checkpoint utilities, configuration) and
`--entries` training scripts at the top that all import it. 30 entries give 80 files.
With `--local-loaders` each script builds its own loaders (from the library's datasets)
instead of calling the library's loader builder.
Deterministic: the same arguments write the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

BLOCK = '''

class {name}(nn.Module):
    """Block {index} of family {family}: two linear layers, a residual when the widths agree."""

    def __init__(self, width_in, width_out, dropout=0.{drop}):
        super().__init__()
        self.first = nn.Linear(width_in, width_out)
        self.second = nn.Linear(width_out, width_out)
        self.norm = nn.LayerNorm(width_out)
        self.dropout = nn.Dropout(dropout)
        self.residual = width_in == width_out

    def forward(self, x):
        y = self.dropout(torch.relu(self.first(x)))
        y = self.norm(self.second(y))
        return x + y if self.residual else y

    def extra_repr(self):
        return "residual={{}}".format(self.residual)
'''

TRANSFORM = '''

def {name}(batch, scale={scale}):
    """Transform {index} of family {family}: scales, shifts and clips a batch of features."""
    shifted = batch - batch.mean(dim=0, keepdim=True)
    scaled = shifted * scale
    return scaled.clamp(min=-{clip}, max={clip})
'''


def blocks_module(family: int) -> str:
    body = "".join(
        BLOCK.format(name=f"Block{family}x{index}", index=index, family=family, drop=index % 5) for index in range(6)
    )
    names = ", ".join(f'"Block{family}x{index}"' for index in range(6))
    return f'"""Building blocks, family {family}."""\nimport torch\nimport torch.nn as nn\n\n__all__ = [{names}]\n{body}'


def transforms_module(family: int) -> str:
    body = "".join(
        TRANSFORM.format(name=f"transform_{family}_{index}", index=index, family=family, scale=1 + index, clip=3 + family)
        for index in range(8)
    )
    return f'"""Feature transforms, family {family}."""\nimport torch\n{body}'


CONFIG = '''"""Hyperparameters of every experiment, by name."""
DEFAULTS = {"epochs": 2, "batch_size": 16, "lr": 0.05, "width": 32, "depth": 2, "family": 0}

EXPERIMENTS = {
%s
}


def config_for(name):
    settings = dict(DEFAULTS)
    settings.update(EXPERIMENTS.get(name, {}))
    return settings
'''

FACTORY = '''"""The model factory: picks blocks by family and spreads the model over the GPUs."""
import torch
import torch.nn as nn

from lib.models import heads
%s


class Network(nn.Module):
    def __init__(self, blocks, head):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.head = head

    def forward(self, x):
        return self.head(self.blocks(x))


def build_model(config):
    family = FAMILIES[config["family"] %% len(FAMILIES)]
    width = config["width"]
    blocks = [family.__dict__[family.__all__[0]](12, width)]
    blocks += [family.__dict__[name](width, width) for name in family.__all__[1 : config["depth"]]]
    model = Network(blocks, heads.ClassifierHead(width, 4))
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    return model
'''

HEADS = '''"""Output heads."""
import torch.nn as nn


class ClassifierHead(nn.Module):
    def __init__(self, width, classes):
        super().__init__()
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc(x)
'''

DATASETS = '''"""Synthetic datasets (a real project reads files here), with feature transforms."""
import torch
from torch.utils.data import TensorDataset

%s


def make_split(seed, size=96, features=12, classes=4):
    generator = torch.Generator().manual_seed(seed)
    inputs = TRANSFORMS[seed %% len(TRANSFORMS)](torch.randn(size, features, generator=generator))
    labels = torch.randint(0, classes, (size,), generator=generator)
    cut = size * 2 // 3
    return TensorDataset(inputs[:cut], labels[:cut]), TensorDataset(inputs[cut:], labels[cut:])
'''

LOADERS = '''"""The loader builder every training script uses."""
from torch.utils.data import DataLoader

from lib.data.datasets import make_split


def build_loaders(config, seed=0):
    train_set, val_set = make_split(seed)
    train_loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True)
    val_loader = DataLoader(val_set, batch_size=config["batch_size"], shuffle=False)
    return train_loader, val_loader
'''

TRAINER = '''"""The training loop the scripts share: one epoch over the loader it is given."""
import torch

from lib.utils.logger import log
from lib.utils.meters import AverageMeter


def train_one_epoch(model, loader, criterion, optimizer, epoch):
    meter = AverageMeter()
    model.train()
    for inputs, target in loader:
        loss = criterion(model(inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        meter.update(loss.item(), inputs.size(0))
    log("epoch {} loss {:.4f}".format(epoch, meter.avg))
    return meter.avg


def evaluate(model, loader):
    correct = total = 0
    model.eval()
    with torch.no_grad():
        for inputs, target in loader:
            correct += (model(inputs).argmax(1) == target).sum().item()
            total += target.numel()
    return correct / max(total, 1)
'''

LOGGER = '''"""Logging for the scripts."""
import time

START = time.time()


def log(message):
    print("[{:7.1f}s] {}".format(time.time() - START, message))
'''

METERS = '''"""Running averages."""


class AverageMeter:
    def __init__(self):
        self.sum = 0.0
        self.count = 0

    def update(self, value, n=1):
        self.sum += value * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)
'''

CHECKPOINT = '''"""Checkpoints."""
import os

import torch


def save_checkpoint(state, folder, name="last.pth"):
    os.makedirs(folder, exist_ok=True)
    torch.save(state, os.path.join(folder, name))
'''

ENTRY_SHARED = '''"""Experiment {index}: {what}."""
import argparse

import torch
import torch.nn as nn
{torch_import}
from lib.config import config_for
{loaders_import}
from lib.models.factory import build_model
from lib.utils.checkpoint import save_checkpoint
from lib.utils.logger import log
{extra_import}
parser = argparse.ArgumentParser(description="experiment {index}")
parser.add_argument("--out", default="runs/exp{index:02d}")
parser.add_argument("--seed", default={index}, type=int)


def main():
    args = parser.parse_args()
    config = config_for("exp{index:02d}")
    torch.manual_seed(args.seed)
    model = build_model(config)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
{loaders}
    best = 0.0
    for epoch in range(config["epochs"]):
{loop}
        accuracy = evaluate(model, val_loader)
        best = max(best, accuracy)
        log("exp{index:02d} epoch {{}} accuracy {{:.3f}} best {{:.3f}}".format(epoch, accuracy, best))
        save_checkpoint({{"epoch": epoch, "model": model.state_dict(), "best": best}}, args.out)


if __name__ == "__main__":
    main()
'''

TRAINER_LOOP = "        train_one_epoch(model, train_loader, criterion, optimizer, epoch)"
OWN_LOOP = '''        model.train()
        for inputs, target in train_loader:
            loss = criterion(model(inputs), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        log("exp{index:02d} epoch {{}} last loss {{:.4f}}".format(epoch, loss.item()))'''


SHARED_LOADERS = "    train_loader, val_loader = build_loaders(config, seed=args.seed)"
LOCAL_LOADERS = '''    train_set, val_set = make_split(args.seed)
    train_loader = DataLoader(train_set, batch_size=config["batch_size"], shuffle=True)
    val_loader = DataLoader(val_set, batch_size=config["batch_size"], shuffle=False)'''


def generate(out: Path, entries: int = 30, local_loaders: bool = False) -> list[Path]:
    """Write the project; with ``local_loaders`` each script builds its own loaders from the
    library's datasets instead of calling the library's loader builder."""
    files: dict[str, str] = {
        "lib/__init__.py": "",
        "lib/config.py": CONFIG % "\n".join(
            f'    "exp{i:02d}": {{"width": {16 + 8 * (i % 4)}, "depth": {2 + i % 3}, "family": {i % 10}}},'
            for i in range(entries)
        ),
        "lib/models/__init__.py": "",
        "lib/models/heads.py": HEADS,
        "lib/models/factory.py": FACTORY % "\n".join(f"from lib.models import blocks_{f} as family_{f}" for f in range(10))
        + "\n\nFAMILIES = [" + ", ".join(f"family_{f}" for f in range(10)) + "]\n",
        "lib/data/__init__.py": "",
        "lib/data/datasets.py": "",  # below: it imports every transform module
        "lib/data/loaders.py": LOADERS,
        "lib/engine/__init__.py": "",
        "lib/engine/trainer.py": TRAINER,
        "lib/utils/__init__.py": "",
        "lib/utils/logger.py": LOGGER,
        "lib/utils/meters.py": METERS,
        "lib/utils/checkpoint.py": CHECKPOINT,
    }
    for family in range(10):
        files[f"lib/models/blocks_{family}.py"] = blocks_module(family)
        files[f"lib/data/transforms_{family}.py"] = transforms_module(family)
    filler = 80 - entries - len(files)
    for index in range(max(filler, 0)):
        files[f"lib/data/augment_{index}.py"] = transforms_module(10 + index)
    families = [(f"transforms_{family}", family) for family in range(10)]
    families += [(f"augment_{index}", 10 + index) for index in range(max(filler, 0))]
    files["lib/data/datasets.py"] = DATASETS % (
        "\n".join(f"from lib.data import {name}" for name, _ in families)
        + "\n\nTRANSFORMS = ["
        + ", ".join(f"{name}.transform_{family}_0" for name, family in families)
        + "]"
    )
    for index in range(entries):
        shared = index % 3 != 2  # two in three use the shared trainer, the others their own loop
        files[f"train_{index:02d}.py"] = ENTRY_SHARED.format(
            index=index,
            what="the shared trainer" if shared else "its own training loop",
            extra_import="from lib.engine.trainer import evaluate, train_one_epoch\n" if shared else "from lib.engine.trainer import evaluate\n",
            loop=TRAINER_LOOP if shared else OWN_LOOP.format(index=index),
            torch_import="from torch.utils.data import DataLoader\n" if local_loaders else "",
            loaders_import="from lib.data.datasets import make_split" if local_loaders else "from lib.data.loaders import build_loaders",
            loaders=LOCAL_LOADERS if local_loaders else SHARED_LOADERS,
        )
    written = []
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--entries", type=int, default=30)
    parser.add_argument("--local-loaders", action="store_true", help="scripts build their own loaders")
    args = parser.parse_args()
    written = generate(args.out, args.entries, args.local_loaders)
    print(f"{len(written)} files in {args.out}")


if __name__ == "__main__":
    main()
