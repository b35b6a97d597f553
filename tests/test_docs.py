"""The documentation site: the generated references, and `mkdocs build --strict`.

The reference pages are generated at build time by the hook in ddpify/docs_reference.py:
transforms.md from the golden fixtures, rules.md from ddpify/rules.py; nothing generated is
committed. Every code the CLI can print has an anchor there, which its outputs link.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import FIXTURES, ROOT
from ddpify.convert_codes import convert_codes
from ddpify.docs_reference import collapse_helpers, explanation_markdown, generate, generate_rules
from ddpify.rules import DOCS_URL, RULES, code_url

# One worker runs this file whole: its module-scoped fixtures are shared by its tests.
pytestmark = pytest.mark.xdist_group("test_docs")

DOCS = ROOT / "docs"
CODE = re.compile(r"\b(DDP\d{3})\b")


@pytest.fixture(scope="module")
def reference() -> str:
    return generate(FIXTURES)


def fixture_codes() -> set[str]:
    return {code for path in FIXTURES.glob("*/*.diag.txt") for code in CODE.findall(path.read_text(encoding="utf-8"))}


def sections(page: str) -> dict[str, str]:
    """Code -> its section of the reference page."""
    parts = re.split(r"^### (DDP\d{3}) \{#ddp\d{3}\}$", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_reference_has_every_code_with_an_excerpt_from_a_fixture(reference: str) -> None:
    found = sections(reference)
    assert fixture_codes() <= set(found), "a code the fixtures report has no section"
    assert set(convert_codes()) <= set(found), "a documented convert code has no section"
    for code in fixture_codes():
        section = found[code]
        assert "**In the fixtures**" in section, code
        example = re.search(r"Example, `(fixtures/[^`]+\.py)` line (\d+)", section)
        assert example, code
        assert (ROOT / example.group(1)).is_file()
        assert '```diff title="' in section or '```python title="' in section, code
        diagnostics = (ROOT / example.group(1)).with_suffix("").with_suffix(".diag.txt")
        if diagnostics.is_file():  # a single-file fixture (project ones have a report.txt)
            assert f":{example.group(2)}:" in diagnostics.read_text(encoding="utf-8")
    for code in convert_codes():
        assert f"| [{code}](#{code.lower()}) |" in reference, "the summary table links every code"


def test_rules_reference_has_every_check_code_with_its_example() -> None:
    page = generate_rules()
    for code, rule in RULES.items():
        section = page.split(f"### {code} {rule.name} {{#{code.lower()}}}\n", 1)[1].split("\n### ", 1)[0]
        assert rule.explanation in section and rule.before.rstrip() in section and rule.after.rstrip() in section
        assert (("*Fixable*" in section) == rule.fixable), code
        assert f"| [{code}](#{code.lower()}) |" in page


def test_reference_excerpts_are_windows_not_whole_files(reference: str) -> None:
    blocks = re.findall(r"^```(?:diff|python)[^\n]*\n(.*?)^```$", reference, flags=re.MULTILINE | re.DOTALL)
    assert blocks
    assert max(len(block.splitlines()) for block in blocks) <= 40
    assert "def ddp_after_step" not in reference, "the emitted helpers are summarised, not shown"
    assert "# ... ddpify's distributed helpers" in reference


def test_reference_generation_is_deterministic_and_fast() -> None:
    start = time.perf_counter()
    first = generate(FIXTURES)
    elapsed = time.perf_counter() - start
    assert generate(FIXTURES) == first
    assert elapsed < 5, f"generating the reference took {elapsed:.1f} s"


def test_reference_diff_shows_the_reported_change(reference: str) -> None:
    section = sections(reference)["DDP701"]
    diff = section[section.index("```diff"):]
    assert re.search(r'^-.*"cuda:\d', diff, flags=re.MULTILINE)
    assert re.search(r'^\+.*"cuda"', diff, flags=re.MULTILINE)


def test_refused_example_shows_the_untouched_source(reference: str) -> None:
    section = sections(reference)["DDP106"]
    assert "left byte-identical (refused)" in section
    assert "nn.DataParallel" in section


def test_explanation_markdown_fences_the_examples() -> None:
    text = (
        "DDP999  the thing moved, as ``x`` shows::\n\n    a = 1\n    # becomes\n    b = 2\n\n"
        "More words.\n\n(ddpify/transforms/example.py)"
    )
    assert explanation_markdown(text) == (
        "the thing moved, as ``x`` shows:\n\n```python\na = 1\n# becomes\nb = 2\n```\n\nMore words.\n\n"
        "Emitted by `ddpify/transforms/example.py`; `ddpify rule CODE` prints this explanation.\n"
    )


def test_collapse_helpers_keeps_the_script_around_them() -> None:
    lines = [
        "import torch", "", "# Distributed set-up added by ddpify. Launch with", "#   torchrun ...", "", "",
        "def ddp_setup():", "    pass", "", "", "class DdpNoOp:", "    x = 1", "", "", "ddp_setup()", "train()",
    ]
    collapsed = collapse_helpers(lines)
    assert collapsed[0] == "import torch"
    assert collapsed[2].startswith("# ... ddpify's distributed helpers, 10 lines (ddp_setup, DdpNoOp)")
    assert collapsed[-2:] == ["ddp_setup()", "train()"]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    page = (site / "transforms" / "index.html").read_text(encoding="utf-8")
    assert 'id="ddp101"' in page and "fixtures/" in page
    for name in ("index", "quickstart", "commands", "configuration", "launching", "limitations", "verify", "real-world", "performance"):
        folder = site if name == "index" else site / name
        assert (folder / "index.html").is_file(), name
    assert not (DOCS / "transforms.md").exists(), "the reference is generated at build time, never committed"
    assert not (DOCS / "rules.md").exists(), "the rules reference is generated at build time, never committed"
    # Every code the CLI can print (check codes, convert codes) links an anchor the site holds.
    printable = set(RULES) | set(convert_codes())
    pages: dict[str, str] = {}
    for code in sorted(printable):
        url = code_url(code)
        assert url.startswith(DOCS_URL), url
        path, anchor = url[len(DOCS_URL):].split("#")
        if path not in pages:
            pages[path] = (site / path / "index.html").read_text(encoding="utf-8")
        assert f'id="{anchor}"' in pages[path], f"{code}: {url} has no anchor in the built site"
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["site_url"] == DOCS_URL, "the CLI links the site where mkdocs.yml says it is published"


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(items) -> list[str]:
        found = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            found += pages(value) if isinstance(value, list) else [value]
        return found

    nav = pages(config["nav"])
    assert sorted(nav) == sorted({p.name for p in DOCS.glob("*.md")} | {"transforms.md", "rules.md"})
    assert config["hooks"] == ["ddpify/docs_reference.py"]


def test_commands_page_documents_every_option() -> None:
    import typer.main

    from ddpify.cli import app

    page = (DOCS / "commands.md").read_text(encoding="utf-8")
    known = set()
    for name, command in typer.main.get_command(app).commands.items():
        assert f"## {name}" in page
        for parameter in command.params:
            for option in (o for o in parameter.opts if o.startswith("--") and o != "--help"):
                known.add(option)
                assert f"`{option}" in page, f"ddpify {name} {option} is not documented"
    documented = set(re.findall(r"^\| `(--[a-z-]+)", page, flags=re.MULTILINE))
    documented |= set(re.findall(r"^\| `-[a-z]`, `(--[a-z-]+)", page, flags=re.MULTILINE))
    assert documented and documented <= known, f"options that do not exist: {documented - known}"


def test_limitations_page_lists_every_refusal() -> None:
    page = (DOCS / "limitations.md").read_text(encoding="utf-8")
    refusing = [code for code, text in convert_codes().items() if re.match(r"DDP\d{3}\s+\((error|refuses)", text)]
    assert "DDP106" in refusing and "DDP001" in refusing
    for code in refusing:
        assert f"[{code}](transforms.md#{code.lower()})" in page, f"{code} refuses a file but is not on the page"
    assert "--allow-partial" in page


def test_readme_keeps_its_two_commands_and_links_the_docs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks[0].splitlines()[-1].startswith("python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/ddpify convert")
    assert blocks[1].splitlines()[-1] == "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest -q"
    assert readme.index(blocks[1]) < readme.index("docs/index.md") < readme.index("## Using it")
    for block in blocks[:2]:
        assert block in index, "the docs' home page shows the README's two commands as they are"
