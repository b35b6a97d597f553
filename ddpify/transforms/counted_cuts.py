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

(A loop that makes its data each step, or trains on a whole graph, cuts nothing: refused,
DDP304. The analysis is analysis/counted_draws.py; the loops are chosen in SamplerTransform's
check, which no longer refuses them.)
"""

from __future__ import annotations

import libcst as cst

from ddpify.transforms.base import Transform


class CountedCutsTransform(Transform):
    CODE_PREFIX = "DDP31"

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
