"""Block managers (contract: harness/contracts/block_manager.py)."""
