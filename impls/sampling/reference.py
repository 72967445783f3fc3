"""The float64 oracle (harness/references/sampling.py) as a registered implementation of the processing level:
the contract's definitions computed row by row, ranks and masses by pairwise comparison.  Float64 throughout,
whatever the logits' dtype.
"""

from harness.contracts.sampling import check_inputs
from harness.references.sampling import processed
from harness.registry import register


@register("sampling", "reference", dtypes=("float32", "float64"), cite="the contract's definitions, in float64",
          caps={"returns": "probs", "order": "transformers", "ties": "keep"})
def reference(logits, params):
    check_inputs(logits, params)
    return processed(logits, params, order="transformers", ties="keep").to(logits.device)
