"""Speculative decoding: enumeration cost, acceptance, tokens per target call, quality, wall-clock speedup, and
the cost of a batch-invariant batch form.

Tiny models: llm_inference_harness.models.zoo ("target", "draft_good", "draft_bad"); drafts from
harness/sampling/drafts.  Ratios (speedup, c) are measured within one process, one setup, so that load on a shared
machine cancels.
"""

import time

from benchmarks.common import DEVICES, registered, require, resolve_device, resolve_impl
from benchmarks.invariance_cost import alternating_ratio


def setup(*params):
    """asv runs this before every benchmark here: older commits without these modules are skipped."""
    require("llm_inference_harness.contracts.speculative", "llm_inference_harness.sampling.enumeration",
            "llm_inference_harness.sampling.lm")


DRAFTS = ["draft_good", "draft_bad", "bigram", "trigram", "uniform", "prompt_lookup"]
GAMMAS = [1, 2, 3, 4, 5, 6, 7, 8]
SAMPLER = "cached"  # the KV-cached speculative sampler whose speed the wall-clock benchmarks measure


def _enumerable() -> list[str]:
    """Registered samplers that draw through an Rng and sample (greedy is deterministic)."""
    return [i.name for i in registered("speculative") if i.caps.rng != "own" and not i.caps.greedy]


def _models():
    from llm_inference_harness.models import zoo
    from llm_inference_harness.sampling.lm import GPTLM

    try:
        return zoo, GPTLM(zoo.load("target"))
    except FileNotFoundError as exc:
        raise NotImplementedError(f"tiny models not trained: {exc}") from exc


def _draft(name: str):
    from llm_inference_harness.models import zoo
    from llm_inference_harness.sampling.drafts.ngram import ngram, uniform
    from llm_inference_harness.sampling.drafts.prompt_lookup import PromptLookup
    from llm_inference_harness.sampling.lm import GPTLM

    V = zoo.tokenizer().vocab_size
    return {"draft_good": lambda: GPTLM(zoo.load("draft_good")), "draft_bad": lambda: GPTLM(zoo.load("draft_bad")),
            "bigram": lambda: ngram(2), "trigram": lambda: ngram(3), "uniform": lambda: uniform(V),
            "prompt_lookup": lambda: PromptLookup(V)}[name]()


def _enumerable_sampler(impl: str, device: str):
    import torch

    resolve_device(device)
    if device != "cpu":
        raise NotImplementedError("enumeration runs on the cpu")
    return resolve_impl("speculative", impl, torch.device(device), "float64").fn


def _sampler():
    """The wall-clock benchmarks' speculative sampler, resolved through the registry like every implementation."""
    import torch

    return resolve_impl("speculative", SAMPLER, torch.device("cpu"), "float64").fn


def _tiny_models_seconds(fn, T: int) -> float:
    """Seconds to enumerate the tiny target with draft_good at gamma 2 for the first T tokens."""
    return _tiny_models_enumeration(fn, T).seconds


def _tiny_models_enumeration(fn, T: int):
    """The enumeration of the tiny target with draft_good at gamma 2 for the first T tokens, from a cold start
    (a fresh memo of the target's rows; workers as by default: none below PARALLEL_AFTER_RUNS runs)."""
    from llm_inference_harness.sampling.enumeration import exact_distribution
    from llm_inference_harness.sampling.lm import PerPrefix

    zoo, target = _models()
    return exact_distribution(fn, PerPrefix(target), _draft("draft_good"), [zoo.tokenizer().bos], gamma=2, T=T)


GOAL_ERROR = 1e-6  # a wrong enumeration is off by far more; float32 rows computed in other batches, by ~1e-8


def _checked_goal_enumeration(fn):
    """The goal case's enumeration, once its distribution is the target's (a time is reported only for a right
    answer): the reference is computed afterwards, level by level in batched calls, so the timed run starts
    cold."""
    from llm_inference_harness.sampling.enumeration import max_difference

    got = _tiny_models_enumeration(fn, T=3)
    zoo, target = _models()
    err, where = max_difference(got.dist, _autoregressive_by_level(target, [zoo.tokenizer().bos], 3))
    if err > GOAL_ERROR or got.mass_error > 1e-12:
        raise AssertionError(f"the goal case's enumeration is wrong: P{where} off by {err:.3g}, mass off by "
                             f"{got.mass_error:.3g}")
    return got


def _autoregressive_by_level(target, prompt, T: int) -> dict:
    """P(first T tokens) of sampling from the target (no eos), each level's prefixes scored in one call."""
    dist = {(): 1.0}
    for _ in range(T):
        rows = target([[*prompt, *seq] for seq in dist], 1)[:, 0].tolist()  # (prefixes, V)
        dist = {(*seq, t): prob * pt for (seq, prob), row in zip(dist.items(), rows, strict=True)
                for t, pt in enumerate(row) if pt > 0}
    return dist


class Enumeration:
    """Exact enumeration: a vocabulary-4 table pair at gamma 3, T 4 (goal <= 1 s); tiny models gamma 2, T 2."""

    params = [_enumerable(), DEVICES]
    param_names = ["impl", "device"]
    timeout = 600

    def setup(self, impl, device):
        from llm_inference_harness.sampling.lm import TableLM

        try:
            from llm_inference_harness.strategies.common import generator
            from llm_inference_harness.strategies.speculative import probability_table
        except ImportError:  # before the strategies became one module per technique (a438844)
            from llm_inference_harness.strategies import generator, probability_table

        self.fn = _enumerable_sampler(impl, device)
        g = generator(0)
        self.target, self.draft = (TableLM(probability_table(4, order, 0.3, g)) for order in (2, 1))

    def time_vocab4_gamma3_T4(self, impl, device):
        from llm_inference_harness.sampling.enumeration import exact_distribution

        exact_distribution(self.fn, self.target, self.draft, [0], gamma=3, T=4)

    def track_tiny_models_gamma2_T2_seconds(self, impl, device):
        return _tiny_models_seconds(self.fn, T=2)

    track_tiny_models_gamma2_T2_seconds.unit = "s"


class EnumerationGoal:
    """The goal case: tiny target, draft_good, gamma 2, T 3 from BOS (goal <= 3 s on two shared cores), the
    standard sampler: its 274,625 outputs, timed from a cold start (fresh row memo, workers as by default:
    one process at this size) and reported only once the distribution is checked against the target's.
    Before rounds were cut at target calls and last draws settled from two runs: 709,796 runs over 1,970
    round states, 19-29 s; after: 22,475 runs over the same 1,970 states (runs counts every sampler call: a
    machine-independent measure of the enumerator's work), 2.4-3.7 s of CPU in one process."""

    params = [[n for n in _enumerable() if n == "standard"], DEVICES]
    param_names = ["impl", "device"]
    timeout = 600

    def setup(self, impl, device):
        self.fn = _enumerable_sampler(impl, device)

    def track_tiny_models_gamma2_T3_seconds(self, impl, device):
        return _checked_goal_enumeration(self.fn).seconds

    track_tiny_models_gamma2_T3_seconds.unit = "s"

    def track_tiny_models_gamma2_T3_runs(self, impl, device):
        return _checked_goal_enumeration(self.fn).runs

    track_tiny_models_gamma2_T3_runs.unit = "runs"


class Acceptance:
    """Acceptance rate a per draft; tokens per target call against (1 - a^(g+1)) / (1 - a)."""

    params = [DRAFTS, GAMMAS]
    param_names = ["draft", "gamma"]
    timeout = 600

    def setup(self, draft, gamma):
        from llm_inference_harness.sampling.lm import TorchRng

        self.zoo, self.target = _models()
        self.draft = _draft(draft)
        self.docs = self.zoo.test_corpus(20)
        self.rng = TorchRng(0)

    def track_acceptance_rate(self, draft, gamma):
        from llm_inference_harness.sampling.measure import acceptance

        return acceptance(self.target, self.draft, self.docs)

    track_acceptance_rate.unit = "a"

    def track_tokens_per_call_measured(self, draft, gamma):
        """accepted + 1 tokens per target call, over the rounds that drafted all gamma tokens in 20 documents
        sampled from BOS to EOS (past EOS the models leave their training distribution).  Those are the
        formula's rounds: a document's last round is cut at EOS, and one whose draft ended the document drafts
        fewer, which at a = 0.98 and 26-token documents would cost a tenth of the tokens per call at gamma 8."""
        from llm_inference_harness.sampling.measure import BOS_TOKENS

        cached, tok, rounds = _sampler(), self.zoo.tokenizer(), []
        for _ in range(20):
            out = cached(self.target, self.draft, [tok.bos], gamma=gamma, max_new_tokens=BOS_TOKENS, rng=self.rng,
                         eos=tok.eos)
            rounds += [r for r in out.rounds if r.drafted == gamma]
        return sum(r.accepted + 1 for r in rounds) / sum(r.target_calls for r in rounds)

    track_tokens_per_call_measured.unit = "tokens/call"

    def track_tokens_per_call_formula(self, draft, gamma):
        from llm_inference_harness.sampling.measure import acceptance
        from llm_inference_harness.sampling.speedup import tokens_per_call

        return tokens_per_call(acceptance(self.target, self.draft, self.docs), gamma)

    track_tokens_per_call_formula.unit = "tokens/call"


class Grammaticality:
    """Share of 1000 sampled documents the grammar accepts: the bad draft alone, the target alone, and
    speculative sampling with the bad draft (exactness says: the target's share, up to sampling noise)."""

    params = [["draft_bad_alone", "target_alone", "speculative_with_draft_bad"]]
    param_names = ["sampler"]
    timeout = 1200
    N_DOCS = 1000

    def setup(self, sampler):
        import torch

        torch.set_num_threads(1)
        self.zoo, self.target = _models()

    def track_grammatical_fraction(self, sampler):
        from llm_inference_harness.sampling.measure import BOS_TOKENS

        zoo = self.zoo
        if sampler == "draft_bad_alone":
            return zoo.grammatical_fraction(zoo.sample(zoo.load("draft_bad"), self.N_DOCS, seed=1))
        if sampler == "target_alone":
            return zoo.grammatical_fraction(zoo.sample(zoo.load("target"), self.N_DOCS, seed=1))
        from llm_inference_harness.sampling.lm import TorchRng

        cached, tok, draft, rng = _sampler(), zoo.tokenizer(), _draft("draft_bad"), TorchRng(1)
        docs = [[tok.bos, *cached(self.target, draft, [tok.bos], gamma=2, max_new_tokens=BOS_TOKENS, rng=rng,
                                  eos=tok.eos).tokens] for _ in range(self.N_DOCS)]
        return zoo.grammatical_fraction(docs)

    track_grammatical_fraction.unit = "fraction"


class WallClock:
    """Speedup (time per token) of KV-cached speculative over KV-cached plain sampling of documents, and
    the estimate (1 - a^(g+1)) / ((1 - a)(1 + g c)) with c = draft step time / target step time."""

    params = [["draft_good", "draft_bad", "bigram", "trigram"], GAMMAS, DEVICES]
    param_names = ["draft", "gamma", "device"]
    timeout = 600

    def setup(self, draft, gamma, device):
        import torch

        from llm_inference_harness.sampling.lm import TorchRng

        if resolve_device(device).type != "cpu":
            raise NotImplementedError("the tiny models' sessions run on the cpu")
        torch.set_num_threads(1)  # tiny models: a thread pool only adds contention on a shared machine
        self.zoo, self.target = _models()
        self.draft = _draft(draft)
        self.bos, self.eos = self.zoo.tokenizer().bos, self.zoo.tokenizer().eos
        self.rng, self.sampler = TorchRng, _sampler()

    def time_speculative(self, draft, gamma, device):
        from llm_inference_harness.sampling.measure import document

        document(self.sampler, self.target, self.draft, gamma, self.rng(0), self.bos, self.eos)

    def track_speedup_measured(self, draft, gamma, device):
        """Plain time per token / speculative time per token over the documents of `run_documents`."""
        from llm_inference_harness.sampling.measure import document, run_documents, warm_up

        samplers = [lambda rng, g=g: document(self.sampler, self.target, self.draft, g, rng, self.bos, self.eos)
                    for g in (0, gamma)]
        warm_up(samplers, self.rng)
        seconds, tokens = run_documents(samplers, self.rng)
        return (seconds[0] / tokens[0]) / (seconds[1] / tokens[1])

    track_speedup_measured.unit = "x"

    def _step_costs(self, gamma: int, rounds: int = 41) -> tuple[float, float]:
        """(c, v): a draft step and the target call verifying gamma drafts, each in target one-token steps.
        The three calls take turns for `rounds` rounds and each ratio is a median over rounds, so load that
        comes and goes on a shared machine falls on both sides of every ratio."""
        import statistics

        from llm_inference_harness.sampling.lm import session

        def timer(lm, positions):
            s = session(lm)
            s.extend([self.bos] * 30)

            def run():
                start = time.perf_counter()
                s.extend([self.bos] * positions)
                s.rollback(30)
                return time.perf_counter() - start
            return run

        draft, step, verify = timer(self.draft, 1), timer(self.target, 1), timer(self.target, gamma + 1)
        ratios = [(draft() / t, verify() / t) for t in (step() for _ in range(rounds))]
        return statistics.median(r[0] for r in ratios), statistics.median(r[1] for r in ratios)

    def track_speedup_estimated(self, draft, gamma, device):
        """Leviathan et al.'s estimate: (1 - a^(g+1)) / ((1 - a)(1 + g c))."""
        from llm_inference_harness.sampling.measure import acceptance
        from llm_inference_harness.sampling.speedup import speedup

        c, _ = self._step_costs(gamma)
        return speedup(acceptance(self.target, self.draft, self.zoo.test_corpus(20)), gamma, c)

    track_speedup_estimated.unit = "x"

    def track_verify_over_step(self, draft, gamma, device):
        """Time of the target call that verifies g drafts (g + 1 positions) / time of a one-token step:
        1 where a step is bound by reading weights; more on this CPU, where small GEMMs cost by rows."""
        return self._step_costs(gamma)[1]

    track_verify_over_step.unit = "ratio"

    def track_speedup_estimated_with_verify(self, draft, gamma, device):
        """The same estimate with the measured verify cost: (1 - a^(g+1)) / ((1 - a)(v + g c))."""
        from llm_inference_harness.sampling.measure import acceptance
        from llm_inference_harness.sampling.speedup import speedup

        c, verify = self._step_costs(gamma)
        return speedup(acceptance(self.target, self.draft, self.zoo.test_corpus(20)), gamma, c, verify)

    track_speedup_estimated_with_verify.unit = "x"


class TimePerToken:
    """Where the time of KV-cached sampling goes, in microseconds per generated token: inside the target's
    session (its steps and rollbacks), inside draft_good's, and in the sampler itself (draws, distribution
    checks, acceptance tests, bookkeeping).  gamma 0 is plain sampling.  The three parts add up to the
    wall-clock time per token, so the speedup's ceiling can be read off: with the sampler's share at zero
    and the draft free, speculative time per token is the target's part alone."""

    params = [[0, *GAMMAS], ["target", "draft", "sampler"]]
    param_names = ["gamma", "part"]
    timeout = 300

    def setup(self, gamma, part):
        import torch

        from llm_inference_harness.sampling.lm import TorchRng
        from llm_inference_harness.sampling.measure import Timed

        torch.set_num_threads(1)  # as in WallClock
        zoo, target = _models()
        self.clock = {"target": 0.0, "draft": 0.0}
        self.target = Timed(target, self.clock, "target")
        self.draft = Timed(_draft("draft_good"), self.clock, "draft")
        self.bos, self.eos, self.rng, self.sampler = zoo.tokenizer().bos, zoo.tokenizer().eos, TorchRng, _sampler()

    def track_microseconds_per_token(self, gamma, part):
        """Over the documents of `run_documents`, after the warm-up."""
        from llm_inference_harness.sampling.measure import document, run_documents, warm_up

        samplers = [lambda rng: document(self.sampler, self.target, self.draft, gamma, rng, self.bos, self.eos)]
        warm_up(samplers, self.rng)
        self.clock.update(target=0.0, draft=0.0)
        (seconds,), (tokens,) = run_documents(samplers, self.rng)
        inside = self.clock[part] if part in self.clock else seconds - sum(self.clock.values())
        return inside / tokens * 1e6

    track_microseconds_per_token.unit = "us"


class BatchInvarianceCost:
    """The cost of batch invariance for a sampler: 8 prompts sampled together for 32 tokens at gamma 4 from
    vocabulary-16 order-2 tables (model calls cost nothing, so this is the sampler's own bookkeeping), the
    batch form with one generator and one draft length per row (impls/speculative/batch_invariant.py) over
    impls/speculative/batched.py's (one generator and one draft length for the batch), timed in turn within
    one run (median of 7 rounds' ratios)."""

    params = [["cpu"]]
    param_names = ["device"]
    timeout = 300

    def setup(self, device):
        import torch

        from llm_inference_harness.sampling.lm import TableLM, TorchRng
        from llm_inference_harness.strategies.speculative import probability_table

        require("llm_inference_harness.impls.speculative.batch_invariant")
        from llm_inference_harness.impls.speculative.batch_invariant import sample_rows
        from llm_inference_harness.impls.speculative.batched import speculative_batched

        g = torch.Generator().manual_seed(0)
        target, draft = (TableLM(probability_table(16, 2, 0.3, g)) for _ in range(2))
        prompts = [[b % 16, (3 * b) % 16] for b in range(8)]
        kw = dict(gamma=4, max_new_tokens=32)
        self.invariant = lambda: sample_rows(target, draft, prompts, rngs=[TorchRng(b) for b in range(8)], **kw)
        self.shared = lambda: speculative_batched(target, draft, prompts, rng=TorchRng(0), **kw)

    def track_batch_invariant_over_fastest(self, device):
        """Higher is dearer: 1.0 means invariance is free."""
        return alternating_ratio(self.invariant, self.shared)

    track_batch_invariant_over_fastest.unit = "ratio"
