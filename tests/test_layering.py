"""The layers' import rules, read from the source: `kernels/` (installed as `flowcore.kernels`) is
the bottom layer and imports only torch, Triton, the standard library and itself (relatively), so
it can never pull in the rest of flowcore."""
import ast
import re
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


def _kernel_module(path: Path) -> str:
    """`kernels/triton/step.py` -> "triton.step"; a package's `__init__.py` -> the package."""
    parts = path.relative_to(KERNELS).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def _relative_imports(path: Path) -> set[str]:
    """The `kernels/` modules `path` imports relatively, anywhere in the file (also inside functions)."""
    package = _kernel_module(path).split(".")[:-1] if path.name != "__init__.py" else _kernel_module(path).split(".")
    package = [] if package == ["__init__"] else package
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            names = [node.module] if node.module else [alias.name for alias in node.names]
            found |= {".".join([*base, name]) for name in names}
    modules = {_kernel_module(p) for p in KERNELS.rglob("*.py")}
    return {name if name in modules else name.rpartition(".")[0] for name in found} & modules


def test_kernels_have_no_import_circle():
    """Read from every import statement: the modules of `kernels/` form no circle (the Triton files are
    reached by name through `dispatch.triton_ops`, which they never import)."""
    graph = {_kernel_module(path): _relative_imports(path) for path in KERNELS.rglob("*.py")}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(graph[module]):
            assert state.get(imported) != "open", " -> ".join([*trail, module, imported])
            if imported not in state:
                visit(imported, [*trail, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_triton_files_take_their_math_from_the_reference_module_only():
    allowed = {"_utils", "compat", "reference", "triangular"}
    for path in sorted((KERNELS / "triton").glob("*.py")):
        imported = {name for name in _relative_imports(path) if not name.startswith("triton")}
        assert imported <= allowed, f"{path.name} imports {sorted(imported - allowed)}"


def test_outside_kernels_one_place_asks_for_the_plan():
    """`Glow._plan`: every other part of flowcore runs a flow through a `Glow`."""
    flowcore = KERNELS.parent / "flowcore"
    sites = [f"{path.relative_to(flowcore.parent)}:{line}" for path in sorted(flowcore.rglob("*.py"))
             for line, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bkernels\.plan\(|flowcore\.kernels[.\w]* import .*\b(plan|resolve)\b", text)]
    assert len(sites) == 1 and sites[0].startswith("flowcore/flows/glow.py:"), sites
