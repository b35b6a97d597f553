"""Trainer-class script: the loader lives in an attribute, the epoch loop in a method."""
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model, dataset, device):
        self.device = device
        self.model = DDP(model.to(device), device_ids=[device] if device.type == "cuda" else None)
        self.train_loader = DataLoader(dataset, batch_size=16 // dist.get_world_size(), sampler=DistributedSampler(dataset, shuffle=False), drop_last=True)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.loss_fn = nn.MSELoss()

    def train_epoch(self):
        self.model.train()
        total = 0.0
        for inputs, targets in self.train_loader:
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            self.optimizer.zero_grad()
            loss = self.loss_fn(self.model(inputs), targets)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return total

    def fit(self, epochs):
        for epoch in range(epochs):
            self.train_loader.sampler.set_epoch(epoch)
            total = torch.tensor(self.train_epoch(), device=self.device)
            dist.all_reduce(total)  # the mean over ranks, as DataParallel printed the global batch's
            total = total.item() / dist.get_world_size()
            if dist.get_rank() == 0:
                print(f"epoch {epoch}: summed loss {total:.4f}")


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
    else:  # plain `python trainer_main.py`: a world of one
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = TensorDataset(torch.randn(72, 6), torch.randn(72, 2))
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    trainer = Trainer(model, dataset, device)
    trainer.fit(4)
    if dist.get_rank() == 0:
        print("finished")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
