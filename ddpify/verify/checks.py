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
        weights_in_sync(reports),
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
    without_ddp = [rank for rank, r in sorted(reports.items()) if not r["ddp_models"]]
    if without_ddp:
        return Check(name, False, f"rank(s) {_list(without_ddp)} never built a DistributedDataParallel model")
    backend = next(iter(reports.values()))["process_group"]["backend"]
    return Check(name, True, f"{backend}, world size {outcome.world_size}, ranks {_list(sorted(reports))}")


def weights_in_sync(reports: dict[int, dict]) -> Check:
    name = "weights identical across ranks"
    hashes = {rank: r["param_hash"] for rank, r in reports.items()}
    if None in hashes.values():
        return Check(name, None, "no optimizer or DDP model parameters recorded")
    if len(set(hashes.values())) == 1:
        count = next(iter(reports.values()))["param_count"]
        return Check(name, True, f"{count} parameters, the same bytes on every rank")
    groups = defaultdict(list)
    for rank, digest in sorted(hashes.items()):
        groups[digest[:12]].append(rank)
    return Check(name, False, "ranks disagree: " + "; ".join(f"{_list(r)} -> {h}" for h, r in groups.items()))


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
    counts = Counter(i for r in by_rank.values() for i in r["indices"])
    repeated = sum(n - 1 for n in counts.values())
    if size is None:
        return None
    padding = 0 if first["drop_last"] else math.ceil(size / world) * world - size
    if repeated > padding:
        return f"{repeated} sample draws repeat across ranks, more than the sampler's padding of {padding}"
    if not all(r["complete"] for r in by_rank.values()):
        return None
    missing = size - len(counts)
    allowed = size % world if first["drop_last"] else 0
    if missing > allowed:
        return f"{missing} of {size} samples never seen by any rank"
    return None


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
