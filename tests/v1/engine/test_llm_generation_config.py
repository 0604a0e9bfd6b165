"""The model's generation config end to end (`LLM`, kimi-linear-tiny's config, tokenizer and dummy
weights copied to a folder with a `generation_config.json` of its own; CPU, torch reference
kernels): its eos ids stop a sequence although the tokenizer's eos is another, unless
`ignore_eos` (at `--generation-config vllm` too, as upstream); its sampling values are `LLM`'s
defaults, not at `vllm`."""

import json
import logging
import shutil

import pytest

from vllm import LLM, SamplingParams
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.v1.engine import llm_engine

MODEL = "kimi-linear-tiny"
ARGS = dict(max_model_len=128, max_num_seqs=4, kv_cache_memory=16 << 20, load_format="dummy")
PROMPT = [5, 17, 99, 3, 42, 8, 61]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def greedy_tokens(torch_reference_kernels):
    """The built-in model's greedy tokens of PROMPT when nothing stops it."""
    llm = LLM(MODEL, **ARGS)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        (out,) = llm.generate([PROMPT], params, use_tqdm=False)
        return list(out.outputs[0].token_ids)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, greedy_tokens):
    """kimi-linear-tiny whose generation config ends a turn on its tokenizer's eos (257) and on
    the first token of the greedy output at index >= 2 that did not occur before (the random
    weights never choose 257). Returns (folder, that index)."""
    tokens = greedy_tokens
    j = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    folder = tmp_path_factory.mktemp("model")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(resolve_model(MODEL)[0] / name, folder / name)
    generation = {"eos_token_id": [257, tokens[j]], "temperature": 0.0, "max_new_tokens": 9}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder, j


@pytest.fixture(scope="module")
def llm(model_folder):
    llm = LLM(str(model_folder[0]), **ARGS)
    yield llm
    llm.shutdown()


def test_generation_config_eos_stops_unless_ignore_eos(llm, model_folder, greedy_tokens):
    _, j = model_folder
    tokens = greedy_tokens
    assert llm.get_tokenizer().eos_token_id == 257 != tokens[j]
    (out,) = llm.generate([PROMPT], GREEDY, use_tqdm=False)
    completion = out.outputs[0]
    assert list(completion.token_ids) == tokens[: j + 1]
    # A stop token as upstream: the reason, and its text out of the output unless asked for.
    assert (completion.finish_reason, completion.stop_reason) == ("stop", tokens[j])
    assert completion.text == llm.get_tokenizer().decode(tokens[:j])
    params = SamplingParams(temperature=0.0, max_tokens=12, include_stop_str_in_output=True)
    (out,) = llm.generate([PROMPT], params, use_tqdm=False)
    assert out.outputs[0].text == llm.get_tokenizer().decode(tokens[: j + 1])
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    (out,) = llm.generate([PROMPT], params, use_tqdm=False)
    assert list(out.outputs[0].token_ids) == tokens
    assert out.outputs[0].finish_reason == "length"


def test_generation_config_sets_llm_defaults(llm, model_folder, greedy_tokens):
    _, j = model_folder
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.max_tokens) == (0.0, 9)
    # No sampling params: greedy, at most 9 tokens (and the eos ids stop); explicit ones win.
    (out,) = llm.generate([PROMPT], use_tqdm=False)
    assert list(out.outputs[0].token_ids) == greedy_tokens[: min(j + 1, 9)]
    (out,) = llm.chat([{"role": "user", "content": "hi"}], use_tqdm=False)
    assert len(out.outputs[0].token_ids) <= 9  # not SamplingParams' 16
    explicit = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    (out,) = llm.generate([PROMPT], explicit, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 12


def test_vllm_setting_keeps_only_the_eos_ids(model_folder, greedy_tokens):
    _, j = model_folder
    llm = LLM(str(model_folder[0]), generation_config="vllm", **ARGS)
    try:
        (out,) = llm.generate([PROMPT], GREEDY, use_tqdm=False)
        assert list(out.outputs[0].token_ids) == greedy_tokens[: j + 1]
        assert out.outputs[0].stop_reason == greedy_tokens[j]
        assert llm.get_default_sampling_params() == SamplingParams()
    finally:
        llm.shutdown()


def test_the_model_s_own_stop_ids_are_logged_at_start(model_folder, greedy_tokens, caplog):
    """They decide where every reply ends, so start-up says which they are and where from."""
    _, j = model_folder
    log = logging.getLogger(llm_engine.__name__)
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=llm_engine.__name__):
            LLM(str(model_folder[0]), **ARGS).shutdown()
    finally:
        log.removeHandler(caplog.handler)
    # The tokenizer's own eos (257) is not among them: it stops requests anyway.
    assert f"Stop token ids [{greedy_tokens[j]}] come from the model's generation config " in (
        caplog.text
    )
