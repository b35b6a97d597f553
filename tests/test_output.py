"""What the command line prints and how it exits, in the manner of ruff and black: one exit
code per outcome, one line per finding, repeated diagnostics folded, --quiet / --verbose,
GitHub annotations at the level the command fails at, `ddpify rule` pages, docs links."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES
from ddpify import cli
from ddpify.cli import app
from ddpify.convert_codes import convert_codes
from ddpify.rules import DOCS_URL, RULES, code_url

runner = CliRunner()
SCRIPT = (FIXTURES / "process_group" / "main_function.py").read_text()
GUARDS = (FIXTURES / "wrap" / "guards.py").read_text()  # seven wraps, six reported alike
REFUSED = (FIXTURES / "wrap" / "functional_import.py").read_text()  # DDP004: refused
BROKEN = "import torch\nmodel = torch.nn.DataParallel(\n"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


# -- exit codes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "files, arguments, expected",
    [
        ({"a.py": SCRIPT}, [], 0),  # converted (written)
        ({"a.py": "print('hello')\n"}, [], 0),  # nothing to convert
        ({"a.py": "print('hello')\n"}, ["--diff"], 0),  # nothing to show
        ({"a.py": SCRIPT}, ["--diff"], 1),  # changes shown
        ({"a.py": SCRIPT}, ["--exit-non-zero-on-change"], 1),  # changes written, asked to say so
        ({"a.py": "print('hello')\n"}, ["--exit-non-zero-on-change"], 0),
        ({"a.py": REFUSED}, [], 3),  # refused: left as it was
        ({"a.py": REFUSED}, ["--diff"], 3),
        ({"a.py": BROKEN}, [], 2),  # does not parse
        ({"a.py": SCRIPT, "b.py": REFUSED}, ["--diff"], 3),  # the worst file decides
        ({"a.py": REFUSED, "b.py": BROKEN}, [], 2),
        ({"a.py": SCRIPT, "b.py": SCRIPT}, ["-o", "out.py"], 2),  # usage
    ],
    ids=[
        "converted", "nothing", "nothing-diff", "diff", "written-non-zero", "nothing-non-zero", "refused",
        "refused-diff", "parse-error", "refused-beats-diff", "error-beats-refused", "usage",
    ],
)
def test_convert_exit_codes(tmp_path, files, arguments, expected):
    paths = [write(tmp_path, name, text) for name, text in files.items()]
    arguments = [str(tmp_path / a) if a == "out.py" else a for a in arguments]
    result = runner.invoke(app, ["convert", *arguments, *map(str, paths)])
    assert result.exit_code == expected, result.output


def test_a_usage_error_of_the_parser_itself_exits_2():
    assert runner.invoke(app, ["convert", "--no-such-option", "x.py"]).exit_code == 2
    assert runner.invoke(app, ["check", "--output-format", "xml", "x.py"]).exit_code == 2


def test_check_exit_codes(tmp_path):
    clean, found, broken = write(tmp_path, "c.py", "print(1)\n"), write(tmp_path, "f.py", SCRIPT), write(tmp_path, "b.py", BROKEN)
    assert runner.invoke(app, ["check", str(clean)]).exit_code == 0
    assert runner.invoke(app, ["check", str(found)]).exit_code == 1
    assert runner.invoke(app, ["check", "--exit-zero", str(found)]).exit_code == 0
    assert runner.invoke(app, ["check", str(broken)]).exit_code == 2


def test_an_internal_error_exits_2_with_the_traceback(tmp_path, monkeypatch, capsys):
    from ddpify import api

    def boom(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(api, "convert_files", boom)
    monkeypatch.setattr(sys, "argv", ["ddpify", "convert", str(write(tmp_path, "a.py", SCRIPT))])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "RuntimeError: a bug" in err and "error: internal error in ddpify" in err


def test_exit_codes_are_documented():
    page = (Path(__file__).resolve().parent.parent / "docs" / "commands.md").read_text()
    convert = page[page.index("## convert"):page.index("## check")]
    for code, words in ((0, "converted"), (1, "--diff"), (2, "parse"), (3, "refused")):
        assert re.search(rf"^\| {code} \| .*{re.escape(words)}", convert, flags=re.MULTILINE), code


# -- convert's output ---------------------------------------------------------------------------


def test_repeated_diagnostics_of_one_kind_are_one_line(tmp_path):
    path = write(tmp_path, "train.py", GUARDS)
    result = runner.invoke(app, ["convert", "-o", str(tmp_path / "out.py"), str(path)])
    lines = [line for line in result.output.splitlines() if ": DDP" in line]
    wraps = [line for line in lines if "DDP101 DataParallel -> DistributedDataParallel on this process's device" in line]
    assert f"  {path}:28:16: DDP101 DataParallel -> DistributedDataParallel on this process's device (6 places: lines 28, 30, 35, 38, 40, 43)" in wraps
    # a different message is another kind; no kind is said twice
    assert len(wraps) == 2
    kinds = [re.sub(r" \(\d+ places: lines [\d, .]+\)", "", line.split(": ", 1)[1]) for line in lines]
    assert len(kinds) == len(set(kinds)), lines


def test_folded_places_are_counted_and_cut():
    from ddpify.diagnostics import Diagnostic, FileResult
    from ddpify.cli import View, _diagnostic_lines

    same = [Diagnostic(n, 5, "DDP601", "print() runs on rank 0 only") for n in (12, 40, 41, 55, 60, 71, 90, 97, 120, 130)]
    result = FileResult("t.py", "", "x", (*same, Diagnostic(13, 1, "DDP601", "print() runs on rank 0 only", cli.Severity.WARNING)))
    assert _diagnostic_lines(result, View()) == [
        "  t.py:12:5: DDP601 print() runs on rank 0 only (10 places: lines 12, 40, 41, 55, 60, 71, 90, 97, ...)",
        "  t.py:13:1: DDP601 print() runs on rank 0 only [warning]",  # another severity: another kind
    ]
    assert len(_diagnostic_lines(result, View(verbose=True))) == 11


def test_verbose_shows_every_place_and_links_every_code(tmp_path):
    path = write(tmp_path, "train.py", GUARDS)
    result = runner.invoke(app, ["convert", "-v", "-o", str(tmp_path / "out.py"), str(path)])
    plain = "DDP101 DataParallel -> DistributedDataParallel on this process's device"
    assert sum(line.endswith(plain) for line in result.output.splitlines()) == 6
    assert f"  DDP101  {DOCS_URL}transforms/#ddp101" in result.output


def test_quiet_says_one_line_per_file_and_why_a_file_was_refused(tmp_path):
    good, bad = write(tmp_path, "good.py", SCRIPT), write(tmp_path, "bad.py", REFUSED)
    result = runner.invoke(app, ["convert", "-q", str(good), str(bad)])
    assert result.exit_code == 3
    lines = result.output.splitlines()
    assert lines[0] == f"{good}: converted" and lines[1] == f"{bad}: not converted (file left untouched)"
    assert all(line.endswith("[error]") for line in lines[2:]) and "DDP004" in lines[2], result.output
    assert "launch" not in result.output
    assert runner.invoke(app, ["convert", "-q", "-v", str(good)]).exit_code == 2


def test_a_projects_refusal_comes_first_and_the_files_it_holds_back_share_one_line(tmp_path):
    (tmp_path / "trainer.py").write_text(
        "import torch\nfrom torch.nn.parallel import replicate, parallel_apply\n\n\ndef train(net, loader, opt):\n"
        "    for x, y in loader:\n        out = parallel_apply(replicate(net, [0]), [x])[0]\n"
        "        opt.zero_grad()\n        ((out - y) ** 2).mean().backward()\n        opt.step()\n"
    )
    (tmp_path / "utils.py").write_text("def log(message):\n    print(message)\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom trainer import train\nfrom utils import log\n\n"
        "net = torch.nn.DataParallel(torch.nn.Linear(4, 1))\n"
        "train(net, DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4), torch.optim.SGD(net.parameters(), 0.1))\n"
        "log('done')\n"
    )
    result = runner.invoke(app, ["convert", "--diff", str(tmp_path)])
    lines = result.output.splitlines()
    assert result.exit_code == 3, result.output
    refused = lines.index(f"{tmp_path / 'trainer.py'}: not converted (file left untouched)")
    held = lines.index(f"{tmp_path / 'train.py'}, {tmp_path / 'utils.py'}: not converted (left untouched)")
    assert refused < held and "DDP004" in lines[refused + 1] and "works together with these files" in lines[held + 1]
    assert sum("DDP210" in line for line in lines) == 1
    verbose = runner.invoke(app, ["convert", "--diff", "-v", str(tmp_path)])
    assert sum(": DDP210 " in line for line in verbose.output.splitlines()) == 2  # (every file on its own)


# -- check's output -----------------------------------------------------------------------------


def test_check_prints_one_line_per_finding_then_a_summary_with_links(tmp_path):
    path = write(tmp_path, "train.py", "import torch\nm = torch.nn.DataParallel(n)\nk = torch.nn.DataParallel(n)\n")
    result = runner.invoke(app, ["check", str(path)])
    assert result.output.splitlines() == [
        f"{path}:2:5: DDP100 [*] nn.DataParallel is used; `ddpify convert` rewrites it to DistributedDataParallel",
        f"{path}:3:5: DDP100 [*] nn.DataParallel is used; `ddpify convert` rewrites it to DistributedDataParallel",
        "Found 2 findings.",
        "[*] 2 fixable with `ddpify convert`.",
        "Explained by `ddpify rule CODE` and at:",
        f"  DDP100  {DOCS_URL}rules/#ddp100",
    ]
    assert result.output.count("fixable") == 1
    quiet = runner.invoke(app, ["check", "-q", str(path)])
    assert quiet.exit_code == 1 and len(quiet.output.splitlines()) == 2


def test_github_annotations_are_errors_when_the_command_fails(tmp_path):
    path = write(tmp_path, "t.py", "import torch\nm = torch.nn.DataParallel(n)\n")
    failing = runner.invoke(app, ["check", "--output-format", "github", str(path)])
    assert failing.exit_code == 1 and failing.output.startswith("::error file=")
    assert f"({code_url('DDP100')})" in failing.output.replace("%3A", ":")
    passing = runner.invoke(app, ["check", "--output-format", "github", "--exit-zero", str(path)])
    assert passing.exit_code == 0 and passing.output.startswith("::warning file=")


def test_json_and_sarif_link_the_docs(tmp_path):
    path = write(tmp_path, "t.py", "import torch\nm = torch.nn.DataParallel(n)\n")
    rows = json.loads(runner.invoke(app, ["check", "--output-format", "json", str(path)]).output)
    assert rows[0]["url"] == f"{DOCS_URL}rules/#ddp100"
    sarif = json.loads(runner.invoke(app, ["check", "--output-format", "sarif", str(path)]).output)
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert all(rule["helpUri"] == code_url(rule["id"]) for rule in rules)


# -- ddpify rule --------------------------------------------------------------------------------


def test_rule_for_a_check_code_reads_like_ruff_rule():
    result = runner.invoke(app, ["rule", "DDP612"])
    assert result.exit_code == 0
    text = result.output
    assert text.startswith("# progress-bar-on-every-rank (DDP612)\n\n")
    assert "Fix is available: `ddpify convert` rewrites it." in text
    for heading in ("## What it does\n", "## Why is this bad?\n", "## Example\n```python\n", "Use instead:\n```python\n"):
        assert heading in text
    assert text.rstrip().endswith(f"Docs: {DOCS_URL}rules/#ddp612")


@pytest.mark.parametrize("code", sorted(convert_codes()))
def test_rule_for_every_convert_code_is_clean(code):
    text = runner.invoke(app, ["rule", code]).output
    assert text.startswith(f"# {code}\n\nReported by `ddpify convert`")
    assert "::" not in text, "reStructuredText's example marker"
    assert "ddpify/transforms" not in text and "(ddpify/" not in text, "an internal module path"
    assert not re.search(r"(?<!`)``(?!`)", text), "reStructuredText's double backticks"
    assert text.count("```") % 2 == 0
    assert text.rstrip().endswith(f"Docs: {code_url(code)}")


def test_rule_list_cuts_no_word():
    result = runner.invoke(app, ["rule"])
    assert result.exit_code == 0 and "check codes" in result.output and "convert codes" in result.output
    full_texts = {code: rule.summary for code, rule in RULES.items()}
    for line in result.output.splitlines():
        match = re.match(r"^  (DDP\d{3})  ", line)
        if not match:
            continue
        assert "::" not in line and "``" not in line
        if line.endswith(" ..."):
            shown = line[:-4].split()[-1]
            # the last word shown is whole: the full text has it followed by a space
            source = full_texts.get(match.group(1)) or " ".join(convert_codes()[match.group(1)].split())
            assert re.search(rf"{re.escape(shown)}\s", source.replace("``", "`")), line


@pytest.mark.parametrize("code, expected", [("DDP51", "did you mean DDP510"), ("ddp6111", "did you mean DDP611"), ("XYZ", "codes look like DDP105")])
def test_unknown_code_is_one_line_with_close_matches(code, expected):
    result = runner.invoke(app, ["rule", code])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and expected in result.output, result.output


def test_every_code_has_a_docs_anchor_on_a_generated_page():
    """Check codes on rules/, convert codes on transforms/ (the built site is checked in
    tests/test_docs.py)."""
    for code in RULES:
        assert code_url(code) == f"{DOCS_URL}rules/#{code.lower()}"
    for code in set(convert_codes()) - set(RULES):
        assert code_url(code) == f"{DOCS_URL}transforms/#{code.lower()}"


def test_a_long_elif_chain_converts_in_linear_time():
    # Bag-of-Tricks-for-AT: 20 `elif` branches; each statement's guard question asked again of
    # every statement around it, without a memo, never finished
    import time

    from ddpify.api import convert_source

    branches = "".join(
        f"        {'if' if i == 0 else 'elif'} args.m == 'a{i}':\n            loss = ((model(x) - y) ** 2).mean() * {i + 1}\n"
        f"            print('branch {i}')\n"
        for i in range(24)
    )
    source = (
        "import argparse\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "p = argparse.ArgumentParser()\np.add_argument('--m', default='a0')\nargs = p.parse_args()\n"
        "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
        f"for epoch in range(2):\n    for x, y in loader:\n{branches}        opt.zero_grad()\n        loss.backward()\n        opt.step()\n"
    )
    started = time.perf_counter()
    result = convert_source(source, path="train.py")
    assert result.changed and not result.error
    assert time.perf_counter() - started < 20


def test_a_rewrite_that_does_not_compile_is_never_written(monkeypatch, tmp_path):
    from ddpify import after_rewrite, engine

    assert after_rewrite.rewrite_does_not_compile("x = 1\n", "x = 1\n") is None
    assert after_rewrite.rewrite_does_not_compile("x = (\n", "x = (\n") is None  # (the original's own error: DDP001's)
    # a rewrite that broke the grammar (a splice this Python refuses) is refused whole
    monkeypatch.setattr(engine.ConversionContext, "finish", lambda self, code: code + "print(f'{'\n")
    script = write(tmp_path, "train.py", "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 1))\n")
    result = CliRunner().invoke(app, ["convert", str(script)])
    assert "DDP002" in result.output and "does not compile" in result.output
    assert script.read_text() == "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 1))\n"


def test_a_rewrite_that_puts_a_collective_where_no_rank_reaches_it_is_never_written(monkeypatch, tmp_path):
    # locuslab/smoothing: a closing barrier after `return datasets.CIFAR10(..., download=True)`
    # never ran, and the ranks waiting for it hung. Whatever rewrite does it, it is not written.
    from ddpify import after_rewrite, engine

    returned = "def f():\n    return 1\n    dist.barrier()\n"
    assert after_rewrite.collective_never_reached("def f():\n    return 1\n", returned)
    assert after_rewrite.collective_never_reached(returned, returned) is None  # (the original's own)
    assert after_rewrite.collective_never_reached("x = 1\n", "for i in y:\n    continue\n    ddp_mean(i)\n")
    monkeypatch.setattr(engine.ConversionContext, "finish", lambda self, code: code + "\ndef f():\n    raise SystemExit\n    dist.barrier()\n")
    script = write(tmp_path, "train.py", "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 1))\n")
    result = CliRunner().invoke(app, ["convert", str(script)])
    assert "DDP002" in result.output and "no rank reaches" in result.output
    assert script.read_text() == "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 1))\n"


def test_a_rewrite_that_still_builds_data_parallel_is_never_written(monkeypatch, tmp_path):
    # theonegis/rsfn (folder mode): `nn` taken from a project module was not seen as torch's, the
    # loaders were sharded and both `nn.DataParallel(...)` wraps left: N DataParallel jobs under
    # torchrun, reported "converted". Whatever missed it, such a result is not written (DDP003).
    from ddpify import after_rewrite, engine

    left = after_rewrite.data_parallel_left
    assert "imported from model" in left("from model import nn\nnet = nn.DataParallel(g)\n")
    assert "from model import *" in left("from model import *\nnet = nn.DataParallel(g)\n")
    assert "line 3" in left("from torch.nn import DataParallel\n\nnet = DataParallel(g)\n")
    assert left("from model import *\nnet = DataParallel(g)\n")  # (bound by nothing but a star import)
    assert left("y = nn.parallel.data_parallel(net, x)\n")
    assert left("class DataParallel:\n    pass\n\nnet = DataParallel(g)\n") is None  # (the file's own class)
    assert left("from forks import DataParallel\nnet = DataParallel(g)\n") is None  # (a fork: DDP122's)
    assert left("y = self.data_parallel(x)\nz = isinstance(m, nn.DataParallel)\n") is None
    assert left("net = nn.DataParallel(g)  # ddpify: ignore[DDP003]\n") is None
    monkeypatch.setattr(engine.ConversionContext, "finish", lambda self, code: code + "\nextra = nn.DataParallel(nn.Linear(1, 1))\n")
    script = write(tmp_path, "train.py", "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 1))\n")
    result = CliRunner().invoke(app, ["convert", str(script)])
    assert "DDP003" in result.output and "would still build DataParallel" in result.output
    assert script.read_text() == "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 1))\n"


def test_a_rewrite_that_puts_a_collective_where_rank_zero_goes_alone_is_never_written(monkeypatch, tmp_path):
    # Jacqueline121/RetinaNet_pytorch: `if not os.path.exists(d): os.mkdir(d)` guarded for rank 0 as a
    # whole, and its test agreed by a broadcast (ddp_agreed): rank 0 in the broadcast, the others at
    # the barrier after the block, a hang at the first epoch's end. Whatever rewrite does it, not written.
    from ddpify import after_rewrite, engine

    check = after_rewrite.collective_for_rank_zero_alone
    helper = "def ddp_agreed(flag):\n    dist.broadcast(flag, 0)\n    return flag\n\n\n"
    guarded = helper + "if ddp_rank() == 0:\n    if ddp_agreed(not os.path.exists(d)):\n        os.mkdir(d)\ndist.barrier()\n"
    assert "ddp_agreed" in check("import os\n", guarded)
    assert check(guarded, guarded) is None  # (the original's own)
    assert "dist.all_reduce" in check("x = 1\n", "if dist.get_rank() == 0 and epoch:\n    dist.all_reduce(t)\n")
    # rank 0 first: the other ranks' barrier before, rank 0's after, meet
    first = "if ddp_rank() != 0:\n    dist.barrier()\nload()\nif ddp_rank() == 0:\n    dist.barrier()\n"
    assert check("load()\n", first) is None
    assert check("x = 1\n", "if ddp_rank() == 0:\n    torch.save(m, p)\ndist.barrier()\n") is None
    # (in a conditional expression's rank-0 arm too: a second broadcast inside the first's, batch 46)
    nested = "def ddp_from_rank_zero(value):\n    dist.broadcast_object_list([value], 0)\n    return value\n\n\n"
    nested += "a = ddp_from_rank_zero(ddp_from_rank_zero(input() if dist.get_rank() == 0 else None) if dist.get_rank() == 0 else None)\n"
    assert "ddp_from_rank_zero" in check("a = input()\n", nested)
    assert check("a = input()\n", nested.split("a = ")[0] + "a = ddp_from_rank_zero(input() if dist.get_rank() == 0 else None)\n") is None
    monkeypatch.setattr(engine.ConversionContext, "finish", lambda self, code: code + "\nif ddp_rank() == 0:\n    dist.barrier()\n")
    script = write(tmp_path, "train.py", "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(2, 1))\n")
    result = CliRunner().invoke(app, ["convert", str(script)])
    assert "DDP002" in result.output and "only rank 0 runs" in result.output
