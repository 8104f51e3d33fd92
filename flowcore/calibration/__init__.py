"""Calibrators fitted on sentence vectors without labels: the flow (`FlowCalibrator`), its input
standardisation, BERT-whitening, the linear baselines (`postprocess`: mean-centring,
all-but-the-top, PCA/ZCA whitening), and the flow file they are all saved in."""
