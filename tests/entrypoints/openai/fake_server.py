"""Serve `FakeEngine` through the real app in a process of its own (for server tests that need a
scripted reply, e.g. the reasoning parser; PORT 0 binds one the OS picks, logged as `vllm serve`
logs its address):
`python tests/entrypoints/openai/fake_server.py PORT SCRIPT [--reasoning-parser kimi_k3]
[--api-key KEY] [--step-delay SECONDS] [--abort-delay SECONDS] [--max-model-len N]
[--trust-request-chat-template] [--enable-prompt-tokens-details]`."""

import argparse
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402

from vllm.entrypoints.openai.api_server import (  # noqa: E402
    SERVING_LINE,
    _Server,
    bind_socket,
    build_app,
)
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("script")
    parser.add_argument("--reasoning-parser", default=None)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--abort-delay", type=float, default=0.0)
    parser.add_argument("--max-model-len", type=int, default=128)
    parser.add_argument("--trust-request-chat-template", action="store_true")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true")
    args = parser.parse_args()
    engine = AsyncLLM(
        FakeEngine(args.script, args.max_model_len, args.step_delay, args.abort_delay)
    )
    app = build_app(
        engine,
        ["fake", "fake-alias"],
        "fake",
        api_key=args.api_key,
        reasoning_parser=args.reasoning_parser,
        trust_request_chat_template=args.trust_request_chat_template,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
    )
    sock = bind_socket("127.0.0.1", args.port)
    # The address as `vllm serve` logs it: with PORT 0, how RemoteServer learns the OS's pick.
    print(SERVING_LINE % ("fake", "127.0.0.1", sock.getsockname()[1]), flush=True)
    try:
        # `vllm serve`'s server: shutdown ends the requests in flight at once.
        _Server(uvicorn.Config(app, log_level="warning"), engine).run(sockets=[sock])
    finally:
        sock.close()
        engine.shutdown()


if __name__ == "__main__":
    main()
