"""Entry point of the `vllm` console script: one subcommand per action (`serve`)."""

import sys

import vllm
from vllm.utils.cli import FlexibleArgumentParser, run_main


def make_parser() -> FlexibleArgumentParser:
    # Imported here, inside `main`'s Ctrl-C handling: it imports torch (about a second).
    from vllm.entrypoints.cli import serve

    parser = FlexibleArgumentParser(
        prog="vllm", description="vllm-k3: serve Kimi-K3 / Kimi-Linear models."
    )
    parser.add_argument("-v", "--version", action="version", version=vllm.__version__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command's exit status; Ctrl-C before the server's own handlers are installed (while
    torch is imported, the flags are checked) exits 130 with one line, not a traceback."""
    return run_main(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `vllm` alone: its help, as upstream (not a usage error)
        parser.print_help()
        return 0
    return args.dispatch(args, args.subparser)


if __name__ == "__main__":
    sys.exit(main())
