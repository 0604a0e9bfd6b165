"""`--generation-config`: what is read from a model's `generation_config.json` (eos ids, sampling
defaults), the `auto` fallback to `config.json`'s eos ids, `vllm`, a folder of its own, and the
errors that name the flag (vllm/config/generation.py)."""

import json
from pathlib import Path

import pytest

from vllm.config.generation import GenerationConfig, load_generation_config
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.sampling_params import SamplingParams
from vllm.transformers_utils.configs import load_model_config

MODEL = "kimi-linear-tiny"  # config.json: eos_token_id 257, vocab_size 320


@pytest.fixture
def hf_config():
    return load_model_config(resolve_model(MODEL)[0])


def _folder(tmp_path: Path, content: "dict | str") -> Path:
    text = content if isinstance(content, str) else json.dumps(content)
    (tmp_path / "generation_config.json").write_text(text)
    return tmp_path


def test_auto_reads_eos_ids_and_sampling_defaults(tmp_path, hf_config):
    folder = _folder(tmp_path, {
        "eos_token_id": [257, 300], "temperature": 0.6, "top_p": 0.95, "top_k": 20,
        "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 64, "do_sample": True,
        "bos_token_id": 1, "transformers_version": "4.57.1", "top_a": None,
    })  # fmt: skip
    config = load_generation_config("auto", folder, hf_config)
    assert config.eos_token_ids == (257, 300)
    assert config.sampling_defaults == {
        "repetition_penalty": 1.1, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
        "min_p": 0.05, "max_tokens": 64,
    }  # fmt: skip
    assert config.source == str(folder / "generation_config.json")
    # One id, and null values (which transformers writes for unset fields), are read too.
    folder = _folder(tmp_path, {"eos_token_id": 300, "temperature": None})
    assert load_generation_config("auto", folder, hf_config) == GenerationConfig(
        str(folder / "generation_config.json"), (300,), {}
    )


def test_auto_without_the_file_takes_config_json_eos(tmp_path, hf_config):
    config = load_generation_config("auto", tmp_path, hf_config)
    assert config == GenerationConfig("config.json", (257,), {})
    # The built-in models ship none: their config's eos is the tokenizer's own.
    args = EngineArgs(model=MODEL).create_engine_config()
    assert args.model_config.generation_config.eos_token_ids == (257,)


def test_vllm_keeps_the_eos_ids_alone(tmp_path, hf_config):
    folder = _folder(tmp_path, {"eos_token_id": [300], "temperature": 0.5})
    config = load_generation_config("vllm", folder, hf_config)
    assert config.eos_token_ids == (300,) and config.sampling_defaults == {}
    # Without a file, config.json's eos ids, as at `auto`.
    config = load_generation_config("vllm", tmp_path / "none", hf_config)
    assert config == GenerationConfig("config.json", (257,), {})


def test_vllm_does_not_check_the_sampling_values_it_drops(tmp_path, hf_config):
    # `vllm` is the way out of a file whose sampling values this engine refuses: only its eos ids
    # are read, so only they (and the file being a JSON object) can fail.
    folder = _folder(tmp_path, {"eos_token_id": [300], "temperature": -1, "top_p": "x"})
    config = load_generation_config("vllm", folder, hf_config)
    assert config == GenerationConfig(str(folder / "generation_config.json"), (300,), {})
    with pytest.raises(ValueError, match="^generation_config: .*temperature must be"):
        load_generation_config("auto", folder, hf_config)
    # A file it cannot use at all is passed over for config.json's eos ids, as upstream falls
    # back: `vllm` is the way to serve such a model (`auto` refuses it).
    for broken in ({"eos_token_id": [1000]}, "{not json", [1, 2]):
        _folder(tmp_path, broken)
        with pytest.raises(ValueError, match="^generation_config: "):
            load_generation_config("auto", folder, hf_config)
        config = load_generation_config("vllm", folder, hf_config)
        assert config == GenerationConfig("config.json", (257,), {})


def test_a_folder_of_its_own(tmp_path, hf_config):
    (tmp_path / "gen").mkdir()
    folder = _folder(tmp_path / "gen", {"eos_token_id": [300], "top_p": 0.5})
    config = load_generation_config(str(folder), resolve_model(MODEL)[0], hf_config)
    assert config.eos_token_ids == (300,) and config.sampling_defaults == {"top_p": 0.5}


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "cannot read .*generation_config.json"),
        ("[1, 2]", "must hold a JSON object, got list"),
        ({"eos_token_id": "</s>"}, "eos_token_id must be a token id or a list of them"),
        ({"eos_token_id": [257, True]}, "eos_token_id must be a token id"),
        ({"eos_token_id": [1000]}, r"eos_token_id 1000 is outside the vocabulary \[0, 320\)"),
        ({"temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"top_p": 2}, r"top_p must be in \(0, 1\], got 2"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"max_new_tokens": -1}, "max_new_tokens must be >= 1, got -1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
    ],
)
def test_bad_files_are_named(tmp_path, hf_config, content, message):
    folder = _folder(tmp_path, content)
    with pytest.raises(ValueError, match=f"^generation_config: .*{message}"):
        load_generation_config("auto", folder, hf_config)


def test_bad_settings_are_named(tmp_path, hf_config):
    model = resolve_model(MODEL)[0]
    with pytest.raises(ValueError, match="generation_config '/no/such/folder' does not exist"):
        load_generation_config("/no/such/folder", model, hf_config)
    file = _folder(tmp_path, {}) / "generation_config.json"
    with pytest.raises(ValueError, match="is a file, not a folder"):
        load_generation_config(str(file), model, hf_config)
    with pytest.raises(ValueError, match="has no generation_config.json"):
        load_generation_config(str(model), model, hf_config)
    with pytest.raises(ValueError, match="must be 'auto', 'vllm' or a folder, got 3"):
        load_generation_config(3, model, hf_config)
    # Through the engine arguments, before anything is built.
    args = EngineArgs(model=MODEL, generation_config=str(_folder(tmp_path, {"top_p": 0})))
    with pytest.raises(ValueError, match="^generation_config: .*top_p must be"):
        args.create_engine_config()


def test_only_eos_ids_other_than_the_tokenizer_eos_become_stop_token_ids():
    """The tokenizer's eos stops without being a stop token id (its stop_reason stays None, as
    upstream); the others join a copy of the request's stop_token_ids; ignore_eos adds none."""
    own = [9]
    params = SamplingParams(stop_token_ids=own)
    params.update_from_tokenizer(5)
    params.update_from_generation_config((5, 7, 9), 5)
    assert params.stop_token_ids == [9, 7] and own == [9]
    assert params.all_stop_token_ids == {5, 7, 9}
    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_tokenizer(5)
    ignoring.update_from_generation_config((5, 7), 5)
    assert ignoring.stop_token_ids == [] and ignoring.all_stop_token_ids == set()
