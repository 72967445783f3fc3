"""Attention backward implementations (contract: harness/contracts/attention_backward.py)."""
