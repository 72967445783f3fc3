"""Attention implementations (contract: harness/contracts/attention.py)."""
