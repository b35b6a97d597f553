"""The launch line `ddpify convert` prints runs as printed on the machine at hand: a process
count that works without CUDA, torchrun or its module form as this machine has it, and the
script's own GPU-count option named with what it now means."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, run_launched
from ddpify import launching
from ddpify.launching import Machine, gpu_options, launch_lines

CANONICAL = "torchrun --standalone --nproc-per-node=gpu train.py"


def lines(canonical: str, gpus: int | None, runner: str = "torchrun") -> list[tuple[str, str]]:
    return [(line.label, line.command) for line in launch_lines(canonical, Machine(gpus, runner))]


def test_with_gpus_the_line_is_the_canonical_one():
    assert lines(CANONICAL, 4) == [("launch", CANONICAL)]
    assert lines(CANONICAL, None) == [("launch", CANONICAL)]  # GPUs that cannot be counted: trust torchrun


def test_without_gpus_the_cpu_line_comes_first_and_the_gpu_line_beside_it():
    assert lines(CANONICAL, 0) == [
        ("launch (no GPU found here, 2 processes on the CPU)", "torchrun --standalone --nproc-per-node=2 train.py"),
        ("launch on a machine with GPUs", CANONICAL),
    ]


def test_a_scripts_own_cuda_only_ddp_path_gets_no_cpu_line():
    # BERT-NER: its DDP path calls torch.cuda.set_device and NCCL (DDP011): a CPU line would crash
    found = launch_lines(CANONICAL, Machine(0, "torchrun"), gpu_only=True)
    assert [(line.command, "GPUs" in line.label) for line in found] == [(CANONICAL, True)]
    assert launch_lines(CANONICAL, Machine(2, "torchrun"), gpu_only=True)[0].label == "launch"


def test_a_counted_line_runs_anywhere_and_keeps_its_devices():
    line = "CUDA_VISIBLE_DEVICES=0,3 torchrun --standalone --nproc-per-node=2 train.py --lr 0.1"
    assert lines(line, 0, ".venv/bin/torchrun") == [
        ("launch", "CUDA_VISIBLE_DEVICES=0,3 .venv/bin/torchrun --standalone --nproc-per-node=2 train.py --lr 0.1")
    ]


def test_the_runner_replaces_torchrun_and_a_scripts_own_launcher_is_left_alone():
    assert lines(CANONICAL, 1, "python -m torch.distributed.run") == [
        ("launch", "python -m torch.distributed.run --standalone --nproc-per-node=gpu train.py")
    ]
    own = "python train.py --dist-url tcp://127.0.0.1:29500 --multiprocessing-distributed --world-size 1 --rank 0"
    assert lines(own, 0) == [("launch", own)]


def test_torchrun_command_follows_what_this_machine_has(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launching.shutil, "which", lambda name: "/usr/bin/torchrun")
    assert launching.torchrun_command() == "torchrun"
    # not on PATH: the torchrun beside this Python (a virtual environment not activated)
    monkeypatch.setattr(launching.shutil, "which", lambda name: None)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "torchrun").write_text("#!/bin/sh\n")
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setattr(launching.sys, "executable", str(bin_dir / "python"))
    assert launching.torchrun_command() == ".venv/bin/torchrun"
    # no torchrun there either: this Python's module form where it has torch, else python's
    (bin_dir / "torchrun").unlink()
    monkeypatch.setattr(launching.importlib.util, "find_spec", lambda name: object())
    assert launching.torchrun_command() == ".venv/bin/python -m torch.distributed.run"
    monkeypatch.setattr(launching.importlib.util, "find_spec", lambda name: None)
    assert launching.torchrun_command() == "python -m torch.distributed.run"


def test_gpu_count_never_imports_torch_and_honours_an_empty_device_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert launching.gpu_count() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert launching.gpu_count() == 0
    code = "import sys, ddpify.launching as l; l.gpu_count(); l.torchrun_command(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


# -- the script's own GPU count -------------------------------------------------------------------


def test_count_and_switch_options_are_named_with_the_lines_that_still_read_them():
    from ddpify.api import convert_file

    source = (FIXTURES / "e2e" / "guard_flag.py").read_text()
    found = gpu_options(source, convert_file(FIXTURES / "e2e" / "guard_flag.py").output)
    assert [(o.name, o.line, o.kind) for o in found] == [("--ngpu", 11, "count"), ("--mGPUs", 12, "switch")]
    assert all(o.reads for o in found)  # the guards around the wraps still read them
    assert found[0].meaning().startswith(
        "--ngpu (line 11) no longer sets how many GPUs train: each process trains on one GPU, and --nproc-per-node "
        "on the launch line sets how many start (the converted script still reads its value: line"
    )
    assert found[1].meaning().startswith("--mGPUs (line 12) no longer decides whether several GPUs train")


def test_a_device_count_variable_is_not_the_number_of_processes():
    found = gpu_options((FIXTURES / "wrap" / "gpu_count_variable.py").read_text())
    assert [(o.name, o.kind) for o in found] == [("args.n_gpu", "variable"), ("n_gpu", "variable")]
    assert "still counts the GPUs each process can see, not the processes training" in found[0].meaning()


@pytest.mark.parametrize(
    "declaration, expected",
    [
        ("parser.add_argument('--gpus', type=int, default=1)", [("--gpus", "count")]),
        ("parser.add_argument('--num_gpus', '--num-gpus', type=int)", [("--num_gpus", "count")]),
        ("parser.add_argument('--n_gpu', dest='ngpu', type=int)", [("--n_gpu", "count")]),
        ("parser.add_argument('--gpus', default='0,1')", []),  # ids, not a count
        ("parser.add_argument('--gpu_ids', type=str, default='0')", []),
        ("parser.add_argument('--multi_gpu', action='store_true')", [("--multi_gpu", "switch")]),
        ("parser.add_argument('--gpu', type=int, default=0)", []),  # one device index (DDP710)
    ],
)
def test_which_options_are_gpu_counts(declaration, expected):
    source = f"import argparse\nparser = argparse.ArgumentParser()\n{declaration}\n"
    assert [(o.name, o.kind) for o in gpu_options(source)] == expected


def test_the_cli_names_the_option_after_the_launch_line(tmp_path):
    from typer.testing import CliRunner

    from ddpify.cli import app

    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "e2e" / "guard_flag.py").read_text())
    output = CliRunner().invoke(app, ["convert", str(script)]).output.splitlines()
    launch = max(i for i, line in enumerate(output) if line.startswith("  launch"))
    assert output[launch + 1].startswith("  note: --ngpu (line 11) no longer sets how many GPUs train")
    assert output[launch + 2].startswith("  note: --mGPUs (line 12)")


# -- the printed line, run as printed -------------------------------------------------------------


def _printed_lines(folder: Path, path_env: str) -> list[str]:
    env = {**os.environ, "PATH": path_env, "CUDA_VISIBLE_DEVICES": ""}  # a machine without GPUs
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run(
        [sys.executable, "-m", "ddpify", "convert", "train.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("launch")]


@pytest.mark.e2e
@pytest.mark.parametrize("torchrun_on_path", [False, True], ids=["no-torchrun-on-path", "torchrun-on-path"])
def test_the_printed_launch_line_runs_as_printed_on_a_cpu_machine(tmp_path, torchrun_on_path):
    pytest.importorskip("torch")
    venv_bin = str(Path(sys.executable).parent)
    others = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin and not (Path(p) / "torchrun").exists()]
    path_env = os.pathsep.join([venv_bin, *others] if torchrun_on_path else others)
    (tmp_path / "train.py").write_text((FIXTURES / "e2e" / "trainer_main.py").read_text())
    printed = _printed_lines(tmp_path, path_env)
    assert len(printed) == 2, printed
    label, command = printed[0].split(": ", 1)
    assert label == "launch (no GPU found here, 2 processes on the CPU)"
    assert printed[1] == f"launch on a machine with GPUs: {command.replace('--nproc-per-node=2', '--nproc-per-node=gpu')}"
    if torchrun_on_path:
        assert command == "torchrun --standalone --nproc-per-node=2 train.py"
    else:
        assert command.split()[0] in (f"{venv_bin}/torchrun", f"{sys.executable}"), command
        assert not command.startswith("torchrun ")
    env = {**os.environ, "PATH": path_env, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    result = run_launched(["bash", "-c", command], cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    assert "epoch" in result.stdout.lower() or result.stdout.strip(), result.stdout


def test_an_attribute_and_a_variable_of_one_name_are_read_apart():
    source = (FIXTURES / "wrap" / "gpu_count_variable.py").read_text()
    converted = source + "print(args.n_gpu)\nprint(n_gpu, n_gpu)\n"
    lines = len(source.splitlines())
    found = {o.name: o.reads for o in gpu_options(source, converted)}
    assert lines + 1 in found["args.n_gpu"] and lines + 2 not in found["args.n_gpu"]
    assert lines + 2 in found["n_gpu"] and lines + 1 not in found["n_gpu"]
