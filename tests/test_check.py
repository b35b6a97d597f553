"""ddpify check: findings, codes, suppressions, config, output formats, pre-commit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, ROOT
from ddpify.check import CheckOptions, check_source
from ddpify.cli import app
from ddpify.rules import RULES

runner = CliRunner()
HAZARDS = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
os.environ["CUDA_VISIBLE_DEVICES"] = "0"
ds = list(range(10))
loader = DataLoader(ds, shuffle=True, sampler=DistributedSampler(ds))
model = DDP(torch.nn.Linear(2, 2).to("cuda:0"), device_ids=[0])
print("hi")
print("quiet")  # noqa: DDP611
if dist.get_rank() == 0:
    torch.save(model.state_dict(), "x.pt")
torch.save(model.state_dict(), "y.pt")  # ddpify: ignore[DDP7]
"""


def codes(source: str, **options) -> list[tuple[int, str]]:
    return [(d.line, d.code) for d in check_source(source, CheckOptions(**options))]


def test_every_hazard_is_found_once_at_its_line():
    assert codes(HAZARDS) == [
        (6, "DDP711"), (8, "DDP310"), (8, "DDP510"), (9, "DDP710"), (9, "DDP710"), (10, "DDP611"), (14, "DDP610"),
    ]


def test_data_parallel_is_flagged_in_any_file():
    assert codes("import torch\nm = torch.nn.DataParallel(net)\n") == [(2, "DDP100")]


def test_data_parallel_through_a_star_import_is_flagged():
    source = "from models import *\nm = torch.nn.DataParallel(net)\nn2 = nn.DataParallel(net)\n"
    assert codes(source) == [(2, "DDP100"), (3, "DDP100")]


def test_functional_data_parallel_is_flagged_in_any_file():
    source = (
        "import torch.nn as nn\nfrom torch.nn.parallel import data_parallel as dp\n"
        "class Generator(nn.Module):\n    def forward(self, x):\n"
        "        if x.is_cuda and self.ngpu > 1:\n"
        "            return nn.parallel.data_parallel(self.main, x, range(self.ngpu))\n"  # 6
        "        return dp(self.main, x, [0])\n"  # 7
    )
    assert codes(source) == [(6, "DDP120"), (7, "DDP120")]
    assert codes("from models import *\ny = nn.parallel.data_parallel(net, x, [0, 1])\n") == [(2, "DDP120")]
    assert codes("def data_parallel(m, x):\n    return m(x)\ny = data_parallel(net, x)\n") == []


def test_data_parallel_subclasses_and_forks():
    source = (
        "import torch.nn as nn\nfrom torch.nn import Module\n"
        "class CustomDataParallel(nn.DataParallel):\n    pass\n"  # 3: a subclass, at its base
        "class _DataParallel(Module):\n    def replicate(self, module, device_ids):\n        return []\n"  # 5: a fork
        "class DataParallelWrapper(Module):\n    def forward(self, x):\n        return x\n"  # only the name
        "model = CustomDataParallel(net)\nother = _DataParallel(net)\n"  # defined here: not a foreign variant
        "ok = isinstance(model, nn.DataParallel)\n"  # 13
    )
    assert codes(source) == [(3, "DDP121"), (5, "DDP121"), (13, "DDP100")]


def test_data_parallel_variants_from_other_modules():
    source = (
        "from models.data_parallel import DataParallel\n"
        "from encoding.parallel import DataParallelModel as DPM, DataParallelCriterion\n"
        "import apex\n"
        "model = DataParallel(net, device_ids=[0, 1], chunk_sizes=[2, 6])\n"  # 4: CenterNet's fork
        "model = DPM(net)\ncriterion = DataParallelCriterion(criterion)\n"  # 5, 6
        "ddp = apex.parallel.DistributedDataParallel(net)\n"  # DDP, not a DataParallel variant
        "model = BalancedDataParallel(2, net, dim=0)\n"  # 8: bound elsewhere (a star import)
        "criterion = DataParallelCriterion\n"  # named, not called with a model
    )
    assert codes(source) == [(4, "DDP122"), (5, "DDP122"), (6, "DDP122"), (8, "DDP122")]


def test_dataparallel_only_sync_batchnorm():
    source = (
        "import torch.nn as nn\nfrom sync_batchnorm import SynchronizedBatchNorm2d, DataParallelWithCallback\n"
        "from sync_batchnorm.replicate import patch_replication_callback\n"
        "net = nn.Sequential(nn.Conv2d(3, 8, 3), SynchronizedBatchNorm2d(8), SynchronizedBatchNorm2d(8))\n"
        "model = nn.DataParallel(net)\npatch_replication_callback(model)\n"  # 5, 6
        "other = DataParallelWithCallback(net, device_ids=[0, 1])\n"  # 7
    )
    # The layers once a file (at their first mention), each DataParallel-only helper where it is called.
    assert codes(source) == [(2, "DDP123"), (5, "DDP100"), (6, "DDP123"), (7, "DDP123")]
    converted = (
        "from sync_batchnorm import SynchronizedBatchNorm2d\nimport torch\n"
        "net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(Net(SynchronizedBatchNorm2d))\n"
    )
    assert codes(converted) == []


HF_SWITCH = """\
import argparse
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
args = parser.parse_args()
if args.local_rank != -1:
    torch.distributed.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
else:
    model = torch.nn.DataParallel(model)
"""


def test_ddp_path_that_plain_torchrun_does_not_select():
    assert codes(HF_SWITCH) == [(4, "DDP124"), (10, "DDP100")]
    fixed = HF_SWITCH.replace("default=-1", 'default=int(os.environ.get("LOCAL_RANK", -1))')
    assert codes(fixed) == [(10, "DDP100")]
    # The DDP path alone (no DataParallel beside it), or DataParallel with no DDP path: no switch to take.
    assert codes(HF_SWITCH.replace("torch.nn.DataParallel(model)", "model")) == []
    assert codes(HF_SWITCH.replace('    torch.distributed.init_process_group("nccl")\n', "").replace(
        "torch.nn.parallel.DistributedDataParallel", "Wrapper")) == [(9, "DDP100")]
    # BasicSR/mmcv: --launcher selects the DDP path; its --local_rank is the old launcher's argument.
    launcher = HF_SWITCH.replace(
        'parser.add_argument("--local_rank", type=int, default=-1)\n',
        'parser.add_argument("--launcher", choices=["none", "pytorch"], default="none")\n'
        'parser.add_argument("--local_rank", type=int, default=0)\n',
    )
    assert codes(launcher) == [(4, "DDP124"), (11, "DDP100")]
    assert codes(launcher.replace('default="none"', 'default="pytorch"')) == [(11, "DDP100")]
    for switch in ('"--multiprocessing-distributed", action="store_true"', '"--distributed", action="store_true"'):
        source = HF_SWITCH.replace('"--local_rank", type=int, default=-1', switch)
        assert codes(source) == [(4, "DDP124"), (10, "DDP100")], switch
    not_a_flag = HF_SWITCH.replace('"--local_rank", type=int, default=-1', '"--distributed", type=int')
    assert codes(not_a_flag) == [(10, "DDP100")]


def test_gpu_argument_with_a_default_index_in_ddp_code():
    source = (
        "import torch.distributed as dist\nparser.add_argument('--gpu', default=0, type=int)\n"
        "parser.add_argument('--gpu-id', default=None, type=int)\nparser.add_argument('--gpus', default=0)\n"
    )
    assert codes(source) == [(2, "DDP710")]
    assert codes(source.replace("import torch.distributed as dist\n", "import torch\n")) == []


# Each DataParallel form (and DDP path beside DataParallel) in its golden fixture, and what
# `check` reports there; where convert rewrote the switch (or replaced the layers), its output
# no longer has the finding.
FORM_FIXTURES = {
    "wrap/star_import.py": "DDP123",
    "wrap/star_import_nn.py": "DDP100",
    "wrap/unwraps.py": "DDP100",
    "wrap/functional_in_forward.py": "DDP120",
    "wrap/chunk_sizes.py": "DDP121",
    "wrap/subclass.py": "DDP121",
    "wrap/subclass_forwarding.py": "DDP121",
    "wrap/subclass_scatter.py": "DDP121",
    "wrap/own_class.py": "DDP122",
    "wrap/sync_bn.py": "DDP123",
    "existing_ddp/local_rank.py": "DDP124",
    "existing_ddp/hf_local_rank.py": "DDP124",
    "existing_ddp/local_rank_dash.py": "DDP124",
    "existing_ddp/world_size_env.py": "DDP124",
    "existing_ddp/launcher_pytorch.py": "DDP124",
    "existing_ddp/multiprocessing_distributed.py": "DDP124",
}


@pytest.mark.parametrize("name", FORM_FIXTURES)
def test_every_form_is_reported_in_its_fixture(name):
    path = FIXTURES / name
    code = FORM_FIXTURES[name]
    assert code in {d.code for d in check_source(path.read_text())}
    converted = path.with_name(path.stem + ".ddp.py").read_text()
    # (a switch the launch line sets, DDP007, stays at its default in the file: check still names it)
    on_the_launch_line = code == "DDP124" and " DDP007 " in path.with_name(path.stem + ".diag.txt").read_text()
    if converted != path.read_text() and code in ("DDP123", "DDP124") and not on_the_launch_line:
        assert code not in {d.code for d in check_source(converted)}


def test_progress_bars_and_trackers_on_every_rank():
    source = (
        "import torch.distributed as dist\nimport wandb as wb\nfrom tqdm import tqdm, trange as tr\n"
        "from torch.utils.tensorboard import SummaryWriter\n"
        "w = SummaryWriter('runs')\n"  # 5: every rank
        "w2 = SummaryWriter('runs') if dist.get_rank() == 0 else None\n"
        "run = wb.init(project='x')\n"  # 7: every rank
        "for x in tqdm(range(3)):\n    pass\n"  # 8: every rank draws
        "for x in tr(3, disable=dist.get_rank() != 0):\n    pass\n"
        "for x in tqdm(range(3), **options):\n    pass\n"
        "if dist.get_rank() == 0:\n    bar = tqdm(range(3))\n"
    )
    assert codes(source) == [(5, "DDP613"), (7, "DDP613"), (8, "DDP612")]
    assert _exhaustive(source) == [(5, "DDP613"), (7, "DDP613"), (8, "DDP612")]


def test_ddp_rules_do_not_fire_outside_ddp_code():
    assert codes('import torch\nprint("x")\nx = torch.zeros(1).cuda(0)\n') == []


def test_set_epoch_anywhere_satisfies_ddp510():
    assert "DDP510" not in [c for _, c in codes(HAZARDS + "loader.sampler.set_epoch(0)\n")]


def test_select_and_ignore_by_prefix():
    assert {c for _, c in codes(HAZARDS, select=("DDP7",))} == {"DDP710", "DDP711"}
    assert "DDP710" not in {c for _, c in codes(HAZARDS, ignore=("DDP71",))}


def test_converted_fixtures_check_clean_and_originals_do_not():
    for expected in FIXTURES.glob("e2e/*.ddp.py"):
        assert check_source(expected.read_text()) == (), expected
        # (DataParallel the module, or by function: DCGAN's data_parallel() in forward)
        assert {"DDP100", "DDP120"} & {d.code for d in check_source(expected.with_name(expected.name[:-7] + ".py").read_text())}


# Each snippet has a finding on a line that says none of the rule words itself, or a layout the
# line-selective walk must still reach (aliases, continuation lines, decorators, \r newlines).
SELECTIVE_WALK_CASES = {
    "alias": ("from torch.nn import DataParallel as DP\nm = DP(\n    net)\n", [(2, "DDP100")]),
    "torch alias": (
        "import torch as th\nth.distributed.init_process_group('gloo')\nif True:\n    print(1)\n",
        [(4, "DDP611")],
    ),
    "parenthesised import": (
        "from torch import (\n    distributed as d,\n)\nd.barrier()\nprint(2)\n", [(5, "DDP611")],
    ),
    "sampler alias": (
        "import torch.distributed as dist\nfrom torch.utils.data import DistributedSampler as S\nx = S(ds)\n",
        [(3, "DDP510")],
    ),
    "decorator": (
        "import torch.distributed as dist\n@wrap(print('x'))\ndef f():\n    pass\n", [(2, "DDP611")],
    ),
    "lone carriage returns": ("import torch\rimport torch.distributed as dist\rx = 1\rprint(x)\r", [(4, "DDP611")]),
    "guard far above": (
        "import torch.distributed as dist\nif dist.get_rank() == 0:\n" + "    x = 1\n" * 50 + "    print(x)\n",
        [],
    ),
    "match": (
        "import torch.distributed as dist\nmatch x:\n    case [a]:\n        print(a)\n", [(4, "DDP611")],
    ),
    "star-imported DataParallel": ("from models import *\nnet = nn.DataParallel(\n    net)\n", [(2, "DDP100")]),
    "functional alias": (
        "from torch.nn.parallel import data_parallel as dp\ny = dp(\n    net, x)\n", [(2, "DDP120")],
    ),
    "subclass base on a continuation line": (
        "from torch.nn import DataParallel as DP\nclass Wrapper(\n        DP):\n    pass\n", [(3, "DDP121")],
    ),
    "decorated fork": (
        "@register\nclass BalancedDataParallel(Base):\n    def scatter(self, inputs, kwargs, ids):\n"
        "        return inputs\n",
        [(2, "DDP121")],
    ),
    "variant alias": (
        "from encoding.parallel import DataParallelModel as DPM\nmodel = DPM(\n    net)\n", [(2, "DDP122")],
    ),
    "variant defined below its call": (
        "def build(net):\n    return BalancedDataParallel(2, net)\nclass BalancedDataParallel(Base):\n    pass\n", [],
    ),
    "sync-BN layer in a parenthesised import": (
        "from sync_batchnorm import (\n    SynchronizedBatchNorm2d,\n)\nbn = SynchronizedBatchNorm2d(8)\n",
        [(2, "DDP123")],
    ),
    "sync-BN callback alias": (
        "from sync_batchnorm import patch_replication_callback as patch\nif True:\n    patch(model)\n",
        [(3, "DDP123")],
    ),
    "switch on a continuation line": (
        "import torch.distributed as dist\nimport torch.nn as nn\nparser.add_argument(\n"
        "    '--local_rank', type=int, default=-1)\nm = nn.DataParallel(net)\n",
        [(3, "DDP124"), (5, "DDP100")],
    ),
    "launcher beside local_rank": (
        "from torch.nn.parallel import DataParallel as DP, DistributedDataParallel\n"
        "def parse(parser):\n    parser.add_argument('--local_rank', type=int, default=0)\n"
        "    parser.add_argument(\n        '--launcher', default='none')\nm = DP(net)\n",
        [(4, "DDP124"), (6, "DDP100")],
    ),
    "gpu default on a continuation line": (
        "import torch.distributed as dist\nparser.add_argument('--gpu',\n    type=int, default=0)\n",
        [(3, "DDP710")],
    ),
}


@pytest.mark.parametrize("name", SELECTIVE_WALK_CASES)
def test_selective_walk_finds_what_a_full_walk_finds(name):
    source, expected = SELECTIVE_WALK_CASES[name]
    assert sorted(set(codes(source))) == expected
    assert _exhaustive(source) == expected


def _exhaustive(source: str) -> list[tuple[int, str]]:
    """Every statement walked, no text pre-filter: what check_source must agree with."""
    import ast

    from ddpify import check

    found = check._diagnostics(check._checked(ast.parse(source), source, selective=False), source, CheckOptions())
    return sorted({(d.line, d.code) for d in found})


def _parses(source: str) -> bool:
    try:
        compile(source, "<fixture>", "exec", dont_inherit=True)
    except SyntaxError:
        return False
    return True


def test_pre_filter_and_selective_walk_agree_with_a_full_walk_on_real_code():
    """On torch's own distributed, data and parallel code (findings of every kind), skipping
    files and statements by their words never changes the findings."""
    torch_root = Path(pytest.importorskip("torch").__file__).parent
    folders = ["nn/parallel", "utils/data", "testing/_internal/distributed", "distributed/elastic", "distributed/fsdp"]
    files = [f for folder in folders for f in sorted((torch_root / folder).rglob("*.py"))]
    files += sorted(FIXTURES.rglob("*.py"))
    assert len(files) > 100
    total = 0
    for path in files:
        source = path.read_text(encoding="utf-8")
        if not _parses(source):
            continue  # (fixtures/devices/async_keyword.py: Python before 3.7, read by convert only)
        expected = _exhaustive(source)
        total += len(expected)
        assert sorted(set(codes(source))) == expected, path
    assert total > 50  # the sample really exercises the rules


def test_every_code_has_an_example_and_the_rule_command_shows_it():
    for code, rule in RULES.items():
        assert rule.before and rule.after and rule.summary
        result = runner.invoke(app, ["rule", code.lower()])
        assert result.exit_code == 0 and "## Example" in result.output and "Use instead:" in result.output
    assert runner.invoke(app, ["rule", "DDP999"]).exit_code == 2
    listing = runner.invoke(app, ["rule"])
    check_lines = listing.output.split("\n\nconvert codes:")[0].splitlines()[1:]  # "  DDP100  data-parallel ..."
    assert listing.exit_code == 0 and [line.split()[0] for line in check_lines] == list(RULES)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(HAZARDS)
    (tmp_path / "pkg" / "clean.py").write_text("print('fine')\n")
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "old.py").write_text("import torch\nm = torch.nn.DataParallel(n)\n")
    return tmp_path


def invoke(*args):
    return runner.invoke(app, ["check", *map(str, args)])


def test_exit_codes(project):
    assert invoke(project / "pkg" / "clean.py").exit_code == 0
    assert invoke(project / "pkg").exit_code == 1
    assert invoke("--exit-zero", project / "pkg").exit_code == 0
    # Only files that can have findings are parsed (text pre-filter), so the error shows there.
    (project / "bad.py").write_text("import torch.distributed\nprint(\n")
    assert invoke(project / "bad.py").exit_code == 2
    assert invoke("--output-format", "xml", project).exit_code == 2


def test_concise_format_and_directory_walk(project):
    result = invoke("--output-format", "concise", project)
    assert f"{project / 'pkg' / 'train.py'}:6:12: DDP711 " in result.output
    assert f"{project / 'vendor' / 'old.py'}:2:5: DDP100 " in result.output


def test_pyproject_config(project):
    (project / "pyproject.toml").write_text(
        '[tool.ddpify]\nignore = ["DDP61"]\nextend-exclude = ["vendor"]\n'
        'per-file-ignores = { "pkg/train.py" = ["DDP3"] }\n'
    )
    found = {line.split(": ")[1].split()[0] for line in invoke("--output-format", "concise", project).output.splitlines()}
    assert found == {"DDP711", "DDP510", "DDP710"}
    # excluded files named explicitly are checked unless --force-exclude (pre-commit names files)
    assert invoke(project / "vendor" / "old.py").exit_code == 1
    assert invoke("--force-exclude", project / "vendor" / "old.py").exit_code == 0


def test_unknown_config_key_is_an_error(project):
    (project / "pyproject.toml").write_text("[tool.ddpify]\nselekt = []\n")
    assert invoke(project).exit_code == 2


def test_stdin(project):
    result = runner.invoke(app, ["check", "-", "--stdin-filename", "x.py", "--output-format", "concise"], input=HAZARDS)
    assert result.exit_code == 1 and result.output.startswith("x.py:6:12: DDP711")


def test_json_format(project):
    rows = json.loads(invoke("--output-format", "json", project / "pkg").output)
    assert {row["code"] for row in rows} >= {"DDP711", "DDP610"} and all(row["line"] > 0 for row in rows)


def test_github_annotations_escape_properties_and_data(tmp_path):
    weird = tmp_path / "a,b:c.py"
    weird.write_text("import torch\nm = torch.nn.DataParallel(n)\n")
    line = invoke("--output-format", "github", weird).output.splitlines()[0]
    assert line.startswith("::error file=") and "a%2Cb%3Ac.py,line=2,col=5,title=DDP100::" in line


def test_sarif_is_what_github_code_scanning_reads(project, tmp_path):
    out = tmp_path / "report.sarif"
    (project / "pyproject.toml").write_text("[tool.ddpify]\n")
    result = runner.invoke(app, ["check", "--output-format", "sarif", "--output-file", str(out), str(project / "pkg")])
    assert result.exit_code == 1
    sarif = json.loads(out.read_text())
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    run = sarif["runs"][0]
    assert run["tool"]["driver"]["name"] == "ddpify"
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert len(rule_ids) == len(set(rule_ids)) and set(RULES) <= set(rule_ids)
    for finding in run["results"]:
        assert finding["ruleId"] in rule_ids and finding["message"]["text"]
        location = finding["locations"][0]["physicalLocation"]
        assert location["artifactLocation"]["uri"] == "pkg/train.py"  # relative to the repo root
        assert location["region"]["startLine"] >= 1


def test_convert_diff_is_the_review_mode(tmp_path):
    script = tmp_path / "t.py"
    script.write_text((FIXTURES / "process_group" / "flat.py").read_text())
    before = script.read_text()
    result = runner.invoke(app, ["convert", "--diff", str(script)])
    assert result.exit_code == 1 and "+ddp_setup()" in result.stdout and script.read_text() == before


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_pre_commit_hook_fails_on_data_parallel_and_passes_clean(tmp_path):
    pre_commit = [sys.executable, "-m", "pre_commit"]
    repo = tmp_path / "user-repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (repo / "clean.py").write_text("print('hello')\n")
    (repo / "train.py").write_text("import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n")
    git("add", ".")
    env_home = {"PRE_COMMIT_HOME": str(tmp_path / "pc-cache")}
    import os

    env = {**os.environ, **env_home}
    source = tmp_path / "ddpify-src"  # try-repo needs a git repo: a snapshot of this checkout
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", "demo-out"))
    for args in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "s"]):
        subprocess.run(["git", *args], cwd=source, check=True, capture_output=True)
    run = lambda *files: subprocess.run(  # noqa: E731
        [*pre_commit, "try-repo", str(source), "ddpify", "--files", *files], cwd=repo, env=env, capture_output=True, text=True
    )
    failing = run("train.py", "clean.py")
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "train.py:2:9: DDP100" in failing.stdout
    passing = run("clean.py")
    assert passing.returncode == 0, passing.stdout + passing.stderr


def test_a_loader_module_converted_in_a_project_is_not_told_to_call_set_epoch():
    # deeplab's dataloaders/__init__.py after `ddpify convert .`: set_epoch is in train.py
    source = (
        "import torch\nimport torch.distributed as dist\nfrom torch.utils.data import DataLoader\n"
        "from torch.utils.data.distributed import DistributedSampler\n\n\n"
        "# Distributed helpers added by ddpify; the entry script sets up the process group.\n\n\n"
        "def make_data_loader(train_set):\n"
        "    return DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set, shuffle=True))\n"
    )
    assert "DDP510" not in [code for _, code in codes(source)]
    plain = source.replace("# Distributed helpers added by ddpify; the entry script sets up the process group.\n", "")
    assert "DDP510" in [code for _, code in codes(plain)]


VARIANT_CASES = {
    "variants from other modules": (
        "from models.data_parallel import DataParallel\n"
        "from encoding.parallel import DataParallelModel as DPM, DataParallelCriterion\n"
        "import apex\nmodel = DataParallel(net, device_ids=[0, 1], chunk_sizes=[2, 6])\n"
        "model = DPM(net)\ncriterion = DataParallelCriterion(criterion)\n"
        "ddp = apex.parallel.DistributedDataParallel(net)\nmodel = BalancedDataParallel(2, net, dim=0)\n"
        "criterion = DataParallelCriterion\n"
    ),
    "a fork and a function defined here": (
        "from torch.nn import Module\n@register\nclass BalancedDataParallel(Module):\n"
        "    def scatter(self, inputs, kwargs, ids):\n        return inputs\n"
        "def MyDataParallel(net):\n    return net\nmodel = MyDataParallel(net)\nother = BalancedDataParallel(0, net)\n"
    ),
    "suppressed on its line": "from mylib import DataParallelModel\nmodel = DataParallelModel(net)  # noqa: DDP122\n",
    "star import, attribute of a call": "from models import *\nmodel = get_lib().DataParallelModel(\n    net)\n",
    "only keywords": "from mylib import DataParallelModel\nmodel = DataParallelModel(module=net)\n",
}


def _convert_variants(source: str) -> list[tuple[int, int, str]] | None:
    """What a conversion refuses with (DDP120-122, found by the libcst analysis), for a file
    with no torch DataParallel to convert; None where the file has something else to say."""
    import libcst as cst

    from ddpify.analysis import analyze
    from ddpify.engine import variant_refusal
    from ddpify.transforms.base import MetadataView

    wrapper = cst.MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    facts = analyze(wrapper)
    if facts.wraps or facts.dp_references or facts.problems:
        return None
    result = variant_refusal("x.py", source, facts, MetadataView(wrapper))
    return sorted((d.line, d.col, d.code) for d in result.diagnostics) if result else []


def test_convert_finds_the_dataparallel_variants_check_finds():
    """convert parses once (libcst) and finds the variants it refuses as check (ast) does."""
    from ddpify.engine import VARIANT_CODES
    from ddpify.names import mentions_data_parallel

    torch_root = Path(pytest.importorskip("torch").__file__).parent
    sources = {name: source for name, (source, _) in SELECTIVE_WALK_CASES.items()} | VARIANT_CASES
    inputs = [
        path for path in sorted(FIXTURES.rglob("*.py"))
        if not path.name.endswith(".ddp.py") and not any(part.endswith(".ddp") for part in path.parts)  # inputs only
    ]
    for path in [*inputs, torch_root / "nn" / "parallel" / "data_parallel.py"]:  # torch's own DataParallel: a fork
        if _parses(path.read_text(encoding="utf-8")):  # (async_keyword.py: Python before 3.7)
            sources[str(path)] = path.read_text(encoding="utf-8")
    compared = found = 0
    for name, source in sources.items():
        if not mentions_data_parallel(source):
            continue
        converted = _convert_variants(source)
        if converted is None:
            continue
        expected = sorted({(d.line, d.col, d.code) for d in check_source(source) if d.code in VARIANT_CODES})
        assert converted == expected, name
        compared += 1
        found += len(expected)
    assert compared > 10 and found >= 6
