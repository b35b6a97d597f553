"""FashionMNIST-style DataParallel training (shape of the seed article), synthetic data."""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
import os
import subprocess
import sys
import time
os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
os.environ["CUDA_VISIBLE_DEVICES"] = "0,3"


# Define model
class NeuralNetwork(nn.Module):
    def __init__(self):
        super(NeuralNetwork, self).__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28*28, 64),
            nn.ReLU(),
            nn.Linear(64, 10)
        )

    def forward(self, x):
        x = self.flatten(x)
        logits = self.linear_relu_stack(x)
        return logits


def train(dataloader, model, loss_fn, optimizer):
    size = len(dataloader.dataset)
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        X, y = X.to(device), y.to(device)

        # Compute prediction error
        pred = model(X)
        loss = loss_fn(pred, y)

        # Backpropagation
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if batch % 4 == 0:
            loss = loss.detach().clone()
            dist.all_reduce(loss)  # the mean over ranks, as DataParallel printed the global batch's
            loss, current = loss.item() / dist.get_world_size(), batch * len(X)
        if batch % 4 == 0 and dist.get_rank() == 0:
            print(f"loss: {loss:>7f}  [{current:>5d}/{size:>5d}]")


def test(dataloader, model, loss_fn):
    size = len(dataloader.dataset)
    num_batches = len(dataloader)
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            X, y = X.to(device), y.to(device)
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    test_loss /= num_batches
    correct /= size
    if dist.get_rank() == 0:
        print(f"Test Error: \n Accuracy: {(100*correct):>0.1f}%, Avg loss: {test_loss:>8f} \n")


if __name__ == '__main__':
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
    else:  # plain `python fashion_mnist.py`: a world of one
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    # Synthetic stand-in for FashionMNIST: 256 training and 100 test images.
    training_data = TensorDataset(torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,)))
    test_data = TensorDataset(torch.randn(100, 1, 28, 28), torch.randint(0, 10, (100,)))

    batch_size = 32

    # Create data loaders.
    train_sampler = DistributedSampler(training_data, shuffle=False)
    train_dataloader = DataLoader(training_data, batch_size=batch_size // dist.get_world_size(), sampler=train_sampler)
    test_dataloader = DataLoader(test_data, batch_size=batch_size)

    model = NeuralNetwork()
    #model = nn.DataParallel(model,device_ids = [0,1])
    model.to(device)
    model = DDP(model, device_ids=[local_rank] if torch.cuda.is_available() else None)

    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)

    epochs = 3
    T1 = time.time()
    for t in range(epochs):
        train_sampler.set_epoch(t)
        if dist.get_rank() == 0:
            print(f"Epoch {t+1}\n-------------------------------")
        train(train_dataloader, model, loss_fn, optimizer)
        test(test_dataloader, model, loss_fn)
    T2 = time.time()
    if dist.get_rank() == 0:
        print('time is %s ms' % ((T2 - T1) * 1000))
        torch.save(model.state_dict(), os.environ.get("DDPIFY_WEIGHTS", "model.pth"))
        print("Done!")
    dist.destroy_process_group()
