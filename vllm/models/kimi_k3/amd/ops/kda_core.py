"""The KDA core (gated delta rule with per-key-channel decay) over a flattened batch, with the
recurrent state of each sequence kept in a slot pool.

Per head, with `q`, `k` L2-normalised (`x / sqrt(sum x^2 + 1e-6)`) and `q` scaled by `K^-0.5`, and
state `S` `[K, V]` fp32, every token does::

    S = S * exp(g)[:, None];  u = beta * (v - S^T k);  S = S + k u^T;  o = S^T q

Inputs: `q`, `k` `[T, H, K]`, `v` `[T, H, V]`, `g` `[T, H, K]` (log decay, fp32), `beta` `[T, H]`;
`state` `[S, H, K, V]` fp32, read at `slots` (zeros where a sequence has no initial state) and
written back. Output `[T, H, V]` in the inputs' dtype (q, k, v share one).

GPU: fla-core's `chunk_kda` (`kda_prefill`) and `fused_recurrent_kda` (`kda_decode`) with
`cu_seqlens`. CPU: the per-token recurrence above in fp32, the exact reference. `kda_prefill` /
`kda_decode` choose. The layer's decode rows take neither: they run `fused_kda_decode`, whose
unfused reference (`fused_kda_decode_ref`) is where `kda_decode` serves.
"""

from typing import TYPE_CHECKING, NamedTuple

import torch

from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate

if TYPE_CHECKING:  # kda_prefill_graphs.py imports this module
    from vllm.models.kimi_k3.amd.ops.kda_prefill_graphs import KdaPrefillGraphs


class KdaGate(NamedTuple):
    """The decay gate's parameters, for a core that applies the gate itself: `A_log` `[H]` and
    `dt_bias` `[H * K]` fp32, `lower_bound` (kda_gate.py)."""

    A_log: torch.Tensor  # noqa: N815 (checkpoint name)
    dt_bias: torch.Tensor
    lower_bound: float | None


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """fla's q/k normalisation: `x / sqrt(sum x^2 + 1e-6)` over the last dim, in fp32."""
    x = x.float()
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def _delta_rule_step(s, q, k, v, g, beta):
    """One token of the recurrence on fp32 state `s` `[..., H, K, V]` with normalised q, k
    `[..., H, K]`, v `[..., H, V]`, log decay g `[..., H, K]`, beta `[..., H]`: (o, new state)."""
    s = s * torch.exp(g).unsqueeze(-1)
    u = beta.unsqueeze(-1) * (v - (s * k.unsqueeze(-1)).sum(dim=-2))
    s = s + k.unsqueeze(-1) * u.unsqueeze(-2)
    return (s * q.unsqueeze(-1)).sum(dim=-2), s


def kda_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: `q`, `k`, `g` `[L, H, K]`, `v` `[L, H, V]`, `beta` `[L, H]`, `state`
    `[H, K, V]` fp32. Returns (o `[L, H, V]` fp32, final state)."""
    q = l2_normalize(q) * q.shape[-1] ** -0.5
    k, v, g, beta = l2_normalize(k), v.float(), g.float(), beta.float()
    s = state.float().clone()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(q.shape[0]):
        out[t], s = _delta_rule_step(s, q[t], k[t], v[t], g[t], beta[t])
    return out, s


def fla_chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    gate: KdaGate | None,
    **extra,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla-core's `chunk_kda` as the engine calls it: `[1, T, H, *]` inputs, N sequences of
    `cu_seqlens` `[N + 1]` int64 starting from `initial_state` `[N, H, K, V]` fp32, q and k
    L2-normalised in fla-core; returns (out `[1, T, H, V]`, final states `[N, H, K, V]`).
    `extra`: further `chunk_kda` arguments, overriding the ones set here (the prefill graphs'
    fixed-shape form; a benchmark's `safe_gate=False`).

    With `gate`, `g` is the gate's raw input and fla-core applies the gate in its chunked cumsum
    of the decay (`use_gate_in_kernel`). A lower-bounded gate (Kimi-K3's) also takes fla-core's
    `safe_gate` path: its decay lies in `[lower_bound, 0)`, so fla-core computes the intra-chunk
    scores of 16-token sub-chunks with tensor-core products
    (`chunk_kda_fwd_kernel_intra_sub_chunk`) instead of its token-parallel kernel, the form its
    docstring pairs with `lower_bound` (its shift of the gate exponents comes from the bound)."""
    from fla.ops.kda import chunk_kda

    kwargs = {}
    if gate is not None:
        bounded = gate.lower_bound is not None
        kwargs = dict(use_gate_in_kernel=True, A_log=gate.A_log, dt_bias=gate.dt_bias,
                      lower_bound=gate.lower_bound, safe_gate=bounded)  # fmt: skip
    kwargs.update(extra)
    return chunk_kda(
        q, k, v, g, beta, initial_state=initial_state, output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens, **kwargs,
    )  # fmt: skip


def _gather_initial(state: torch.Tensor, slots: torch.Tensor, has_initial: torch.Tensor):
    # Indexing copies the slots' states, so zeroing new sequences' in place touches no slot: one
    # launch where a zero-filled tensor and a `where` took two.
    return state[slots].masked_fill_(~has_initial.view(-1, 1, 1, 1), 0.0)


def kda_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    query_start_loc: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    gate: KdaGate | None = None,
    graphs: "KdaPrefillGraphs | None" = None,
) -> torch.Tensor:
    """Prefill (or continued prefill) of N sequences; `query_start_loc` `[N + 1]` int64 (fla's
    offsets dtype: converting here would hand fla a new tensor per layer, and fla's per-tensor
    cache of the offsets it reads back to the host would miss, one host sync per layer).

    With `gate`, `g` is the gate's raw input `[T, H, K]` and the core applies the gate: on the
    GPU inside fla-core's chunked cumsum of the decay (`use_gate_in_kernel`), which spares a pass
    that writes the fp32 decay and another that reads it; on the CPU through `kda_gate`. With a
    lower bound fla computes what `kda_gate` does; without one its softplus uses approximate
    exp2 / log2 instructions and is 0 below x of about -17, where `kda_gate`'s log1p is not: the
    decay differs by about 1e-7 at most. A lower bound also takes fla-core's `safe_gate` path
    (`fla_chunk_kda`); `test_kda_prefill_applies_the_gate_itself` checks both results on the
    GPU.

    `graphs` (a `KdaPrefillGraphs`, kda_prefill_graphs.py): the same result from a captured
    replay where one of its buckets holds the step."""
    if query_start_loc.dtype != torch.int64:
        raise ValueError(f"query_start_loc must be int64, got {query_start_loc.dtype}")
    if graphs is not None:
        out = graphs.run(q, k, v, g, beta, state, query_start_loc, slots, has_initial_state, gate)
        if out is not None:
            return out
    if q.is_cuda:
        init = _gather_initial(state, slots, has_initial_state)
        x = (t.unsqueeze(0) for t in (q, k, v, g, beta))
        out, final = fla_chunk_kda(*x, init, query_start_loc, gate)
        state[slots] = final
        return out.squeeze(0)
    if gate is not None:
        g = kda_gate(g.flatten(1), gate.A_log, gate.dt_bias, gate.lower_bound)
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    starts = query_start_loc.tolist()
    for i, (slot, has_init) in enumerate(
        zip(slots.tolist(), has_initial_state.tolist(), strict=True)
    ):
        a, b = starts[i], starts[i + 1]
        init = state[slot] if has_init else torch.zeros_like(state[slot])
        o, final = kda_recurrent_ref(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], init)
        out[a:b] = o.to(v.dtype)
        state[slot] = final
    return out


def kda_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One token for each of N sequences continuing from their slots: inputs `[N, H, ...]`."""
    if q.is_cuda:
        from fla.ops.kda import fused_recurrent_kda

        n = q.shape[0]
        cu = torch.arange(n + 1, dtype=torch.long, device=q.device)
        out, final = fused_recurrent_kda(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0), beta.unsqueeze(0),
            initial_state=state[slots], output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu,
        )  # fmt: skip
        state[slots] = final
        return out.squeeze(0)
    qn = l2_normalize(q) * q.shape[-1] ** -0.5
    o, state[slots] = _delta_rule_step(
        state[slots], qn, l2_normalize(k), v.float(), g.float(), beta.float()
    )
    return o.to(v.dtype)
