"""Draft models for speculative decoding: language models (llm_inference_harness.sampling.lm.LM), not registered
implementations.

    ngram(order, n_docs=2000)   n-gram tables fitted on the grammar corpus (order 2: bigram, 3: trigram)
    uniform(V)                  every token equally likely
    PromptLookup(V, n)          copy the token that followed the last earlier match of the final n-gram
    the small GPTs              sampling.lm.GPTLM(models.zoo.load("draft_good" | "draft_bad")), both modules of
                                llm_inference_harness
"""
