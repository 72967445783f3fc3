"""A decoder-only transformer, written plainly (nanoGPT): pre-LayerNorm blocks, causal self-attention,
MHA or GQA, learned or rotary positions.

`forward_with(idx, positions, attend)` runs the network with a caller-supplied attention
``attend(layer, q, k, v) -> y``: plain `forward` passes `causal_attention` (PyTorch's SDPA, bottom-right
causal); a KV cache passes a function that stores k, v and attends over the cache, and a registered
attention kernel is tried in the model by passing it (``lambda layer, q, k, v: impl.fn(q, k, v, causal=True)``).
Rotary positions: Su et al. 2021, "RoFormer", section 3.4 (the half-split form of GPT-NeoX).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 128  # the most positions a sequence may use
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 4  # < n_head: grouped-query attention; query head h reads kv head h // (n_head // n_kv_head)
    n_embd: int = 128
    positions: str = "rotary"  # "rotary" or "learned"
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(f"GPTConfig: n_head {self.n_head} must be a multiple of n_kv_head {self.n_kv_head}")
        if self.positions not in ("rotary", "learned"):
            raise ValueError(f"GPTConfig: positions must be 'rotary' or 'learned', got {self.positions!r}")
        if self.positions == "rotary" and self.head_dim % 2:
            raise ValueError(f"GPTConfig: rotary positions need an even head dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, query i seeing key j <= i + Nk - Nq (bottom-right: new queries see the whole
    cache); q (B, H, Nq, d), k, v (B, Hkv, Nk, d) with Nq <= Nk.  SDPA's is_causal is top-left, so it serves
    Nq = Nk only; one query sees every key and needs no mask."""
    Nq, Nk, gqa = q.shape[2], k.shape[2], q.shape[1] != k.shape[1]
    if Nq == Nk or Nq == 1:
        return F.scaled_dot_product_attention(q, k, v, is_causal=Nq > 1, enable_gqa=gqa)
    allowed = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).tril(Nk - Nq)  # (Nq, Nk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)


class ConcatCache:
    """The plainest KV cache: per layer, keys and values concatenated along the sequence.  `attend` is
    `GPT.forward_with`'s hook; `truncate(n)` forgets every position from n on (rejected draft tokens)."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if layer in self.layers:
            old_k, old_v = self.layers[layer]
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)  # (B, Hkv, t, d)
        self.layers[layer] = (k, v)
        return causal_attention(q, k, v)

    def truncate(self, length: int) -> None:
        self.layers = {layer: (k[:, :, :length], v[:, :, :length]) for layer, (k, v) in self.layers.items()}


def rotary(positions: torch.Tensor, d: int, base: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, 1, T, d/2) of the angles pos * base^(-2i/d), computed in float64."""
    freqs = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)  # (d/2,)
    angles = (positions.to(torch.float64)[..., None] * freqs)[:, None]  # (B, 1, T, d/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, heads, T, d): the pair (i, i + d/2) turns by the angle whose cos, sin are given.

    cos = [cos, cos] and sin = [-sin, sin] over the two halves (`GPT.rope`), so with x = [x1, x2] this is
    [x1 cos - x2 sin, x2 cos + x1 sin] in four kernels (the same floats: negation and + commute exactly).
    """
    d = x.shape[-1]
    swapped = torch.cat([x[..., d // 2 :], x[..., : d // 2]], dim=-1)  # (B, heads, T, d): [x2, x1]
    return x * cos + swapped * sin  # (B, heads, T, d)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q = nn.Linear(cfg.n_embd, cfg.n_head * d, bias=False)
        self.kv = nn.Linear(cfg.n_embd, 2 * cfg.n_kv_head * d, bias=False)
        self.proj = nn.Linear(cfg.n_head * d, cfg.n_embd, bias=False)

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None):
        """x (B, T, D) -> q (B, H, T, d), k and v (B, Hkv, T, d), rotary (cos, sin) applied to q and k."""
        cfg, (B, T, _) = self.cfg, x.shape
        q = self.q(x).view(B, T, cfg.n_head, cfg.head_dim).transpose(1, 2)  # (B, H, T, d)
        k, v = self.kv(x).view(B, T, 2, cfg.n_kv_head, cfg.head_dim).permute(2, 0, 3, 1, 4)  # (B, Hkv, T, d) each
        if rope is not None:  # one rotation for the H + Hkv heads of q and k
            q, k = rotate(torch.cat([q, k], dim=1), *rope).split([cfg.n_head, cfg.n_kv_head], dim=1)  # (B, H|Hkv, T, d)
        return q, k, v

    def output(self, y: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = y.shape
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, H, T, d) -> (B, T, D)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x: torch.Tensor, rope, attend: Callable) -> torch.Tensor:
        q, k, v = self.attn.project(self.ln_1(x), rope)
        x = x + self.attn.output(attend(q, k, v))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.rope_tables: dict = {}  # (dtype, device) -> cos, sin (block_size, d) of every position

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """idx (B, T) token ids -> logits (B, T, V); positions (B, T) default to 0..T-1."""
        return self.forward_with(idx, positions, lambda layer, q, k, v: causal_attention(q, k, v))

    def forward_with(self, idx: torch.Tensor, positions: torch.Tensor | None, attend: Attend, *,
                     checked: bool = False) -> torch.Tensor:
        """Logits (B, T, V) with ``attend(layer, q (B,H,T,d), k, v (B,Hkv,T,d)) -> (B,H,T,d)`` as attention.

        ``checked=True``: the caller has already validated idx and positions (a KV cache validates each step's
        tokens and owns the positions), so the four reductions of `check_inputs` are not paid again per step."""
        positions = positions if checked else self.check_inputs(idx, positions)
        x = self.wte(idx)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe(positions)
        rope = self.rope(positions, x.dtype) if self.wpe is None else None
        for layer, block in enumerate(self.blocks):
            x = block(x, rope, lambda q, k, v, layer=layer: attend(layer, q, k, v))
        return self.lm_head(self.ln_f(x))  # (B, T, V)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (B, 1, T, d) at positions (B, T), looked up in tables built once per dtype and device:
        a decode step then costs two lookups, not a float64 trigonometry pass."""
        key = (dtype, positions.device)
        if key not in self.rope_tables:
            with torch.inference_mode(False):  # plain tensors even if first built by an inference-mode decoder
                every = torch.arange(self.cfg.block_size, device=positions.device)[None]  # (1, block_size)
                cos, sin = rotary(every, self.cfg.head_dim, self.cfg.rope_base, dtype)  # (1, 1, block_size, d/2)
                cos, sin = cos[0, 0], sin[0, 0]  # (block_size, d/2)
                self.rope_tables[key] = torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)  # (block_size, d)
        cos, sin = self.rope_tables[key]
        return cos[positions][:, None], sin[positions][:, None]  # (B, 1, T, d)

    def check_inputs(self, idx: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"GPT: idx must be a (B, T) LongTensor, got {getattr(idx, 'shape', type(idx))}")
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < self.cfg.vocab_size):
            raise ValueError(f"GPT: idx holds ids outside [0, {self.cfg.vocab_size})")
        if positions is None:
            positions = torch.arange(idx.shape[1], device=idx.device).expand(idx.shape)  # (B, T)
        if positions.shape != idx.shape:
            raise ValueError(f"GPT: positions must have idx's shape {tuple(idx.shape)}, got {tuple(positions.shape)}")
        if positions.numel() and not (0 <= int(positions.min()) and int(positions.max()) < self.cfg.block_size):
            raise ValueError(f"GPT: positions must lie in [0, block_size={self.cfg.block_size})")
        return positions

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def nll_loss(logits: torch.Tensor, targets: torch.Tensor, pad: int, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits (B, T, V) against targets (B, T), ignoring PAD targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=pad,
                           reduction=reduction)
