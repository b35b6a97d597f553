"""DDP809 (transforms/agreed_branches.py): a branch every rank must take alike is decided on
rank 0's value; tests that are the same on every rank (analysis/settled.py) are left alone."""

from __future__ import annotations

from ddpify.api import convert_source

HEAD = '''import time
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)
model = nn.DataParallel(nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
'''
STEP = '''        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def converted(body: str) -> tuple[str, list]:
    result = convert_source(HEAD + body, path="train.py")
    assert result.changed and not result.error, result.error
    return result.output, [d for d in result.diagnostics if d.code == "DDP809"]


def test_a_time_budget_that_ends_the_epoch_loop_is_decided_on_rank_zero_s_clock():
    output, agreed = converted(
        "start = time.time()\nwhile time.time() - start < 3600:\n    for x, y in loader:\n" + STEP
    )
    assert "while ddp_agreed(time.time() - start < 3600):" in output and len(agreed) == 1
    assert "def ddp_agreed(flag):" in output


def test_counters_constants_and_settings_are_left_as_they_are():
    output, agreed = converted(
        "step, warmup = 0, 2\nfor epoch in range(5):\n    for x, y in loader:\n"
        "        if step < warmup:\n            model(x)\n" + STEP + "        step += 1\n"
        "    if epoch == 3:\n        break\n"
    )
    assert not agreed and "ddp_agreed" not in output


def test_a_flag_every_call_passes_as_a_literal_is_the_same_on_every_rank():
    body = (
        "def run(data, train):\n    for x, y in data:\n        if train:\n"
        "            loss = ((model(x) - y) ** 2).mean()\n            optimizer.zero_grad()\n"
        "            loss.backward()\n            optimizer.step()\n\n\n"
        "for epoch in range(2):\n    run(loader, True)\n    run(loader, train=False)\n"
    )
    output, agreed = converted(body)
    assert not agreed, agreed


def test_a_count_kept_under_a_per_rank_test_is_not_the_same_on_every_rank():
    body = (
        "best, bad = 1e9, 0\nfor epoch in range(9):\n    for x, y in loader:\n" + STEP
        + "    val = model(torch.randn(4, 2)).std().item()\n"
        "    if val < best:\n        best = val\n        model(torch.zeros(1, 2))\n    else:\n        bad += 1\n"
        "    if bad > 2:\n        break\n"
    )
    output, agreed = converted(body)
    assert "if ddp_agreed(val < best):" in output
    assert "if ddp_agreed(bad > 2):" in output or "ddp_mean(bad)" in output


def test_a_test_not_every_rank_reaches_is_left_alone():
    body = (
        "for epoch in range(3):\n    for x, y in loader:\n" + STEP
        + "    try:\n        value = float(open('stop.txt').read())\n    except OSError:\n"
        "        if loss.item() < 0.1:\n            break\n"
    )
    output, agreed = converted(body)
    assert not agreed and "ddp_agreed(loss" not in output


def test_a_skip_on_what_the_loop_draws_is_decided_alike():
    # NetVlad: `if query is None: continue` when a share holds no valid triplet
    output, _ = converted(
        "for epoch in range(2):\n    for i, (x, y) in enumerate(loader):\n        if x is None:\n            continue\n"
        "        if i > 100:\n            break\n" + STEP
    )
    assert "if ddp_any(x is None):" in output and "if i > 100:" in output


def test_a_patience_count_kept_under_a_per_rank_test_decides_its_stop_on_rank_zero():
    output, _ = converted(
        "best, bad = 1e9, 0\nfor epoch in range(9):\n    for x, y in loader:\n" + STEP
        + "    model.eval()\n    val_loss = model(torch.randn(4, 2)).std().item()\n"
        "    if val_loss < best:\n        best = val_loss\n        bad = 0\n    else:\n        bad += 1\n"
        "    if bad >= 3:\n        break\n"
    )
    assert "if ddp_agreed(bad >= 3):" in output or "ddp_mean(bad)" in output


def test_a_test_inside_a_block_rank_zero_runs_alone_is_not_a_collective():
    # (a `with open(...)` block around a stop test runs on rank 0 alone: a broadcast there would
    # meet the other ranks' barrier)
    output, _ = converted(
        "class Stop:\n    def __init__(self):\n        self.stop = False\n\n    def update(self, value):\n"
        "        self.stop = value < 0.1\n\n\nstopper = Stop()\nfor epoch in range(3):\n    for x, y in loader:\n" + STEP
        + "    stopper.update(loss.item())\n    with open('log.txt', 'a') as f:\n        f.write('epoch')\n"
        "        if stopper.stop:\n            f.write('stop')\n"
    )
    with_block = output[output.index("with open('log.txt'"):]
    assert "ddp_agreed" not in with_block.split("\n\n")[0]


def test_every_summed_term_divided_by_a_count_later_keeps_no_factor():
    output, _ = converted(
        "crit = torch.nn.MSELoss(reduction='sum')\naux = torch.nn.L1Loss(reduction='sum')\n"
        "for epoch in range(2):\n    for x, y in loader:\n        out = model(x)\n        n = torch.sum(y > 0)\n"
        "        loss = 0\n        for i in range(len(x)):\n            loss += crit(out[i], y[i])\n"
        "        for i in range(len(x)):\n            loss += aux(out[i], y[i])\n        loss /= n.float()\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n"
    )
    assert "loss /= ddp_mean(n.float())" in output and "get_world_size()\n" not in output.split("for epoch")[1]
