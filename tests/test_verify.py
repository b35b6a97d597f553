"""`ddpify verify` for real: every e2e fixture passes (with --equivalence), and hand-written
DDP scripts with the classic mistakes fail with the right reasons."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, ROOT, fixture_inputs
from ddpify.cli import app
from ddpify.verify import runner as verify_runner
from ddpify.verify.runner import VerifyOptions, verify

pytest.importorskip("torch")
pytestmark = pytest.mark.e2e
cli = CliRunner()


def verdicts(report) -> dict[str, str]:
    return {check.name: check.verdict for check in report.checks}


def reasons(report) -> str:
    return "\n".join(f"{c.verdict} {c.name}: {c.reason}" for c in report.checks)


@pytest.mark.parametrize("case", fixture_inputs("e2e"), ids=lambda p: p.name)
def test_converted_fixture_passes_every_check(case: Path):
    report = verify(case, options=VerifyOptions(equivalence=True))
    assert report.exit_code == 0, reasons(report)
    found = verdicts(report)
    assert found["every rank finishes"] == found["weights identical across ranks"] == "PASS"
    assert found["each training sample once per epoch"] == found["same weights as the original run"] == "PASS"
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


def test_a_hung_world_is_killed_at_the_timeout():
    report = verify(FIXTURES / "verify" / "hangs.py", options=VerifyOptions(timeout=15))
    assert report.exit_code == 1
    assert report.checks[0].passed is False and "timed out" in report.checks[0].reason


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
    data = json.loads(result.output)
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


def test_refused_conversion_exits_2():
    result = cli.invoke(app, ["verify", str(FIXTURES / "loaders" / "positional_options.py")])
    assert result.exit_code == 2 and "not converted" in result.output


def _has_gpus() -> bool:
    import torch

    return torch.cuda.device_count() >= 2
