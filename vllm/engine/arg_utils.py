"""`EngineArgs`: the one dataclass that both the `vllm` command line and `LLM(...)` fill.

Every field is a keyword of `LLM(...)` and a `--flag` of the CLI (underscores become dashes);
`create_engine_config()` resolves defaults and checks every value, so a bad argument fails at
construction with a message naming it; several fail together (`EngineArgsError`, one line each),
so that a command line learns of all of them in one run.
"""

import argparse
import dataclasses
import json
import re
from dataclasses import dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from vllm import envs
from vllm.config.generation import load_generation_config
from vllm.config.quantization import (
    FusedLayerSplitError,
    QuantizationConfigArgs,
    parse_quantization_config,
)
from vllm.config.vllm import (
    CacheConfig,
    CompilationConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
    cudagraph_capture_sizes,
    resolve_max_num_batched_tokens,
)
from vllm.engine.refusals import REFUSED, EngineArgsError, Refusals
from vllm.envs import EnvVarError
from vllm.logger import init_logger
from vllm.sampling_params import SEED_MAX, SEED_MIN
from vllm.utils.cli import JSON_METAVAR

if TYPE_CHECKING:
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

logger = init_logger(__name__)

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
}
_LOAD_FORMATS = ("auto", "safetensors", "dummy")
# Size suffixes, as upstream reads them: lower case 1000s, upper case 1024s.
_SCALES = {"": 1} | {s: 1000 ** (i + 1) for i, s in enumerate("kmgt")}
_SCALES |= {s: 1 << 10 * (i + 1) for i, s in enumerate("KMGT")}


def _suffixed(text: str) -> tuple[Fraction, str] | None:
    """`text` as an exact number (`2.01` is 201/100) and its size suffix; None if it is not
    one."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", text.strip())
    return (Fraction(match[1]), match[2]) if match else None


def parse_max_model_len(value: "int | str | None") -> int | None:
    """An int, a string with a k/m/g/t suffix (`32k`; `32K` means 1024s), or `auto`/`-1` (None:
    the model's `max_position_embeddings`)."""
    if value is None or value in ("auto", "-1", -1):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    parsed = _suffixed(str(value))
    if parsed is None:
        raise ValueError(f"max_model_len: cannot parse {value!r} (e.g. 4096, 32k, 1m, auto)")
    tokens = parsed[0] * _SCALES[parsed[1]]
    if tokens.denominator != 1:
        raise ValueError(f"max_model_len: {value!r} is not a whole number of tokens")
    return int(tokens)


def human_readable_int(value: str) -> int:
    """An int as upstream's `--kv-cache-memory-bytes` takes one: `123456`, or a number with a
    suffix, k/m/g/t for 1000s (decimals allowed: `1.5g`), K/M/G/T for 1024s (whole numbers:
    `8G`). `8GiB` is refused, as upstream does."""
    parsed = _suffixed(value)
    if parsed is None:
        raise argparse.ArgumentTypeError(
            f"cannot parse {value!r} (e.g. 123456, 8G for 8 * 2**30, 1.5g for 1.5 * 10**9)"
        )
    number, suffix = parsed
    if suffix.isupper() and number.denominator != 1:
        raise argparse.ArgumentTypeError(
            f"{value!r}: decimals only go with the suffixes of 1000s (k, m, g, t): "
            f"{value.strip()[:-1]}{suffix.lower()}?"
        )
    if not suffix and "." in value:
        raise argparse.ArgumentTypeError(f"cannot parse {value!r}: not a whole number")
    return int(number * _SCALES[suffix])  # a fraction of a byte is dropped, as upstream


# upstream's short spellings of some flags
_SHORT_FLAGS = {"tensor_parallel_size": ("-tp",)}
# Upstream's names of fields this fork named otherwise first (flags and `LLM(...)` keywords);
# ours stay as aliases.
UPSTREAM_NAMES = {"kv_cache_memory": "kv_cache_memory_bytes"}


def _flags(name: str) -> list[str]:
    """The field's `--flag`s: upstream's name first (argparse names it in errors), then ours."""
    names = [UPSTREAM_NAMES[name], name] if name in UPSTREAM_NAMES else [name]
    return ["--" + n.replace("_", "-") for n in names]


# What `None` resolves to, for the --help of the fields whose default is None.
_NONE_DEFAULTS = {
    "max_model_len": "auto, the model's max_position_embeddings",
    "max_num_batched_tokens": "8192, or max_num_seqs if larger",
    "max_cudagraph_capture_size": "512, at most max_num_seqs",
}


@dataclass
class EngineArgs:
    """Arguments of the engine (see each field's comment; CLI help is generated from them)."""

    model: str = "kimi-k3-tiny"  # checkpoint folder or built-in model name
    revision: str | None = None  # None only: the folder as it is (no hub revision is fetched)
    tokenizer: str | None = None  # folder with the tokenizer files (default: the model's)
    tokenizer_mode: str = "auto"  # auto only: its tokenizer.json / tiktoken.model, read here
    skip_tokenizer_init: bool = False  # no tokenizer: prompts must be token ids, outputs no text
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32 (auto: bf16 on GPU, fp32 on CPU)
    seed: int = 0  # seeds unseeded requests' sampling and --load-format dummy's weights
    load_format: str = "auto"  # auto | safetensors | dummy
    quantization_config: str | dict | None = None  # online quantization JSON, docs/quantization.md
    tensor_parallel_size: int = 1  # ranks sharding the model (workers: NCCL on GPU, gloo on CPU)
    disable_custom_all_reduce: bool = False  # no effect: TP all-reduces are NCCL's (CPU: gloo)
    max_model_len: int | str | None = None  # prompt+output tokens: 4096, 32k, 1m (K: x1024), auto
    max_num_seqs: int = 256  # sequences in flight
    max_num_batched_tokens: int | None = None  # tokens per step
    enable_chunked_prefill: bool | None = None  # on only: prompts are chunked to each step's budget
    block_size: int = 16  # tokens per MLA latent cache block
    enable_prefix_caching: bool | None = None  # no prefix cache: on is taken with a warning
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory the engine may use
    num_gpu_blocks_override: int | None = None  # MLA blocks, instead of sizing from memory
    kv_cache_memory: int | None = None  # bytes per rank, not profiled: 8G, 1.5g (CPU: 1 GiB)
    enforce_eager: bool = False  # no CUDA graphs
    async_scheduling: bool | None = None  # launch decode steps ahead (default: on for CUDA)
    max_cudagraph_capture_size: int | None = None  # largest decode batch captured
    max_logprobs: int = 20  # most (prompt_)logprobs a request may ask for (-1: the vocabulary)
    device: str = "auto"  # auto | cuda | cpu
    kv_cache_dtype: str = "auto"  # auto (the model dtype) only: fp8 MLA caches are refused
    generation_config: str = "auto"  # eos ids, defaults: auto (the model's) | vllm (eos) | folder
    trust_remote_code: bool = False  # accepted for recipe compatibility: no remote code runs
    disable_log_stats: bool = False  # no throughput/cache log every 10 s of serving (LLM: none)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one `--flag` per field (help from the field comments of this class)."""
        helps = _field_help()
        for f in fields(cls):
            flags = [*_flags(f.name), *_SHORT_FLAGS.get(f.name, ())]
            if f.type is bool or f.type == "bool":
                parser.add_argument(*flags, action="store_true", help=helps.get(f.name))
                continue
            if f.type == bool | None or f.type == "bool | None":
                # Unset (None) leaves the choice to the engine; --no-<flag> turns it off.
                parser.add_argument(*flags, action=argparse.BooleanOptionalAction,
                                    help=helps.get(f.name))  # fmt: skip
                continue
            help_text = helps.get(f.name)
            default = f.default if f.default is not None else _NONE_DEFAULTS.get(f.name)
            if default is not None:
                help_text = f"{help_text} (default: {default})"
            # The value named after the first flag, as argparse names it without a `dest`:
            # `--kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES`, as upstream's help shows it.
            # A JSON object's flag says so, and takes dotted keys (FlexibleArgumentParser).
            metavar = flags[0].lstrip("-").replace("-", "_").upper()
            if "dict" in str(f.type):
                metavar = JSON_METAVAR
            parser.add_argument(
                *flags, dest=f.name, default=f.default, help=help_text, type=_cli_type(f),
                metavar=metavar,
            )  # fmt: skip
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    def create_engine_config(self) -> VllmConfig:
        """Resolve defaults and validate; raises ValueError naming the bad argument, or
        `EngineArgsError` naming each of them where several are refused."""
        from vllm.model_executor.model_loader.builtin import check_load_format

        refusals = Refusals()
        check = refusals.check
        # Not read by the checks below that take them (a truthy "no" is not the user's "on").
        bad_bools = {
            f.name
            for f in fields(self)
            if check(_check_bool_field, f.name, f.type, getattr(self, f.name)) is REFUSED
        }
        refusals.errors.extend(self._neutral_field_refusals(bad_bools))
        bad_variables = envs.refused()
        refusals.errors.extend(bad_variables)
        tp = check(_check_int, "tensor_parallel_size", self.tensor_parallel_size, 1)
        max_num_seqs = check(_check_int, "max_num_seqs", self.max_num_seqs, 1)
        block_size = check(_check_int, "block_size", self.block_size, 1)
        check(_check_seed, self.seed)
        check(_check_int, "max_logprobs", self.max_logprobs, -1)
        asked_batched = check(
            _check_optional_int, "max_num_batched_tokens", self.max_num_batched_tokens, 1
        )
        check(_check_optional_int, "num_gpu_blocks_override", self.num_gpu_blocks_override, 1)
        check(_check_optional_int, "kv_cache_memory", self.kv_cache_memory, 1)
        check(_check_optional_int, "max_cudagraph_capture_size", self.max_cudagraph_capture_size, 0)
        check(self._check_gpu_memory_utilization)
        load_format = check(self._load_format)
        check(self._check_kv_cache_dtype)
        device = check(self._device)
        dtype = check(_resolve_dtype, check(self._dtype), device)
        asked_len = check(parse_max_model_len, self.max_model_len)
        quant = check(self._quantization_config)
        folder = check(self._model_folder)
        hf_config = check(_load_hf_config, folder)
        # Each check below needs a value checked above, and `check` skips it where that value was
        # refused (so one refusal is all such a chain reports): its message would only repeat
        # that refusal, or judge a value that is not the user's (no model config: no limit for
        # max_model_len, no layers for the quantization config).
        if hf_config is not REFUSED:  # a folder's config first, then its weights
            check(check_load_format, folder, load_format)
        max_model_len = check(_max_model_len, asked_len, hf_config)
        check(self._warn_of_unfilled_blocks, block_size, max_model_len)
        batched = check(_max_num_batched_tokens, asked_batched, max_num_seqs)
        quant_method = check(_online_quantization, quant, hf_config)
        tokenizer = REFUSED
        if "skip_tokenizer_init" not in bad_bools:
            tokenizer = check(self._tokenizer_folder, folder)
        generation_config = check(load_generation_config, self.generation_config, folder, hf_config)
        if not bad_variables:  # the model's layers read them, and would refuse them again
            # Unquantized where the quantization config was refused, so that what the model
            # refuses otherwise (a TP size that does not shard it) is still reported with it.
            unquantized = quant_method is REFUSED
            check(
                self._check_model_builds,
                hf_config,
                dtype,
                None if unquantized else quant_method,
                tp,
            )
        refusals.raise_any()
        model_config = ModelConfig(
            model=str(self.model), folder=folder, tokenizer=tokenizer, hf_config=hf_config,
            dtype=dtype, max_model_len=max_model_len, load_format=self.load_format,
            seed=self.seed, quantization_config=None if quant is None else quant[0],
            enforce_eager=self.enforce_eager, max_logprobs=self.max_logprobs,
            generation_config=generation_config,
        )  # fmt: skip
        graphs = device == "cuda" and not self.enforce_eager
        async_scheduling = self._async_scheduling(device)
        sizes = cudagraph_capture_sizes(self.max_num_seqs, self.max_cudagraph_capture_size)
        return VllmConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                self.block_size,
                self.gpu_memory_utilization,
                self.num_gpu_blocks_override,
                self.kv_cache_memory,
            ),
            parallel_config=ParallelConfig(self.tensor_parallel_size),
            scheduler_config=SchedulerConfig(
                self.max_num_seqs, batched, max_model_len, async_scheduling
            ),
            compilation_config=CompilationConfig(sizes if graphs else []),
            device=device,
        )

    def _check_model_builds(
        self,
        hf_config: Any,
        dtype: torch.dtype,
        quant: "QuantizationConfig | None",
        tp: int,
    ) -> None:
        """The model built on the meta device, at TP = 1 and then at this TP size, so that what
        its layers refuse is known before any worker starts, and blamed on the right argument."""
        from vllm.model_executor.model_loader.loader import check_model_builds

        try:
            check_model_builds(hf_config, dtype, quant, 1)
        except (FusedLayerSplitError, EnvVarError):
            raise  # names the quantization config, or the environment variable, itself
        except ValueError as e:
            raise ValueError(f"model: {e}") from None
        if tp > 1:
            try:
                check_model_builds(hf_config, dtype, quant, tp)
            except EnvVarError:
                raise
            except ValueError as e:
                raise ValueError(
                    f"tensor_parallel_size: {tp} does not shard this model: {e}"
                ) from None

    def _neutral_field_refusals(self, bad_bools: set[str]) -> list[ValueError]:
        """Upstream's fields whose effect here is nil, or what this engine does anyway
        (docs/engine.md; prefix caching, which changes no output, is only warned of when asked
        for): a value that names what it does is taken; one that asks for what it
        does not do is refused, by name and with the reason. `bad_bools`: the bool fields
        already refused as no bool, not read here."""
        refusals = []
        if self.revision is not None:
            # Ignored, a pinned revision would run another version without a word.
            refusals.append(ValueError(
                f"revision {self.revision!r} cannot be honoured: vllm-k3 loads the model folder "
                "(or built-in model) as it is and downloads nothing, so no hub revision can be "
                "checked out or checked; leave revision unset"
            ))  # fmt: skip
        if self.tokenizer_mode != "auto":
            refusals.append(ValueError(
                f"tokenizer_mode {self.tokenizer_mode!r} is not supported: 'auto' only, the "
                "tokenizer folder's tokenizer.json or tiktoken.model read by vllm-k3 itself; there "
                "is no transformers ('hf', 'slow'), mistral_common or registered ('custom') "
                "tokenizer"
            ))  # fmt: skip
        if self.enable_chunked_prefill is False:
            refusals.append(ValueError(
                "enable_chunked_prefill: turning it off is not supported: the scheduler always "
                "splits a prompt that does not fit the tokens left in a step "
                "(max_num_batched_tokens) over several steps; leave it unset or on"
            ))  # fmt: skip
        if self.enable_prefix_caching and "enable_prefix_caching" not in bad_bools:
            # Upstream's default is on, so only the explicit spelling of what every upstream
            # run asks for could be refused; outputs are the same without a cache.
            logger.warning(
                "enable_prefix_caching has no effect: vllm-k3 has no prefix cache (a KDA state "
                "cannot be resumed from a block of cached tokens), so every prompt is prefilled "
                "in full; outputs are the same, without a cache hit's speed-up (docs/engine.md)"
            )
        return refusals

    def _check_gpu_memory_utilization(self) -> None:
        utilization = self.gpu_memory_utilization
        if (
            isinstance(utilization, bool)
            or not isinstance(utilization, int | float)
            or not (0 < utilization <= 1)
        ):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")

    def _load_format(self) -> str:
        if self.load_format not in _LOAD_FORMATS:
            raise ValueError(
                f"load_format must be one of {_LOAD_FORMATS}, got {self.load_format!r}"
            )
        return self.load_format

    def _check_kv_cache_dtype(self) -> None:
        if self.kv_cache_dtype != "auto":
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported: the MLA latent cache is "
                "kept in the model dtype ('auto')"
            )

    def _quantization_config(self) -> "tuple[dict, QuantizationConfigArgs] | None":
        """The decoded `quantization_config` and its parsed fields (None: not quantized)."""
        quant = self.quantization_config
        if quant is None:
            return None
        if isinstance(quant, str):
            try:
                quant = json.loads(quant)
            except json.JSONDecodeError as e:
                raise ValueError(f"quantization_config is not valid JSON: {e}") from None
        return quant, parse_quantization_config(quant)

    def _model_folder(self) -> Path:
        from vllm.model_executor.model_loader.builtin import resolve_model

        return resolve_model(self.model)[0]

    def _warn_of_unfilled_blocks(self, block_size: int, max_model_len: int) -> None:
        if block_size > max(max_model_len, EngineArgs.block_size):
            # Works, but no sequence ever fills its one block (more likely a mistaken flag).
            logger.warning(
                "block_size %d exceeds max_model_len %d: each sequence takes one block, of which "
                "at least %d tokens' cache stay unused",
                block_size, max_model_len, block_size - max_model_len,
            )  # fmt: skip

    def _async_scheduling(self, device: str) -> bool:
        """On by default where it overlaps anything: on a GPU (a CPU runs each forward before
        the call returns), at any TP size (a step launched ahead takes its input ids from rank
        0's sampler, broadcast on the device to the other ranks)."""
        return device == "cuda" if self.async_scheduling is None else self.async_scheduling

    def _tokenizer_folder(self, model_folder: Path) -> Path | None:
        """The folder the tokenizer is read from; None with `skip_tokenizer_init`."""
        from vllm.model_executor.model_loader.builtin import resolve_model
        from vllm.transformers_utils.tokenizer import has_tokenizer

        if self.skip_tokenizer_init:
            if self.tokenizer is not None:
                raise ValueError("tokenizer and skip_tokenizer_init exclude each other")
            return None
        folder = model_folder
        if self.tokenizer is not None:
            folder = resolve_model(self.tokenizer, "tokenizer")[0]
        if not has_tokenizer(folder):
            raise ValueError(
                f"tokenizer: {str(folder)!r} has neither tokenizer.json nor tiktoken.model; pass "
                "a tokenizer folder, or skip_tokenizer_init to run on token-id prompts"
            )
        return folder

    def _device(self) -> str:
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be auto, cuda or cpu, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no GPU")
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def _dtype(self) -> torch.dtype | None:
        """The dtype asked for; None for auto (`_resolve_dtype`)."""
        if isinstance(self.dtype, torch.dtype):
            if self.dtype not in _DTYPES.values():
                raise ValueError(f"dtype {self.dtype} is not one of {sorted(set(_DTYPES))}")
            return self.dtype
        if self.dtype == "auto":
            return None
        if not isinstance(self.dtype, str) or self.dtype not in _DTYPES:  # a list is unhashable
            raise ValueError(f"dtype must be auto or one of {sorted(_DTYPES)}, got {self.dtype!r}")
        return _DTYPES[self.dtype]


def _check_bool_field(name: str, kind: Any, value: Any) -> None:
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    if kind == bool | None and not isinstance(value, bool | None):
        raise ValueError(f"{name} must be a bool or None, got {value!r}")


def _check_seed(seed: Any) -> None:
    _check_int("seed", seed, SEED_MIN)
    if seed > SEED_MAX:  # torch's generators take int64 / uint64 values
        raise ValueError(f"seed must be <= {SEED_MAX}, got {seed}")


def _check_optional_int(name: str, value: Any, low: int) -> int | None:
    return None if value is None else _check_int(name, value, low)


def _resolve_dtype(dtype: torch.dtype | None, device: str) -> torch.dtype:
    # CPU BLAS is slow and inexact in bf16; the CPU reference paths are fp32.
    if dtype is not None:
        return dtype
    return torch.bfloat16 if device == "cuda" else torch.float32


def _load_hf_config(folder: Path) -> Any:
    from vllm.transformers_utils.configs import load_model_config

    try:
        return load_model_config(folder, warn_checkpoint_quantization=True)
    except ValueError as e:
        raise ValueError(f"model: {e}") from None


def _max_model_len(asked: int | None, hf_config: Any) -> int:
    """`max_model_len` (None: the model's `max_position_embeddings`), within the model's."""
    limit = getattr(hf_config, "text_config", hf_config).max_position_embeddings
    max_model_len = limit if asked is None else asked
    # One prompt token and one generated token at least (the scheduler's own bound).
    _check_int("max_model_len", max_model_len, 2)
    if max_model_len > limit:
        raise ValueError(
            f"max_model_len {max_model_len} exceeds the model's max_position_embeddings {limit}"
        )
    return max_model_len


def _max_num_batched_tokens(asked: int | None, max_num_seqs: int) -> int:
    batched = resolve_max_num_batched_tokens(asked, max_num_seqs)
    if batched < max_num_seqs:
        raise ValueError(
            f"max_num_batched_tokens ({batched}) must be >= max_num_seqs "
            f"({max_num_seqs}): every running sequence's decode token fits in a step"
        )
    return batched


def _online_quantization(
    quant: "tuple[dict, QuantizationConfigArgs] | None", hf_config: Any
) -> "QuantizationConfig | None":
    """The online method of the quantization config, for this model's fused layers; checks
    whether one exists for the scheme (the runner builds its own)."""
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
    from vllm.models.registry import model_class

    if quant is None:
        return None
    return OnlineQuantizationConfig(quant[1], model_class(hf_config).packed_modules_mapping)


def _check_int(name: str, value: Any, low: int | None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def _cli_type(f: dataclasses.Field) -> Any:
    if f.name in ("max_model_len", "quantization_config", "dtype", "model", "tokenizer"):
        return str
    if f.name == "gpu_memory_utilization":
        return float
    if f.name == "kv_cache_memory":
        return human_readable_int
    if "int" in str(f.type):
        return int
    return str


def _field_help() -> dict[str, str]:
    """Field name -> its trailing comment in this class's source (one source of help text)."""
    import inspect

    helps = {}
    for line in inspect.getsource(EngineArgs).splitlines():
        match = re.match(r"\s+(\w+): [^=]+= .*?#\s*(.+)$", line)
        if match:
            helps[match[1]] = match[2]
    return helps


def usage_error(parser: argparse.ArgumentParser, refused: list[str]) -> NoReturn:
    """Exit 2 with the usage errors `refused` (`argument --flag: reason`), all of them."""
    if len(refused) == 1:
        parser.error(refused[0])
    parser.error(f"{len(refused)} arguments refused:\n  " + "\n  ".join(refused))


def each_refusal(error: ValueError) -> list[ValueError]:
    """The refusals that `error`, from `create_engine_config`, stands for: an
    `EngineArgsError`'s, or `error` itself."""
    return error.errors if isinstance(error, EngineArgsError) else [error]


def refusal(error: ValueError) -> str:
    """The usage error for `error` (from `create_engine_config`): the `--flag` of the field that
    it names, without the message's own `field: ` prefix (the inverse of `add_cli_args`)."""
    message = str(error)
    if isinstance(error, EnvVarError):  # its message names the variable; words after are values
        return f"environment variable {message}"
    field = _field_of(message)
    if field is None:
        return f"argument engine arguments: {message}"
    flag = _flags(field)[0]
    return f"argument {flag}: {message.removeprefix(field + ': ')}"


def _field_of(message: str) -> str | None:
    """The first EngineArgs field that an error message names (messages name their field
    first; words after it may come from the user's own values)."""
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    message = re.sub(r"^(--)?quantization[ _-]config\b", "quantization_config", message)
    return next((w for w in re.findall(r"[a-z][a-z_]+", message) if w in names), None)
