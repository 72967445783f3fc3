"""Continuous batching over a KV-cache budget, under three memory policies (vLLM paper, Sec. 3 and 6).

Every step: swapped-out requests come back first, then waiting requests join (first come, first
served) while their memory can be had; every running request emits one token; finished requests
leave.  Policies:
  reserve_max -- a contiguous region of prompt + max output tokens per request (Orca-style "Max");
  oracle      -- a contiguous region of prompt + the true output length ("Oracle"), first fit, so
                 external fragmentation is real;
  paged       -- a registered block manager allocates blocks on demand; when a token finds no free
                 block the latest-admitted request is preempted by recompute (its blocks dropped, it
                 re-joins at the head of the queue with prompt + generated tokens) or by swap.
A KV slot holds one token; the budget is a number of slots (Llama-3-8B: 128 KiB per token).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from llm_inference_harness.contracts.block_manager import NullStorage, OutOfBlocks, open_manager
from llm_inference_harness.engine.registry import get


@dataclass(frozen=True)
class Request:
    id: int
    prompt: int
    output: int  # the true number of tokens it will generate (>= 1)


@dataclass(eq=False)  # identity: `r in running` must not compare fields
class Running:
    req: Request
    generated: int = 0  # tokens emitted so far; the KV of prompt + generated tokens is stored

    @property
    def stored(self) -> int:
        return self.req.prompt + self.generated

    @property
    def final(self) -> int:
        return self.req.prompt + self.req.output


class Contiguous:
    """First-fit contiguous regions of ``reserve(request)`` slots each."""

    paged = swap = False

    def __init__(self, budget: int, reserve, name: str):
        self.budget, self.reserve, self.name = budget, reserve, name
        self.regions: list[tuple[int, int, int]] = []  # (start, size, request id), sorted by start

    def holes(self) -> list[tuple[int, int]]:  # (start, size) of every gap, in address order
        out, pos = [], 0
        for start, size, _ in self.regions:
            out.append((pos, start - pos))
            pos = start + size
        return [*out, (pos, self.budget - pos)]

    def admit(self, r: Running) -> int | None:
        size = self.reserve(r.req)
        start = next((s for s, free in self.holes() if free >= size), None)
        if start is None:
            return None
        self.regions.append((start, size, r.req.id))
        self.regions.sort()
        return 0  # tokens found cached: none

    def grow(self, r: Running) -> bool:
        return True  # the reservation already covers every token up to the request's end

    def release(self, r: Running) -> None:
        self.regions = [g for g in self.regions if g[2] != r.req.id]

    def allocated(self, r: Running) -> int:
        return next(size for _, size, rid in self.regions if rid == r.req.id)

    def external_fragmentation(self) -> int:
        """Free slots outside the largest hole: memory no request larger than that hole can use."""
        sizes = [free for _, free in self.holes()]
        return sum(sizes) - max(sizes)


class Paged:
    """Blocks on demand from a registered block manager; preemption of the latest request when they run out."""

    paged = True

    def __init__(self, budget: int, block_size: int, *, impl: str = "vllm_style", swap: bool = False,
                 cpu_budget: int = 0, watermark: float = 0.01):
        self.B, self.swap, self.name = block_size, swap, f"paged{block_size}" + ("_swap" if swap else "")
        self.budget = budget
        self.m = open_manager(get("block_manager", impl), budget // block_size, block_size, NullStorage(),
                              num_cpu_blocks=cpu_budget // block_size if swap else 0, timed=False)
        self.watermark = int(watermark * (budget // block_size))  # blocks kept free at admission (vLLM's default 1%)

    @staticmethod
    def tokens(r: Running, n: int) -> list[int]:
        return [r.req.id * 100_000 + i for i in range(n)]  # distinct per request: no accidental sharing

    def admit(self, r: Running, *, alone: bool = False) -> int | None:
        need = -(-r.stored // self.B) + (0 if alone else self.watermark)
        if need > self.m.num_free_blocks():
            return None
        try:
            return self.m.allocate(r.req.id, self.tokens(r, r.stored))
        except OutOfBlocks:
            return None

    def grow(self, r: Running) -> bool:
        try:
            self.m.append(r.req.id, r.req.id * 100_000 + r.stored)
        except OutOfBlocks:
            return False
        return True

    def release(self, r: Running) -> None:
        self.m.free(r.req.id)

    def swap_out(self, r: Running) -> bool:
        try:
            self.m.swap_out(r.req.id)
        except OutOfBlocks:
            return False
        return True

    def swap_in(self, r: Running) -> bool:
        try:
            self.m.swap_in(r.req.id)
        except OutOfBlocks:
            return False
        return True

    def allocated(self, r: Running) -> int:
        return len(self.m.block_table(r.req.id)) * self.B

    def external_fragmentation(self) -> int:
        return 0  # any free block serves any request


def reserve_max(budget: int, max_output: int) -> Contiguous:
    return Contiguous(budget, lambda q: q.prompt + max_output, "reserve_max")


def oracle(budget: int) -> Contiguous:
    return Contiguous(budget, lambda q: q.prompt + q.output, "oracle")


@dataclass
class Totals:
    """Per-step sums; divided by the step count they give the averages of the table."""

    steps: int = 0
    stored: float = 0  # tokens whose KV is stored
    reserved_unused: float = 0  # allocated slots the request will still fill
    internal: float = 0  # allocated slots it will never fill
    external: float = 0  # free slots outside the largest hole
    batch: float = 0

    def add(self, stored, reserved_unused, internal, external, batch):
        self.steps += 1
        self.stored += stored
        self.reserved_unused += reserved_unused
        self.internal += internal
        self.external += external
        self.batch += batch


@dataclass
class Metrics:
    policy: str
    budget: int
    queued: Totals  # steps in which requests were left waiting after admission (memory is the limit)
    overall: Totals
    steps: int = 0
    generated: int = 0
    preemptions: int = 0
    swaps: int = 0
    recomputed_tokens: int = 0

    def mean(self, what: str, over: str = "queued") -> float:
        t = getattr(self, over)
        return getattr(t, what) / t.steps if t.steps else float("nan")

    def share(self, what: str, over: str = "queued") -> float:
        """A slot count averaged over steps, as a fraction of the budget."""
        return self.mean(what, over) / self.budget

    @property
    def throughput(self) -> float:
        """Tokens per step: each step is one decode iteration, memory-bound, so roughly equal in time."""
        return self.generated / self.steps


def simulate(requests: list[Request], policy, *, progress: bool = False, trace: list | None = None) -> Metrics:
    """Run to completion; ``trace``, if given, receives one (stored, reserved_unused, internal, external,
    batch, allocated) sample per step."""
    too_big = [q for q in requests if q.prompt + q.output > policy.budget]
    if too_big:
        raise ValueError(f"simulate: request {too_big[0]} can never fit the budget")
    waiting: deque[Running] = deque(Running(q) for q in requests)
    swapped: deque[Running] = deque()
    running: list[Running] = []
    met = Metrics(policy.name, policy.budget, Totals(), Totals())
    bar = _progress(progress, len(requests), policy.name)
    while waiting or swapped or running:
        while swapped and policy.swap_in(swapped[0]):
            running.append(swapped.popleft())
        while waiting and not swapped:
            r = waiting[0]
            cached = policy.admit(r, alone=not running) if policy.paged else policy.admit(r)
            if cached is None:
                break
            if r.generated:  # preempted by recompute earlier: its prompt + generated tokens are recomputed
                met.recomputed_tokens += r.stored - cached
            running.append(waiting.popleft())
        queued = bool(waiting or swapped)  # requests left waiting after admission: memory is the limit
        if not running:
            raise RuntimeError(f"simulate: {policy.name} cannot admit request {waiting[0].req} into an empty pool")
        for r in list(running):
            while r in running and not policy.grow(r):
                victim = running.pop()  # the latest-admitted request gives its memory back
                met.preemptions += 1
                if policy.swap and policy.swap_out(victim):
                    swapped.appendleft(victim)
                    met.swaps += 1
                else:
                    policy.release(victim)
                    waiting.appendleft(victim)
            if r in running:
                r.generated += 1
                met.generated += 1
        stored = sum(r.stored for r in running)
        tails = [(policy.allocated(r) - r.stored, r.final - r.stored) for r in running]
        reserved = sum(min(tail, future) for tail, future in tails)
        sample = (stored, reserved, sum(t for t, _ in tails) - reserved, policy.external_fragmentation(), len(running))
        met.overall.add(*sample)
        if trace is not None:
            trace.append((*sample, sum(policy.allocated(r) for r in running)))
        if queued:
            met.queued.add(*sample)
        for r in [r for r in running if r.generated == r.req.output]:
            running.remove(r)
            policy.release(r)
            bar.update(1)
        met.steps += 1
    bar.close()
    return met


def _progress(enabled: bool, total: int, name: str):
    from llm_inference_harness.engine.progress import progress

    return progress(total=total, desc=name, unit="req", enabled=enabled, leave=False)
