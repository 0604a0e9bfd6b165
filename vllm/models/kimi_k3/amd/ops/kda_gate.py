"""KDA decay gate: the per-key-channel log decay `g` from the raw gate projection, and (fused with
it for prefill) the delta rule's `beta = sigmoid(b)`.

`raw` `[T, H * K]`, `A_log` `[H]`, `dt_bias` `[H * K]` (fp32). With `x = raw + dt_bias`:
- `lower_bound` set (Kimi-K3: -5): `g = lower_bound * sigmoid(exp(A_log) * x)`, in (lower_bound, 0);
- otherwise: `g = -exp(A_log) * softplus(x)`, softplus linear above 20 (as fla and transformers).
Returns `g` `[T, H, K]` fp32. `kda_gate_beta` also takes the beta logits `b` `[T, H]` and returns
`(g, beta)`, beta `[T, H]` fp32: one Triton kernel on the GPU instead of torch's chain of
elementwise kernels over `[T, H * K]` fp32 temporaries (upcast, add, exp, log1p, where, mul).
"""

import torch

from vllm.triton_utils import next_power_of_2, use_triton
from vllm.triton_utils.launch import launch, launch_spec
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

if triton is not None:

    @triton.jit
    def _kda_gate_beta_kernel(
        raw_ptr, a_log_ptr, dt_bias_ptr, b_ptr, g_ptr, beta_ptr,
        stride_rt, stride_rc, stride_bt, stride_bh, tokens, heads, width, key_dim, lower_bound,
        HAS_LOWER_BOUND: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
        BLOCK_H: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        t_ok = t < tokens
        c_ok = c < width
        ok = t_ok[:, None] & c_ok[None, :]
        raw = tl.load(raw_ptr + t[:, None] * stride_rt + c[None, :] * stride_rc, mask=ok, other=0.0)
        x = raw.to(tl.float32) + tl.load(dt_bias_ptr + c, mask=c_ok, other=0.0)[None, :]
        rate = tl.exp(tl.load(a_log_ptr + c // key_dim, mask=c_ok, other=0.0))[None, :]
        if HAS_LOWER_BOUND:
            g = lower_bound * tl.sigmoid(rate * x)
        else:
            # log1p(e) to the ulp without a log1p: log(1 + e) * e / ((1 + e) - 1) corrects the
            # rounding of 1 + e (plain log(1 + e) loses e entirely once it is below 2^-24). Clamped:
            # above 20 softplus is x, and e = inf would make the unused branch inf / inf.
            e = tl.exp(tl.minimum(x, 20.0))
            u = 1.0 + e
            softplus = tl.where(u == 1.0, e, tl.log(u) * e / (u - 1.0))
            g = -rate * tl.where(x > 20.0, x, softplus)
        tl.store(g_ptr + t[:, None] * width + c[None, :], g, mask=ok)
        if tl.program_id(1) == 0:
            hh = tl.arange(0, BLOCK_H)
            b_ok = t_ok[:, None] & (hh < heads)[None, :]
            b = tl.load(
                b_ptr + t[:, None] * stride_bt + hh[None, :] * stride_bh, mask=b_ok, other=0.0
            )
            beta = tl.sigmoid(b.to(tl.float32))
            tl.store(beta_ptr + t[:, None] * heads + hh[None, :], beta, mask=b_ok)


def kda_gate(
    raw: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None = None,
) -> torch.Tensor:
    """`g` in torch (the reference of the kernel; decode references use it too)."""
    heads = A_log.numel()
    x = (raw.float() + dt_bias.float()).view(raw.shape[0], heads, -1)
    rate = torch.exp(A_log.float()).view(1, heads, 1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(rate * x)
    return -rate * torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))


def kda_gate_beta_ref(
    raw: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None,
    b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `kda_gate_beta`."""
    return kda_gate(raw, A_log, dt_bias, lower_bound), torch.sigmoid(b.float())


def kda_gate_beta(
    raw: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 (checkpoint name)
    dt_bias: torch.Tensor,
    lower_bound: float | None,
    b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(g [T, H, K], beta [T, H])`, both fp32; `raw` and `b` (floating point) may have any
    strides; every tensor on `raw`'s device."""
    heads = A_log.numel()
    for name, t in (("raw", raw), ("b", b)):
        if t.dim() != 2 or not t.is_floating_point():
            raise ValueError(
                f"{name} must be a 2-D floating-point tensor, got {t.dtype} {t.dim()}-D"
            )
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias), ("b", b)):
        if t.device != raw.device:
            raise ValueError(f"{name} is on {t.device}, raw on {raw.device}")
    if heads == 0:
        raise ValueError("A_log must hold one value per head, got none")
    tokens, width = raw.shape
    if width % heads or dt_bias.shape != (width,) or not dt_bias.is_contiguous():
        raise ValueError(
            f"raw [T, H * K] and dt_bias [H * K] (contiguous) for {heads} heads, got "
            f"{tuple(raw.shape)} and {tuple(dt_bias.shape)}"
        )
    if b.shape != (tokens, heads):
        raise ValueError(f"b must be [{tokens}, {heads}], got {tuple(b.shape)}")
    if A_log.dtype != torch.float32 or dt_bias.dtype != torch.float32 or not A_log.is_contiguous():
        raise ValueError("A_log and dt_bias must be contiguous fp32")
    if not use_triton(raw.device):
        return kda_gate_beta_ref(raw, A_log, dt_bias, lower_bound, b)
    g = torch.empty(tokens, heads, width // heads, dtype=torch.float32, device=raw.device)
    beta = torch.empty(tokens, heads, dtype=torch.float32, device=raw.device)
    if tokens == 0:
        return g, beta
    block_t, block_c = 32, 128
    launch(
        _kda_gate_beta_kernel, (triton.cdiv(tokens, block_t), triton.cdiv(width, block_c), 1),
        (
            raw, A_log, dt_bias, b, g, beta,
            raw.stride(0), raw.stride(1), b.stride(0), b.stride(1), tokens, heads, width,
            width // heads, float(lower_bound) if lower_bound is not None else 0.0,
        ),
        launch_spec(
            _kda_gate_beta_kernel, HAS_LOWER_BOUND=lower_bound is not None, BLOCK_T=block_t,
            BLOCK_C=block_c, BLOCK_H=next_power_of_2(heads), num_warps=4,
            **pdl_options(use_pdl(raw.device)),
        ),
    )  # fmt: skip
    return g, beta
