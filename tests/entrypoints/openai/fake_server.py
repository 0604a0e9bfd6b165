"""Serve `FakeEngine` through the real app in a process of its own (for server tests that need a
scripted reply, e.g. the reasoning parser):
`python tests/entrypoints/openai/fake_server.py PORT SCRIPT [--reasoning-parser kimi_k3]
[--api-key KEY] [--step-delay SECONDS] [--abort-delay SECONDS] [--max-model-len N]`."""

import argparse
import sys
from pathlib import Path

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402

from vllm.entrypoints.openai.api_server import build_app  # noqa: E402
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
    )
    try:
        uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
