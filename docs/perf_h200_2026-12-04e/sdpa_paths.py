"""Device-call probe (twenty-eighth run): what each way of running MLA's prefill attention for a
new prompt (Lq == ctx, 32 heads, q/k 192, v 128 split from one kv_b_proj output) costs at steady
state, in one process with TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 (torch reads it once):

- dense: v read in place (a strided 192-wide view): torch falls back to cuDNN's per-shape plan;
- ragged+pad: the zero-padded contiguous v (the copy timed with it), cuDNN's ragged path;
- ragged pad only: the same with v padded beforehand; pad: the copy alone;
- ragged dv128: v contiguous at its own 128 columns (copy beforehand), if torch's cuDNN path
  takes a value head dim unlike q's (kernel name and the max difference to ragged+pad printed);
- flash: torch's flash kernel with v read in place.

Per length: median ms of triton.testing.do_bench (L2 flushed) after warm-up calls that build
the plans, and the kernel that ran.

    TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 python sdpa_paths.py
"""

import os
import warnings

os.environ["TORCH_CUDNN_SDPA_AVOID_RECOMPILE"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from triton.testing import do_bench  # noqa: E402

warnings.simplefilter("ignore")
H, NOPE, ROPE, DV = 32, 128, 64, 128
QK = NOPE + ROPE


def bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)


def attend(q, k, v):
    return F.scaled_dot_product_attention(bhsd(q), bhsd(k), bhsd(v), is_causal=True, scale=QK**-0.5)


def kernel_of(fn) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    names = [n for n in names if "setup" not in n and "Memcpy" not in n and "elementwise" not in n]
    return max(names, key=len, default="?")[:60]


def one_length(length: int) -> None:
    q = torch.randn(length, H, QK, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(length, H, QK, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(length, H, NOPE + DV, device="cuda", dtype=torch.bfloat16)
    v = kv[..., NOPE:]
    in_place = kv[..., NOPE - (QK - DV) :]
    padded = F.pad(v, (0, QK - DV))
    v128 = v.contiguous()
    cases = {
        "dense": lambda: attend(q, k, in_place),
        "ragged+pad": lambda: attend(q, k, F.pad(v, (0, QK - DV))),
        "ragged pad only": lambda: attend(q, k, padded),
        "pad": lambda: F.pad(v, (0, QK - DV)),
        "ragged dv128": lambda: attend(q, k, v128),
        "flash": lambda: attend(q, k, in_place),
    }
    ref = attend(q, k, padded)[0, :, :, :DV]
    for name, fn in cases.items():
        backend = SDPBackend.FLASH_ATTENTION if name == "flash" else SDPBackend.CUDNN_ATTENTION
        try:
            with sdpa_kernel([backend]):
                for _ in range(3):
                    fn()
                ms = do_bench(fn, warmup=5, rep=40)
                kern = kernel_of(fn)
                extra = ""
                if name == "ragged dv128":
                    extra = f"  max|diff| {(fn()[0] - ref).abs().max().item():.3g}"
            print(f"L={length:5d} {name:16s} {ms:7.3f} ms  {kern}{extra}", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"L={length:5d} {name:16s} failed: {str(exc)[:160]}", flush=True)


def main() -> None:
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for length in (8192, 8000, 4096, 2048, 1024, 512):
        one_length(length)


if __name__ == "__main__":
    main()
