"""bench/'s own modules, for the tests that check them: `bench/` is not on the tests' import path
(its module names would shadow the tests'), so they are imported with it on `sys.path` for the import
alone."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def import_bench(name: str) -> ModuleType:
    """Import `bench/<name>.py` (and what it imports from bench/ at its top) and take bench/ off the path."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
