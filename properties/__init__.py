"""Hypothesis property tests, one module per technique; also run by `harness check`."""

# The folder properties/ imported under its own name (the repository root on sys.path) would be a second
# copy of every module beside llm_inference_harness.properties's.
if __name__ != "llm_inference_harness.properties":
    raise ImportError(f"import llm_inference_harness.properties, not {__name__}"
                      " (the folder properties/ is installed as that)")
