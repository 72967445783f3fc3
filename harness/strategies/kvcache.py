"""KV-cache decode cases (contract: harness/contracts/kvcache.py): tiny random GPTs and ragged prompts from a seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import event
from hypothesis import strategies as st

from llm_inference_harness.engine.tolerance import dtype_of
from llm_inference_harness.strategies.common import generator, seeds

POSITIONS = 32  # the block_size of every decode case's model: the most tokens a sequence may hold


@dataclass(frozen=True)
class DecodeCase:
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    positions: str  # "rotary" | "learned"
    vocab: int
    prompts: tuple[tuple[int, ...], ...]  # B prompts, ragged
    steps: tuple[tuple[int, ...], ...]  # decode steps, each B tokens
    max_len: int
    dtype: str
    seed: int

    def config(self, n_kv_head: int | None = None):
        from llm_inference_harness.models.gpt import GPTConfig

        return GPTConfig(vocab_size=self.vocab, block_size=POSITIONS, n_layer=self.n_layer, n_head=self.n_head,
                         n_kv_head=n_kv_head or self.n_kv_head, n_embd=self.n_head * self.head_dim,
                         positions=self.positions)

    def model(self):
        """A GPT with weights drawn from the seed (independent of torch's global RNG), in self.dtype."""
        from llm_inference_harness.models.gpt import GPT

        model, g = GPT(self.config()).double().eval(), generator(self.seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
                if name.endswith("weight") and p.dim() == 2 and not name.startswith(("wte", "wpe")):
                    p.copy_(noise / p.shape[1] ** 0.5)  # fan-in scaled: activations stay O(1)
                elif "ln" in name and name.endswith("weight"):
                    p.copy_(1 + 0.1 * noise)
                else:
                    p.copy_(noise if name.startswith(("wte", "wpe")) else 0.1 * noise)
        return model.to(dtype_of(self.dtype))

    def prompt_tensors(self) -> list[torch.Tensor]:
        return [torch.tensor(p, dtype=torch.long) for p in self.prompts]

    def step_tensors(self) -> list[torch.Tensor]:
        return [torch.tensor(s, dtype=torch.long) for s in self.steps]

    def sequences(self) -> list[torch.Tensor]:
        """Each row's whole token sequence: its prompt, then its stepped tokens."""
        return [torch.tensor([*p, *(s[b] for s in self.steps)], dtype=torch.long) for b, p in enumerate(self.prompts)]


@st.composite
def relate(draw: st.DrawFn, base: tuple[int, ...], rows: tuple[tuple[int, ...], ...],
           vocab: int) -> tuple[tuple[int, ...], ...]:
    """rows, each starting with base's tokens as far as both go; half the time one token in the first quarter
    of each differs from base's: the same later blocks after another prefix."""
    rows = tuple([*base[:len(row)], *row[len(base):]] for row in rows)
    if draw(st.booleans()):
        for row in rows:
            at = draw(st.integers(0, (len(row) - 1) // 4))
            row[at] = (row[at] + 1) % vocab
    return tuple(map(tuple, rows))


@st.composite
def decode_cases(
    draw: st.DrawFn, dtypes: tuple[str, ...] = ("float64",), batch: tuple[int, int] = (1, 3), ragged: bool = True,
    max_prompt: int = 6, max_steps: int = 4, gqa: bool = False, spare: st.SearchStrategy[int] | None = None,
    fill: bool = False, related: bool = False,
) -> DecodeCase:
    """``gqa``: at least 2 kv heads shared by groups of at least 2 query heads (where a head mapping shows;
    a group of 3 catches a mapping that assumes a power of two), in one case of four as many aligned rows as query
    heads.  ``fill``: half the time the longest row
    steps until it holds the model's 32 positions (a leftover sliding window drops the oldest).
    ``related``: half the time every row starts with row 0's tokens, one of them changed in half of those
    (a prefix cache keyed by a block's own tokens, not by everything before them, mixes them up).

    Never n_embd = 2: a LayerNorm over two features maps them to about +-1 whatever they are, and where the
    two nearly agree it amplifies the rounding of their difference, so the order a cache computes in (one
    row at a time) and the full forward's differ by more than the plain orders earn (a float64 case found by
    the thorough profile: 1.3e-14 against a bound of 6e-15 for every correct cache; recompute passed)."""
    n_kv_head = draw(st.integers(2, 3) if gqa else st.integers(1, 2))
    n_head = n_kv_head * draw(st.sampled_from([2, 3] if gqa else [1, 2, 3]))
    vocab, B = draw(st.integers(3, 17)), draw(st.integers(*batch))
    tokens = st.integers(0, vocab - 1)
    if gqa and draw(st.integers(0, 3), label="as many rows as query heads") == 0:
        B, ragged = n_head, False  # aligned rows of (B, H, T, d) also read as (H, B, T, d): a head count taken from
        event("decode case: a batch of as many aligned rows as query heads")  # the wrong dim shows only here
    if ragged:
        lengths = [draw(st.integers(1, max_prompt)) for _ in range(B)]
    else:
        lengths = [draw(st.integers(1, max_prompt))] * B
    prompts = [tuple(draw(st.lists(tokens, min_size=n, max_size=n))) for n in lengths]
    if related and B > 1 and draw(st.booleans()):
        prompts = [prompts[0], *draw(relate(prompts[0], tuple(prompts[1:]), vocab))]
    room = POSITIONS - max(lengths)
    steps = [st.integers(0, min(max_steps, room))] + ([st.just(room)] if fill else [])
    n_steps = draw(st.one_of(*steps))
    spare_slots = draw(spare if spare is not None else st.integers(0, 3))
    return DecodeCase(
        n_layer=draw(st.integers(1, 3)), n_head=n_head, n_kv_head=n_kv_head,
        head_dim=draw(st.sampled_from([2, 4, 8] if n_head > 1 else [4, 8])),  # n_embd >= 4, see below
        positions=draw(st.sampled_from(["rotary", "learned"])), vocab=vocab, prompts=tuple(prompts),
        steps=tuple(tuple(draw(st.lists(tokens, min_size=B, max_size=B))) for _ in range(n_steps)),
        max_len=min(POSITIONS, max(lengths) + n_steps + spare_slots), dtype=draw(st.sampled_from(dtypes)),
        seed=draw(seeds),
    )


# --- the model protocol (CausalLM) -----------------------------------------------------------------------------
# Weights come from one of a few seeds: a model is built once per (seed, dtype) and reused across examples (a
# transformers model costs ~30 ms to build, a decode of a case ~10 calls of ~3 ms); the inputs carry the variety.
model_seeds = st.integers(0, 7)


@dataclass(frozen=True)
class ModelCase:
    """B prompts (ragged: the harness left-pads them with ``pad``), then the tokens fed after them in chunks."""

    prompts: tuple[tuple[int, ...], ...]
    chunks: tuple[tuple[tuple[int, ...], ...], ...]  # each chunk: B rows of the same length (1: a decode step)
    pad: int  # the token id under every left pad: never attended, so any id will do
    spare: int  # slots the cache has past the last token

    @property
    def batch(self) -> int:
        return len(self.prompts)

    @property
    def max_len(self) -> int:
        return max(map(len, self.prompts)) + sum(len(c[0]) for c in self.chunks) + self.spare

    def sequences(self) -> list[torch.Tensor]:
        """Each row's whole token sequence, unpadded: its prompt, then its chunks."""
        return [torch.tensor([*p, *(t for c in self.chunks for t in c[b])], dtype=torch.long)
                for b, p in enumerate(self.prompts)]


@st.composite
def model_cases(draw: st.DrawFn, vocab: int, room: int, batch: tuple[int, int] = (1, 3), ragged: bool = True,
                prompt: tuple[int, int] = (1, 8), fed: tuple[int, int] = (0, 4), chunk: int = 1,
                spare: st.SearchStrategy[int] | None = None, window: int | None = None) -> ModelCase:
    """``room``: the most slots a row may use.  ``fed``: how many tokens follow the prompt, in chunks of up to
    ``chunk`` (a chunked prefill, a multi-token continuation); most chunks are single decode steps.  ``window``:
    half the time the prompts end near a multiple of the sliding window (W - 1, W, W + 1, 2W - 1, ...) and at least
    2W + 2 tokens follow, where the room allows: every row passes the window several times."""
    B = draw(st.integers(*batch))
    lo, hi = prompt[0], min(prompt[1], room - fed[0])
    # half the prompts 1-2 tokens long: a cache sized or calibrated on its prompt then meets tokens it never saw
    lengths_of = st.one_of(st.integers(lo, min(lo + 1, hi)), st.integers(lo, hi))
    if window is not None and draw(st.booleans()):
        near = [n for k in (1, 2) for n in (k * window - 1, k * window, k * window + 1) if lo <= n <= hi]
        lengths_of, fed = st.sampled_from(near or [lo]), (max(fed[0], 2 * window + 2), max(fed[1], 2 * window + 2))
    lengths = [draw(lengths_of) for _ in range(B)] if ragged else [draw(lengths_of)] * B
    tokens = st.integers(0, vocab - 1)
    prompts = tuple(tuple(draw(st.lists(tokens, min_size=n, max_size=n))) for n in lengths)
    left = room - max(lengths)
    to_feed = draw(st.integers(min(fed[0], left), min(fed[1], left)))
    chunks = []
    while to_feed:
        n = min(to_feed, draw(st.sampled_from([1, 1, 1, *range(2, chunk + 1)])) if chunk > 1 else 1)
        chunks.append(tuple(tuple(draw(st.lists(tokens, min_size=n, max_size=n))) for _ in range(B)))
        to_feed -= n
    used = max(lengths) + sum(len(c[0]) for c in chunks)
    return ModelCase(prompts=prompts, chunks=tuple(chunks), pad=draw(tokens),
                     spare=min(draw(spare if spare is not None else st.integers(0, 3)), room - used))
