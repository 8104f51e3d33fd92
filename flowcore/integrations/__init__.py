"""Bridges to sentence-transformers and MTEB; each submodule imports its optional library itself."""
