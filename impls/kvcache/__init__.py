"""KV-cache decoders (contract: harness/contracts/kvcache.py)."""
