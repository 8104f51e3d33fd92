"""flowcore: BERT-flow calibration of sentence embeddings (layers: docs/design.md).

Direction convention, everywhere: `z, logdet = flow(x)` maps data -> latent, and `logdet` is log|det dz/dx|
per row; `flow.inverse(z)` maps back. Public names are imported lazily, so `import flowcore` stays cheap.
"""
from __future__ import annotations

import importlib
import os
import sys
import warnings

__version__ = "0.1.0"

# Python started in a flowcore checkout has it on `sys.path`, where `kernels/` would pass for Hugging Face's
# `kernels` package (which transformers imports): drop that entry; only `flowcore.kernels` loads the folder.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_CHECKOUT, "setup.py")) and os.path.isdir(os.path.join(_CHECKOUT, "kernels", "triton")):
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _CHECKOUT]

_EXPORTS = {name: module for module, names in {
    "flowcore.flows.glow": ("Glow", "CONFIGS"),
    "flowcore.flows.train": ("fit",),
    "flowcore.calibration.base": ("Calibrator", "load"),
    "flowcore.calibration.flow": ("FlowCalibrator",),
    "flowcore.calibration.whitening": ("Whitening", "ZCAWhitening"),
    "flowcore.calibration.linear": ("MeanCentering", "AllButTheTop"),
    "flowcore.calibration.auto": ("AutoCalibration",),
    "flowcore.calibration.file": ("EncoderProvenance",),
    "flowcore.text.encoder": ("Encoder",),
    "flowcore.backend": ("get_backend", "set_backend", "use_backend", "BackendUnavailableError"),
}.items() for name in names}
_RENAMED = {"PCAWhitening": "Whitening", "load_calibrator": "load"}
"""Earlier names, still answered (with a DeprecationWarning) until 1.0."""

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _RENAMED:
        warnings.warn(f"flowcore.{name} is now flowcore.{_RENAMED[name]}; the old name goes at 1.0",
                      DeprecationWarning, stacklevel=2)
        return __getattr__(_RENAMED[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flowcore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
