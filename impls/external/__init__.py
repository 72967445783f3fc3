"""Adapters of third-party libraries to the harness's contracts, one file per library.

The entry point ``external`` (pyproject.toml, group harness.impls): importing the package registers every
adapter below, each with an ``unavailable`` reason where its library is not installed (the ``external``
extra installs the CPU ones; flash-attn, FlashInfer, xFormers and vLLM need CUDA builds).  A real bug of a
library, found by a property, is recorded next to its adapter with
`llm_inference_harness.engine.registry.known_failure`.
"""

from llm_inference_harness.impls.external import (  # noqa: F401 - imported to register
    bitsandbytes_int8,
    common,
    compressed_tensors_int,
    flash_attn_kernels,
    flashinfer_kernels,
    flashinfer_sampling,
    gguf_quants,
    hf_models,
    hqq_quant,
    mlx_affine,
    onnxruntime_ops,
    quanto_weights,
    torch_ao_observers,
    torchao_affine,
    transformers_attention,
    transformers_kv,
    transformers_kv_mutants,
    transformers_sampling,
    transformers_speculative,
    vllm_ops,
    vllm_sampling,
    xformers_kernels,
)
