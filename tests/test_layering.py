"""The layers' import rules, read from the source: `kernels/` (installed as `flowcore.kernels`) is
the bottom layer and imports only torch, Triton, the standard library and itself (relatively), so
it can never pull in the rest of flowcore."""
import ast
import sys
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
ALLOWED = {"torch", "triton", "__future__"} | set(sys.stdlib_module_names)


def _absolute_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.lineno, node.module


def test_kernels_import_only_torch_triton_the_standard_library_and_themselves():
    files = sorted(KERNELS.rglob("*.py"))
    assert len(files) >= 10
    offending = [f"{path.relative_to(KERNELS.parent)}:{line}: import {name}"
                 for path in files for line, name in _absolute_imports(path)
                 if name.split(".")[0] not in ALLOWED]
    assert not offending, "\n".join(offending)


def test_only_the_triton_subpackage_imports_triton():
    """Triton is optional: outside `kernels/triton/` nothing imports it (the kernels there are
    imported when a Triton op first runs)."""
    offending = [f"{path.relative_to(KERNELS.parent)}:{line}" for path in sorted(KERNELS.rglob("*.py"))
                 if "triton" not in path.relative_to(KERNELS).parts[:-1]
                 for line, name in _absolute_imports(path) if name.split(".")[0] == "triton"]
    assert not offending, offending
