"""Run a training script in this process and record what it did (for tests and `verify`).

    python -m ddpify.verify.probe SCRIPT [ARGS...]
    python -m torch.distributed.run --nproc-per-node=2 -m ddpify.verify.probe SCRIPT [ARGS...]

The script runs unmodified (``runpy``, as ``__main__``). The probe records every optimizer
the script creates and, when the script ends, writes ``rank<RANK>.pt`` into
``$DDPIFY_PROBE_DIR`` with each optimizer's final parameters and the ``set_epoch`` values
each DistributedSampler received. Parameters are read through the optimizers so that a
DataParallel run, a plain run and a DDP run are compared parameter by parameter.

This module imports torch; only launched processes import it, never the CLI.
"""

from __future__ import annotations

import os
import runpy
import sys

import torch


def _record_optimizers(optimizers: list) -> None:
    original_init = torch.optim.Optimizer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        optimizers.append(self)

    torch.optim.Optimizer.__init__ = init


def _record_set_epoch(epochs: list) -> None:
    from torch.utils.data.distributed import DistributedSampler

    original = DistributedSampler.set_epoch

    def set_epoch(self, epoch):
        epochs.append(int(epoch))
        return original(self, epoch)

    DistributedSampler.set_epoch = set_epoch


def _dump(optimizers: list, epochs: list) -> None:
    directory = os.environ.get("DDPIFY_PROBE_DIR")
    if not directory:
        return
    params = [
        [p.detach().cpu().clone() for group in optimizer.param_groups for p in group["params"]]
        for optimizer in optimizers
    ]
    rank = os.environ.get("RANK", "0")
    torch.save({"params": params, "set_epoch": epochs}, os.path.join(directory, f"rank{rank}.pt"))


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m ddpify.verify.probe SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    optimizers: list = []
    epochs: list = []
    _record_optimizers(optimizers)
    _record_set_epoch(epochs)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        _dump(optimizers, epochs)


if __name__ == "__main__":
    main()
