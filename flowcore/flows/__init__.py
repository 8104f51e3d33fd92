"""The flow: Glow's layers (ActNorm, invertible linear, coupling), one step, the multi-scale Glow
and its maximum-likelihood training. Layers compose the ops of `flowcore.kernels`."""
