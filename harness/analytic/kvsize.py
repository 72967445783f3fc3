"""KV-cache sizes of real models, and how many concurrent requests a memory budget serves.

    bytes per token = 2 (K and V) x layers x kv_heads x head_dim x bytes per element

Configs are the published Hugging Face ``config.json`` values (num_hidden_layers,
num_key_value_heads, hidden_size / num_attention_heads or head_dim), cited per entry.  Sizes use
binary units where the folklore numbers do: Llama-2-7B's 128K context (131072 tokens) needs 64 GiB
(= 68.7 GB), and "60 GB" in the 30 / 120 / 240 concurrent-4K-requests example is 60 GiB (with
60e9 bytes it is 27 / 111 / 223).  ``python -m llm_inference_harness.analytic.kvsize`` prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB, GiB, GB = 2**10, 2**30, 10**9


@dataclass(frozen=True)
class KVConfig:
    name: str
    n_layer: int
    n_kv_head: int
    head_dim: int
    n_head: int  # query heads, for the MHA / GQA / MQA label
    source: str

    @property
    def kind(self) -> str:
        return "MHA" if self.n_kv_head == self.n_head else "MQA" if self.n_kv_head == 1 else "GQA"


_HF = "https://huggingface.co/{}/blob/main/config.json"
CONFIGS = {c.name: c for c in (
    KVConfig("Llama-2-7B", 32, 32, 4096 // 32, 32, _HF.format("meta-llama/Llama-2-7b-hf")),
    KVConfig("Llama-2-13B", 40, 40, 5120 // 40, 40, _HF.format("meta-llama/Llama-2-13b-hf")),
    KVConfig("Llama-2-70B", 80, 8, 8192 // 64, 64, _HF.format("meta-llama/Llama-2-70b-hf")),
    KVConfig("Llama-3-8B", 32, 8, 4096 // 32, 32, _HF.format("meta-llama/Meta-Llama-3-8B")),
    KVConfig("Llama-3-70B", 80, 8, 8192 // 64, 64, _HF.format("meta-llama/Meta-Llama-3-70B")),
    KVConfig("Mistral-7B-v0.1", 32, 8, 4096 // 32, 32, _HF.format("mistralai/Mistral-7B-v0.1")),
    KVConfig("Qwen2-7B", 28, 4, 3584 // 28, 28, _HF.format("Qwen/Qwen2-7B")),
    KVConfig("Falcon-7B", 32, 1, 4544 // 71, 71, _HF.format("tiiuae/falcon-7b")),
)}
BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "int4": 0.5}


def bytes_per_token(cfg: KVConfig, dtype: str = "fp16") -> float:
    if dtype not in BYTES:
        raise ValueError(f"kvsize: dtype must be one of {sorted(BYTES)}, got {dtype!r}")
    return 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * BYTES[dtype]


def cache_bytes(cfg: KVConfig, tokens: int, dtype: str = "fp16") -> float:
    return bytes_per_token(cfg, dtype) * tokens


def concurrent_requests(cfg: KVConfig, budget_bytes: float, context_tokens: int, dtype: str = "fp16") -> int:
    """How many requests of ``context_tokens`` each fit their whole KV cache in ``budget_bytes``."""
    if context_tokens < 1 or budget_bytes < 0:
        raise ValueError(f"kvsize: need context_tokens >= 1 and budget_bytes >= 0, "
                         f"got {context_tokens}, {budget_bytes}")
    return int(budget_bytes // cache_bytes(cfg, context_tokens, dtype))


def main() -> None:
    print(f"{'model':16} {'kind':4} {'KiB/token fp16':>14} {'GiB @128K fp16':>14} {'4K reqs in 60 GiB fp16/int8':>28}")
    for c in CONFIGS.values():
        reqs = [concurrent_requests(c, 60 * GiB, 4096, dt) for dt in ("fp16", "int8")]
        print(f"{c.name:16} {c.kind:4} {bytes_per_token(c) / KiB:14.0f} {cache_bytes(c, 128 * 1024) / GiB:14.1f} "
              f"{reqs[0]:>18} / {reqs[1]}")


if __name__ == "__main__":
    main()
