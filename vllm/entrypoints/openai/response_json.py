"""The JSON body of a response, written in bounded pieces so that other threads run in between.

`JSONResponse(model.model_dump())` writes a response in two calls, pydantic's dump and
`json.dumps`, each holding the GIL from start to end: 0.5 s and 2 s for a completion that echoes
a 1M-token prompt with logprobs (95 MB), during which the server's event loop cannot run, even
when the writing is on a worker thread. `response_json` writes the same bytes with the same
writers, one piece at a time: no call takes more than `_ITEMS` list items or `_CHARS` characters
of a string.
"""

import json
import typing
from collections.abc import Iterator
from functools import cache
from typing import Any

from pydantic import BaseModel

# Starlette's JSONResponse.render: json.dumps with these options, then UTF-8. Floats are written by
# float.__repr__ ("1e-05"), where pydantic's own JSON writer has "0.00001": clients see no change.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
# At most about 0.4 ms of writing per call (256 tokens of legacy logprobs; 64k characters).
_ITEMS = 256
_CHARS = 1 << 16


def response_json(model: BaseModel) -> bytes:
    """`JSONResponse(model.model_dump()).body`, written piece by piece."""
    # bytes.join copies a large result without holding the GIL.
    return b"".join(piece.encode("utf-8") for piece in json_pieces(model))


def json_pieces(value: Any) -> Iterator[str]:
    """The JSON that `json.dumps` with JSONResponse's options writes for `value` (a model: for
    its `model_dump()`), in pieces.

    A model is written field by field, a list `_ITEMS` items per call, a long string `_CHARS`
    characters per call. A list's models are written one by one, as models, unless their
    fields hold no models: such a model is one token's logprob, small, and `model_dump` takes
    `_ITEMS` of them per call (walked one by one, the top logprobs of a chat reply took three
    times as long to write). Walking a model gives `model_dump()`'s content where the model has
    no custom serialization (serializers, computed or excluded fields), which no response model
    has (tests/entrypoints/openai/test_response_json.py checks).
    """
    if isinstance(value, BaseModel):
        yield "{"
        for i, (key, item) in enumerate(value):  # fields, in model_dump's order
            yield ("," if i else "") + _ENCODER.encode(key) + ":"
            yield from json_pieces(item)
        yield "}"
    elif isinstance(value, list):
        yield "["
        for start in range(0, len(value), _ITEMS):
            if start:
                yield ","
            yield from _items(value[start : start + _ITEMS])
        yield "]"
    elif isinstance(value, str) and len(value) > _CHARS:
        # JSON escapes each character on its own, so the pieces' escapes join into the whole's.
        yield '"'
        for start in range(0, len(value), _CHARS):
            yield _ENCODER.encode(value[start : start + _CHARS])[1:-1]
        yield '"'
    else:
        yield _ENCODER.encode(value)


def _items(items: list) -> Iterator[str]:
    """JSON of `items`, a list's items, without the brackets."""
    if any(isinstance(item, BaseModel) and not _holds_no_models(type(item)) for item in items):
        for i, item in enumerate(items):
            if i:
                yield ","
            yield from json_pieces(item)
    else:
        plain = [item.model_dump() if isinstance(item, BaseModel) else item for item in items]
        yield _ENCODER.encode(plain)[1:-1]


@cache
def _holds_no_models(cls: type[BaseModel]) -> bool:
    """Whether no field of `cls` is typed to hold a model."""
    return not any(_names_model(field.annotation) for field in cls.model_fields.values())


def _names_model(annotation: Any) -> bool:
    """Whether `annotation` is a model class or names one inside (`list[M]`, `M | None`, ...)."""
    if typing.get_origin(annotation) is None and isinstance(annotation, type):
        return issubclass(annotation, BaseModel)
    return any(_names_model(arg) for arg in typing.get_args(annotation))
