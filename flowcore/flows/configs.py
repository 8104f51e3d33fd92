"""The official Glow configurations of BERT-flow by name (levels, depth per level, conditioner
width), apart from `glow.py` so that naming them (e.g. the CLI's `--config` choices) imports no torch."""

__all__ = ["CONFIGS"]

CONFIGS = {
    "l2_d2_w32": dict(levels=2, depth=2, width=32),
    "l2_d3_w16": dict(levels=2, depth=3, width=16),
    "l2_d3_w32": dict(levels=2, depth=3, width=32),
    "l3_d2_w32": dict(levels=3, depth=2, width=32),
    "l3_d3_w16": dict(levels=3, depth=3, width=16),
    "l3_d3_w32": dict(levels=3, depth=3, width=32),
}
