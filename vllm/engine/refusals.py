"""Every refusal of one `EngineArgs.create_engine_config` run, kept rather than raised at the
first (`Refusals`), so that a command line learns of all its bad arguments at once; several are
raised together as `EngineArgsError`."""

from collections.abc import Callable
from typing import Any, TypeVar

from vllm.envs import EnvVarError


class Refused:
    """The value of a refused check (`REFUSED`)."""


REFUSED = Refused()
_T = TypeVar("_T")


class EngineArgsError(ValueError):
    """Several arguments refused by `EngineArgs.create_engine_config`: `errors`, each the
    ValueError naming its argument (a single refusal is raised as it is)."""

    def __init__(self, errors: list[ValueError]) -> None:
        lines = "".join(f"\n  {e}" for e in errors)
        what = "engine arguments"
        if any(isinstance(e, EnvVarError) for e in errors):
            what += " and environment variables"
        super().__init__(f"{len(errors)} {what} refused:{lines}")
        self.errors = errors


class Refusals:
    """The ValueErrors of `create_engine_config`'s checks, all kept, so that one run reports
    every bad argument rather than the first."""

    def __init__(self) -> None:
        self.errors: list[ValueError] = []

    def check(self, check: Callable[..., _T], *args: Any) -> "_T | Refused":
        """`check(*args)`, or `REFUSED` where it raises ValueError (kept), or where an argument
        is `REFUSED` (not run: it depends on a refused value)."""
        if any(arg is REFUSED for arg in args):
            return REFUSED
        try:
            return check(*args)
        except ValueError as e:
            self.errors.append(e)
            return REFUSED

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise EngineArgsError(self.errors)
