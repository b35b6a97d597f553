"""The rules ``ddpify check`` reports, with explanations and before/after examples.

Codes are stable and grouped by prefix like the convert codes: DDP1 model wrapping, DDP3
data loading, DDP5 epochs, DDP6 side effects, DDP7 devices. Imports nothing heavy: the
CLI's ``rule`` command and the SARIF writer read it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where the documentation site is published (mkdocs.yml's site_url says the same): every
# code has an anchor there, on the check rules page or the transforms reference, and the
# CLI's outputs link it (tests/test_docs.py builds the site and finds each anchor).
DOCS_URL = "https://ddpify.readthedocs.io/en/latest/"
RULES_PAGE = "rules"  # docs page (generated, ddpify/docs_reference.py) with the check codes
TRANSFORMS_PAGE = "transforms"  # the convert codes


def code_url(code: str) -> str:
    """The docs anchor of a code: check codes on the rules page, convert codes on the
    transforms reference (both pages are generated when the site is built)."""
    page = RULES_PAGE if code in RULES else TRANSFORMS_PAGE
    return f"{DOCS_URL}{page}/#{code.lower()}"


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
            "DDP120",
            "functional-data-parallel",
            "functional data_parallel() splits the batch inside one process: under DDP call the module itself",
            "The functional form of DataParallel (often inside a model's forward, as old DCGAN code did) "
            "replicates the module onto several GPUs every call. Under DistributedDataParallel each process "
            "already holds its own share of the batch on its own GPU: call the module directly and wrap the "
            "whole model in DDP once. `ddpify convert` refuses such a file (DDP004) rather than leave it "
            "replicating inside every rank.",
            "def forward(self, x):\n"
            "    if x.is_cuda and self.ngpu > 1:\n"
            "        return nn.parallel.data_parallel(self.main, x, range(self.ngpu))\n"
            "    return self.main(x)\n",
            "def forward(self, x):\n    return self.main(x)\n"
            "# and once, where the model is built:\n"
            "model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])\n",
        ),
        Rule(
            "DDP121",
            "data-parallel-subclass",
            "DataParallel subclass or fork: its scatter/gather/chunk_sizes logic has no DDP form "
            "(attribute forwarding and scattering-only subclasses convert)",
            "A project's DataParallel subclass (`class CustomDataParallel(nn.DataParallel)`) or a fork of its "
            "code (a class named *DataParallel* with its own scatter, gather, replicate or parallel_apply) still "
            "runs one process that splits each batch across GPUs. `ddpify convert` rebases a subclass that only "
            "forwards attribute reads (`__getattr__`) onto DistributedDataParallel, and turns the wraps of a "
            "subclass that only changes how a batch is split (uneven `chunk_sizes`, a lighter master GPU) into "
            "DDP (DDP129): under DDP every process holds its own share and nothing is gathered. A custom gather "
            "or a forward that computes changes what the model returns: replace the class with "
            "DistributedDataParallel by hand and give each process its share of the batch through a "
            "DistributedSampler.",
            "class BalancedDataParallel(nn.DataParallel):\n"
            "    def scatter(self, inputs, kwargs, device_ids):\n"
            "        ...  # gpu0 gets a smaller chunk\n"
            "model = BalancedDataParallel(gpu0_bsz, model, dim=0)\n",
            "model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])\n"
            "# the loader: DataLoader(ds, batch_size=global_batch // world_size, sampler=DistributedSampler(ds))\n",
        ),
        Rule(
            "DDP122",
            "data-parallel-variant",
            "a DataParallel variant that is not torch's wraps a model: replace it with DistributedDataParallel by hand",
            "Names like `DataParallel` imported from a project's own module (CenterNet's chunk_sizes fork), "
            "`BalancedDataParallel` or `DataParallelModel` / `DataParallelCriterion` (PyTorch-Encoding) are "
            "DataParallel variants: one process, one thread per GPU, outputs or losses gathered on one GPU. "
            "`ddpify convert` only rewrites torch's own class, so these are left for a person: wrap the model "
            "in DistributedDataParallel, compute the loss locally in each process (DDP averages gradients, "
            "not losses), and shard the data with a DistributedSampler.",
            "from encoding.parallel import DataParallelModel, DataParallelCriterion\n"
            "model = DataParallelModel(model).cuda()\n"
            "criterion = DataParallelCriterion(criterion).cuda()\n",
            "model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])\n"
            "criterion = criterion.to(local_rank)  # each process computes its own loss\n",
        ),
        Rule(
            "DDP123",
            "sync-batchnorm-helper",
            "DataParallel-only synchronised BatchNorm (SynchronizedBatchNorm*, patch_replication_callback): "
            "use torch.nn.SyncBatchNorm",
            "Synchronized-BatchNorm-PyTorch synchronises its layers through a callback that DataParallel "
            "runs when it replicates the model; `patch_replication_callback` asserts a DataParallel. Under "
            "DistributedDataParallel nothing replicates, so these layers silently compute per-process "
            "statistics. torch's own SyncBatchNorm synchronises across DDP processes, and its "
            "`convert_sync_batchnorm` replaces these layers (they subclass torch's BatchNorm). `ddpify "
            "convert` does this for a `patch_replication_callback` right beside its wrap.",
            "model = nn.DataParallel(model, device_ids=gpu_ids)\npatch_replication_callback(model)\n",
            "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
            "model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])\n",
        ),
        Rule(
            "DDP124",
            "ddp-path-not-selected",
            "a DDP path beside DataParallel reads a switch plain torchrun leaves unset: ranks run DataParallel "
            "(or share one GPU)",
            "Scripts of the HuggingFace, pytorch/examples and mmcv/BasicSR era choose between "
            "DistributedDataParallel and DataParallel with a switch. torchrun passes the local rank only in the "
            "LOCAL_RANK environment variable, so `--local_rank` keeps its default: with -1 each rank runs the "
            "DataParallel branch on every GPU with all the data; with 0 (apex-style scripts that switch on "
            "WORLD_SIZE) every rank takes GPU 0. Read the default from LOCAL_RANK and accept "
            "both spellings (`ddpify convert` does this). A `--launcher` (default `none`) or `--distributed` "
            "flag must be on the launch line: `torchrun --nproc-per-node=N train.py --launcher pytorch`. "
            "`--multiprocessing-distributed` spawns its own processes: launch it with python, not torchrun "
            "(`python train.py --multiprocessing-distributed --dist-url tcp://127.0.0.1:29500 --world-size 1 "
            "--rank 0`).",
            "parser.add_argument('--local_rank', type=int, default=-1)\n"
            "...\n"
            "if args.local_rank != -1:\n    model = DDP(model, device_ids=[args.local_rank])\n"
            "elif n_gpu > 1:\n    model = nn.DataParallel(model)\n",
            "parser.add_argument('--local_rank', '--local-rank', type=int,\n"
            "                    default=int(os.environ.get('LOCAL_RANK', -1)))\n"
            "# launch: torchrun --standalone --nproc-per-node=gpu train.py\n",
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
            "print runs on every rank: quiet the other ranks' output at set-up, or limit it to rank 0",
            "Every process runs the same script, so each line is printed once per process. Rather than guard "
            "every print (and miss those in helpers and libraries), silence stdout on the ranks other than 0 "
            "once, at set-up, as DETR's `setup_for_distributed` and ddpify's `ddp_quiet` do; errors still show.",
            "print(f'epoch {epoch} loss {loss:.4f}')\n",
            "if dist.get_rank() != 0:  # at set-up\n    sys.stdout = open(os.devnull, 'w')\n"
            "print(f'epoch {epoch} loss {loss:.4f}')\n",
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
            "Under DDP each process owns one GPU, chosen by LOCAL_RANK. `cuda:0`, `.cuda(0)`, "
            "`device_ids=[0]` or a `--gpu` argument with a default index (`add_argument('--gpu', type=int, "
            "default=0)`, used where no launcher overrides it, as under torchrun) put every process on GPU 0 "
            "(NCCL then fails with 'Duplicate GPU detected').",
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
