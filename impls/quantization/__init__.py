"""Quantizers (contract: harness/contracts/quantization.py)."""
