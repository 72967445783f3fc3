"""The float64 oracle (harness/references/sampling.py) as a registered implementation of the processing level:
the contract's definitions computed row by row, ranks and masses by pairwise comparison.  Float64 throughout,
whatever the logits' dtype.  The pairwise ranks hold V^2 booleans a row: it serves V <= 4096.
"""

from llm_inference_harness.contracts.sampling import check_inputs
from llm_inference_harness.engine.registry import register
from llm_inference_harness.references.sampling import processed


@register("sampling", "reference", dtypes=("float32", "float64"), cite="the contract's definitions, in float64",
          caps={"returns": "probs", "order": "transformers", "ties": "keep", "max_vocab": 4096})
def reference(logits, params):
    check_inputs(logits, params)
    return processed(logits, params, order="transformers", ties="keep").to(logits.device)
