"""The official Glow configurations of BERT-flow by name, "l<levels>_d<depth per level>_w<conditioner width>",
and the variants of its steps, apart from `glow.py` so that naming them (e.g. the CLI's choices) imports no torch."""

__all__ = ["CONFIGS", "COUPLINGS", "PERMUTATIONS"]

CONFIGS = {f"l{levels}_d{depth}_w{width}": dict(levels=levels, depth=depth, width=width)
           for levels in (2, 3) for depth, width in ((2, 32), (3, 16), (3, 32))}
COUPLINGS = ("affine", "additive")
"""Each step's coupling: affine (scale and shift) or additive (shift only, volume-preserving)."""
PERMUTATIONS = ("lu", "reverse")
"""Each step's invertible 1x1: learned and LU-parametrised, or the fixed reversal of the features."""
