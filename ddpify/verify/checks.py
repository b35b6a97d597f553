"""The verdicts of ``ddpify verify``, computed from what the probe recorded on each rank.

Pure Python over the probe's ``rank<R>.json`` reports: the CLI process never imports torch.
Each check returns a :class:`Check` (PASS/FAIL, or SKIP when it does not apply, with a
one-line reason).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: not applicable (skipped)
    reason: str

    @property
    def verdict(self) -> str:
        return "SKIP" if self.passed is None else "PASS" if self.passed else "FAIL"


@dataclass(frozen=True)
class LaunchOutcome:
    """How the launched world ended, as the launcher saw it."""

    world_size: int
    returncode: int | None
    timed_out: bool
    seconds: float
    output_tail: str = ""


def run_checks(outcome: LaunchOutcome, reports: dict[int, dict]) -> list[Check]:
    if len(reports) != outcome.world_size:
        return [ranks_finish(outcome, reports)]  # the other verdicts need every rank's report
    return [
        ranks_finish(outcome, reports),
        process_group_and_ddp(outcome, reports),
        ranks_agree_while_training(reports),
        weights_in_sync(reports),
        trained_parameters_in_ddp(reports),
        hyper_parameters_agree(reports),
        samples_once_per_epoch(reports),
        order_changes_each_epoch(reports),
        written_once("checkpoints written by one rank", _saves(reports), "checkpoint"),
        written_once("files written by one rank", _written_files(reports), "file"),
        lines_printed_once(reports),
    ]


def ranks_finish(outcome: LaunchOutcome, reports: dict[int, dict]) -> Check:
    name = "every rank finishes"
    if outcome.timed_out:
        return Check(name, False, f"timed out after {outcome.seconds:.0f} s (a rank hung: a collective only some ranks reached?)")
    missing = sorted(set(range(outcome.world_size)) - set(reports))
    if missing:
        return Check(name, False, f"rank(s) {_list(missing)} left no report (crashed before the end); launcher exit {outcome.returncode}")
    failed = {rank: r for rank, r in sorted(reports.items()) if r["status"] != 0}
    if failed:
        rank, report = next(iter(failed.items()))
        last = (report.get("error") or "").strip().splitlines()[-1:] or [""]
        return Check(name, False, f"rank(s) {_list(failed)} exited {report['status']}: {last[0]}")
    if outcome.returncode not in (0, None):
        return Check(name, False, f"the launcher exited {outcome.returncode}")
    return Check(name, True, f"{outcome.world_size} ranks exited 0 in {outcome.seconds:.1f} s")


def _divergence(reports: dict[int, dict]) -> dict | None:
    return next((r["diverged"] for _, r in sorted(reports.items()) if r.get("diverged")), None)


def ranks_agree_while_training(reports: dict[int, dict]) -> Check:
    """The probe's cross-rank check (what the converted script's own ``ddp_after_step`` did):
    after each optimizer's steps 1, 2, 4, 8, ... every rank's trained tensors, weights (sums
    and sums of squares) and learning rates, all-reduced; the first step they were apart."""
    name = "ranks agree during training"
    diverged = _divergence(reports)
    if diverged:
        apart = diverged["apart"]
        what = [label for label, keys in (
            ("numbers of trained parameter tensors", ("trained parameter tensors",)),
            ("learning rates", ("learning rates",)),
            ("weights", ("weights (sums)", "weights (sums of squares)")),
        ) if any(key in apart for key in keys)]
        odd = _ranks_apart(reports)
        who = f" (rank(s) {_list(odd)} differ from rank 0)" if odd else ""
        rates = ""
        if "learning rates" in apart:
            rates = f"; learning rates from {diverged['smallest'][1]:g} to {diverged['largest'][1]:g}"
        return Check(
            name, False,
            f"after step {diverged['step']} of optimizer {diverged['optimizer']} the ranks hold different "
            f"{' and '.join(what)}{who}{rates}: part of the model is trained outside DistributedDataParallel "
            "(a wrap that did not run on every rank, a module the optimizer trains outside the wrap), or one rank "
            "decided alone (a learning rate set from its own loss)",
        )
    made = max((r.get("sync_checks", 0) for r in reports.values()), default=0)
    if not made:
        return Check(name, None, "no optimizer stepped under a process group of more than one rank")
    return Check(
        name, True,
        f"{made} check(s) after optimizer steps 1, 2, 4, ...: the same weights and learning rates on every rank",
    )


def _ranks_apart(reports: dict[int, dict]) -> list[int]:
    """Ranks whose own fingerprint at the failing check differs from rank 0's."""
    mine = {rank: (r.get("diverged") or {}).get("mine") for rank, r in sorted(reports.items())}
    first = mine.get(0)
    if first is None:
        return []
    return [
        rank for rank, values in mine.items()
        if values is not None and any(not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(first, values))
    ]


def _kept_together(reports: dict[int, dict]) -> bool:
    """Every rank stepped and was checked against the others, and none drifted apart."""
    return all(r.get("sync_checks", 0) > 0 and r.get("steps", 0) > 0 for r in reports.values()) and not _divergence(reports)


def process_group_and_ddp(outcome: LaunchOutcome, reports: dict[int, dict]) -> Check:
    name = "process group and DDP model on every rank"
    if not reports:
        return Check(name, False, "no rank reported")
    without_group = [rank for rank, r in sorted(reports.items()) if not r["process_group"]]
    if without_group:
        return Check(name, False, f"rank(s) {_list(without_group)} never called init_process_group")
    sizes = {r["process_group"]["world_size"] for r in reports.values()}
    if sizes != {outcome.world_size}:
        return Check(name, False, f"world sizes {sorted(sizes)} reported, {outcome.world_size} launched")
    backend = next(iter(reports.values()))["process_group"]["backend"]
    without_ddp = [rank for rank, r in sorted(reports.items()) if not r["ddp_models"]]
    if without_ddp and outcome.world_size == 1:  # a world of one has no gradients to average
        return Check(name, True, f"{backend}, world size 1: the model need not be wrapped in DDP")
    if len(without_ddp) == len(reports) and _kept_together(reports):
        # (a wrap whose module trains nothing builds no DDP; the weights trained beside it had their
        # gradients averaged all the same, as the cross-rank checks after the steps show)
        checks = max(r.get("sync_checks", 0) for r in reports.values())
        return Check(name, True, f"{backend}, world size {outcome.world_size}: no DDP model (no wrapped module trains), "
                     f"the trained weights agreed on every rank at {checks} check(s)")
    if without_ddp:
        return Check(name, False, f"rank(s) {_list(without_ddp)} never built a DistributedDataParallel model")
    return Check(name, True, f"{backend}, world size {outcome.world_size}, ranks {_list(sorted(reports))}")


def weights_in_sync(reports: dict[int, dict]) -> Check:
    """Compared right after the last optimizer step: a script may overwrite the weights
    before it exits (every rank loading rank 0's checkpoint) and hide ranks that trained apart."""
    name = "weights identical across ranks"
    after_step = {rank: r["weights"]["after_last_step"] for rank, r in reports.items()}
    if not any(after_step.values()):
        return _exit_weights_in_sync(name, reports)
    idle = sorted(rank for rank, weights in after_step.items() if weights is None)
    if idle:
        return Check(name, False, f"rank(s) {_list(idle)} never stepped an optimizer; the others did")
    broken = _nonfinite(after_step)
    if broken:
        return Check(name, False, f"{broken} after the last optimizer step")
    if _same_hash(after_step):
        count = next(iter(after_step.values()))["count"]
        return Check(name, True, f"{count} parameter values after the last optimizer step, the same bytes on every rank")
    at_exit = {rank: r["weights"]["at_exit"] for rank, r in reports.items()}
    hidden = "; at exit they agree: the script overwrote the weights after training" if _same_hash(at_exit) else ""
    return Check(name, False, f"after the last optimizer step ranks disagree: {_hash_groups(after_step)}{hidden}")


def _exit_weights_in_sync(name: str, reports: dict[int, dict]) -> Check:
    at_exit = {rank: r["weights"]["at_exit"] for rank, r in reports.items()}
    if None in at_exit.values():
        return Check(name, None, "no optimizer stepped and no DDP model parameters recorded")
    broken = _nonfinite(at_exit)
    if broken:
        return Check(name, False, f"{broken} at exit")
    if _same_hash(at_exit):
        count = next(iter(at_exit.values()))["count"]
        return Check(name, True, f"no optimizer stepped; {count} parameter values at exit, the same bytes on every rank")
    return Check(name, False, f"no optimizer stepped; at exit ranks disagree: {_hash_groups(at_exit)}")


def _nonfinite(weights: dict[int, dict]) -> str:
    """'rank(s) ... hold N NaN or infinite weight value(s)', or '' (NaN has the same bytes
    on every rank, so equal hashes alone would pass a run that diverged)."""
    broken = {rank: w["nonfinite"] for rank, w in sorted(weights.items()) if w["nonfinite"]}
    if not broken:
        return ""
    counts = ", ".join(f"{n} on rank {rank}" for rank, n in broken.items())
    return f"rank(s) {_list(broken)} hold NaN or infinite weights ({counts})"


def _same_hash(weights: dict[int, dict | None]) -> bool:
    return None not in weights.values() and len({w["hash"] for w in weights.values()}) == 1


def _hash_groups(weights: dict[int, dict]) -> str:
    groups = defaultdict(list)
    for rank, summary in sorted(weights.items()):
        groups[summary["hash"][:12]].append(rank)
    return "; ".join(f"{_list(ranks)} -> {digest}" for digest, ranks in groups.items())


def trained_parameters_in_ddp(reports: dict[int, dict]) -> Check:
    """Gradients of a parameter outside DDP are not averaged: each rank trains it on its own
    shard, and the ranks' models drift apart (or the conversion missed a model)."""
    name = "every trained parameter is inside a DDP module"
    if len(reports) == 1 and all(r["process_group"].get("world_size") == 1 for r in reports.values() if r["process_group"]):
        return Check(name, None, "a world of one: no gradients to average")
    stepped = {rank: [o for o in r["optimizers"] if o["steps"]] for rank, r in sorted(reports.items())}
    if not any(stepped.values()):
        return Check(name, None, "no optimizer stepped")
    outside = {rank: sum(o["outside_ddp"] for o in found) for rank, found in stepped.items()}
    trained = {rank: sum(o["trained_params"] for o in found) for rank, found in stepped.items()}
    failing = [rank for rank, count in outside.items() if count]
    if failing:
        rank, others = failing[0], failing[1:]
        also = f" (and on rank(s) {_list(others)})" if others else ""
        return Check(
            name, False,
            f"{outside[rank]} of {trained[rank]} trained parameter tensor(s) on rank {rank}{also} are in no "
            "DistributedDataParallel module built on that rank by its optimizer's first step: "
            "DDP does not average their gradients",
        )
    count = max(trained.values())
    return Check(name, True, f"{count} trained parameter tensor(s) in {max(map(len, stepped.values()))} optimizer(s), all inside DDP")


def hyper_parameters_agree(reports: dict[int, dict]) -> Check:
    """Each stepped optimizer's param-group lr, momentum, weight decay and betas after its
    last step (a scheduler fed a rank's own loss, or a rank-dependent lr, splits them)."""
    name = "optimizer hyper-parameters agree across ranks"
    seen = {rank: [o["hyper"] for o in r["optimizers"] if o["steps"]] for rank, r in sorted(reports.items())}
    if not any(seen.values()):
        return Check(name, None, "no optimizer stepped")
    first_rank, first = next(iter(seen.items()))
    for rank, hyper in seen.items():
        if len(hyper) != len(first):
            return Check(name, False, f"rank {first_rank} stepped {len(first)} optimizer(s), rank {rank} {len(hyper)}")
        difference = _first_difference(first, hyper)
        if difference:
            where, mine, theirs = difference
            return Check(name, False, f"{where}: {mine} on rank {first_rank}, {theirs} on rank {rank}")
    rates = sorted({_plain_text(g.get("lr")) for optimizer in first for g in optimizer})
    return Check(name, True, f"{len(first)} optimizer(s) after their last step, lr {', '.join(rates)} on every rank")


def _first_difference(left: list[list[dict]], right: list[list[dict]]) -> tuple[str, str, str] | None:
    for number, (groups_a, groups_b) in enumerate(zip(left, right)):
        if len(groups_a) != len(groups_b):
            return f"optimizer {number} param groups", str(len(groups_a)), str(len(groups_b))
        for index, (a, b) in enumerate(zip(groups_a, groups_b)):
            for key in sorted(set(a) | set(b)):
                if not _same_value(a.get(key), b.get(key)):
                    return f"optimizer {number} group {index} {key}", _plain_text(a.get(key)), _plain_text(b.get(key))
    return None


def _same_value(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return a == b or both_nan


def _plain_text(value) -> str:
    if isinstance(value, list):
        return "(" + ", ".join(_plain_text(v) for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) else str(value)


# -- samplers ----------------------------------------------------------------------------------


def training_passes(reports: dict[int, dict]) -> dict[tuple[str, int], dict[int, dict]]:
    """(loop site, pass number) -> rank -> the sampler pass, for loops that stepped an optimizer."""
    passes: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
    for rank, report in reports.items():
        seen: Counter = Counter()
        for record in report["samplers"]:
            number = seen[record["site"]]
            seen[record["site"]] += 1
            passes[(record["site"], number)][rank] = record
    return {
        key: by_rank
        for key, by_rank in passes.items()
        if any(r["steps_at_end"] > r["steps_at_start"] for r in by_rank.values())
    }


def samples_once_per_epoch(reports: dict[int, dict]) -> Check:
    name = "each training sample once per epoch"
    passes = training_passes(reports)
    if not passes:
        return Check(name, None, "no loader was iterated while an optimizer stepped")
    world = len(reports)
    checked = 0
    for (site, number), by_rank in sorted(passes.items()):
        problem = _pass_problem(by_rank, world)
        if problem:
            return Check(name, False, f"loop at {site}, pass {number + 1}: {problem}")
        checked += all(r["complete"] for r in by_rank.values())
    partial = len(passes) - checked
    suffix = f" ({partial} partial, checked for overlap only)" if partial else ""
    return Check(name, True, f"{checked} complete training epoch(s) across {world} ranks{suffix}")


def _pass_problem(by_rank: dict[int, dict], world: int) -> str | None:
    first = next(iter(by_rank.values()))
    size = first["dataset_size"]
    if len(by_rank) != world:
        return f"only rank(s) {_list(sorted(by_rank))} trained in this loop"
    if not first["distributed"] and world > 1:
        return (
            f"{first['kind']} over {size} samples is not sharded: every rank trains on all of it, "
            f"each sample {world} times per epoch (use a DistributedSampler)"
        )
    if first.get("whole"):
        return _whole_batches_problem(by_rank)
    return _split_problem(by_rank) or _coverage_problem(by_rank, world)


def _whole_batches_problem(by_rank: dict[int, dict]) -> str | None:
    """Batches every rank holds whole (the model's calls take each rank's share) must be the
    same batches on every rank, or the gathered outputs mix samples of different batches."""
    first = next(iter(by_rank.values()))["indices"]
    differ = [rank for rank, record in sorted(by_rank.items()) if record["indices"] != first]
    return f"rank(s) {_list(differ)} drew other whole batches than rank 0" if differ else None


def _coverage_problem(by_rank: dict[int, dict], world: int) -> str | None:
    """Indices are the base dataset's (through any Subset), so ranks are compared by sample."""
    first = next(iter(by_rank.values()))
    size = first["dataset_size"]
    counts = Counter(i for r in by_rank.values() for i in r["indices"])
    repeated = sum(n - 1 for n in counts.values())
    if size is None:
        return None
    padding = 0 if first["drop_last"] else math.ceil(size / world) * world - size
    # A Subset that lists a sample twice draws it twice in one process too.
    listed_twice = size - first["subset"]["distinct"] if first.get("subset") else 0
    if repeated > padding + listed_twice:
        return f"{repeated} sample draws repeat across ranks, more than the sampler's padding of {padding}"
    if not all(r["complete"] for r in by_rank.values()):
        return None
    missing = size - listed_twice - len(counts)
    allowed = size % world if first["drop_last"] else 0
    if missing > allowed:
        return f"{missing} of {size} samples never seen by any rank"
    return None


def _split_problem(by_rank: dict[int, dict]) -> str | None:
    """Ranks whose loaders wrap different Subsets (a random_split each rank draws itself)
    shard different lists: positions agree, the samples behind them do not."""
    digests = defaultdict(list)
    for rank, record in sorted(by_rank.items()):
        digests[(record.get("subset") or {}).get("digest")].append(rank)
    if len(digests) < 2:
        return None
    groups = " / ".join(_list(ranks) for ranks in digests.values())
    return (
        f"ranks {groups} shard different subsets of the dataset: a random split or permutation "
        "not made the same on every rank, so some samples are trained twice and some never"
    )


def order_changes_each_epoch(reports: dict[int, dict]) -> Check:
    name = "new order every epoch when shuffling"
    by_site: dict[str, list] = defaultdict(list)
    for (site, number), by_rank in sorted(training_passes(reports).items()):
        if all(r["distributed"] and r["shuffle"] for r in by_rank.values()):
            by_site[site].append(by_rank)
    if not by_site:
        return Check(name, None, "no shuffled DistributedSampler in training")
    for site, epochs in by_site.items():
        if len(epochs) < 2:
            continue
        for rank in epochs[0]:
            values = [epoch[rank]["epoch"] for epoch in epochs if rank in epoch]
            if len(set(values)) < len(values):
                return Check(
                    name, False,
                    f"loop at {site}: rank {rank} sampler epoch stayed {values[:4]}: set_epoch is not "
                    "called each epoch, so every epoch repeats one order",
                )
            orders = [tuple(epoch[rank]["indices"]) for epoch in epochs if rank in epoch]
            if len(set(orders)) < len(orders):
                return Check(name, False, f"loop at {site}: rank {rank} drew the same order in two epochs")
    epochs = max(len(e) for e in by_site.values())
    if epochs < 2:
        return Check(name, None, "fewer than two epochs ran")
    return Check(name, True, f"set_epoch moved the order in each of {epochs} epochs")


# -- side effects ------------------------------------------------------------------------------


def _saves(reports: dict[int, dict]) -> dict[str, set[int]]:
    writers: dict[str, set[int]] = defaultdict(set)
    for rank, report in reports.items():
        for save in report["saves"]:
            writers[save["path"]].add(rank)
    return writers


def _written_files(reports: dict[int, dict]) -> dict[str, set[int]]:
    saved = set(_saves(reports))
    writers: dict[str, set[int]] = defaultdict(set)
    for rank, report in reports.items():
        for written in report["written_files"]:
            if written["path"] not in saved:
                writers[written["path"]].add(rank)
    return writers


def written_once(name: str, writers: dict[str, set[int]], what: str) -> Check:
    return _one_rank_each(name, writers, what, "written by", f"no {what} written")


def lines_printed_once(reports: dict[int, dict]) -> Check:
    printers: dict[str, set[int]] = defaultdict(set)
    for rank, report in reports.items():
        for key in report["outputs"]:  # "stdout file:line"
            printers[key.split(" ", 1)[1]].add(rank)
    return _one_rank_each("no line printed by more than one rank", printers, "printing line", "printed on", "nothing printed")


def _one_rank_each(name: str, owners: dict[str, set[int]], what: str, verb: str, nothing: str) -> Check:
    """PASS when each path / line belongs to one rank; FAIL names the first shared one."""
    if not owners:
        return Check(name, None, nothing)
    shared = sorted(key for key, ranks in owners.items() if len(ranks) > 1)
    if shared:
        more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
        return Check(name, False, f"{shared[0]} {verb} ranks {_list(sorted(owners[shared[0]]))}{more}")
    return Check(name, True, f"{len(owners)} {what}(s), each by one rank")


def _list(ranks) -> str:
    return ",".join(str(r) for r in ranks)
