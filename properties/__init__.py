"""Hypothesis property tests, one module per technique; also run by `harness check`."""
