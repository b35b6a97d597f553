"""DCGAN-style switches that gated DataParallel and are off under the launch line:
`--ngpu` defaults to 1 and `--mGPUs` is unset. Every rank must still wrap, and wrap the
model after its weights are initialised."""
import argparse
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--ngpu", type=int, default=1)
parser.add_argument("--mGPUs", action="store_true")
opt = parser.parse_args()


def weights_init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.02)
        nn.init.zeros_(m.bias)


def main():
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"], LOCAL_RANK=os.environ["SLURM_LOCALID"])
        if "MASTER_ADDR" not in os.environ:
            hosts = subprocess.check_output(["scontrol", "show", "hostnames", os.environ["SLURM_NODELIST"]], text=True)
            os.environ["MASTER_ADDR"] = hosts.split()[0]
        os.environ.setdefault("MASTER_PORT", "29500")
    if "RANK" not in os.environ and torch.cuda.device_count() > 1:  # plain python: one process per GPU, as DataParallel used them all
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torch.cuda.device_count()}"]
        sys.exit(subprocess.call([*command, *sys.argv]))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    if "RANK" in os.environ:  # launched by torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    else:  # plain `python guard_flag.py`: a world of one
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    device_ids = [local_rank] if torch.cuda.is_available() else None
    torch.manual_seed(5)
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    netG = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6)).to(device)
    netG.apply(weights_init)
    netG = DDP(netG, device_ids=device_ids)
    netD = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
    netD = DDP(netD, device_ids=device_ids)
    optimizerD = torch.optim.SGD(netD.parameters(), lr=0.05)
    optimizerG = torch.optim.SGD(netG.parameters(), lr=0.05)
    dataset = TensorDataset(torch.randn(48, 6), torch.randn(48, 4))
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=12 // dist.get_world_size(), sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for real, noise in loader:
            real, noise = real.to(device), noise.to(device)
            optimizerD.zero_grad()
            errD = netD(netG(noise).detach()).mean() - netD(real).mean()
            errD.backward()
            optimizerD.step()
            optimizerG.zero_grad()
            errG = -netD(netG(noise)).mean()
            errG.backward()
            optimizerG.step()
        if dist.get_rank() == 0:
            print(f"[{epoch}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
