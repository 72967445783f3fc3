"""KV-cache sizes of real models (harness/analytic/kvsize.py) against published numbers.
"""

import pytest

from llm_inference_harness.analytic.kvsize import (
    CONFIGS,
    GB,
    GiB,
    KiB,
    bytes_per_token,
    cache_bytes,
    concurrent_requests,
)


# ---------------------------------------------------------------------------------------------
# KV-cache sizes of real models (harness/analytic/kvsize.py) against published numbers
def test_bytes_per_token_of_real_models():
    assert bytes_per_token(CONFIGS["Llama-2-7B"], "fp16") == 512 * KiB  # MHA: 2 x 32 x 32 x 128 x 2
    assert bytes_per_token(CONFIGS["Llama-3-8B"], "fp16") == 128 * KiB  # GQA, 8 kv heads
    assert bytes_per_token(CONFIGS["Llama-3-70B"], "fp16") == 320 * KiB  # GQA, 80 layers


def test_long_context_of_llama2_7b_is_64_gib():
    size = cache_bytes(CONFIGS["Llama-2-7B"], 128 * 1024, "fp16")
    assert size == 64 * GiB  # the folklore "64 GB" is binary; in decimal units it is 68.7 GB
    assert round(size / GB, 1) == 68.7


def test_concurrent_4k_requests_in_60_gib():
    mha, gqa = CONFIGS["Llama-2-7B"], CONFIGS["Llama-3-8B"]
    counts = [concurrent_requests(m, 60 * GiB, 4096, dt) for m, dt in ((mha, "fp16"), (gqa, "fp16"), (gqa, "int8"))]
    assert counts == [30, 120, 240]
    assert concurrent_requests(mha, 60 * GB, 4096, "fp16") == 27  # the same budget read as 60e9 bytes
    with pytest.raises(ValueError, match="dtype"):
        bytes_per_token(mha, "fp12")
