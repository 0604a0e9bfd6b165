"""Ad hoc (fiftieth run): record the batch-1 decode launches of the step's main Triton kernels at
Kimi-Linear's sizes and the H200's launch choices (grid, arguments, options), without running
them, into launches.json for compile.py. Run from the repository root; it sets the interpreter
itself (the recorders stand in for the kernels, as in the compile test they borrow from)."""

import importlib
import inspect
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path[:0] = ["tests", "tests/triton_utils"]

import pytest  # noqa: E402
import test_kernels_compile_for_hopper as hopper  # noqa: E402
import torch  # noqa: E402
from counted_kernels import COUNTED_KERNELS  # noqa: E402

from vllm.model_executor.kernels.linear.gemv import gemv, gemv_batched, gemv_fp8  # noqa: E402
from vllm.model_executor.layers.activation import SiluAndMul  # noqa: E402
from vllm.model_executor.layers.fused_moe.experts_triton import moe_experts_triton  # noqa: E402
from vllm.model_executor.layers.fused_moe.fused_router import fused_norm_router_topk  # noqa: E402
from vllm.model_executor.layers.fused_moe.router import RoutingParams  # noqa: E402
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm  # noqa: E402
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import kda_decode_config  # noqa: E402

SMS = 132
LAUNCHES: list[dict] = []
TAG = [""]


class Recorder:
    """Stands in for a kernel: `kernel[grid](...)` appends the launch, runs nothing."""

    def __init__(self, module: str, name: str, kernel) -> None:
        self.module, self.name, self.kernel = module, name, kernel
        self.signature = inspect.signature(kernel.fn)

    def __getitem__(self, grid):
        def record(*args, **kwargs) -> None:
            params = self.signature.parameters
            options = {k: v for k, v in kwargs.items() if k not in params}
            bound = self.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
            bound.apply_defaults()
            shape = tuple(grid(dict(bound.arguments)) if callable(grid) else grid)
            LAUNCHES.append(
                dict(
                    module=self.module, kernel=self.name, options=options, tag=TAG[0],
                    args={n: hopper._describe(v) for n, v in bound.arguments.items()},
                    grid=list(shape + (1,) * (3 - len(shape))),
                )
            )  # fmt: skip

        return record

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)


def main() -> None:
    mp = pytest.MonkeyPatch()
    for module_name, names in COUNTED_KERNELS.items():
        module = importlib.import_module(module_name)
        for name in names:
            mp.setattr(module, name, Recorder(module_name, name, getattr(module, name)))
        for attr, value in (("use_pdl", lambda device: True), ("num_sms", lambda d=None: SMS)):
            if hasattr(module, attr):
                mp.setattr(module, attr, value)
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("vllm") and hasattr(module, "num_sms"):
            mp.setattr(module, "num_sms", lambda device=None: SMS)
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    x = torch.randn(1, 2304).to(bf16)
    cases = {
        "kda in_proj 12576x2304": lambda: gemv(x, torch.randn(12576, 2304).to(bf16)),
        "mla q_kv_a 6720x2304": lambda: gemv(x, torch.randn(6720, 2304).to(bf16)),
        "o_proj fp8 2304x4096": lambda: gemv_fp8(
            torch.randn(1, 4096).to(fp8),
            torch.rand(1, 1),
            torch.randn(2304, 4096).to(fp8),
            torch.rand(2304, 1),
        ),  # fmt: skip
        "W_UK": lambda: gemv_batched(
            torch.randn(32, 1, 128).to(bf16), torch.randn(32, 512, 128).to(bf16)
        ),
        "W_UV": lambda: gemv_batched(
            torch.randn(32, 1, 512).to(bf16), torch.randn(32, 128, 512).to(bf16)
        ),
        "input norm": lambda: fused_add_rms_norm(x, x.clone(), torch.ones(2304, dtype=bf16), 1e-6),
        "experts, 1 token, top-8 + shared": lambda: moe_experts_triton(
            x,
            torch.empty(16, 2048, 2304, dtype=bf16),
            torch.empty(16, 2304, 1024, dtype=bf16),
            torch.rand(1, 9),
            torch.randint(0, 16, (1, 9)),
            SiluAndMul(),
        ),  # fmt: skip
        "norm + router": lambda: fused_norm_router_topk(
            x,
            x.clone(),
            torch.ones(2304, dtype=bf16),
            1e-6,
            torch.randn(256, 2304),
            torch.randn(256),
            RoutingParams(
                num_experts=256,
                top_k=8,
                renormalize=True,
                num_expert_group=1,
                topk_group=1,
                scoring_func="sigmoid",
                routed_scaling_factor=2.446,
                num_fused_shared_experts=1,
            ),
            torch.zeros(1, dtype=torch.int32),
        ),  # fmt: skip
        "kda decode b1": lambda: hopper._drive_kda_decode(
            1, 32, 128, [kda_decode_config(1, 32, 128, SMS)], rank=128
        ),
        "mla decode b1 8k": lambda: hopper._drive_mla(1, 32, 512, 64, 16, 8224),
    }
    for tag, call in cases.items():
        TAG[0] = tag
        call()
    with open("launches.json", "w") as f:
        json.dump(LAUNCHES, f)
    print(f"{len(LAUNCHES)} launches")


if __name__ == "__main__":
    main()
