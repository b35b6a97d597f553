# Flat script with shuffling and an epoch loop that has no epoch variable.
import os
import subprocess
import sys

import torch as ch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun
    os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"], LOCAL_RANK=os.environ["SLURM_LOCALID"])
    if "MASTER_ADDR" not in os.environ:
        hosts = subprocess.check_output(["scontrol", "show", "hostnames", os.environ["SLURM_NODELIST"]], text=True)
        os.environ["MASTER_ADDR"] = hosts.split()[0]
    os.environ.setdefault("MASTER_PORT", "29500")
if "RANK" not in os.environ and ch.cuda.device_count() > 1:  # plain python: one process per GPU, as DataParallel used them all
    command = [sys.executable, "-m", "ch.distributed.run", "--standalone", f"--nproc-per-node={ch.cuda.device_count()}"]
    sys.exit(subprocess.call([*command, *sys.argv]))
local_rank = int(os.environ.get("LOCAL_RANK", 0))
if ch.cuda.is_available():
    ch.cuda.set_device(local_rank)
device = ch.device("cuda", local_rank) if ch.cuda.is_available() else ch.device("cpu")
if "RANK" in os.environ:  # launched by torchrun
    dist.init_process_group("nccl" if ch.cuda.is_available() else "gloo")
else:  # plain `python flat_shuffle.py`: a world of one
    dist.init_process_group("nccl" if ch.cuda.is_available() else "gloo", store=dist.HashStore(), rank=0, world_size=1)

ch.manual_seed(2)
data = TensorDataset(ch.randn(40, 3), ch.randn(40, 1))
sampler = DistributedSampler(data, shuffle=True)
loader = DataLoader(data, batch_size=8 // dist.get_world_size(), sampler=sampler)
net = DDP(nn.Linear(3, 1).to(device), device_ids=[local_rank] if ch.cuda.is_available() else None)
opt = ch.optim.Adam(net.parameters(), lr=0.01)

epochs_done = 0
while epochs_done < 3:
    sampler.set_epoch(epochs_done)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    epochs_done += 1
    if dist.get_rank() == 0:
        print("epoch", epochs_done)

if dist.get_rank() == 0:
    ch.save(net.state_dict(), "flat_shuffle.pt")
dist.destroy_process_group()
