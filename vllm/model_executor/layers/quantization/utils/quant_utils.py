"""Descriptions of how a tensor is quantized: `GroupShape`, `ScaleDesc`, `QuantKey`, FP8 keys.

A `QuantKey` is the contract between a producer of a quantized activation and the linear that
consumes it (upstream-facts A): equal keys mean the same dtype, scale granularity, scale dtype,
static/dynamic scale and symmetry. Keys are frozen dataclasses, so `==` compares values.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from vllm.platforms import current_platform


class GroupShape(NamedTuple):
    """Extent of the block that shares one scale: (rows, cols); -1 means the whole dimension."""

    row: int
    col: int

    def is_per_tensor(self) -> bool:
        return self.row == -1 and self.col == -1

    def is_per_token(self) -> bool:
        return self.row == 1 and self.col == -1

    def is_per_channel(self) -> bool:
        return self.row == -1 and self.col == 1

    def is_per_group(self) -> bool:
        return self.row == 1 and self.col >= 1


GroupShape.PER_TENSOR = GroupShape(-1, -1)
GroupShape.PER_TOKEN = GroupShape(1, -1)
GroupShape.PER_CHANNEL = GroupShape(-1, 1)


@dataclass(frozen=True)
class ScaleDesc:
    """One scale tensor: its dtype, whether it is fixed at load (static) and its group shape."""

    dtype: torch.dtype
    static: bool
    group_shape: GroupShape

    def __str__(self) -> str:
        kind = "static" if self.static else "dynamic"
        return f"{self.group_shape}, {kind}, {self.dtype}"


@dataclass(frozen=True)
class QuantKey:
    """What a quantized tensor is: element dtype, scale(s) and symmetry."""

    dtype: torch.dtype
    scale: ScaleDesc
    scale2: ScaleDesc | None = None
    symmetric: bool = True

    def __str__(self) -> str:
        sym = "sym" if self.symmetric else "asym"
        scale2 = f", scale2({self.scale2})" if self.scale2 is not None else ""
        return f"QuantKey({self.dtype}, scale({self.scale}){scale2}, {sym})"


FP8_DTYPE = current_platform.fp8_dtype()

kStaticTensorScale = ScaleDesc(torch.float32, True, GroupShape.PER_TENSOR)
kDynamicTensorScale = ScaleDesc(torch.float32, False, GroupShape.PER_TENSOR)
kStaticTokenScale = ScaleDesc(torch.float32, True, GroupShape.PER_TOKEN)
kDynamicTokenScale = ScaleDesc(torch.float32, False, GroupShape.PER_TOKEN)
kStaticChannelScale = ScaleDesc(torch.float32, True, GroupShape.PER_CHANNEL)
kDynamic128Scale = ScaleDesc(torch.float32, False, GroupShape(1, 128))
kStatic128BlockScale = ScaleDesc(torch.float32, True, GroupShape(128, 128))
kDynamic64Scale = ScaleDesc(torch.float32, False, GroupShape(1, 64))

kFp8StaticTensorSym = QuantKey(FP8_DTYPE, kStaticTensorScale)
kFp8DynamicTensorSym = QuantKey(FP8_DTYPE, kDynamicTensorScale)
kFp8StaticTokenSym = QuantKey(FP8_DTYPE, kStaticTokenScale)
kFp8StaticChannelSym = QuantKey(FP8_DTYPE, kStaticChannelScale)
# The PTPC activation key: dynamic, per token, fp32 scale [M, 1].
kFp8DynamicTokenSym = QuantKey(FP8_DTYPE, kDynamicTokenScale)
kFp8Dynamic128Sym = QuantKey(FP8_DTYPE, kDynamic128Scale)
kFp8Static128BlockSym = QuantKey(FP8_DTYPE, kStatic128BlockScale)
kFp8Dynamic64Sym = QuantKey(FP8_DTYPE, kDynamic64Scale)

kInt8DynamicTokenSym = QuantKey(torch.int8, kDynamicTokenScale)
