"""Implementations, one file each, grouped by technique: one package per technique, each an entry point
of the group harness.impls (pyproject.toml)."""

# The folder impls/ imported under its own name (the repository root on sys.path) would be a second
# copy of every module beside llm_inference_harness.impls's.
if __name__ != "llm_inference_harness.impls":
    raise ImportError(f"import llm_inference_harness.impls, not {__name__} (the folder impls/ is installed as that)")
