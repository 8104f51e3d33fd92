"""The documentation speaks to users and cannot drift: the generated command-line page is what
the parser prints now, every documented `flowcore` command parses, and neither the README nor
docs/ talk about how the project was made. (The Python blocks of README.md and docs/ run as
tests of their own: conftest.py at the repository's root collects them.)"""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_FOR_USERS = re.compile(r"\bsessions?\b|build machine|\bissues? ?#?\d+|\bagents?\b|sandbox", re.IGNORECASE)


def test_the_command_line_page_is_generated_from_the_parser():
    result = subprocess.run([sys.executable, str(REPO / "docs" / "generate.py"), "cli", "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_pages_speak_about_the_product_not_its_making(page):
    found = [f"{page.name}:{number}: {line.strip()}" for number, line in
             enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if NOT_FOR_USERS.search(line)]
    assert not found, "\n".join(found)


def _documented_commands():
    """Every `flowcore ...` line of the README's and docs' shell blocks, continuation lines joined."""
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip().removeprefix("$ ")
                for part in line.split("&&"):
                    part = part.strip()
                    if part.startswith("flowcore "):
                        yield page.name, part


COMMANDS = sorted(set(_documented_commands()))


@pytest.mark.parametrize("page, command", COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_every_documented_command_parses(page, command):
    """The flags a page shows exist and take the values it gives (parsed, not run; the runs are
    the CLI tests)."""
    from flowcore.cli import build_parser

    words = shlex.split(re.sub(r"\[[^\]]*\]", " ", command))[1:]  # [optional parts] left out
    if words in (["--help"], ["--version"]):
        return
    try:
        build_parser().parse_args(words)
    except SystemExit as exit:
        pytest.fail(f"{page}: `{command}` does not parse (exit {exit.code})")


CODE_PAGES = [page for page in PAGES if "```python" in page.read_text(encoding="utf-8")]


@pytest.mark.parametrize("page", CODE_PAGES, ids=lambda path: path.name)
def test_every_python_block_runs(page, tmp_path, monkeypatch):
    """The page's Python blocks, in order, in one namespace (as a reader would paste them), in an
    empty folder; `<!-- skip: next -->` before a block that needs what tests cannot have (a GPU,
    the Hugging Face Hub)."""
    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

    monkeypatch.chdir(tmp_path)
    for example in Sybil([PythonCodeBlockParser(), SkipParser()]).parse(page):
        example.evaluate()
