"""The model's generation config (`--generation-config`): its eos ids and default sampling.

`generation_config.json`, as transformers writes it beside `config.json`, holds what the model's
authors recommend generating with. As upstream vLLM, two things are taken from it:

- `eos_token_id` (an id or a list): the ids other than the tokenizer's eos become stop token ids
  of every request unless it sets `ignore_eos` (a chat model whose tokenizer eos is `[EOS]` ends
  its turns with `<|im_end|>`). Like a request's own stop token ids, they end the token ids, are
  the output's `stop_reason`, and their text is left out unless `include_stop_str_in_output`.
- The sampling defaults `repetition_penalty`, `temperature`, `top_k`, `top_p`, `min_p` and
  `max_new_tokens` (as `max_tokens`), for requests that leave them unset: the server's null or
  missing fields, `LLM.generate` / `LLM.chat` without sampling params. The server also caps every
  request's max_tokens at `max_new_tokens`, as upstream. Every other key (`do_sample` included:
  upstream ignores it too) is ignored.

Where the setting is `auto` and the model folder has no `generation_config.json`, the eos ids of
`config.json` are used, as upstream falls back to the model config (it keeps no sampling fields).
`vllm` keeps vLLM's sampling defaults but still stops on the model's eos ids, read as at `auto`
(upstream reads the file for them at either setting: an instruct model must end its turns); the
file's sampling values are then neither used nor checked, and a file it cannot read is logged and
passed over for `config.json`'s eos ids, as upstream falls back. A folder reads its
`generation_config.json`, which must exist.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams

logger = init_logger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"
# generation_config.json key -> the SamplingParams field it is the default of.
_SAMPLING_KEYS = {
    "repetition_penalty": "repetition_penalty",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class GenerationConfig:
    """What the engine takes from the model's generation config (empty: nothing)."""

    source: str | None = None  # the file read, or "config.json" (its eos ids), for the logs
    eos_token_ids: tuple[int, ...] = ()
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields


def load_generation_config(setting: Any, model_folder: Path, hf_config: Any) -> GenerationConfig:
    """Resolve `--generation-config` (`auto`, `vllm` or a folder) for the model in `model_folder`
    whose parsed `config.json` is `hf_config`. Raises ValueError naming `generation_config`."""
    if not isinstance(setting, str | Path) or not str(setting).strip():
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got {setting!r}")
    vocab = getattr(hf_config, "text_config", hf_config).vocab_size
    if setting in ("auto", "vllm"):
        file = Path(model_folder) / GENERATION_CONFIG_FILE
        if not file.is_file():
            return _of_model_config(hf_config, vocab)
        if setting == "vllm":
            try:
                return _read(file, vocab, sampling=False)
            except ValueError as e:
                # `vllm` is how a user serves a model whose file this engine cannot use: as
                # upstream, its eos ids then come from config.json.
                logger.warning("%s; its eos ids come from config.json instead", e)
                return _of_model_config(hf_config, vocab)
    else:
        folder = Path(setting)
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "does not exist"
            raise ValueError(
                f"generation_config {str(setting)!r} {what}: pass 'auto', 'vllm' or the folder "
                f"holding {GENERATION_CONFIG_FILE}"
            )
        file = folder / GENERATION_CONFIG_FILE
        if not file.is_file():
            raise ValueError(f"generation_config: {str(folder)!r} has no {GENERATION_CONFIG_FILE}")
    return _read(file, vocab)


def _of_model_config(hf_config: Any, vocab: int) -> GenerationConfig:
    eos = _eos_ids(hf_config.eos_token_id, vocab, "config.json")
    return GenerationConfig("config.json", eos) if eos else GenerationConfig()


def _read(file: Path, vocab: int, sampling: bool = True) -> GenerationConfig:
    """The file's eos ids and, if `sampling`, its sampling defaults. Without them (`vllm`) their
    values are not checked either: that setting is how a user serves a model whose file holds a
    value this engine refuses."""
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"generation_config: cannot read {file}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(
            f"generation_config: {file} must hold a JSON object, got {type(config).__name__}"
        )
    eos = _eos_ids(config.get("eos_token_id"), vocab, str(file))
    if not sampling:
        return GenerationConfig(str(file), eos)
    defaults = {
        name: config[key] for key, name in _SAMPLING_KEYS.items() if config.get(key) is not None
    }
    max_new = defaults.get("max_tokens")
    # At least 1, where SamplingParams takes 0: as a cap on every request, 0 would leave no output
    # at all. Checked first, so that every integer below 1 gets this one message (its type is
    # SamplingParams' to check).
    if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new < 1:
        raise ValueError(f"generation_config: {file}: max_new_tokens must be >= 1, got {max_new}")
    try:
        SamplingParams(**defaults)  # the values' types and ranges, checked once at start-up
    except ValueError as e:
        # The field keeps the file's name (max_new_tokens) in the message.
        message = str(e).replace("max_tokens", "max_new_tokens")
        raise ValueError(f"generation_config: {file}: {message}") from None
    return GenerationConfig(str(file), eos, defaults)


def _eos_ids(value: Any, vocab: int, where: str) -> tuple[int, ...]:
    ids = value if isinstance(value, list) else [] if value is None else [value]
    for token_id in ids:
        if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id:
            raise ValueError(
                f"generation_config: {where}: eos_token_id must be a token id or a list of them, "
                f"got {value!r}"
            )
        if token_id >= vocab:
            raise ValueError(
                f"generation_config: {where}: eos_token_id {token_id} is outside the vocabulary "
                f"[0, {vocab})"
            )
    return tuple(dict.fromkeys(ids))
