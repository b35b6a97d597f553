"""Golden fixtures: fixtures/<area>/<name>.py -> <name>.ddp.py and <name>.diag.txt.

Run `pytest tests/test_golden.py --update-golden` to rewrite the expected files, then
review the diff. A fixture's first line may hold `# fixture-options: per_process_batch`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FIXTURES, fixture_inputs
from ddpify.api import convert_source
from ddpify.diagnostics import ConvertOptions, FileResult

CASES = fixture_inputs()


def options_for(source: str) -> ConvertOptions:
    first = source.splitlines()[0] if source else ""
    flags = first.split(":", 1)[1].split() if first.startswith("# fixture-options:") else []
    # `no_relaunch` turns a default-on option off
    return ConvertOptions(**{flag.removeprefix("no_"): not flag.startswith("no_") for flag in flags})


def render_diagnostics(result: FileResult) -> str:
    lines = [f"{d.concise(Path(result.path).name)} [{d.severity.value}]" for d in result.diagnostics]
    if result.launch_command:
        lines.append(f"launch: {result.launch_command}")
    return "".join(f"{line}\n" for line in lines)


@pytest.mark.parametrize("case", CASES, ids=[str(p.relative_to(FIXTURES)) for p in CASES])
def test_golden(case: Path, update_golden: bool) -> None:
    source = case.read_text(encoding="utf-8")
    options = options_for(source)
    result = convert_source(source, options, path=case.name)
    expected_code = case.with_name(case.stem + ".ddp.py")
    expected_diag = case.with_name(case.stem + ".diag.txt")
    if update_golden:
        expected_code.write_text(result.output, encoding="utf-8")
        expected_diag.write_text(render_diagnostics(result), encoding="utf-8")
    assert result.output == expected_code.read_text(encoding="utf-8")
    assert render_diagnostics(result) == expected_diag.read_text(encoding="utf-8")
    compile(result.output, str(expected_code), "exec")
    again = convert_source(result.output, options, path=case.name)
    assert again.output == result.output, "converting twice must equal converting once"
    if result.error:
        assert result.output == source, "a refused file is left byte-identical"
    assert _trailing_whitespace(result.output) <= _trailing_whitespace(source), "no new trailing whitespace"
    if result.changed and "ddp_setup()" in result.output:
        assert _no_collective_before_setup(result.output), "a dist.* call runs before ddp_setup()"


def _no_collective_before_setup(code: str) -> bool:
    """Top-level statements before the one that calls ddp_setup() never call dist.*."""
    import ast

    tree = ast.parse(code)
    # (or a function of the script that opens with it: `args = get_args()`)
    setting_up = {"ddp_setup"} | {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name != "ddp_setup"
        and any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "ddp_setup" for c in ast.walk(node))
    }
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            continue
        calls = [node for node in ast.walk(statement) if isinstance(node, ast.Call)]
        if any(isinstance(c.func, ast.Name) and c.func.id in setting_up for c in calls):
            return True
        if any(isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and c.func.value.id == "dist" for c in calls):
            return False
    return True


def _trailing_whitespace(text: str) -> int:
    return sum(1 for line in text.splitlines() if line != line.rstrip())
