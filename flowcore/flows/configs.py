"""The official Glow configurations of BERT-flow by name, "l<levels>_d<depth per level>_w<conditioner width>",
apart from `glow.py` so that naming them (e.g. the CLI's `--config` choices) imports no torch."""

__all__ = ["CONFIGS"]

CONFIGS = {f"l{levels}_d{depth}_w{width}": dict(levels=levels, depth=depth, width=width)
           for levels in (2, 3) for depth, width in ((2, 32), (3, 16), (3, 32))}
