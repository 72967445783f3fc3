"""Seeded request workloads and the two canned scenarios (a steady load, a burst)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llm_inference_harness.analytic.simulator.engine import Request


@dataclass(frozen=True)
class Scenario:
    name: str
    n_requests: int
    budget: int  # KV slots (tokens)
    max_output: int  # the cap on output length, and what reserve_max reserves
    prompt: tuple  # ("uniform", low, high) or ("geometric", mean)
    output_mean: float  # outputs: geometric with this mean, capped at max_output
    seed: int = 0

    def requests(self) -> list[Request]:
        rng = np.random.default_rng(self.seed)
        kind, *args = self.prompt
        if kind == "uniform":
            prompts = rng.integers(args[0], args[1] + 1, self.n_requests)
        else:
            prompts = np.minimum(rng.geometric(1 / args[0], self.n_requests), 2048)
        outputs = np.minimum(rng.geometric(1 / self.output_mean, self.n_requests), self.max_output)
        return [Request(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]


SCENARIOS = {
    # (a) 400 requests at once, prompts 16-512, outputs geometric mean 128 capped at 1024, 32,768 slots
    "a": Scenario("a", 400, 32_768, 1024, ("uniform", 16, 512), 128.0),
    # (b) 600 requests, prompts mean ~203, outputs mean ~376 capped at 2048, 65,536 slots (Llama-3-8B: 8 GiB)
    "b": Scenario("b", 600, 65_536, 2048, ("geometric", 203.0), 376.0),
}
