"""Paged attention implementations (contract: harness/contracts/paged_attention.py)."""
