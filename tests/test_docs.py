"""The documentation speaks to users and cannot drift: the generated command-line page is what
the parser prints now, every documented `flowcore` command parses, every Python block runs, every
link leads somewhere, and neither the README nor docs/ talk about how the project was made."""
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


def test_the_readme_is_read_in_five_minutes():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the reference belongs in docs/"


def test_the_readme_starts_with_the_two_commands_for_a_fresh_machine():
    """The first commands a reader meets set up a fresh checkout and run the main job, then the tests."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```(\w*)\n(.*?)```", text, re.S)
    assert first_block.group(1) == "bash"
    commands = first_block.group(2).strip().splitlines()
    assert len(commands) == 2
    assert commands[0].startswith("python3 -m venv .venv") and "flowcore sts" in commands[0]
    assert "pip install -e . &&" in commands[0] and "[test]" not in commands[0], "the main job needs no test tools"
    assert "pip install -e '.[test]' &&" in commands[1] and commands[1].endswith("pytest tests")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    installs = [ci.index("pip install --quiet -e .  "), ci.index("pip install --quiet -e '.[test]'"),
                ci.index("pytest tests")]
    assert installs == sorted(installs), "CI installs as the README does, then runs its test command"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_pages_speak_about_the_product_not_its_making(page):
    found = [f"{page.name}:{number}: {line.strip()}" for number, line in
             enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if NOT_FOR_USERS.search(line)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_every_link_to_a_file_of_the_repository_leads_somewhere(page):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
    missing = [target for target in targets if "://" not in target and not (page.parent / target).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def _documented_commands():
    """Every `flowcore ...` line of the README's and docs' shell blocks, continuation lines joined,
    with the block's `NAME="..."` variables put in and any other `$name` as a placeholder word."""
    for page in PAGES:
        for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            variables = dict(re.findall(r'^(\w+)="([^"]*)"$', block, re.M))
            block = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), "placeholder"), block)
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
    empty folder that sits where a checkout does (`../shared/data/sts` is the STS data, as in the
    README's commands); `<!-- skip: next -->` before a block that needs what tests cannot have (a
    GPU, the Hugging Face Hub)."""
    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

    (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    (tmp_path / "checkout").mkdir()
    monkeypatch.chdir(tmp_path / "checkout")
    before = set(REPO.iterdir())
    for example in Sybil([PythonCodeBlockParser(), SkipParser()]).parse(page):
        example.evaluate()
    assert set(REPO.iterdir()) == before, "a block wrote into the checkout (a relative path resolved elsewhere)"


def test_the_deploy_page_shows_the_example_script_itself():
    """docs/deploy.md shows docs/examples/deploy_onnx.py (which CI runs without torch or flowcore) verbatim."""
    script = (REPO / "docs" / "examples" / "deploy_onnx.py").read_text(encoding="utf-8")
    assert f"```python\n{script}```" in (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
