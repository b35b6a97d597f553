"""The rules ``ddpify check`` reports, with explanations and before/after examples.

Codes are stable and grouped by prefix like the convert codes: DDP1 model wrapping, DDP3
data loading, DDP5 epochs, DDP6 side effects, DDP7 devices. Imports nothing heavy: the
CLI's ``rule`` command and the SARIF writer read it directly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    summary: str
    explanation: str
    before: str
    after: str
    fixable: bool = False  # `ddpify convert` rewrites it


RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule(
            "DDP100",
            "data-parallel",
            "nn.DataParallel is used; `ddpify convert` rewrites it to DistributedDataParallel",
            "DataParallel runs one process with a thread per GPU: the GIL, a model copy every step and "
            "gathering outputs on GPU 0 make it slower than DistributedDataParallel even on one machine, "
            "and it cannot span machines.",
            "model = nn.DataParallel(model)\n",
            "model = DistributedDataParallel(model.to(ddp_device()), device_ids=ddp_device_ids())\n"
            "# plus process-group set-up, DistributedSampler and rank-0 side effects: run `ddpify convert`\n",
            fixable=True,
        ),
        Rule(
            "DDP310",
            "shuffle-with-sampler",
            "DataLoader gets shuffle=True and a sampler: DataLoader raises; move shuffle into the sampler",
            "DataLoader refuses `shuffle=True` together with `sampler=`. With a DistributedSampler, shuffling "
            "is the sampler's job.",
            "DataLoader(ds, batch_size=32, shuffle=True, sampler=DistributedSampler(ds))\n",
            "DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds, shuffle=True))\n",
        ),
        Rule(
            "DDP510",
            "missing-set-epoch",
            "DistributedSampler is created but set_epoch() is never called: every epoch sees the same order",
            "A DistributedSampler seeds its shuffle with the epoch number. Without `set_epoch(epoch)` at the "
            "start of every epoch, each epoch repeats the first epoch's order.",
            "for epoch in range(epochs):\n    for x, y in loader:\n        ...\n",
            "for epoch in range(epochs):\n    loader.sampler.set_epoch(epoch)\n    for x, y in loader:\n        ...\n",
        ),
        Rule(
            "DDP610",
            "save-on-every-rank",
            "torch.save runs on every rank: limit it to rank 0 (and barrier before others read the file)",
            "Every process runs the same script. Unguarded saves write the same file N times, racing each other.",
            "torch.save(model.state_dict(), 'ckpt.pt')\n",
            "if dist.get_rank() == 0:\n    torch.save(model.state_dict(), 'ckpt.pt')\ndist.barrier()\n",
        ),
        Rule(
            "DDP611",
            "print-on-every-rank",
            "print runs on every rank: limit it to rank 0",
            "Every process runs the same script, so each line is printed once per process.",
            "print(f'epoch {epoch} loss {loss:.4f}')\n",
            "if dist.get_rank() == 0:\n    print(f'epoch {epoch} loss {loss:.4f}')\n",
        ),
        Rule(
            "DDP612",
            "progress-bar-on-every-rank",
            "progress bar drawn by every rank: pass disable=dist.get_rank() != 0",
            "Each process draws its own tqdm bar on the same terminal, so N bars overwrite each other.",
            "for x, y in tqdm(loader):\n",
            "for x, y in tqdm(loader, disable=dist.get_rank() != 0):\n",
            fixable=True,
        ),
        Rule(
            "DDP613",
            "tracker-on-every-rank",
            "experiment tracker started on every rank: create it on rank 0 only",
            "A SummaryWriter or wandb.init() on every process writes N event files or starts N runs "
            "for one training job.",
            "writer = SummaryWriter('runs/exp')\n",
            "writer = SummaryWriter('runs/exp') if dist.get_rank() == 0 else None\n",
            fixable=True,
        ),
        Rule(
            "DDP710",
            "hard-coded-device",
            "hard-coded GPU index in DDP code: every rank would use that GPU; use the local rank's device",
            "Under DDP each process owns one GPU, chosen by LOCAL_RANK. `cuda:0`, `.cuda(0)` or "
            "`device_ids=[0]` put every process on GPU 0 (NCCL then fails with 'Duplicate GPU detected').",
            "model = DDP(model.to('cuda:0'), device_ids=[0])\n",
            "torch.cuda.set_device(local_rank)\nmodel = DDP(model.to('cuda'), device_ids=[local_rank])\n",
        ),
        Rule(
            "DDP711",
            "in-script-visible-devices",
            "CUDA_VISIBLE_DEVICES is set inside the script: choose GPUs on the launch line instead",
            "Setting CUDA_VISIBLE_DEVICES in the script fights the launcher: torchrun starts one process per "
            "GPU and each must see the GPUs the launch line chose.",
            "os.environ['CUDA_VISIBLE_DEVICES'] = '0,3'\n",
            "# CUDA_VISIBLE_DEVICES=0,3 torchrun --standalone --nproc-per-node=2 train.py\n",
        ),
    )
}
