"""Implementations, one file each, grouped by technique: one package per technique, each an entry point
of the group harness.impls (pyproject.toml)."""
