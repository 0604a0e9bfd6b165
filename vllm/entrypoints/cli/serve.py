"""`vllm serve MODEL [flags]`: the OpenAI-compatible server.

Engine flags come from `EngineArgs.add_cli_args` (the same fields as `LLM(...)` keywords); this
module adds the server's own flags and the recipe's flags that the engine has no field for, each
either working or refused at start-up with a message naming it. Every check runs before the model
loads.
"""

import argparse
import json
import os

from vllm import envs
from vllm.engine.arg_utils import EngineArgs, each_refusal, refusal, usage_error
from vllm.entrypoints.openai.protocol import DEFAULT_MAX_REQUEST_BODY_BYTES
from vllm.logger import init_logger
from vllm.reasoning import REASONING_PARSERS
from vllm.utils.cli import JSON_LIST_METAVAR, JSON_METAVAR

logger = init_logger(__name__)

_DESCRIPTION = """\
Serve MODEL (a checkpoint folder or a built-in name such as kimi-k3-tiny) over an
OpenAI-compatible HTTP API: /v1/completions, /v1/chat/completions, /v1/models[/MODEL], /tokenize,
/detokenize, /tokenizer_info, /health (and /ping), /version, /metrics. See docs/serving.md."""


def _json_list(text: str) -> list[str]:
    """A flag's JSON list of strings (argparse names the flag in the error)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, got {text!r}")
    return value


_SERVER_FLAGS: list[tuple[tuple[str, ...], dict]] = [
    (
        ("--served-model-name",),
        dict(
            nargs="+",
            default=None,
            metavar="NAME",
            help="name(s) the API accepts in the `model` field; responses echo the first "
            "(default: MODEL)",
        ),
    ),
    (("--host",), dict(default=None, help="address to bind (default: all interfaces)")),
    (
        ("--port",),
        dict(
            type=int,
            default=8000,
            help="TCP port (default 8000; 0: one the OS picks, logged at start-up)",
        ),
    ),
    (
        ("--api-key",),
        dict(
            default=None,
            help="require `Authorization: Bearer KEY` on /v1/* requests (401 otherwise); "
            "default: $VLLM_API_KEY",
        ),
    ),
    (
        ("--allowed-origins",),
        dict(
            type=_json_list,
            default=["*"],
            metavar=JSON_LIST_METAVAR,
            help="CORS: the origins whose web pages may call the API, a JSON list such as "
            '\'["https://ui.example"]\' (default: ["*"], any, as vLLM)',
        ),
    ),
    (
        ("--allowed-methods",),
        dict(
            type=_json_list,
            default=["*"],
            metavar=JSON_LIST_METAVAR,
            help='CORS: the methods those pages may use, a JSON list (default: ["*"])',
        ),
    ),
    (
        ("--allowed-headers",),
        dict(
            type=_json_list,
            default=["*"],
            metavar=JSON_LIST_METAVAR,
            help='CORS: the request headers those pages may send, a JSON list (default: ["*"])',
        ),
    ),
    (
        ("--allow-credentials",),
        dict(
            action="store_true",
            help="CORS: let those pages send the browser's cookies and HTTP authentication "
            "(default: off)",
        ),
    ),
    (
        ("--enable-tokenizer-info-endpoint",),
        dict(
            action=argparse.BooleanOptionalAction,
            default=True,
            help="serve GET /tokenizer_info (on by default here, unlike vLLM: lm_eval's "
            "remote tokenizer needs it, or it downloads a tokenizer from the hub)",
        ),
    ),
    (
        ("--max-request-body-bytes",),
        dict(
            type=int,
            default=DEFAULT_MAX_REQUEST_BODY_BYTES,
            metavar="BYTES",
            help="largest request body accepted, in bytes; a larger one is a 413 and never read "
            f"whole (default: {DEFAULT_MAX_REQUEST_BODY_BYTES}, 32 MiB)",
        ),
    ),
    (
        ("--uvicorn-log-level",),
        dict(
            default="info",
            choices=["critical", "error", "warning", "info", "debug", "trace"],
            help="log level of uvicorn's access and error logs (default: info)",
        ),
    ),
    (
        ("--enable-log-requests",),
        dict(
            action="store_true",
            help="log each request handed to the engine: its id, prompt token ids and sampling "
            "parameters (off by default, as upstream)",
        ),
    ),
    (
        ("--max-log-len",),
        dict(
            type=int,
            default=None,
            metavar="N",
            help="with --enable-log-requests, the most prompt token ids a request's line shows "
            "(default: all)",
        ),
    ),
    (
        ("--reasoning-parser",),
        dict(
            default=None,
            choices=sorted(REASONING_PARSERS),
            help="split the chat reply's think channel into `reasoning` (kimi_k3: "
            "<|open|>think<|sep|> ... <|close|>think<|sep|>); no effect on /v1/completions",
        ),
    ),
    (
        ("--trust-request-chat-template",),
        dict(
            action="store_true",
            help="accept a request's own `chat_template` (chat, /tokenize); off by default, as "
            "in vLLM: a template is a program the server runs, and even sandboxed it can loop "
            "for as long as it likes",
        ),
    ),
    (
        ("--enable-prompt-tokens-details",),
        dict(
            action="store_true",
            help="report `usage.prompt_tokens_details` (`cached_tokens`: the prompt tokens "
            "served from the prefix cache, 0 here, where there is none) in the replies of "
            "/v1/completions and /v1/chat/completions and in a stream's final usage chunk; "
            "off by default, as in vLLM (`prompt_tokens_details` null, or left out of a chunk)",
        ),
    ),
    (
        ("--language-model-only",),
        dict(
            action="store_true",
            help="serve only the text model; this fork has no vision tower, so this is always the "
            "case (accepted for the recipe)",
        ),
    ),
    (
        ("--attention-config", "-ac"),
        dict(
            default=None,
            metavar=JSON_METAVAR,
            help="upstream AttentionConfig as a JSON object; this fork has one MLA/KDA "
            "implementation per platform, so each key is reported as having no effect",
        ),
    ),
    (
        ("--quantization", "-q"),
        dict(
            default=None,
            metavar="METHOD",
            help="upstream's quantization method name (e.g. fp8): refused, this fork quantizes "
            "online through --quantization-config JSON (docs/quantization.md); without this "
            "flag, --quantization was taken as an abbreviation of --quantization-config",
        ),
    ),
    (
        ("--speculative-config", "-sc"),
        dict(
            default=None,
            metavar=JSON_METAVAR,
            help="speculative decoding config: refused, speculative decoding is not implemented",
        ),
    ),
]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible API",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="checkpoint folder or built-in model name (or --model; both only if they agree)",
    )
    engine = parser.add_argument_group("engine (the same fields as LLM(...) keywords)")
    EngineArgs.add_cli_args(engine)
    server = parser.add_argument_group("server")
    for names, kwargs in _SERVER_FLAGS:
        server.add_argument(*names, **kwargs)
    parser.set_defaults(dispatch=run, subparser=parser)
    return parser


def check_server_args(args: argparse.Namespace) -> list[str]:
    """The refusals (`argument --flag: reason`) of the flags that cannot work, all of them, so
    that a recipe with several learns of each in one run; warns for no-op flags."""
    refusals = []
    if args.speculative_config is not None:
        refusals.append(
            "argument --speculative-config/-sc: speculative decoding is not implemented in "
            "vllm-k3 (no draft model runner or rejection sampler); remove the flag to serve "
            "without it"
        )
    if args.quantization is not None:
        refusals.append(
            f"argument --quantization/-q: upstream's method names ({args.quantization!r}) are not "
            "supported; vllm-k3 quantizes online through --quantization-config, e.g. the PTPC "
            'recipe \'{"linear":"fp8_per_channel"}\' (docs/quantization.md)'
        )
    if args.attention_config is not None:
        try:
            config = json.loads(args.attention_config)
        except json.JSONDecodeError as e:
            config = None
            refusals.append(f"argument --attention-config/-ac: not valid JSON: {e}")
        if config is not None and not isinstance(config, dict):
            refusals.append("argument --attention-config/-ac: must be a JSON object")
        for key, value in config.items() if isinstance(config, dict) else ():
            logger.warning(
                "--attention-config %s=%r has no effect: vllm-k3 has one MLA and one KDA "
                "implementation per platform (no backend choice)",
                key,
                value,
            )
    if args.skip_tokenizer_init:
        refusals.append(
            "argument --skip-tokenizer-init: the server takes and returns text, so it needs a "
            "tokenizer; use LLM(...) or the benchmarks for token-id-only runs"
        )
    if args.api_key is not None and not args.api_key.strip():
        # An unset shell variable (`--api-key "$KEY"`) would otherwise serve with no key at all.
        refusals.append("argument --api-key: must not be empty (leave the flag out for no key)")
    if args.api_key is None:
        args.api_key = envs.VLLM_API_KEY
    if envs.VLLM_USE_BREAKABLE_CUDAGRAPH is not None:
        logger.info("VLLM_USE_BREAKABLE_CUDAGRAPH has no effect: decode graphs are whole")
    if args.language_model_only:
        logger.info("--language-model-only: the text model is all that vllm-k3 serves")
    if args.served_model_name is not None and not all(args.served_model_name):
        refusals.append("argument --served-model-name: names must not be empty")
    if args.max_request_body_bytes < 1:
        limit = args.max_request_body_bytes
        refusals.append(f"argument --max-request-body-bytes: must be at least 1, got {limit}")
    if args.max_log_len is not None and args.max_log_len < 0:
        refusals.append(f"argument --max-log-len: must be >= 0, got {args.max_log_len}")
    if not 0 <= args.port < 65536:
        port = args.port
        refusals.append(f"argument --port: must be in 0..65535 (0: one the OS picks), got {port}")
    return refusals


def _same_model(a: str, b: str) -> bool:
    """Whether two spellings name one model (`./ckpt` and `ckpt/` are one folder)."""
    return os.path.normpath(a) == os.path.normpath(b)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Validate everything, then serve until interrupted."""
    from vllm.entrypoints.openai.api_server import BindError, run_server
    from vllm.model_executor.model_loader.errors import CheckpointError, ModelSizeError
    from vllm.v1.core.kv_cache_utils import CacheSizeError

    if args.model_tag is not None:
        # A --model left at its default cannot be told from one given as the default: only a
        # different one is seen.
        if args.model != EngineArgs.model and not _same_model(args.model, args.model_tag):
            parser.error(
                f"argument --model: {args.model!r} differs from MODEL {args.model_tag!r}: give "
                "the model once"
            )
        args.model = args.model_tag
    refused = check_server_args(args)
    try:
        config = EngineArgs.from_cli_args(args).create_engine_config()
    except ValueError as e:
        refused += [refusal(error) for error in each_refusal(e)]
    if refused:
        usage_error(parser, refused)
    try:
        run_server(args, config)
    except BindError as e:
        parser.error(str(e))
    except CacheSizeError as e:  # found once the model is on the device
        parser.error(f"the cache arguments: {e}")
    except (CheckpointError, ModelSizeError) as e:  # found while the tokenizer and weights load
        parser.error(f"loading {args.model}: {e}")
    return 0
