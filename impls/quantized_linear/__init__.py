"""Quantized linear layers (contract: harness/contracts/quantized_linear.py)."""
