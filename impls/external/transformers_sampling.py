"""transformers' logits processors and warpers -- RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper -- applied to each row in the order generate() builds them
(GenerationMixin._get_logits_processor: the repetition penalty among the processors, then temperature, top-k, top-p
and min-p), then softmax: the processing level of the sampling contract.  A temperature-0 row is what generate()
does without sampling: the argmax of the processed scores.  transformers has no presence or frequency penalty, so
the adapter declares the parameters it applies; its repetition penalty reads input_ids, the prompt and the tokens
generated so far.  transformers, generation/logits_process.py and generation/utils.py.
"""

import torch

from llm_inference_harness.contracts.sampling import check_inputs
from llm_inference_harness.engine.registry import known_failure, register
from llm_inference_harness.impls.external.common import FIRST_CALL_IMPORTS_S, Library

TRANSFORMERS = Library("transformers", "transformers")
APPLIED = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def processors(lp, params, b: int) -> list:
    """Row b's processors and warpers, as generate() lists them for these parameters."""
    T, r = params.temperature[b], params.repetition_penalty[b]
    chain = [lp.RepetitionPenaltyLogitsProcessor(penalty=float(r))] if r != 1.0 else []
    if T == 0:
        return chain  # greedy: no warpers, the argmax of the processed scores
    if T != 1.0:
        chain.append(lp.TemperatureLogitsWarper(float(T)))
    if params.top_k[b] != 0:
        chain.append(lp.TopKLogitsWarper(top_k=params.top_k[b]))
    if params.top_p[b] < 1.0:
        chain.append(lp.TopPLogitsWarper(top_p=params.top_p[b]))
    if params.min_p[b] > 0:
        chain.append(lp.MinPLogitsWarper(min_p=params.min_p[b]))
    return chain


@register("sampling", "transformers_warpers", dtypes=("float32", "float64"), unavailable=TRANSFORMERS.unavailable,
          cite="transformers generation/logits_process.py, in generate()'s order",
          caps={"returns": "probs", "order": "transformers", "ties": "keep", "params": APPLIED,
                "call_limit_s": FIRST_CALL_IMPORTS_S})
def transformers_warpers(logits, params):
    check_inputs(logits, params)
    lp = TRANSFORMERS.load("transformers.generation.logits_process")
    B, V = logits.shape
    rows = []
    for b in range(B):
        input_ids = torch.tensor([[*params.prompt_tokens[b], *params.output_tokens[b]]], dtype=torch.long)  # (1, L)
        scores = logits[b : b + 1].clone()  # (1, V): a processor may write in place
        for processor in processors(lp, params, b):
            scores = processor(input_ids, scores)
        if params.temperature[b] == 0:
            rows.append(torch.nn.functional.one_hot(scores.argmax(-1), V).to(logits.dtype)[0])
        else:
            rows.append(torch.softmax(scores, -1)[0])
    return torch.stack(rows) if rows else logits.new_zeros(0, V)


TOP_P_TIES = dict(
    library="transformers", version="5.24.0",
    what="TopPLogitsWarper keeps, of the tokens tied at the top-p boundary, only as many as the mass needs -- the "
         "highest ids, the order its ascending torch.sort leaves ties in -- while TopKLogitsWarper keeps every token "
         "tied at the k-th value, so no one tie rule ('keep' or 'index') describes both; on distinct logits every "
         "warper matches the reference (400 random rows of V = 2 to 50 in float64, error < 1e-9)",
    reproduce="""\
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
scores = torch.tensor([[2.5, 2.0, 2.0, 2.0]])  # p = 0.475, then three tokens tied at 0.175
assert TopPLogitsWarper(0.5)(None, scores).isinf().tolist() == [[False, True, True, False]]  # 2 of 3 tied dropped
assert not TopKLogitsWarper(2)(None, scores).isinf().any()  # top-2 keeps all three tied tokens
""")
for _prop in ("distribution_matches_reference", "parameter_grid_exactly"):
    known_failure("sampling", "transformers_warpers", _prop, **TOP_P_TIES)
