"""Block-manager programs (contract: harness/contracts/block_manager.py): pools, prompts sharing prefixes, evictions."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

TOKEN_ALPHABET = 3  # few distinct tokens, so equal blocks under different prefixes come up often


@dataclass(frozen=True)
class PoolGeometry:
    block_size: int
    num_blocks: int
    num_cpu_blocks: int


def pool_geometries() -> st.SearchStrategy[PoolGeometry]:
    """Pools of 2-12 blocks (a prompt takes at most 5), so that sequences fit, share blocks, run out, evict and
    reuse evicted blocks; one pool in eight has 0 or 1 block, where nearly every request runs out; CPU pools of
    0-12 blocks drawn uniformly from seven sizes (integers() favours the small ones, where multi-block swaps of several
    sequences never fit).  Blocks of 2-4 tokens, and of 1 in one program in eight: a block of one token is never
    partial, so such a program never copies on write, and the target phase, which varies the richest program, would
    spend itself on one."""
    one_in_eight = st.sampled_from([False] * 7 + [True])
    block_size = one_in_eight.flatmap(lambda one: st.just(1) if one else st.sampled_from([2, 3, 4]))
    num_blocks = one_in_eight.flatmap(lambda tiny: st.integers(0, 1) if tiny else st.integers(2, 12))
    return st.builds(PoolGeometry, block_size, num_blocks, st.sampled_from([4, 8, 2, 12, 6, 1, 0]))


def token_lists(block_size: int, min_size: int = 1, max_size: int | None = None) -> st.SearchStrategy[list[int]]:
    """Up to four blocks and a token (or ``max_size``) of tokens."""
    return st.lists(st.integers(0, TOKEN_ALPHABET - 1), min_size=min_size,
                    max_size=4 * block_size + 1 if max_size is None else max_size)


def meetings(history: list[list[int]], block_size: int) -> list[list[int]]:
    """Where two of ``history`` meet: they hold the same full block at the same depth d >= 1 after different earlier
    tokens, and the second goes on past it; the first's tokens up to that block, then the second's after it."""
    B, found = block_size, {}
    for a in history:
        for b in history:
            for d in range(1, min(len(a), len(b) - 1) // B):
                if a[d * B:(d + 1) * B] == b[d * B:(d + 1) * B] and a[:d * B] != b[:d * B]:
                    found.setdefault(tuple(a[:(d + 1) * B] + b[(d + 1) * B:]), None)
    return [list(p) for p in found]


@st.composite
def prompts(draw: st.DrawFn, history: list[list[int]], block_size: int) -> list[int]:
    """A prompt: fresh; a prefix of one of ``history`` (earlier prompts, live sequences' tokens after appends and
    forks) cut mostly at a block boundary, plus new tokens; one of ``history`` with one token of its first block
    changed -- equal later blocks under another prefix; one of ``history`` with two of its tokens swapped, in
    one block or across blocks -- the same tokens in another order, which an additive, XOR-chained or otherwise
    order-blind block hash cannot tell apart; or where two of ``history`` meet (`meetings`): its block after the
    meeting and the one before it are the other's at the same depth, its earlier tokens are not, which a key over
    the previous block's tokens rather than its whole prefix cannot tell apart."""
    met = meetings(history, block_size)
    kind = draw(st.sampled_from(["fresh", "shared_prefix", "other_prefix", "permuted"] + ["meeting"] * bool(met)
                                if history else ["fresh"]))
    if kind == "fresh":
        return draw(token_lists(block_size))
    if kind == "meeting":
        return draw(st.sampled_from(met))
    base = draw(st.sampled_from(list(history)))
    if kind == "shared_prefix":
        cut = draw(st.one_of(st.sampled_from(range(0, len(base) + 1, block_size)), st.integers(0, len(base))))
        return base[:cut] + draw(token_lists(block_size, min_size=0 if cut else 1))
    if kind == "permuted" and len(set(base)) > 1:
        i = draw(st.integers(0, len(base) - 1))
        k = draw(st.sampled_from([k for k in range(len(base)) if base[k] != base[i]]))
        swapped = list(base)
        swapped[i], swapped[k] = base[k], base[i]
        return swapped
    j = draw(st.integers(0, min(block_size, len(base)) - 1))
    return [*base[:j], (base[j] + 1) % TOKEN_ALPHABET, *base[j + 1:]]


@st.composite
def appended_tokens(draw: st.DrawFn, current: list[int], sources: list[list[int]], block_size: int,
                    min_size: int = 1) -> list[int]:
    """Up to two blocks' worth of tokens to append to a sequence holding ``current``: random, or, where one of
    ``sources`` extends ``current``, its next tokens -- a decode that reproduces another request's tokens, so the
    blocks it fills duplicate cached ones (the cache keeps one of them) and hash chains run through them."""
    n = len(current)
    ahead = sorted({tuple(s[n:]) for s in sources if len(s) > n and s[:n] == current})
    if ahead and draw(st.booleans()):
        return list(draw(st.sampled_from(ahead)))[:draw(st.integers(max(min_size, 1), 2 * block_size))]
    return draw(st.lists(st.integers(0, TOKEN_ALPHABET - 1), min_size=min_size, max_size=2 * block_size))


@dataclass(frozen=True)
class EvictionProgram:
    """Steps on one-block prompts, prompt p = [p] * block_size (distinct p: distinct blocks):
    ("use", p) allocate and free at once; ("hold", p) allocate and keep; ("free", i) free the i-th held sequence
    (in allocation order); ("swap", i) swap it out instead (its GPU block is released as by free);
    ("lookup", p); ("too_big", p) an allocate of p's block and more blocks than the pool has (OutOfBlocks).  At
    most num_blocks - 1 sequences are held, so every other allocate fits."""
    num_blocks: int
    block_size: int
    steps: tuple[tuple[str, int], ...]

    @property
    def num_prompts(self) -> int:
        return self.num_blocks + 3  # a few more prompts than blocks: something is evicted


@st.composite
def eviction_programs(draw: st.DrawFn) -> EvictionProgram:
    num_blocks, block_size = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    prompt_ids = st.integers(0, num_blocks + 2)  # EvictionProgram.num_prompts of them
    steps, held = [], 0
    for _ in range(draw(st.integers(1, 24))):
        kinds = ["use", "lookup", "too_big"] + (["hold"] if held < num_blocks - 1 else []) + (
            ["free", "swap"] if held else [])
        kind = draw(st.sampled_from(kinds))
        if kind in ("free", "swap"):
            steps.append((kind, draw(st.integers(0, held - 1))))
        else:
            steps.append((kind, draw(prompt_ids)))
        held += {"hold": 1, "free": -1, "swap": -1}.get(kind, 0)
    return EvictionProgram(num_blocks, block_size, tuple(steps))
