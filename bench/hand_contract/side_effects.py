"""Side effects and exact results: logging, a tqdm bar, a CSV log, a dataset that downloads,
gradient accumulation, an odd-size evaluation set, and a checkpoint read back after saving."""
import csv
import logging
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("train")
ACCUMULATION = 2


class DownloadedData(Dataset):
    """Stands in for a torchvision dataset: download=True writes its files if missing."""

    def __init__(self, root, download=False):
        path = os.path.join(root, "data.pt")
        if download and not os.path.exists(path):
            os.makedirs(root, exist_ok=True)
            generator = torch.Generator().manual_seed(3)
            torch.save((torch.randn(64, 5, generator=generator), torch.randn(64, 1, generator=generator)), path)
        self.inputs, self.targets = torch.load(path)

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, index):
        return self.inputs[index], self.targets[index]


def evaluate(model, loader):
    model.eval()
    device = next(model.parameters()).device
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            outputs = model(inputs)
            loss_sum += nn.functional.mse_loss(outputs, targets, reduction="sum").item()
            correct += ((outputs - targets).abs() < 0.5).sum().item()
            total += len(targets)
    model.train()
    return correct, total, loss_sum / total


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
    else:  # plain `python side_effects.py`: a world of one
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    if dist.get_rank() != 0:
        dist.barrier()  # rank 0 downloads first
    train_set = DownloadedData("data", download=True)
    if dist.get_rank() == 0:
        dist.barrier()
    eval_set = TensorDataset(torch.randn(37, 5), torch.randn(37, 1))
    sampler = DistributedSampler(train_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=8 // dist.get_world_size(), sampler=sampler)
    eval_loader = DataLoader(eval_set, batch_size=8)
    model = DDP(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1)).to(device), device_ids=[local_rank] if torch.cuda.is_available() else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if dist.get_rank() == 0:
        os.makedirs("logs")
        with open("logs/metrics.csv", "w", newline="") as handle:
            csv.writer(handle).writerow(["epoch", "eval_loss", "correct", "total"])

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for step, (inputs, targets) in enumerate(tqdm(train_loader, desc=f"epoch {epoch}", disable=dist.get_rank() != 0)):
            inputs, targets = inputs.to(device), targets.to(device)
            loss = nn.functional.mse_loss(model(inputs), targets) / ACCUMULATION
            loss.backward()
            if (step + 1) % ACCUMULATION == 0:
                optimizer.step()
                optimizer.zero_grad()
            if step % 4 == 0:
                shown = loss.detach() * ACCUMULATION
                dist.all_reduce(shown)  # the mean over ranks, as DataParallel printed the global batch's
                if dist.get_rank() == 0:
                    print(f"train loss {shown.item() / dist.get_world_size():.4f}")
        correct, total, eval_loss = evaluate(model, eval_loader)
        if dist.get_rank() == 0:
            log.info("epoch %d: eval correct %d/%d", epoch, correct, total)
            print(f"epoch {epoch}: eval loss {eval_loss:.6f}, correct {correct} of {total}")
            with open("logs/metrics.csv", "a", newline="") as handle:
                csv.writer(handle).writerow([epoch, f"{eval_loss:.6f}", correct, total])
            torch.save(model.state_dict(), "checkpoint.pt")

    dist.barrier()  # rank 0's last save is complete
    state = torch.load("checkpoint.pt", map_location=device)
    model.load_state_dict(state)
    if dist.get_rank() == 0:
        print(f"checkpoint keys start with {sorted(state)[0]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
