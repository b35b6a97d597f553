"""DDP31x: a loop that counts its steps and cuts each step's batch out of data held whole.

``for j in range(n_batch):`` with ``idx = total_idxs[j * bs:(j + 1) * bs]`` or ``x = X[i * bs:(i
+ 1) * bs]`` draws from no DataLoader (oreo's behaviour cloning, older scripts over tensors in
memory). Every rank counts alike and holds the same data and the same index list (the script's
own random draws are alike on every rank): each takes its contiguous part of every cut, as
DataParallel's scatter split the step's batch, and DDP's average is the global batch's mean
(exactly where the cut divides evenly among the ranks).

DDP315  each rank takes its part of every cut the counted loop makes::

    batch_idxs = total_idxs[j * bs:(j + 1) * bs]
    # becomes
    batch_idxs = ddp_part(total_idxs[j * bs:(j + 1) * bs], dist.get_world_size(), dist.get_rank())

DDP316  a loop that counts its steps and trains each step on one tensor made before it, whole
(mcr2's full-batch ``Z_train = net(X_train)``): each rank runs the model on its part of it and
gets every rank's outputs, as DataParallel's scatter and gather did, so the loss and whatever
else reads the outputs see all of them (a value with no first dimension to split runs whole on
every rank)::

    Z_train = net(X_train)   ->   Z_train = ddp_scattered(net, X_train)

(A loop that makes its data each step, or hands the model more than one value, a graph's
``model(features, adj)``, cuts nothing: refused, DDP304. The analysis is
analysis/counted_draws.py and analysis/scatter_points.py' whole_data_steps; the loops are chosen
in SamplerTransform's check, which no longer refuses them.)
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.scatter_points import whole_data_steps
from ddpify.transforms.base import Transform


class CountedCutsTransform(Transform):
    CODE_PREFIX = "DDP31"

    def check(self) -> None:
        if not self.facts.wraps or self.context.is_library:
            return
        scattered = self.context.scattered_loops
        for loop, calls in whole_data_steps(self.facts).items():
            if scattered.get(loop) != calls:
                continue
            shown = self.context.code(calls[0].args[0].value)
            self.context.report(
                calls[0], "DDP316",
                f"each step trains on `{shown}` whole, made before the loop: each rank runs the model on its part of it "
                "and gets every rank's outputs (ddp_scattered), as DataParallel's scatter and gather did",
            )

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        if original_node not in self.context.split_cuts:
            return updated_node
        self.context.report(
            original_node, "DDP315",
            f"each step's batch is cut out of data held whole (`{self.context.code(original_node)}`): every rank "
            "cuts alike and takes its part (ddp_part), as DataParallel's scatter split the batch",
        )
        world, rank = cst.parse_expression("dist.get_world_size()"), cst.parse_expression("dist.get_rank()")
        return cst.Call(func=cst.Name("ddp_part"), args=[cst.Arg(updated_node), cst.Arg(world), cst.Arg(rank)])
