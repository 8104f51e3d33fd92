"""Calibrators fitted on sentence vectors without labels: the flow (`FlowCalibrator`), its input
standardisation, BERT-whitening, and the flow file they are saved in."""
