"""Calibration on Ray Data (`pip install 'flowcore[ray]'`): `Calibrate` for `Dataset.map_batches`,
`calibrate_ray` (the engine behind `flowcore calibrate --engine ray`) and `moments` (whitening
statistics as a Ray reduction). They live in `flowcore.batch.ray`; see docs/scaling.md."""
from flowcore.batch.input_files import input_files
from flowcore.batch.ray import Calibrate, ShardsFailedError, calibrate_ray, moments, shard_starts

__all__ = ["Calibrate", "ShardsFailedError", "calibrate_ray", "input_files", "moments", "shard_starts"]
