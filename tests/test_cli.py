"""The convert command as users run it: files on disk, exit codes, what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from conftest import FIXTURES
from ddpify import __version__
from ddpify.cli import app

runner = CliRunner()
SCRIPT = (FIXTURES / "process_group" / "main_function.py").read_text()


def write(tmp_path: Path, name: str, text: str, newline: str = "\n", encoding: str = "utf-8") -> Path:
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode(encoding))
    return path


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"ddpify {__version__}"


def test_convert_in_place_reports_changes_and_launch_line(tmp_path):
    path = write(tmp_path, "train.py", SCRIPT)
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 0, result.output
    assert "DdpModel(module, device_ids=ids" in path.read_text()
    assert "DDP101" in result.output and "DDP201" in result.output
    assert f"--standalone --nproc-per-node=gpu {path}" in result.output  # the line for GPUs (tests/test_launch.py)


def test_convert_keeps_mode_newlines_and_encoding(tmp_path):
    text = "# -*- coding: latin-1 -*-\n# caf\xe9\n" + SCRIPT
    path = write(tmp_path, "train.py", text, newline="\r\n", encoding="latin-1")
    path.chmod(0o755)
    assert runner.invoke(app, ["convert", str(path)]).exit_code == 0
    raw = path.read_bytes()
    assert b"caf\xe9" in raw and b"\r\n" in raw and b"\n" not in raw.replace(b"\r\n", b"")
    assert os.stat(path).st_mode & 0o777 == 0o755


def test_a_notebook_is_refused_naming_the_format_not_passed_over(tmp_path):
    # (RL_pytorch's .ipynb: its JSON parses as one Python dict, which read as "nothing to convert", rc 0)
    cells = {"cells": [{"cell_type": "code", "source": ["import torch.nn as nn\n", "model = nn.DataParallel(nn.Linear(2, 2))\n"]}]}
    path = write(tmp_path, "train.ipynb", json.dumps(cells))
    before = path.read_bytes()
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code != 0 and "Jupyter notebook" in result.output and "nbconvert --to script" in result.output
    assert path.read_bytes() == before


def test_output_option_leaves_input_alone(tmp_path):
    path = write(tmp_path, "train.py", SCRIPT)
    out = tmp_path / "train_ddp.py"
    result = runner.invoke(app, ["convert", str(path), "-o", str(out)])
    assert result.exit_code == 0
    assert path.read_text() == SCRIPT and "ddp_setup()" in out.read_text()
    assert f"--nproc-per-node=gpu {out}" in result.output  # on a machine with GPUs, or beside the CPU line


def test_diff_writes_nothing_and_exits_one(tmp_path):
    path = write(tmp_path, "train.py", SCRIPT)
    result = runner.invoke(app, ["convert", "--diff", str(path)])
    assert result.exit_code == 1
    assert f"--- a/{str(path).lstrip('/')}" in result.stdout and "+    ddp_setup()" in result.stdout
    assert path.read_text() == SCRIPT


def test_diff_of_nothing_to_convert_exits_zero(tmp_path):
    path = write(tmp_path, "clean.py", "print('hello')\n")
    assert runner.invoke(app, ["convert", "--diff", str(path)]).exit_code == 0


def test_module_that_only_names_the_class_gets_no_launch_line(tmp_path):
    path = write(tmp_path, "helpers.py", (FIXTURES / "wrap" / "reference_only.py").read_text())
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 0 and "DDP104" in result.output and "launch" not in result.output
    assert "ddp_setup" not in path.read_text()


def test_check_and_no_op_convert_never_import_libcst(tmp_path):
    path = write(tmp_path, "already.py", (FIXTURES / "noop" / "already_ddp.py").read_text())
    code = (
        "import sys\nfrom ddpify.api import convert_file\nfrom ddpify.check import check_source\n"
        f"convert_file({str(path)!r}); check_source(open({str(path)!r}).read())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'libcst'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_parse_error_exits_two_and_leaves_file(tmp_path):
    text = "import torch\nmodel = torch.nn.DataParallel(\n"
    path = write(tmp_path, "broken.py", text)
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 2 and "DDP001" in result.output
    assert path.read_text() == text


def test_unconvertible_file_is_untouched_and_reported(tmp_path):
    text = (FIXTURES / "wrap" / "functional_import.py").read_text()  # (data_parallel() outside a forward)
    path = write(tmp_path, "sub.py", text)
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 3 and "not converted" in result.output and "DDP004" in result.output
    assert path.read_text() == text


def test_missing_file_exits_two(tmp_path):
    assert runner.invoke(app, ["convert", str(tmp_path / "nope.py")]).exit_code == 2


def test_output_with_several_inputs_is_a_usage_error(tmp_path):
    a, b = write(tmp_path, "a.py", SCRIPT), write(tmp_path, "b.py", SCRIPT)
    assert runner.invoke(app, ["convert", str(a), str(b), "-o", str(tmp_path / "c.py")]).exit_code == 2


def test_output_for_a_folder_converts_a_copy_and_leaves_the_folder_alone(tmp_path):
    # (batch 45's reviewers: `ddpify convert DIR -o OUT` was "takes exactly one input file")
    project = tmp_path / "project"
    project.mkdir()
    path = write(project, "train.py", SCRIPT)
    out = tmp_path / "converted"
    result = runner.invoke(app, ["convert", str(project), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert path.read_text() == SCRIPT and "ddp_setup()" in (out / "train.py").read_text()
    assert f"{out / 'train.py'}: converted" in result.output
    again = runner.invoke(app, ["convert", str(project), "-o", str(out)])
    assert again.exit_code == 2 and "exists" in again.output


def test_per_process_batch_option(tmp_path):
    text = (FIXTURES / "loaders" / "shuffle_drop_last.py").read_text()
    path = write(tmp_path, "t.py", text)
    result = runner.invoke(app, ["convert", "--per-process-batch", str(path)])
    assert result.exit_code == 0 and "DDP402" in result.output
    assert "batch_size=16," in path.read_text() and "ddp_local_batch_size(16)" not in path.read_text()


def test_folder_of_scripts_converts_in_parallel(tmp_path):
    for name in ("a.py", "b.py", "c.py"):
        write(tmp_path, name, SCRIPT)
    result = runner.invoke(app, ["convert", "-j", "2", str(tmp_path)])
    assert result.exit_code == 0
    assert all("ddp_setup()" in (tmp_path / n).read_text() for n in ("a.py", "b.py", "c.py"))


def test_cli_start_up_imports_neither_torch_nor_libcst():
    code = "import sys, ddpify.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'libcst')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_python_dash_m_entry_point():
    result = subprocess.run([sys.executable, "-m", "ddpify", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("ddpify ")


def test_pyproject_sets_the_convert_default(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ddpify]\nper-process-batch = true\n")
    path = write(tmp_path, "t.py", (FIXTURES / "loaders" / "shuffle_drop_last.py").read_text())
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 0 and "DDP402" in result.output


def test_unsharded_training_data_refuses_unless_allow_partial(tmp_path):
    # the second loop makes its batches itself, step by step: nothing to split between the ranks
    text = (FIXTURES / "loaders" / "unfed_loop.py").read_text().replace(
        "    extra = [torch.randn(4, 2) for _ in range(3)]\n    for x in extra:\n",
        "    for step in range(3):\n        x = torch.randn(4, 2)\n",
    )
    path = write(tmp_path, "train.py", text)
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 3 and "DDP304" in result.output and "launch" not in result.output
    assert "--allow-partial" not in result.output, "a refusal never points at the partial conversion"
    assert path.read_text() == text
    result = runner.invoke(app, ["convert", "--allow-partial", str(path)])
    assert result.exit_code == 0 and "DDP304" in result.output and "launch" in result.output
    assert "DdpModel(module, device_ids=ids" in path.read_text()


def test_output_is_written_even_when_there_is_nothing_to_convert(tmp_path):
    text = "import torch\nprint(torch.__version__)\n"
    source = write(tmp_path, "plain.py", text)
    result = runner.invoke(app, ["convert", str(source), "-o", str(tmp_path / "out" / "plain_ddp.py")])
    assert result.exit_code == 0 and "nothing to convert" in result.output
    assert (tmp_path / "out" / "plain_ddp.py").read_text() == text


def test_a_refused_file_writes_no_output(tmp_path):
    source = write(tmp_path, "train.py", (FIXTURES / "wrap" / "changed_after_wrap_refused.py").read_text())
    result = runner.invoke(app, ["convert", str(source), "-o", str(tmp_path / "out.py")])
    assert result.exit_code == 3 and not (tmp_path / "out.py").exists()


def test_parse_error_points_at_pythons_position_and_names_async(tmp_path):
    # (`async=` alone is read as non_blocking= and converted, DDP015: another error remains here)
    source = write(tmp_path, "train.py", "import torch\nnet = torch.nn.DataParallel(net)\nx = x.cuda(async=True\n")
    result = runner.invoke(app, ["convert", str(source)])
    assert result.exit_code == 2
    assert "train.py:3:" in result.output and "DDP001" in result.output and "non_blocking=True" in result.output


def test_every_code_the_goldens_emit_is_explained_by_rule():
    import re

    from ddpify.convert_codes import convert_codes
    from ddpify.rules import RULES

    emitted = {code for path in FIXTURES.glob("*/*.diag.txt") for code in re.findall(r": (DDP\d{3}) ", path.read_text())}
    # convert also refuses with check's findings for forms it cannot rewrite (DDP120-122)
    explained = set(convert_codes()) | set(RULES)
    assert emitted and emitted <= explained, emitted - explained
    result = runner.invoke(app, ["rule", "DDP105"])
    assert result.exit_code == 0 and "just before the optimizer" in result.output
    assert "convert codes:" in runner.invoke(app, ["rule"]).output


def test_training_step_in_a_project_module_refuses_where_it_cannot_be_read(tmp_path):
    # the project module is read (ddpify/project/neighbours.py): where it cannot be (it does not
    # parse on Python 3, a Python 2 print statement), the training step is out of sight
    (tmp_path / "train_fns.py").write_text("def train(model, loader, opt):\n    for x in loader:\n        print 'step'\n        model(x).sum().backward()\n        opt.step()\n")
    text = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nimport train_fns\n"
        "model = nn.DataParallel(nn.Linear(2, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)\ntrain_fns.train(model, loader, opt)\n"
    )
    path = write(tmp_path, "main.py", text)
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 3 and "DDP304" in result.output and "train_fns" in result.output
    assert path.read_text() == text


def test_training_in_a_package_of_the_project_root_is_out_of_sight_for_a_tools_script(tmp_path):
    # mdistiller's tools/train.py: the package it imports sits at the repository root, and the
    # trainer (a class picked from a dict) builds the optimizer and iterates the loaders
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "engine.py").write_text("trainer_dict = {}\n")
    (tmp_path / "tools").mkdir()
    text = (
        "import torch\nfrom pkg.engine import trainer_dict\n"
        "def main(cfg, net, loader):\n    net = torch.nn.DataParallel(net.cuda())\n"
        "    trainer = trainer_dict[cfg.TRAINER](net, loader, cfg)\n    trainer.train()\n"
    )
    path = write(tmp_path / "tools", "train.py", text)
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 3 and "DDP304" in result.output and "pkg.engine" in result.output
    assert "ddpify convert DIR" in result.output and path.read_text() == text


def test_training_step_in_a_readable_project_module_is_followed(tmp_path):
    (tmp_path / "train_fns.py").write_text("def train(model, loader, opt):\n    for x in loader:\n        model(x).sum().backward()\n        opt.step()\n")
    text = (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\nimport train_fns\n"
        "model = nn.DataParallel(nn.Linear(2, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)\ntrain_fns.train(model, loader, opt)\n"
    )
    path = write(tmp_path, "main.py", text)
    result = runner.invoke(app, ["convert", str(path)])
    assert result.exit_code == 0, result.output
    # its epochs run out of sight: each pass over the loader is the next epoch
    assert "sampler=DdpNextEpochSampler(dataset, shuffle=False)" in path.read_text()


def test_the_verify_extra_keeps_the_users_torch_and_dev_pins_it():
    """`pip install 'ddpify[verify]'` into a training environment must not replace its torch."""
    import re

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    extras = tomllib.loads((FIXTURES.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    torch_verify = [req for req in extras["verify"] if re.match(r"torch\b", req)]
    assert torch_verify and all("==" not in req and ">=" in req for req in torch_verify), torch_verify
    assert any(req.startswith("numpy") for req in extras["verify"]), "the probe hashes weights through numpy"
    assert "torch==2.13.0" in extras["dev"]
