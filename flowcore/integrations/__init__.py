"""Bridges from flowcore to other libraries: `flowcore.integrations.sentence_transformers` (model
folders for sentence-transformers) and `flowcore.integrations.mteb` (an MTEB v2 adapter).

Each submodule imports its optional library itself; importing this package imports neither.
"""
