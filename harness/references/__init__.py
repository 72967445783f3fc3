"""Float64 oracles, one module per technique (mirroring harness/contracts/). Properties compare against these.

Imports the contracts and numerics; implementations may import a reference (a registered oracle wraps one).
"""
