"""The batches a loop that counts its steps cuts out of data held whole.

``for j in range(n_batch): idx = total_idxs[j * bs:(j + 1) * bs]`` (oreo's behaviour cloning),
``x = X[i * bs:(i + 1) * bs]``: each step takes a range of items of what was made before the
loop, at a place its counter says. Every rank counts alike and, the script's own random draws
being alike, holds the same index list: each takes its part of every such cut, DataParallel's
scatter of the step's batch. A loop that makes its data each step (``torch.randn``, an
environment's rollout) cuts nothing: it has no such draw, and stays refused.
"""

from __future__ import annotations

import libcst as cst

from ddpify.analysis.data_sites import counted_steps
from ddpify.analysis.tree import binding_targets, bound_names, dotted, walk


def sliced_draws(loop: cst.CSTNode) -> list[cst.Subscript]:
    """The outermost cuts ``value[a:b]`` in the loop whose bounds read its counter and whose
    value the loop does not bind (made before it); [] when the loop does not count steps."""
    if not isinstance(loop, cst.For) or not counted_steps(loop.iter):
        return []
    counters = set(bound_names(loop.target))
    made_here = {
        name
        for node in walk(loop.body)
        for target in binding_targets(node)
        for name in bound_names(target)
    }
    found: list[cst.Subscript] = []
    written = {id(target) for node in walk(loop.body) for target in _written(node)}
    within: set[int] = set()  # (inside a cut already found: only the outermost counts)
    for node in walk(loop.body):
        if not isinstance(node, cst.Subscript) or id(node) in written or id(node) in within:
            continue
        cut = node.slice[0].slice if len(node.slice) == 1 else None
        if not isinstance(cut, cst.Slice) or dotted(node.value) in made_here | counters | {None}:
            continue
        bounds = [part for part in (cut.lower, cut.upper) if part is not None]
        if any(isinstance(name, cst.Name) and name.value in counters for part in bounds for name in walk(part)):
            found.append(node)
            within |= {id(inner) for inner in walk(node)}
    return found


def drawn_by_torch(scope: cst.CSTNode) -> set[str]:
    """Names the scope binds to torch's random draws (``perm = torch.randperm(n)``): torch's
    stream is each rank's own after the first step (ddp_share_random_state splits it), so a
    cut of them is not alike on every rank."""
    return {
        name
        for node in walk(scope)
        if isinstance(node, cst.Assign) and any(
            isinstance(call, cst.Call) and (dotted(call.func) or "").startswith("torch.")
            and (dotted(call.func) or "").rpartition(".")[2] in TORCH_DRAWS
            for call in walk(node.value)
        )
        for target in node.targets
        for name in bound_names(target.target)
    }


TORCH_DRAWS = {"randperm", "rand", "randn", "randint", "multinomial", "normal", "bernoulli", "rand_like", "randn_like"}


def _written(node: cst.CSTNode) -> list[cst.CSTNode]:
    """What a statement writes to or deletes (``losses[i * bs:(i + 1) * bs] = ...``): no cut to read."""
    if isinstance(node, cst.Assign):
        return [target.target for target in node.targets]
    if isinstance(node, (cst.AugAssign, cst.AnnAssign)):
        return [node.target]
    if isinstance(node, cst.Del):
        return [node.target]
    return []
