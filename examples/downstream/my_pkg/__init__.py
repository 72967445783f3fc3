"""my_pkg: kernels for inference (here one: `my_pkg.kernels.attention`)."""
