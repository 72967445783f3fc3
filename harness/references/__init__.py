"""Float64 oracles, one module per technique (mirroring harness/contracts/). Properties compare against these.
"""
