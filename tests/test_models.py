"""The farm world and its shipped models: the grammar, the parser, the tokenizer, the GPT, the zoo."""

import json
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

from llm_inference_harness.engine.tolerance import FLOAT64_IDENTITY, RECORDED_METRIC_RTOL
from llm_inference_harness.models import zoo
from llm_inference_harness.models.gpt import GPT, GPTConfig
from llm_inference_harness.models.world import (
    END,
    MAX_DOC_TOKENS,
    TOKENIZER,
    VERBS,
    corpus,
    generate_document,
    is_grammatical,
    parse_error,
)

seeds = st.integers(0, 2**31 - 1)


@pytest.fixture(autouse=True)
def single_threaded():
    """Small models: on a loaded 2-core machine a second OpenMP thread costs ~10 ms of waiting per op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

OTHER_NUMBER = {w: pair[1 - i] for pairs in VERBS.values() for pair in pairs for i, w in enumerate(pair)}


def first_sentence(doc: list[int]) -> tuple[list[str], list[str]]:
    """(words of the first sentence, '.' included; the rest of the document's words)."""
    words = TOKENIZER.decode(doc).split()[1:-1]  # without BOS, EOS
    end = words.index(END) + 1
    return words[:end], words[end:]


def as_doc(words: list[str]) -> list[int]:
    return [TOKENIZER.bos, *TOKENIZER.encode(" ".join(words)), TOKENIZER.eos]


@given(seed=seeds)
def test_generated_documents_parse(seed):
    for doc in corpus(20, seed):
        assert parse_error(doc) is None, f"{TOKENIZER.decode(doc)}: {parse_error(doc)}"
        assert len(doc) <= MAX_DOC_TOKENS


@given(seed=seeds, edit=st.sampled_from(["agreement", "missing_verb", "swap_first_two", "no_period"]))
def test_ungrammatical_edits_are_rejected(seed, edit):
    sentence, rest = first_sentence(generate_document(random.Random(seed)))
    verb = next(i for i, w in enumerate(sentence) if w in OTHER_NUMBER)  # the only verb is the main verb
    if edit == "agreement":
        sentence[verb] = OTHER_NUMBER[sentence[verb]]
    elif edit == "missing_verb":
        del sentence[verb]
    elif edit == "swap_first_two":
        sentence[0], sentence[1] = sentence[1], sentence[0]
    else:
        sentence = sentence[:-1]
    assert not is_grammatical(as_doc(sentence + rest)), f"accepted {edit}: {' '.join(sentence + rest)}"


def test_worked_examples():
    good = "<bos> the cats near a big barn eat some red apples . a hen sleeps in the pond . <eos>"
    assert is_grammatical(TOKENIZER.encode(good))
    for bad in ("<bos> the cat sleep . <eos>", "<bos> a cats sleeps . <eos>", "<bos> the barn sleeps . <eos>",
                "<bos> the cat eats the dog . <eos>", "<bos> the cat sleeps in the dog . <eos>",
                "<bos> the cat sleeps .", "<bos> <eos>", "<bos> the cat sleeps . <eos> <eos>"):
        assert not is_grammatical(TOKENIZER.encode(bad)), bad


@given(seed=seeds)
def test_tokenizer_round_trips(seed):
    doc = generate_document(random.Random(seed))
    text = TOKENIZER.decode(doc)
    assert TOKENIZER.encode(text) == doc
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text


def test_tokenizer_rejects_unknown_words_and_ids():
    with pytest.raises(ValueError, match="unknown word 'tractor'"):
        TOKENIZER.encode("the tractor runs")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOKENIZER.decode([TOKENIZER.vocab_size])
    assert TOKENIZER.words[:3] == ("<pad>", "<bos>", "<eos>") and len(set(TOKENIZER.words)) == TOKENIZER.vocab_size


@given(seed=seeds, positions=st.sampled_from(["rotary", "learned"]), n_kv_head=st.sampled_from([1, 2]),
       cut=st.integers(1, 9))
def test_gpt_is_causal(seed, positions, n_kv_head, cut):
    """Changing tokens at positions >= cut leaves the logits before cut unchanged."""
    torch.manual_seed(seed % 1000)
    model = GPT(GPTConfig(vocab_size=9, block_size=16, n_layer=2, n_head=2, n_kv_head=n_kv_head, n_embd=8,
                          positions=positions)).double().eval()
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 9, (2, 10), generator=g)
    b = a.clone()
    b[:, cut:] = torch.randint(0, 9, (2, 10 - cut), generator=g)
    with torch.no_grad():
        la, lb = model(a), model(b)
    assert la.shape == (2, 10, 9)
    assert torch.equal(la[:, :cut], lb[:, :cut])


@given(seed=seeds, positions=st.sampled_from(["rotary", "learned"]), n_kv_head=st.sampled_from([1, 2]),
       moves=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4)), min_size=1, max_size=6))
def test_kv_session_matches_the_full_forward_through_extends_and_rollbacks(seed, positions, n_kv_head, moves):
    """A KV session driven like a speculative sampler drives it (extend by a few tokens, roll back a few,
    a roll back of nothing included) returns, at every extend, the full forward's distributions over the
    session's prefix, which a plain token list shadows."""
    from llm_inference_harness.sampling.lm import GPTLM

    torch.manual_seed(seed % 1000)
    lm = GPTLM(GPT(GPTConfig(vocab_size=9, block_size=32, n_layer=2, n_head=2, n_kv_head=n_kv_head, n_embd=8,
                             positions=positions)).double().eval())
    g = torch.Generator().manual_seed(seed)
    session, shadow = lm.session(), []
    for grow, shrink in moves:
        new = torch.randint(0, 9, (grow,), generator=g).tolist()
        shadow += new
        got = session.extend(new)  # (grow, V)
        assert (got - lm([shadow], grow)[0]).abs().max() <= FLOAT64_IDENTITY, f"after {len(shadow)} tokens"
        del shadow[len(shadow) - min(shrink, len(shadow) - 1):]
        session.rollback(len(shadow))
        assert session.length == len(shadow)
    with pytest.raises(ValueError, match="rollback"):
        session.rollback(len(shadow) + 1)


def test_gpt_rejects_bad_input():
    model = GPT(GPTConfig(vocab_size=9, block_size=4, n_layer=1, n_head=2, n_kv_head=2, n_embd=8))
    for idx, match in ((torch.zeros(3, dtype=torch.long), "idx"), (torch.full((1, 2), 9), "idx"),
                       (torch.zeros(1, 5, dtype=torch.long), "positions")):
        with pytest.raises(ValueError, match=match):
            model(idx)
    with pytest.raises(ValueError, match="n_kv_head"):
        GPTConfig(n_head=4, n_kv_head=3)


@pytest.mark.parametrize("name", zoo.MODELS)
def test_shipped_weights_reproduce_recorded_nll(name):
    """The safetensors weights, loaded fresh, give the test NLL recorded at training time."""
    meta = json.loads((zoo.WEIGHTS / f"{name}.json").read_text())
    state = load_file(zoo.WEIGHTS / f"{name}.safetensors")
    assert all(t.dtype == torch.float32 for t in state.values())
    model = zoo.load(name)
    assert not model.training and model.num_params() == meta["params"]
    nll = zoo.nll_per_token(model, zoo.test_corpus(meta["test_docs"]))
    assert nll == pytest.approx(meta["test_nll_per_token"], rel=RECORDED_METRIC_RTOL)


def test_models_are_ordered_by_quality():
    """target < draft_good < draft_bad in test NLL (the recorded values; the test above recomputes them)."""
    nll = {name: zoo.metadata(name)["test_nll_per_token"] for name in zoo.MODELS}
    assert nll["target"] < nll["draft_good"] < nll["draft_bad"], nll


def test_sampling_is_seeded_and_target_is_mostly_grammatical():
    model = zoo.load("target")
    first, again = zoo.sample(model, 10, seed=7), zoo.sample(model, 10, seed=7)
    assert first == again
    assert all(d[0] == TOKENIZER.bos for d in first)
    assert zoo.grammatical_fraction(first) >= 0.5  # the recorded fraction over 500 samples is in the json
