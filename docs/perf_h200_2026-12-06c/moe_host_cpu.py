"""CPU probe (forty-second run): the host time of one Kimi-Linear MoE block at a prefill size on
the GPU code path, every Triton launch replaced by a no-op, on the development machine.

Call 159 found a 1k prompt on an H100 waiting on the host: 27-29 ms of its ~60 ms idle in gaps
over 20 us, the longest around the MoE blocks (top-k -> grouping 162 us a layer, grouping ->
gate/up 142 us, norm -> router GEMV 102 us, router -> top-k 75 us). This runs
`KimiMoE.forward_with_norm` (the 48B config with 16 experts: the host path does not depend on
the count) on CPU tensors with `use_triton`, `supports_tma`, `use_pdl` and the shared-memory
query answering as on an H100, the launches stubbed (their own host time, Triton's dispatch of
the two grouped kernels included, is left out), and prints microseconds of host time a block.

    python moe_host_cpu.py [tokens]
"""

import json
import sys
import time

import torch

import vllm.model_executor.kernels.linear.gemv as gemv
import vllm.model_executor.layers.fused_moe.experts as experts
import vllm.model_executor.layers.fused_moe.experts_triton as experts_triton
import vllm.model_executor.layers.fused_moe.experts_triton_grouped as grouped
import vllm.model_executor.layers.fused_moe.fused_router as fused_router
import vllm.model_executor.layers.fused_moe.group_rows as group_rows
import vllm.model_executor.layers.fused_moe.router as router
import vllm.model_executor.layers.fused_moe.weighted_sum as weighted_sum
import vllm.model_executor.layers.layernorm as layernorm
import vllm.model_executor.layers.ops.rms_norm as rms_norm
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.models.kimi_k3.amd.moe import KimiMoE
from vllm.transformers_utils.configs import KimiLinearConfig

AS_ON_AN_H100 = {
    "use_triton": lambda device: True,
    "launch": lambda kernel, grid, args, spec: None,
    "supports_tma": lambda device: True,
    "max_shared_memory": lambda device: 232448,
    "use_pdl": lambda device: True,
}


class _NoKernel:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    modules = (grouped, group_rows, weighted_sum, router, experts, experts_triton, fused_router,
               gemv, rms_norm, layernorm)  # fmt: skip
    for module in modules:
        for name, value in AS_ON_AN_H100.items():
            if hasattr(module, name):
                setattr(module, name, value)
    experts.triton_experts_supported = lambda *args: True
    experts.grouped_mm_is_sync_free = lambda *args: True
    grouped._moe_grouped_gate_up_kernel = grouped._moe_grouped_down_kernel = _NoKernel()
    with open("vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json") as f:
        raw = json.load(f)
    raw["num_experts"] = 16
    config = KimiLinearConfig.from_dict(raw)
    torch.set_default_dtype(torch.bfloat16)
    moe = KimiMoE(config, params_dtype=torch.bfloat16, fuse_shared_experts=True)
    norm = RMSNorm(config.hidden_size, config.rms_norm_eps, torch.bfloat16)
    x = torch.randn(tokens, config.hidden_size)
    residual = torch.randn(tokens, config.hidden_size)
    with torch.no_grad():
        for _ in range(50):
            moe.forward_with_norm(x, residual, norm)
        best = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(300):
                moe.forward_with_norm(x, residual, norm)
            best.append((time.perf_counter() - start) / 300 * 1e6)
    print(f"T={tokens}: {min(best):.1f} us of host time a MoE block (best of 5 x 300; "
          f"launches stubbed)")  # fmt: skip


if __name__ == "__main__":
    main()
