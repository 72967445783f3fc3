"""Hypothesis strategies, one module per technique (mirroring harness/contracts/).

Strategies build valid inputs directly (no `assume`): shapes are drawn so that every constraint
of the contract already holds.  Tensor values come from a drawn seed, so a shrunk counterexample
prints as a small readable record that regenerates the exact tensors.

Imports the engine's core (tolerances), models, sampling and the contracts; the properties import these.
"""
