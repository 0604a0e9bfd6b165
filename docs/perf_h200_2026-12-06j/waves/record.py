"""(Ad hoc, fiftieth run; run from the repository root under TRITON_INTERPRET=1, then compile.py
without it.) Record the batch-1 decode launches (grid, args, options) of the main Triton kernels at
Kimi-Linear's sizes under the interpreter, without running them; write JSON for compile.py."""
import importlib, json, sys, os
sys.path[:0] = ["/work/main/tests", "/work/main/tests/triton_utils"]
os.environ["TRITON_INTERPRET"] = "1"
import torch
import pytest
import test_kernels_compile_for_hopper as T
from counted_kernels import COUNTED_KERNELS

out = []

class Rec:
    def __init__(self, module, name, kernel):
        self.module, self.name, self.kernel = module, name, kernel
        import inspect
        self.sig = inspect.signature(kernel.fn)
    def __getitem__(self, grid):
        def run(*args, **kwargs):
            params = self.sig.parameters
            options = {k: v for k, v in kwargs.items() if k not in params}
            bound = self.sig.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
            bound.apply_defaults()
            values = {n: T._describe(v) for n, v in bound.arguments.items()}
            g = grid(dict(bound.arguments)) if callable(grid) else grid
            g = tuple(g) + (1,) * (3 - len(tuple(g)))
            out.append(dict(module=self.module, kernel=self.name, args=values, options=options,
                            grid=list(g), tag=TAG[0]))
        return run
    def __getattr__(self, a):
        return getattr(self.kernel, a)

TAG = [""]
mp = pytest.MonkeyPatch()
for mod_name, names in COUNTED_KERNELS.items():
    mod = importlib.import_module(mod_name)
    for n in names:
        mp.setattr(mod, n, Rec(mod_name, n, getattr(mod, n)))
    if hasattr(mod, "use_pdl"):
        mp.setattr(mod, "use_pdl", lambda device: True)
from vllm.triton_utils import launch as L
mp.setattr("vllm.triton_utils.num_sms", lambda device=None: 132, raising=False)
for m in list(sys.modules):
    if m.startswith("vllm") and hasattr(sys.modules[m], "num_sms"):
        try:
            mp.setattr(sys.modules[m], "num_sms", lambda device=None: 132)
        except Exception:
            pass

g = torch.Generator().manual_seed(0)
bf = torch.bfloat16
from vllm.model_executor.kernels.linear.gemv import gemv, gemv_fp8, gemv_batched
from vllm.model_executor.kernels.linear.gemv_config import default_config
FP8 = torch.float8_e4m3fn
x = torch.randn(1, 2304, generator=g).to(bf)
TAG[0] = "kda in_proj 12576x2304"; gemv(x, torch.randn(12576, 2304).to(bf))
TAG[0] = "mla q_kv_a 6720x2304"; gemv(x, torch.randn(6720, 2304).to(bf))
a = torch.randn(1, 4096).to(FP8)
TAG[0] = "o_proj fp8 2304x4096"; gemv_fp8(a, torch.rand(1, 1), torch.randn(2304, 4096).to(FP8), torch.rand(2304, 1))
TAG[0] = "W_UK"; gemv_batched(torch.randn(32, 1, 128).to(bf), torch.randn(32, 512, 128).to(bf))
TAG[0] = "W_UV"; gemv_batched(torch.randn(32, 1, 512).to(bf), torch.randn(32, 128, 512).to(bf))
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm
TAG[0] = "input norm"; fused_add_rms_norm(x, x.clone(), torch.ones(2304, dtype=bf), 1e-6)
from vllm.model_executor.layers.fused_moe.experts_triton import moe_experts_triton
from vllm.model_executor.layers.activation import SiluAndMul
E = 16
w13 = torch.empty(E, 2048, 2304, dtype=bf); w2 = torch.empty(E, 2304, 1024, dtype=bf)
TAG[0] = "experts 1 token top-9"; moe_experts_triton(x, w13, w2, torch.rand(1, 9), torch.randint(0, E, (1, 9)), SiluAndMul())
from vllm.model_executor.layers.fused_moe.fused_router import fused_norm_router_topk
from vllm.model_executor.layers.fused_moe.router import RoutingParams
TAG[0] = "router+norm"
try:
    routing = RoutingParams(num_experts=256, top_k=8, renormalize=True, num_expert_group=1, topk_group=1, scoring_func="sigmoid", routed_scaling_factor=2.446, num_fused_shared_experts=1)
    fused_norm_router_topk(x, x.clone(), torch.ones(2304, dtype=bf), 1e-6, torch.randn(256, 2304), torch.randn(256), routing, torch.zeros(1, dtype=torch.int32))
except Exception as e:
    print("router skipped:", e)
TAG[0] = "kda decode b1"
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import kda_decode_config
T._drive_kda_decode(1, 32, 128, [kda_decode_config(1, 32, 128, 132)], rank=128)
TAG[0] = "mla decode b1 8k"
T._drive_mla(1, 32, 512, 64, 16, 8224)
json.dump(out, open("/tmp/occ/launches.json", "w"))
print(len(out), "launches")
