"""Run converted fixtures for real: 2 gloo ranks under torchrun, and as a world of one.

Each fixtures/e2e/<name>.py is run three ways under the probe (ddpify.verify.probe):
the original as one process, the converted script under
`python -m torch.distributed.run --standalone --nproc-per-node=2`, and the converted script
as plain `python` (a world of one). The assertions are about behaviour: exit codes, each
line printed once, identical weights on both ranks, set_epoch once per epoch, and, for
fixtures without shuffling, the same final weights as the original.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import FIXTURES, fixture_inputs, run_launched
from ddpify.api import convert_source
from ddpify.verify.checks import LaunchOutcome, run_checks
from ddpify.verify.runner import _reports

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.e2e
CASES = fixture_inputs("e2e")
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def golden(case: Path) -> str:
    """The converted script, as tests/test_golden.py holds the conversion to it."""
    return case.with_name(case.stem + ".ddp.py").read_text()


# Loaders sharded where they are built get set_epoch in their epoch loop; ddp_shard moves its
# shard to the next epoch on each pass itself (tests/test_template.py).
# (the ddp_shard template's own `self.sampler.set_epoch` forwards to a user's sampler: not a match)
WITH_EPOCHS = [case for case in CASES if re.search(r"(?<!self)\.sampler\.set_epoch\(|ddp_next_epoch\(", golden(case))]
# DistributedSampler draws another order than RandomSampler did, and an unseeded fixture's
# random draws cannot be reproduced: their weights differ from the original's by design
# (rank agreement and set_epoch are still asserted on them).
REPRODUCIBLE = [case for case in CASES if "shuffle=True" not in case.read_text() and "e2e: unseeded" not in case.read_text()]


def grouped(cases: list[Path]) -> list:
    """Each fixture's tests in a group of their own, run by one test worker: its module-scoped
    runs are made once and shared, and the fixtures spread over the workers."""
    return [pytest.param(case, marks=pytest.mark.xdist_group(f"e2e-{case.stem}"), id=case.name) for case in cases]


def over(cases: list[Path]):
    """Run a test on these fixtures' runs only (the runs fixture is shared: one set of runs
    per fixture, whichever tests ask for it)."""
    return pytest.mark.parametrize("runs", grouped(cases), indirect=True)


def only(name: str):
    return over([FIXTURES / "e2e" / f"{name}.py"])


def run(command: list[str], cwd: Path, probe_dir: Path) -> subprocess.CompletedProcess:
    probe_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DDPIFY_PROBE_DIR": str(probe_dir), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        env.pop(name, None)
    result = run_launched(command, cwd=cwd, env=env, timeout=300)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def params(probe_dir: Path, rank: int = 0) -> list:
    return torch.load(probe_dir / f"rank{rank}.pt")["params"]


def epochs(probe_dir: Path, rank: int = 0) -> list[int]:
    return torch.load(probe_dir / f"rank{rank}.pt")["set_epoch"]


def assert_same(left: list, right: list, exact: bool = False) -> None:
    assert len(left) == len(right) and left, "the same optimizers, with parameters"
    for group_a, group_b in zip(left, right):
        assert len(group_a) == len(group_b)
        for a, b in zip(group_a, group_b):
            assert torch.equal(a, b) if exact else torch.allclose(a, b, **TOLERANCE), (a - b).abs().max()


def stdout_lines(result: subprocess.CompletedProcess) -> Counter:
    """Printed lines by label (text before any ':'), numbers masked: values may differ."""
    labels = (re.sub(r"\d+(\.\d+)?", "#", line.split(":")[0]) for line in result.stdout.splitlines())
    return Counter(label for label in labels if label.strip())


@pytest.fixture(scope="module", params=grouped(CASES))
def runs(request, tmp_path_factory):
    case: Path = request.param
    work = tmp_path_factory.mktemp(case.stem)
    (work / "original").mkdir()
    original = work / "original" / case.name
    original.write_text(case.read_text())
    converted = work / case.name
    result = convert_source(case.read_text(), path=case.name)
    assert result.changed and not result.error
    converted.write_text(result.output)
    probe = [sys.executable, "-m", "ddpify.verify.probe"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    # The two one-process runs side by side (one core each), then the two ranks: CI's time.
    with ThreadPoolExecutor(2) as pool:
        original_run = pool.submit(run, [*probe, str(original)], original.parent, work / "p-original")
        single_run = pool.submit(run, [*probe, str(converted)], work, work / "p-single")
        ones = {"original": original_run.result(), "single": single_run.result()}
    return {
        "case": case,
        **ones,
        "ddp": run([*torchrun, "-m", "ddpify.verify.probe", str(converted)], work, work / "p-ddp"),
        "dir": work,
    }


def test_both_ranks_end_with_identical_weights(runs):
    assert_same(params(runs["dir"] / "p-ddp", 0), params(runs["dir"] / "p-ddp", 1), exact=True)


def test_verify_passes_every_check_on_the_two_rank_run(runs):
    # `ddpify verify`'s checks, read from this run's probe reports (the same probe verify
    # launches): one set of runs per fixture serves both (tests/test_verify.py launches verify
    # itself on the fixtures whose equivalence only verify's shuffling-off run can show).
    outcome = LaunchOutcome(2, runs["ddp"].returncode, False, 0.0, runs["ddp"].stderr[-3000:])
    found = {check.name: check for check in run_checks(outcome, _reports(runs["dir"] / "p-ddp"))}
    failed = {name: check.reason for name, check in found.items() if check.passed is False}
    assert not failed, failed
    for name in ("every rank finishes", "weights identical across ranks", "no line printed by more than one rank"):
        assert found[name].verdict == "PASS", (name, found[name].reason)
    # (batches split at run time from a list or a generator: no loader whose samples verify could count)
    no_loader = "e2e: no loader" in runs["case"].read_text()
    assert found["each training sample once per epoch"].verdict == ("SKIP" if no_loader else "PASS")
    if "shuffle=True" in runs["case"].read_text():
        assert found["new order every epoch when shuffling"].verdict == "PASS"


def test_each_line_is_printed_once(runs):
    converted, original = stdout_lines(runs["ddp"]), stdout_lines(runs["original"])
    assert set(original) <= set(converted)
    # As often as the original printed it; a line the original's single process skipped
    # (a branch that only multi-GPU DataParallel took) appears once, not once per rank.
    assert {label: converted[label] for label in converted} == {
        label: original.get(label, 1) for label in converted
    }


@over(WITH_EPOCHS)
def test_set_epoch_is_called_every_epoch_on_every_rank(runs):
    assert "set_epoch(" in (runs["dir"] / runs["case"].name).read_text()
    for rank in (0, 1):
        seen = epochs(runs["dir"] / "p-ddp", rank)
        # one run of n, n + 1, n + 2, ... per epoch loop (a warm-up loop, then the main one;
        # `for epoch in range(1, epochs + 1)` counts from 1)
        starts = [i for i, epoch in enumerate(seen) if i == 0 or epoch != seen[i - 1] + 1]
        assert seen and all(seen[begin] in (0, 1) for begin in starts), seen
        for begin, end in zip(starts, [*starts[1:], len(seen)]):
            assert end - begin >= 2, seen


@over(REPRODUCIBLE)
def test_world_of_one_matches_the_original(runs):
    assert_same(params(runs["dir"] / "p-single"), params(runs["dir"] / "p-original"))


@over(REPRODUCIBLE)
def test_two_ranks_match_the_original_when_not_shuffling(runs):
    assert_same(params(runs["dir"] / "p-ddp"), params(runs["dir"] / "p-original"))


def lines_with(text: str, fragment: str) -> list[str]:
    return [line for line in text.splitlines() if fragment in line]


@only("side_effects")
def test_evaluation_on_an_odd_sized_set_reports_exactly_what_the_original_did(runs):
    original = lines_with(runs["original"].stdout, "eval loss")
    assert len(original) == 3 and "of 37" in original[0]
    assert lines_with(runs["ddp"].stdout, "eval loss") == original
    assert lines_with(runs["single"].stdout, "eval loss") == original


@only("phase_loop")
def test_a_phase_loop_prints_each_phase_s_loss_over_its_data_set_as_the_original(runs):
    numbers = lambda run: [float(n) for line in lines_with(runs[run].stdout, "epoch loss") for n in re.findall(r"\d+\.\d+", line)]  # noqa: E731
    original = numbers("original")
    assert len(original) == 12
    for run in ("ddp", "single"):
        assert numbers(run) == pytest.approx(original, abs=2e-6), run


@only("step_results_logged")
def test_what_a_step_returns_of_its_losses_is_logged_as_the_original_logged_it(runs):
    # (a dict of numbers handed to a logging helper, a history, a tuple beside an output: DDP814;
    # an epoch function's meters in a dict it logs and returns: DDP812)
    numbers = lambda run: [float(n) for line in runs[run].stdout.splitlines() if line.startswith(("step", "epoch")) for n in re.findall(r"\d+\.\d+", line)]  # noqa: E731
    assert len(numbers("original")) == 40
    for run in ("ddp", "single"):
        assert numbers(run) == pytest.approx(numbers("original"), abs=5e-6), run


@only("summed_loss")
def test_a_summed_loss_per_sample_prints_the_original_value(runs):
    numbers = lambda run: [float(line.split()[-1]) for line in lines_with(runs[run].stdout, "loss per sample")]  # noqa: E731
    assert len(numbers("original")) == 3
    for run in ("ddp", "single"):
        assert numbers(run) == pytest.approx(numbers("original"), rel=1e-5), run


@only("shared_forward_pass")
def test_a_summed_loss_evaluation_shares_reports_the_original_value(runs):
    original = lines_with(runs["original"].stdout, "validation loss")
    assert len(original) == 2
    assert lines_with(runs["ddp"].stdout, "validation loss") == lines_with(runs["single"].stdout, "validation loss") == original


@only("features_only_wrap")
def test_a_part_wrap_widened_keeps_dataparallel_s_checkpoint_keys(runs):
    original = lines_with(runs["original"].stdout, "checkpoint keys")
    assert original == ["checkpoint keys ['features.module.0.bias']"]
    assert lines_with(runs["ddp"].stdout, "checkpoint keys") == lines_with(runs["single"].stdout, "checkpoint keys") == original


@only("side_effects")
def test_log_records_and_files_are_written_once(runs):
    for run in ("original", "ddp"):
        assert len(lines_with(runs[run].stderr, "eval correct")) == 3, runs[run].stderr
    for folder in (runs["dir"] / "original", runs["dir"]):
        rows = (folder / "logs" / "metrics.csv").read_text().splitlines()
        assert len(rows) == 4 and rows[0].startswith("epoch,")
    assert (runs["dir"] / "logs" / "metrics.csv").read_text() == (runs["dir"] / "original" / "logs" / "metrics.csv").read_text()


@only("side_effects")
def test_checkpoint_keeps_the_dataparallel_key_layout(runs):
    original = torch.load(runs["dir"] / "original" / "checkpoint.pt")
    converted = torch.load(runs["dir"] / "checkpoint.pt")
    assert list(original) == list(converted) and all(key.startswith("module.") for key in converted)
    assert lines_with(runs["ddp"].stdout, "checkpoint keys") == ["checkpoint keys start with module.0.bias"]


@only("side_effects")
def test_progress_bar_drawn_by_one_rank(runs):
    bars = lambda text: len(lines_with(text.replace("\r", "\n"), "epoch 0: 100%"))  # noqa: E731
    assert bars(runs["ddp"].stderr) == bars(runs["original"].stderr) >= 1


@only("writer_in_train")
def test_writer_used_by_every_rank_writes_once(runs):
    # A stand-in on rank 1 (no AttributeError in train()); rank 0 writes the events file.
    # The work folder holds the 2-rank run's file and the world-of-one run's file.
    assert len(list((runs["dir"] / "original" / "runs").glob("events.out.tfevents.*"))) == 1
    # (one more for each 2-rank run lost to the gloo exit abort and repeated)
    assert len(list((runs["dir"] / "runs").glob("events.out.tfevents.*"))) == 1 + runs["ddp"].attempts


@only("meters_cpu_loss")
def test_meters_and_cpu_losses_print_as_the_original_did(runs):
    numbers = lambda run: [float(n) for line in lines_with(runs[run].stdout, "Epoch: [") for n in re.findall(r"\d+\.\d+", line)]  # noqa: E731
    for run in ("ddp", "single"):
        assert len(lines_with(runs[run].stdout, "Epoch: [")) == len(lines_with(runs["original"].stdout, "Epoch: [")) == 6
        assert len(lines_with(runs[run].stdout, "running loss")) == 6
        # (the meter's last value and its average over every process's batches: the original's)
        assert numbers(run) == pytest.approx(numbers("original"), abs=2e-4), run
    # (meters read after the loop: every rank's batches, not rank 0's share)
    epochs = lambda run: [float(n) for line in lines_with(runs[run].stdout, "train epoch") for n in re.findall(r"-?\d+\.\d+", line)]  # noqa: E731
    assert len(epochs("original")) == 6
    assert epochs("ddp") == pytest.approx(epochs("original"), abs=2e-5)


@only("plateau_best")
def test_plateau_decisions_and_best_checkpoint_match_the_original(runs):
    learning_rates = lambda run: [line.split(" lr ")[1] for line in lines_with(runs[run].stdout, " lr ")]  # noqa: E731
    assert learning_rates("ddp") == learning_rates("single") == learning_rates("original")
    assert len(set(learning_rates("original"))) > 1, "the fixture must make the scheduler decide"
    original = __import__("numpy").load(runs["dir"] / "original" / "predictions.npy")
    converted = __import__("numpy").load(runs["dir"] / "predictions.npy")
    assert torch.allclose(torch.from_numpy(original), torch.from_numpy(converted), **TOLERANCE)


@only("unseeded_split")
def test_unseeded_split_is_the_same_on_every_rank(runs):
    # Rank 0 prints the validation indices; both ranks train on the complement, and the
    # probe recorded which samples each rank's sampler drew (base dataset indices).
    assert len(lines_with(runs["ddp"].stdout, "validation samples")) == 3
    subsets = []
    for rank in (0, 1):
        passes = json.loads((runs["dir"] / "p-ddp" / f"rank{rank}.json").read_text())["samplers"]
        subsets.append({record["subset"]["digest"] for record in passes if record["distributed"]})
    assert len(subsets[0]) == 1 and subsets[0] == subsets[1], "the same training subset on both ranks"


@only("late_import_pickle")
def test_whole_model_pickle_loads_without_a_process_group(runs):
    loaded = torch.load(runs["dir"] / "whole_model.pt", weights_only=False)
    assert isinstance(loaded, torch.nn.Sequential), type(loaded)


@only("head_beside_model")
def test_a_head_wrapped_on_its_own_keeps_its_checkpoint_keys(runs):
    assert lines_with(runs["ddp"].stdout, "head keys") == lines_with(runs["original"].stdout, "head keys") == ["head keys: ['weight']"]


@only("probed_run_folder")
def test_a_probed_run_folder_is_made_once_per_run(runs):
    # The world-of-one run took exp_0 and try_0 in the work folder; the 2-rank run the next
    # one of each (and one more for each repeated run): one per run, not one per rank.
    made = 1 + runs["ddp"].attempts
    assert sorted(p.name for p in (runs["dir"] / "runs").iterdir()) == [f"exp_{i}" for i in range(made)]
    assert sorted(p.name for p in (runs["dir"] / "logs").iterdir()) == [f"try_{i}" for i in range(made)]
    last = runs["dir"] / "runs" / f"exp_{made - 1}"
    assert sorted(p.name for p in last.iterdir()) == ["config.txt", "model.pt"]
    assert lines_with(runs["ddp"].stdout, "run folder") == [f"run folder runs/exp_{made - 1} log folder {made - 1}"]


@only("running_loss_decides")
def test_a_decision_on_the_running_loss_is_the_original_s(runs):
    # (the second rank's share grows noisier: decided on rank 0's share, the run saved at
    # other steps and printed other running losses)
    saves = lines_with(runs["original"].stdout, "saved at step")
    assert len(saves) >= 2
    assert lines_with(runs["ddp"].stdout, "saved at step") == saves
    assert lines_with(runs["ddp"].stdout, "best running loss") == lines_with(runs["original"].stdout, "best running loss")


@only("functional_data_parallel")
def test_dataparallel_by_function_keeps_the_original_s_bare_checkpoint_keys(runs):
    keys = lines_with(runs["original"].stdout, "checkpoint keys")
    assert keys == ["checkpoint keys main.0.bias"]
    assert lines_with(runs["ddp"].stdout, "checkpoint keys") == lines_with(runs["single"].stdout, "checkpoint keys") == keys
