"""Helpers shared by the test packages: the transform contract, kernel checks, tiny models."""
