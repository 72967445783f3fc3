"""The checking engine: the registry and capabilities, the runner, the isolation of children, the boundary
between the judge and the implementation's process (boundary, callserver, wire), and the guard around calls."""
