"""Batch calibration of whole corpora: row types, text and vector sources, the streaming
pipeline, durable outputs and the resumable job behind `flowcore calibrate`."""
