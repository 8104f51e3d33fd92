"""The optional parts of flowcore, by extra (`pip install 'flowcore[EXTRA]'`), and one error for a
missing one, naming the feature and the exact pip command."""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtraError", "require"]

EXTRAS = {
    "onnx": "ONNX export (`flowcore export --format onnx`) and int8 encoding on the CPU (`--quantize int8`): "
            "onnxruntime, onnx, onnxscript",
    "ray": "the Ray Data engine (`flowcore calibrate --engine ray`, `flowcore.ray`): ray[data]",
    "st": "sentence-transformers model folders (`flowcore export`): sentence-transformers",
    "mteb": "the MTEB adapter (`flowcore.integrations.mteb`): mteb",
    "analysis": "`flowcore analyze` (lexical bias, token frequency, figures): rapidfuzz, wordfreq, matplotlib",
}
"""What each extra enables, and the packages it installs."""


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra installs it."""


def require(module: str, feature: str, extra: str) -> ModuleType:
    """`module`, imported, or a `MissingExtraError` naming `feature` and `pip install 'flowcore[extra]'`.

    Example:
        >>> ort = require("onnxruntime", "--quantize int8", "onnx")
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; flowcore's extras are {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = (error.name or module).split(".")[0]
        raise MissingExtraError(f"{feature} needs {missing}, which is not installed: "
                                f"pip install 'flowcore[{extra}]'") from None
