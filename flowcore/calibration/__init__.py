"""Calibrators fitted on sentence vectors without labels, all following one protocol (`base`):
the flow (`calibrator.FlowCalibrator`, with its fit `recipes` and input `standardize`), whitening
tempered and truncated and ZCA (`whitening`), mean-centring and all-but-the-top (`linear`), and
the one file format they are saved in (`flow_file`).

`load(path)` reads any calibrator file; `create(name, **settings)` builds a fresh calibrator of
a method in `NAMES`.
"""
from flowcore.calibration.base import NAMES, Calibrator, calibrator_class, create, load, setting_names

__all__ = ["NAMES", "Calibrator", "calibrator_class", "create", "load", "setting_names"]
