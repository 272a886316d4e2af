"""One conformance suite, run against every engine available: torch always (and torch on CUDA
when there is a GPU), vLLM and the OpenAI-compatible client (against a real `vllm serve` process)
when vLLM is installed. The trainer-side model each engine is compared with runs on the engine's
device, so on a GPU the check is CUDA engine vs CUDA trainer.

Each engine is built once per module (vLLM takes ~20 s to start) and closed at the end.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from training.consistency import compare, default_prompts
from training.engines import SamplingParams, make_engine
from training.policy import load_model, load_tokenizer, stop_token_ids

KINDS = [
    "torch",
    pytest.param("torch-cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="no CUDA device on this machine")),
    pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.slow]),
    pytest.param("openai", marks=[pytest.mark.vllm, pytest.mark.slow]),
]
TORCH_DEVICES = {"torch": "cpu", "torch-cuda": "cuda"}  # the torch engine's device, passed explicitly


@pytest.fixture(scope="module", params=KINDS)
def engine(request, tiny_policy, tmp_path_factory):
    kind = request.param
    if kind not in TORCH_DEVICES and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not importable in this environment (pip install -e '.[vllm]')")
    if kind == "openai":
        from training.engines.openai_engine import VLLMServer

        log = tmp_path_factory.mktemp("vllm_serve") / "serve.log"
        with VLLMServer(tiny_policy, max_model_len=1024, log_path=str(log)) as srv:
            eng = make_engine(f"openai:{srv.url}")
            yield eng
            eng.close()
        return
    if kind in TORCH_DEVICES:
        eng = make_engine(f"torch:{tiny_policy}", device=TORCH_DEVICES[kind])
    else:
        eng = make_engine(f"{kind}:{tiny_policy}", max_model_len=1024)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def tok(tiny_policy):
    return load_tokenizer(tiny_policy)


@pytest.fixture(scope="module")
def prompts(tok):
    return default_prompts(tok, 6)


def _device(engine) -> str:
    """Where the trainer-side model runs for `engine`: its device (torch), else the CPU."""
    return str(getattr(engine, "device", "cpu"))


@pytest.fixture(scope="module")
def base_model(engine, tiny_policy):
    return load_model(tiny_policy).to(_device(engine))


def test_generate_returns_ids_and_logprobs(engine, prompts):
    engine.load_adapter(None, "base")
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=12, seed=3))
    assert len(gens) == len(prompts)
    for g in gens:
        assert 1 <= len(g.token_ids) <= 12
        assert len(g.logprobs) == len(g.token_ids)
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert g.policy_version == "base"
        assert g.finish_reason in ("stop", "length")


def test_seeded_sampling_is_reproducible(engine, prompts):
    engine.load_adapter(None, "base")
    p = SamplingParams(max_new_tokens=16, temperature=1.0, seed=11)
    a = engine.generate(prompts, p)
    b = engine.generate(prompts, p)
    c = engine.generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0, seed=12))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]


def test_large_seeded_batch_is_sampled_whole(engine, prompts):
    """More prompt tokens than one default scheduler step holds (vLLM would prefill in chunks; on
    CPU a chunked seeded request crashed the engine core): every request comes back, reproducibly."""
    engine.load_adapter(None, "base")
    batch = [[t for j in range(80) for t in prompts[(i + j) % len(prompts)]] for i in range(32)]
    assert sum(map(len, batch)) > 16384 and max(map(len, batch)) < 1000
    p = SamplingParams(max_new_tokens=4, temperature=1.0, seed=5)
    a = engine.generate(batch, p)
    assert len(a) == len(batch) and all(g.token_ids for g in a)
    assert [g.token_ids for g in a] == [g.token_ids for g in engine.generate(batch, p)]


def test_greedy_is_batch_invariant(engine, prompts):
    engine.load_adapter(None, "base")
    p = SamplingParams(max_new_tokens=10, temperature=0.0)
    together = engine.generate(prompts, p)
    alone = [engine.generate([q], p)[0] for q in prompts[:3]]
    assert [g.token_ids for g in together[:3]] == [g.token_ids for g in alone]


def test_stop_tokens_end_generation(engine, prompts, tok):
    engine.load_adapter(None, "base")
    probe = engine.generate(prompts[:1], SamplingParams(max_new_tokens=8, temperature=0.0))[0]
    stop = probe.token_ids[2]  # greedy reaches this token at step 3, so stopping on it must cut there
    g = engine.generate(prompts[:1], SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,)))[0]
    assert g.token_ids == probe.token_ids[:probe.token_ids.index(stop) + 1]
    assert g.finish_reason == "stop"
    assert stop_token_ids(tok)  # the policy tokenizer names its turn-end token


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_trainer_logprobs_match_engine(engine, prompts, base_model, temperature):
    """Issue target: < 1e-4 max and < 1e-5 mean per-token |Δ| on identical float32 weights."""
    engine.load_adapter(None, "base")
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=24, temperature=temperature, seed=5))
    rep = compare(base_model, prompts, gens, temperature=temperature)
    assert rep.n_tokens >= len(prompts) * 2
    assert rep.max_abs < 1e-4, rep
    assert rep.mean_abs < 1e-5, rep


def test_engine_scores_its_own_samples(engine, prompts):
    engine.load_adapter(None, "base")
    g = engine.generate(prompts[:2], SamplingParams(max_new_tokens=12, seed=2))
    for p, gen in zip(prompts[:2], g):
        lp = engine.logprobs(p, gen.token_ids)
        assert max(abs(a - b) for a, b in zip(lp, gen.logprobs)) < 1e-4


def test_adapter_hot_swap(engine, prompts, tiny_policy, tiny_adapter):
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    engine.load_adapter(None, "base")
    base = [g.token_ids for g in engine.generate(prompts, greedy)]
    engine.load_adapter(tiny_adapter, "v1")
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=12, seed=9))
    assert all(g.policy_version == "v1" for g in gens)
    assert [g.token_ids for g in engine.generate(prompts, greedy)] != base
    peft_model = load_model(tiny_policy, adapter=tiny_adapter).to(_device(engine))
    rep = compare(peft_model, prompts, gens)
    assert rep.max_abs < 1e-4 and rep.mean_abs < 1e-5, rep
    engine.load_adapter(None, "base")  # back to the base weights: the same greedy outputs as before
    assert [g.token_ids for g in engine.generate(prompts, greedy)] == base
    assert engine.policy_version == "base"


def test_bad_input_is_a_clear_error(engine, tiny_policy):
    with pytest.raises(ValueError):
        engine.generate([[]], SamplingParams(max_new_tokens=4))
    with pytest.raises((FileNotFoundError, RuntimeError)):
        engine.load_adapter(f"{tiny_policy}/no-such-adapter", "vbad")
    with pytest.raises(ValueError):
        engine.generate([[5] * 5000], SamplingParams(max_new_tokens=4))


def test_torch_engine_reuses_adapter_slots_exactly(tiny_policy, tiny_adapter, tmp_path, prompts):
    """A stream of new versions replaces the live adapter in place (memory stays bounded); a
    version loaded while the base is active gets its own slot; each version gives exactly what
    a fresh engine with that adapter gives."""
    from training.policy import save_random_adapter

    other = str(save_random_adapter(tiny_policy, tmp_path / "other", seed=2, scale=4.0))
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    eng = make_engine(f"torch:{tiny_policy}", keep_adapters=2)
    for v, path in enumerate([tiny_adapter, other, tiny_adapter, other, tiny_adapter]):
        eng.load_adapter(path, f"v{v}")
    assert list(eng._adapters) == ["v4"] and len(eng._slots) == 1
    got = [g.token_ids for g in eng.generate(prompts, greedy)]
    eng.load_adapter(None, "base")
    eng.load_adapter(other, "w")
    assert len(eng._slots) == 2
    got_other = [g.token_ids for g in eng.generate(prompts, greedy)]
    eng.load_adapter(tiny_adapter, "v4")  # still loaded: a pure switch
    assert [g.token_ids for g in eng.generate(prompts, greedy)] == got
    for path, seen in ((tiny_adapter, got), (other, got_other)):
        fresh = make_engine(f"torch:{tiny_policy}", adapter=path, version="x")
        assert [g.token_ids for g in fresh.generate(prompts, greedy)] == seen
    assert got != got_other


@pytest.mark.parametrize("adapter", [False, True])
def test_torch_engine_prompt_pass_scores_only_the_last_position_the_same(tiny_policy, tiny_adapter, tok, adapter):
    """The prompt pass asks the model for the last position's logits only (`logits_to_keep`): the
    tokens and logprobs are those of the pass that projects every position, on a left-padded
    batch of unequal prompts, base and adapter, greedy and sampled."""
    prompts = default_prompts(tok, 8)
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    eng = make_engine(f"torch:{tiny_policy}")
    if adapter:
        eng.load_adapter(tiny_adapter, "v1")
    assert eng._last_logits_only
    runs = {}
    for last_only in (True, False):
        eng._last_logits_only = last_only
        runs[last_only] = [(g.token_ids, g.logprobs) for p in (SamplingParams(max_new_tokens=12, temperature=0.0),
                                                              SamplingParams(max_new_tokens=12, temperature=1.0, seed=3))
                           for g in eng.generate(prompts, p)]
    assert runs[True] == runs[False]
    eng.close()
