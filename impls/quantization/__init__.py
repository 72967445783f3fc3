"""Quantizers (contract: harness/contracts/quantization.py) and quantized linear layers
(contract: harness/contracts/quantized_linear.py)."""
