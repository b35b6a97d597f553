"""`ddpify verify` for real: every e2e fixture passes (with --equivalence), and hand-written
DDP scripts with the classic mistakes fail with the right reasons."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import runpy
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, ROOT, fixture_inputs
from ddpify.cli import app
from ddpify.verify import checks
from ddpify.verify import runner as verify_runner
from ddpify.verify.runner import VerifyOptions, verify

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.e2e
cli = CliRunner()


def verdicts(report) -> dict[str, str]:
    return {check.name: check.verdict for check in report.checks}


def reasons(report) -> str:
    return "\n".join(f"{c.verdict} {c.name}: {c.reason}" for c in report.checks)


# Every e2e fixture passes verify's checks in tests/test_e2e.py, read from the 2-rank run that
# file launches anyway. Verify itself (its launcher, and its equivalence run with shuffling off)
# is launched here on the fixtures whose weights test_e2e cannot compare with the original's
# (shuffled or unseeded), and on the bundled example.
VERIFIED = [
    case for case in fixture_inputs("e2e")
    if case.name == "fashion_mnist.py" or "shuffle=True" in case.read_text() or "e2e: unseeded" in case.read_text()
]


@pytest.mark.parametrize("case", VERIFIED, ids=lambda p: p.name)
def test_converted_fixture_passes_every_check(case: Path):
    report = verify(case, options=VerifyOptions(equivalence=True))
    assert report.exit_code == 0, reasons(report)
    found = verdicts(report)
    assert found["every rank finishes"] == found["weights identical across ranks"] == "PASS"
    assert found["same weights as the original run"] == "PASS"
    # (batches split at run time from a list or a generator: no loader whose samples verify could count)
    no_loader = "e2e: no loader" in case.read_text()
    assert found["each training sample once per epoch"] == ("SKIP" if no_loader else "PASS")
    assert found["no line printed by more than one rank"] == "PASS"
    assert [row["rank"] for row in report.ranks] == [0, 1]
    if "shuffle=True" in case.read_text():
        assert found["new order every epoch when shuffling"] == "PASS"


def test_broken_hand_written_ddp_fails_for_each_mistake():
    report = verify(FIXTURES / "verify" / "broken_ddp.py")
    assert report.exit_code == 1
    failed = {c.name: c.reason for c in report.checks if c.passed is False}
    assert set(failed) == {
        "each training sample once per epoch",
        "new order every epoch when shuffling",
        "checkpoints written by one rank",
        "no line printed by more than one rank",
    }, reasons(report)
    assert "not sharded" in failed["each training sample once per epoch"]
    assert "set_epoch" in failed["new order every epoch when shuffling"]
    assert "checkpoint.pt written by ranks 0,1" in failed["checkpoints written by one rank"]
    assert "broken_ddp.py:32 printed on ranks 0,1" in failed["no line printed by more than one rank"]
    assert report.notes and "verifying it as it is" in report.notes[0]


def failures(report) -> dict[str, str]:
    return {c.name: c.reason for c in report.checks if c.passed is False}


def test_weights_are_compared_after_the_last_step_not_at_exit():
    # Every rank loads rank 0's checkpoint before exit: the weights agree then, not after training.
    report = verify(FIXTURES / "verify" / "reload_rank0.py")
    failed = failures(report)
    assert set(failed) == {
        "process group and DDP model on every rank",
        "ranks agree during training",
        "weights identical across ranks",
        "every trained parameter is inside a DDP module",
    }, reasons(report)
    assert "after the last optimizer step ranks disagree" in failed["weights identical across ranks"]
    assert "at exit they agree" in failed["weights identical across ranks"]
    assert "2 of 2 trained parameter tensor(s) on rank 0 (and on rank(s) 1)" in failed["every trained parameter is inside a DDP module"]


def test_ranks_with_different_random_splits_fail_the_sample_check():
    report = verify(FIXTURES / "verify" / "split_per_rank.py")
    failed = failures(report)
    assert set(failed) == {"each training sample once per epoch"}, reasons(report)
    assert "ranks 0 / 1 shard different subsets of the dataset" in failed["each training sample once per epoch"]


def test_sampler_positions_map_through_nested_subsets():
    from torch.utils.data import Subset, TensorDataset

    from ddpify.verify import probe

    base = TensorDataset(torch.arange(10))
    chain = probe._subset_chain(Subset(Subset(base, [9, 8, 7, 6, 5]), [4, 0, 4]))
    assert [probe._base_index(chain, position) for position in range(3)] == [5, 9, 5]
    assert probe._subset_summary(chain, 3)["distinct"] == 2
    assert probe._subset_chain(base) == []


def test_one_split_shared_by_the_ranks_checks_base_indices():
    # Positions 0..3 split evenly, but they map to base samples 7, 7, 2, 9: a repeat and a miss.
    def rank(indices):
        return {"site": "t.py:1", "kind": "DistributedSampler", "distributed": True, "dataset_size": 4,
                "subset": {"digest": "same", "distinct": 4}, "drop_last": False, "complete": True, "indices": indices}

    problem = checks._pass_problem({0: rank([7, 2]), 1: rank([7, 9])}, world=2)
    assert problem == "1 sample draws repeat across ranks, more than the sampler's padding of 0"
    assert checks._pass_problem({0: rank([7, 2]), 1: rank([3, 9])}, world=2) is None


def test_whole_batches_must_be_the_same_batches_on_every_rank():
    # ddp_shard(..., whole_batches=True): every rank draws every batch, the model's calls split it
    def rank(indices):
        return {"site": "t.py:1", "kind": "DdpShard", "distributed": True, "dataset_size": None, "whole": True,
                "drop_last": False, "complete": True, "indices": indices}

    assert checks._pass_problem({0: rank([4, 5, 6, 7]), 1: rank([4, 5, 6, 7])}, world=2) is None
    assert checks._pass_problem({0: rank([4, 5, 6, 7]), 1: rank([5, 4, 6, 7])}, world=2) == (
        "rank(s) 1 drew other whole batches than rank 0"
    )


def test_parameters_added_after_the_wrap_are_outside_ddp():
    report = verify(FIXTURES / "verify" / "head_after_wrap.py")
    failed = failures(report)
    assert set(failed) == {
        "ranks agree during training", "weights identical across ranks", "every trained parameter is inside a DDP module",
    }, reasons(report)
    assert failed["ranks agree during training"].startswith("after step 1 of optimizer 0 the ranks hold different weights")
    assert "2 of 4 trained parameter tensor(s) on rank 0" in failed["every trained parameter is inside a DDP module"]


def test_optimizer_hyper_parameters_must_agree_after_the_last_step():
    def report(lr):
        stepped = {"steps": 3, "hyper": [{"lr": lr, "momentum": 0.9, "betas": [0.9, 0.99]}]}
        return {"optimizers": [stepped, {"steps": 0, "hyper": None}]}

    assert checks.hyper_parameters_agree({0: report(0.1), 1: report(0.1)}).passed
    check = checks.hyper_parameters_agree({0: report(0.1), 1: report(0.05)})
    assert check.passed is False and check.reason == "optimizer 0 group 0 lr: 0.1 on rank 0, 0.05 on rank 1"
    assert checks.hyper_parameters_agree({0: report(float("nan")), 1: report(float("nan"))}).passed


def test_nan_weights_fail_rank_agreement_and_equivalence():
    report = verify(FIXTURES / "verify" / "diverges.py", options=VerifyOptions(equivalence=True))
    failed = failures(report)
    assert set(failed) == {"weights identical across ranks", "same weights as the original run"}, reasons(report)
    assert "rank(s) 0,1 hold NaN or infinite weights (5 on rank 0, 5 on rank 1)" in failed["weights identical across ranks"]
    assert failed["same weights as the original run"].startswith("5 NaN or infinite weight value(s) in the original run")
    assert "difference" not in failed["same weights as the original run"]


def test_compare_reports_nan_in_the_converted_run():
    from ddpify.verify.compare import compare

    finite, broken = torch.zeros(3), torch.tensor([0.0, float("nan"), float("inf")])
    result = compare([[finite]], [[broken]], rtol=1e-5, atol=1e-6)
    assert result == {"equal": False, "reason": "2 NaN or infinite weight value(s) in the converted run", "max_abs_diff": None}


def test_library_warnings_are_not_printing_lines():
    # pin_memory without a GPU, a deprecated GradScaler and the script's own warnings.warn
    # appear on both ranks; only the rank-0 print is the script's.
    report = verify(FIXTURES / "verify" / "library_warnings.py")
    assert report.exit_code == 0, reasons(report)
    printed = next(c for c in report.checks if c.name == "no line printed by more than one rank")
    assert printed.reason == "1 printing line(s), each by one rank"


def test_library_prints_and_logs_are_not_attributed_to_the_user(tmp_path, monkeypatch):
    from ddpify.verify import probe

    library, user = tmp_path / "lib", tmp_path / "user"
    library.mkdir(), user.mkdir()
    (library / "ddpify_test_noisy.py").write_text(
        "import logging\n"
        "def shout():\n"
        "    print('a library prints')\n"
        "    logging.getLogger('ddpify_test_noisy').warning('a library logs')\n"
    )
    (user / "train.py").write_text(
        "import logging, ddpify_test_noisy\n"
        "def main():\n"
        "    print('the script prints')\n"
        "    ddpify_test_noisy.shout()\n"
        "    logging.getLogger('ddpify_test_user').warning('the script logs')\n"
    )
    monkeypatch.syspath_prepend(str(library))
    recorder = probe.Recorder(str(user / "train.py"), [str(user)])
    monkeypatch.setattr(sys, "stdout", probe.RecordingStream(io.StringIO(), "stdout", recorder))
    for name in ("ddpify_test_noisy", "ddpify_test_user"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", [logging.StreamHandler(sys.stdout)])
        monkeypatch.setattr(logger, "propagate", False)
    runpy.run_path(str(user / "train.py"))["main"]()
    assert recorder.data["outputs"] == {"stdout train.py:3": 1, "stdout train.py:5": 1}


class _Writes(io.StringIO):
    def __init__(self):
        super().__init__()
        self.calls = []

    def write(self, text):
        self.calls.append(text)
        return super().write(text)


def test_a_tagged_stream_writes_each_line_whole(tmp_path):
    # Ranks share torchrun's unbuffered pipe: print()'s text and newline written apart
    # interleaved with the other rank's line ("...done waiting[converted rank 0] done waiting").
    from ddpify.verify import probe

    target = _Writes()
    stream = probe.RecordingStream(target, "stdout", probe.Recorder(str(tmp_path / "t.py"), []), "[r1] ")
    stream.write("done ")
    stream.write("waiting")
    assert target.calls == []
    stream.write("\n")
    stream.write("a\nb\n")
    stream.write("partial")
    stream.flush()
    assert target.calls == ["[r1] done waiting\n", "[r1] a\n[r1] b\n", "[r1] partial"]


def test_a_crashing_script_keeps_its_traceback_under_the_probe(tmp_path):
    # The interpreter prints an uncaught exception with no Python frame on the stack.
    script = tmp_path / "crash.py"
    script.write_text("raise ValueError('boom')\n")
    result = subprocess.run([sys.executable, "-m", "ddpify.verify.probe", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "ValueError: boom" in result.stderr, result.stderr


def test_equivalence_with_batchnorm_compares_running_statistics_and_says_so():
    report = verify(FIXTURES / "verify" / "batchnorm.py", options=VerifyOptions(equivalence=True))
    check = next(c for c in report.checks if c.name == "same weights as the original run")
    assert check.passed, check.reason
    assert "1 BatchNorm layer(s) normalised with their running statistics in both runs" in check.reason


def test_a_hung_world_is_killed_at_the_timeout():
    report = verify(FIXTURES / "verify" / "hangs.py", options=VerifyOptions(timeout=15))
    assert report.exit_code == 1
    assert report.checks[0].passed is False and "timed out" in report.checks[0].reason
    # every rank is gone too (torchrun starts its workers in sessions of their own)
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ddpify.verify.probe" in text and "hangs.py" in text:
            left.append(text)
    assert not left, left


def test_equivalence_fails_when_the_global_batch_changes(tmp_path):
    # --per-process-batch keeps each rank's batch: the global batch doubles, so the
    # weights cannot match the original; verify must say so.
    source = (FIXTURES / "e2e" / "trainer_main.py").read_text()
    original = tmp_path / "train.py"
    original.write_text(source)
    (tmp_path / "pyproject.toml").write_text("[tool.ddpify]\nper-process-batch = true\n")
    report = verify(original, options=VerifyOptions(equivalence=True))
    assert verdicts(report)["same weights as the original run"] == "FAIL", reasons(report)
    assert verdicts(report)["weights identical across ranks"] == "PASS"


@pytest.mark.parametrize(
    "options",
    [VerifyOptions(nnodes_sim=2), VerifyOptions(launcher="slurm-sim")],
    ids=["two-simulated-nodes", "slurm-sim"],
)
def test_other_launchers(options):
    report = verify(FIXTURES / "e2e" / "trainer_main.py", options=replace(options, max_steps=6))
    assert report.exit_code == 0, reasons(report)
    assert [(row["rank"], row["steps"]) for row in report.ranks] == [(0, 6), (1, 6)]
    local_ranks = [row["local_rank"] for row in report.ranks]
    assert local_ranks == ([0, 0] if options.nnodes_sim == 2 else [0, 1])


def test_max_steps_ends_training_but_runs_the_rest(tmp_path):
    report = verify(FIXTURES / "e2e" / "fashion_mnist.py", options=VerifyOptions(max_steps=3))
    assert report.exit_code == 0, reasons(report)
    assert all(row["steps"] == 3 for row in report.ranks)
    # The save and the prints after training still happened, once.
    assert verdicts(report)["checkpoints written by one rank"] == "PASS"


def test_cli_json_report_and_exit_code(tmp_path):
    result = cli.invoke(app, ["verify", str(FIXTURES / "verify" / "broken_ddp.py"), "--json", "--max-steps", "4"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)  # the progress lines are on stderr
    assert data["exit_code"] == 1 and {c["verdict"] for c in data["checks"]} >= {"PASS", "FAIL"}


def test_script_arguments_after_double_dash(tmp_path):
    script = tmp_path / "args.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import torch.nn as nn
        model = nn.DataParallel(nn.Linear(2, 1))
        assert sys.argv[1:] == ["--epochs", "2"], sys.argv
    """))
    result = cli.invoke(app, ["verify", str(script), "--", "--epochs", "2"])
    assert "every rank finishes: 2 ranks exited 0" in result.output, result.output


def test_cli_never_imports_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from typer.testing import CliRunner
        from ddpify.cli import app
        result = CliRunner().invoke(app, ["verify", {str(FIXTURES / 'e2e' / 'trainer_main.py')!r}, "--max-steps", "2"])
        print(result.exit_code, "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr


def test_missing_torch_exits_2_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(verify_runner.importlib.util, "find_spec", lambda name: None)
    result = cli.invoke(app, ["verify", str(FIXTURES / "e2e" / "trainer_main.py")])
    assert result.exit_code == 2
    assert "pip install 'ddpify[verify]'" in result.output


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--nproc", "3", "--nnodes-sim", "2"], "multiple of --nnodes-sim"),
        (["--backend", "mpi"], "--backend must be one of"),
        (["--backend", "nccl"], "--backend nccl needs 2 GPU(s)"),
        (["--converted", "missing.py"], "no such file"),
    ],
)
def test_cannot_run_exits_2(arguments, message):
    if "nccl" in arguments and _has_gpus():
        pytest.skip("this machine has GPUs")
    result = cli.invoke(app, ["verify", str(FIXTURES / "e2e" / "trainer_main.py"), *arguments])
    assert result.exit_code == 2 and message in result.output, result.output


def test_refused_conversion_exits_3_as_convert_does():
    result = cli.invoke(app, ["verify", str(FIXTURES / "wrap" / "functional_import.py")])
    assert result.exit_code == 3 and "not converted" in result.output and "DDP004" in result.output


def test_unparsable_script_exits_2(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import torch\nmodel = torch.nn.DataParallel(\n")
    result = cli.invoke(app, ["verify", str(script)])
    assert result.exit_code == 2 and "DDP001" in result.output


def _has_gpus() -> bool:
    import torch

    return torch.cuda.device_count() >= 2


# -- reporting as it goes ---------------------------------------------------------------------


def test_each_run_is_reported_as_it_starts_and_ends_and_the_summary_times_them_all():
    script = FIXTURES / "e2e" / "trainer_main.py"
    result = cli.invoke(app, ["verify", str(script), "--equivalence", "--max-steps", "4"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"verify {script} (converted in memory): 2 ranks, torchrun"
    starts = [i for i, line in enumerate(lines) if ": starting " in line]
    ends = [i for i, line in enumerate(lines) if re.match(r"^\w+: (2 ranks )?exited 0 in [\d.]+ s$", line)]
    assert lines[starts[0]] == "converted: starting 2 ranks (gloo, torchrun)"
    # (a run lost to torch's gloo abort at interpreter exit is started again: a line more)
    originals = [i for i in starts if lines[i].startswith("original: ")]
    assert lines[originals[0]].startswith("original: starting 1 process (plain python, seed 0, shuffling off")
    first_check = next(i for i, line in enumerate(lines) if line.startswith("PASS"))
    assert starts[0] < ends[0] < originals[0] < ends[1] < first_check, result.output
    assert "[converted rank" not in result.output, "rank output only with -v"
    summary = lines[-1]
    assert summary.startswith("all checks passed; runs: converted 2 ranks ") and ", original 1 process " in summary
    assert summary.endswith(" s in all")


def test_verbose_streams_each_ranks_output_as_it_comes(tmp_path):
    """The script waits until the test has seen its first line: verify must pass the line on
    (and the run's start) while the run is still going, not when it ends."""
    script = tmp_path / "waits.py"
    sentinel = tmp_path / "go"
    script.write_text(textwrap.dedent(f"""
        import os, time
        if os.environ.get("RANK") == "1":
            print("rank one says hello", flush=True)
        deadline = time.time() + 120
        while not os.path.exists({str(sentinel)!r}) and time.time() < deadline:
            time.sleep(0.1)
        print("done waiting", flush=True)
    """))
    command = [sys.executable, "-m", "ddpify", "verify", str(script), "-v", "--timeout", "200"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in process.stdout:
            seen.append(line.rstrip("\n"))
            if line.startswith("[converted rank 1] rank one says hello"):
                assert any(s.startswith("converted: starting 2 ranks") for s in seen)
                assert not any(" exited " in s for s in seen), "the run is still waiting"
                sentinel.touch()
        process.wait(timeout=300)
    finally:
        process.kill()
    assert sentinel.exists(), "\n".join(seen)
    assert "[converted rank 0] done waiting" in seen and "[converted rank 1] done waiting" in seen
    assert any(s.startswith("converted: 2 ranks exited 0 in ") for s in seen), "\n".join(seen)


def test_json_keeps_stdout_for_the_document_and_quiet_keeps_the_report():
    script = str(FIXTURES / "e2e" / "trainer_main.py")
    result = subprocess.run(
        [sys.executable, "-m", "ddpify", "verify", script, "--json", "--max-steps", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    data = json.loads(result.stdout)
    assert [run["label"] for run in data["runs"]] == ["converted"] and data["runs"][0]["processes"] == 2
    assert "converted: starting 2 ranks" in result.stderr
    quiet = cli.invoke(app, ["verify", script, "-q", "--max-steps", "2"])
    assert ": starting " not in quiet.output and quiet.output.startswith("verify ") and "runs: converted" in quiet.output


# -- Dropout and --equivalence ----------------------------------------------------------------

DROPOUT = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 8))
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            return self.head(F.dropout(self.body(x), p=0.2, training=self.training))


    def main():
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
        loader = DataLoader(data, batch_size=16, shuffle=True)
        model = nn.DataParallel(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(3):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.4f}")


    if __name__ == "__main__":
        main()
""")


def test_equivalence_with_dropout_compares_with_dropout_off_and_says_so(tmp_path):
    script = tmp_path / "dropout.py"
    script.write_text(DROPOUT)
    report = verify(script, options=VerifyOptions(equivalence=True))
    assert report.exit_code == 0, reasons(report)
    check = next(c for c in report.checks if c.name == "same weights as the original run")
    # the nn.Dropout layer and the functional call in forward
    assert "2 Dropout layer(s) or call(s) off in both runs" in check.reason, check.reason
    assert [run["label"] for run in report.runs] == ["converted", "original", "equivalence"]


def test_dropout_off_is_the_identity_and_on_is_not(tmp_path):
    """The probe's switch, in a process of its own (it patches torch)."""
    script = tmp_path / "masks.py"
    script.write_text(textwrap.dedent("""
        import json, torch
        import torch.nn as nn
        import torch.nn.functional as F
        x = torch.ones(1000)
        layer = nn.Dropout(0.5).train()
        kept = [bool((layer(x) == x).all()), bool((F.dropout(x, 0.5, True) == x).all()),
                bool((F.dropout2d(x.view(10, 10, 10), 0.5, True) == x.view(10, 10, 10)).all())]
        print(json.dumps(kept))
    """))
    for off, expected in (("1", [True, True, True]), ("", [False, False, False])):
        env = {**os.environ, "DDPIFY_PROBE_NO_DROPOUT": off}
        command = [sys.executable, "-m", "ddpify.verify.probe", str(script)]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert json.loads(result.stdout.splitlines()[-1]) == expected, result.stdout + result.stderr


# -- the cross-rank check the converted script no longer carries ------------------------------

HAND_DDP = textwrap.dedent('''
    """Hand-written DDP with no in-script check: {what}."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(nn.Linear(4, 1))
    head = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(list(model.parameters()) + {head_params}, lr=0.1)
    step = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss({forward}, y).backward()
            optimizer.step()
            step += 1
            if step == 2 and dist.get_rank() == 1:
                {at_step_two}
    dist.destroy_process_group()
''')


def test_a_rank_that_changes_its_own_lr_fails_at_the_next_check(tmp_path):
    script = tmp_path / "lr_one_rank.py"
    script.write_text(HAND_DDP.format(
        what="rank 1 halves its learning rate after step 2", head_params="[]", forward="model(x)",
        at_step_two="optimizer.param_groups[0]['lr'] *= 0.5",
    ))
    report = verify(script)
    assert report.exit_code == 1
    reason = failures(report)["ranks agree during training"]
    assert reason.startswith(
        "after step 4 of optimizer 0 the ranks hold different learning rates and weights (rank(s) 1 differ from rank 0)"
    ), reason
    assert "learning rates from 0.05 to 0.1" in reason
    # the run went on: every other verdict sees all of it
    assert [row["steps"] for row in report.ranks] == [8, 8]
    assert failures(report)["optimizer hyper-parameters agree across ranks"] == "optimizer 0 group 0 lr: 0.1 on rank 0, 0.05 on rank 1"


def test_a_module_trained_outside_ddp_fails_at_the_first_step(tmp_path):
    script = tmp_path / "head_outside.py"
    script.write_text(HAND_DDP.format(
        what="a head the optimizer trains outside the wrap", head_params="list(head.parameters())",
        forward="head(model(x))", at_step_two="pass",
    ))
    report = verify(script)
    reason = failures(report)["ranks agree during training"]
    assert reason.startswith("after step 1 of optimizer 0 the ranks hold different weights"), reasons(report)


def _self_check_options():
    """Options that keep the in-script check in the output (``self_check`` once issue 22 makes
    it opt-in; the default before)."""
    from dataclasses import fields

    from ddpify.diagnostics import ConvertOptions

    return ConvertOptions(self_check=True) if "self_check" in {f.name for f in fields(ConvertOptions)} else ConvertOptions()


@pytest.mark.parametrize("in_script_check", [False, True], ids=["without", "with"])
def test_a_converted_script_is_checked_by_verify_with_or_without_its_own_check(tmp_path, in_script_check):
    """Without: what the converted script looks like once the in-script hook is gone (issue
    22), verify's own check still runs. With: the script's check and verify's run side by side."""
    from ddpify.api import convert_file
    from ddpify.diagnostics import ConvertOptions

    options = _self_check_options() if in_script_check else ConvertOptions()
    output = convert_file(FIXTURES / "e2e" / "trainer_main.py", options).output
    if in_script_check:
        assert "register_optimizer_step_post_hook(ddp_after_step)" in output
    else:
        output = output.replace("register_optimizer_step_post_hook(ddp_after_step)", "pass")
    converted = tmp_path / "train.py"
    converted.write_text(output)
    report = verify(FIXTURES / "e2e" / "trainer_main.py", converted, VerifyOptions(max_steps=4))
    assert report.exit_code == 0, reasons(report)
    agree = next(c for c in report.checks if c.name == "ranks agree during training")
    assert agree.passed and agree.reason.startswith("3 check(s) after optimizer steps 1, 2, 4"), agree.reason


def test_world_of_one_needs_no_ddp_wrap():
    # The converted scripts wrap only above one rank (a lent H100 ran them as one NCCL rank:
    # docs/validation.md); a world of one is not failed for an unwrapped model.
    report = verify(FIXTURES / "e2e" / "guard_flag.py", options=VerifyOptions(nproc=1))
    assert report.exit_code == 0, reasons(report)
    found = verdicts(report)
    assert found["process group and DDP model on every rank"] == "PASS"
    assert found["every trained parameter is inside a DDP module"] == "SKIP"


def test_a_world_without_ddp_passes_only_when_its_trained_weights_were_kept_together():
    # A wrap whose module trains nothing (a frozen encoder) builds no DDP; the decoder trained
    # beside it had its gradients averaged by the converted script's optimizer hooks, which the
    # cross-rank weight checks after the steps show. One rank without DDP, or ranks apart, fail.
    group = {"backend": "gloo", "rank": 0, "world_size": 2, "local_rank": 0}

    def report(ddp_models, diverged=None):
        return {"process_group": group, "ddp_models": ddp_models, "steps": 4, "sync_checks": 3, "diverged": diverged}

    outcome = checks.LaunchOutcome(2, 0, False, 0.0, "")
    kept = checks.process_group_and_ddp(outcome, {0: report(0), 1: report(0)})
    assert kept.passed and "no DDP model" in kept.reason and "3 check(s)" in kept.reason, kept.reason
    apart = {"step": 2, "optimizer": 0, "apart": [1], "mine": None}
    assert not checks.process_group_and_ddp(outcome, {0: report(0, apart), 1: report(0, apart)}).passed
    assert not checks.process_group_and_ddp(outcome, {0: report(1), 1: report(0)}).passed
