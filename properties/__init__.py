"""Hypothesis property tests, one module per technique; also run by `python -m harness check`."""
