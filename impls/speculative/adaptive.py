"""Speculative sampling with an adaptive draft length: drafting stops after a token the draft was unsure of.

Each round drafts up to gamma tokens but stops after one it drew with probability below 0.4: the tokens
after an unsure one are the likeliest to be rejected, so drafting them costs draft steps for little gain
(the confidence threshold of Hugging Face's assisted generation; Mamou et al. 2024 learn the stopping rule).
Invariant: the accept/reject rule does not care how many tokens were drafted, so every emitted token is
still distributed as p; tokens per target call lie between 1 and the fixed-gamma formula.
Leviathan et al. 2023, Algorithm 1, with a draft length chosen per round as in Mamou et al. 2024,
"Dynamic Speculation Lookahead Accelerates Speculative Decoding of Large Language Models".
"""

from llm_inference_harness.engine.registry import register
from llm_inference_harness.impls.speculative.standard import SpeculativeSampling

UNSURE = 0.4  # a drafted token below this draft probability ends the round's drafting

adaptive_speculative = register(
    "speculative", "adaptive_gamma", dtypes=("float64",), caps={"adaptive_gamma": True},
    cite="Leviathan et al. 2023, Algorithm 1; Mamou et al. 2024, Dynamic Speculation Lookahead",
)(SpeculativeSampling(unsure=UNSURE))
