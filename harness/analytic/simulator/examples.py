"""Worked examples of block sharing, computed by running a registered block manager.

The numbers they are compared with come from the vLLM paper (Sec. 4.4, parallel sampling) and the
by hand; here they are *counted*: blocks in use in the manager's pool after the requests ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_inference_harness.contracts.block_manager import CountingStorage, NullStorage, deferred, open_manager
from llm_inference_harness.engine.registry import Impl, get


def _impl(impl: Impl | str) -> Impl:
    return get("block_manager", impl) if isinstance(impl, str) else impl


def _used(m, num_blocks: int) -> int:
    return num_blocks - m.num_free_blocks()


def _distinct(tag: int, n: int) -> list[int]:
    """n tokens no other request shares (so neither fork nor the prefix cache can share them)."""
    return [tag * 1_000_000 + i for i in range(n)]


@dataclass(frozen=True)
class ParallelSampling:
    unshared_slots: int  # every sample holds its own copy of the prompt
    shared_slots: int  # samples forked from one prompt
    prefix_cached_slots: int  # samples admitted separately, prompt blocks found in the prefix cache


def parallel_sampling(impl: Impl | str, *, prompt: int, samples: int, output: int, block_size: int) -> ParallelSampling:
    impl, blocks_per_seq = _impl(impl), -(-(prompt + output) // block_size)
    n = samples * blocks_per_seq
    slots = []
    for mode in ("unshared", "fork", "prefix_cache"):
        m = open_manager(impl, n, block_size, NullStorage())
        shared_prompt = _distinct(samples, prompt)
        for s in range(samples):
            if mode == "unshared":
                m.allocate(s, _distinct(s, prompt))
            elif mode == "prefix_cache" or s == 0:
                m.allocate(s, shared_prompt)
            else:
                m.fork(0, s)
        with deferred(m):  # across the boundary: the appends sent without waiting for each reply
            for t in range(output):  # decode steps: every sample emits one token
                for s in range(samples):
                    m.append(s, -(s * output + t) - 1)
        slots.append(_used(m, n) * block_size)
    return ParallelSampling(*slots)


@dataclass(frozen=True)
class SharedPromptAnswers:
    unshared_blocks: int
    shared_blocks: int
    copied_by: list[bool]  # did answer i's first token copy the shared partial block (copy-on-write)?


def shared_prompt_answers(impl: Impl | str, *, prompt: int, answers: int, output: int,
                          block_size: int) -> SharedPromptAnswers:
    impl = _impl(impl)
    n = answers * -(-(prompt + output) // block_size)
    unshared = open_manager(impl, n, block_size, NullStorage())
    for a in range(answers):
        unshared.allocate(a, _distinct(a, prompt))
        with deferred(unshared):
            for t in range(output):
                unshared.append(a, t)
    storage = CountingStorage()
    shared = open_manager(impl, n, block_size, storage)
    shared.allocate(0, _distinct(answers, prompt))
    for a in range(1, answers):
        shared.fork(0, a)
    copied_by = []
    for t in range(output):
        for a in range(answers):
            before = len(storage.copies)
            shared.append(a, a * output + t)
            if t == 0:
                copied_by.append(len(storage.copies) > before)
    return SharedPromptAnswers(_used(unshared, n), _used(shared, n), copied_by)


def block_size_waste(impl: Impl | str, block_size: int, *, lengths) -> float:
    """Mean allocated-but-unused token slots per request, one request at a time."""
    impl, lengths = _impl(impl), list(lengths)
    m = open_manager(impl, -(-max(lengths) // block_size), block_size, NullStorage())
    waste = 0
    with deferred(m):  # each free sent without waiting: the next allocate follows it at once
        for i, n in enumerate(lengths):
            m.allocate(i, _distinct(i, n))
            waste += len(m.block_table(i)) * block_size - n
            m.free(i)
    return waste / len(lengths)
