"""Calibrators fitted on sentence vectors without labels, all following one protocol (`base`):
`load(path)` reads any calibrator file; `create(name, **settings)` builds one of a method in `NAMES`."""
from flowcore.calibration.base import NAMES, Calibrator, calibrator_class, create, fit_options, load, setting_names

__all__ = ["NAMES", "Calibrator", "calibrator_class", "create", "fit_options", "load", "setting_names"]
