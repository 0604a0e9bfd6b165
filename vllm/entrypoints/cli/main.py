"""Entry point of the `vllm` console script: one subcommand per action (`serve`)."""

import argparse
import sys

import vllm
from vllm.entrypoints.cli import serve


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm", description="vllm-k3: serve Kimi-K3 / Kimi-Linear models."
    )
    parser.add_argument("-v", "--version", action="version", version=vllm.__version__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.dispatch(args, args.subparser)


if __name__ == "__main__":
    sys.exit(main())
