"""The KDA prefill core replayed from CUDA graphs: fla-core's `chunk_kda`, captured once per
(token bucket, sequence bucket) on static buffers that every KDA layer of the model shares.

Why: prefill and mixed steps run eagerly, and below a few thousand tokens their time is the
host's. fla-core's `chunk_kda` is most of that host time: on an H100 a call at Kimi-Linear's 32
heads of 128 costs 1.3-1.4 ms of host time (its autotuner and ~15 Triton launches) for 0.22 ms of
device time at 1k tokens, where a replay costs the host 3 us (docs/performance.md, thirty-ninth
run); 20 KDA layers a step.

How: fla-core 0.6.0's `chunk_kda(..., use_graph=True, max_num_seqs=N)` builds its chunk indices on
the device at a fixed shape, for `cu_seqlens` padded with empty sequences to N + 1 entries (grid
rows past the real chunks return at once), so one call captures. `KdaPrefillGraphs.run` copies a
layer's inputs into the first rows of the static buffers (q, k, v, the raw gate, beta; the
sequences' initial states, zeros where a sequence has none; the offsets, then empty sequences up
to the bucket; the layer's `A_log` / `dt_bias`; not q, k, v that the layer's conv wrote there
already, into the views `qkv_buffer` gave it), replays the smallest graph that holds the step,
writes the final states back to the slots and returns the first rows of the graph's output (read
before the next replay, by stream order). Rows past the step keep what an earlier call left there
(zeros at first, finite values after): no sequence covers them, and every kernel that reads them
works per row or per chunk of a sequence.

Which steps: `run` returns None (the caller runs `chunk_kda` eagerly) when no bucket holds the
step's tokens and sequences, its inputs are not shaped, typed or placed as the buffers, or its
gate's `lower_bound` is not the captured one. The token buckets stop at 2048
(`DEFAULT_TOKEN_BUCKETS`), where the device becomes the bottleneck: 4096- and 8192-token buckets
left those prompts' prefill 1-2% slower (the copies into the buffers; same run); a step limit
below a bucket is a bucket of its own (`buckets_within`). The model runner captures at start-up
(`capture_prefill_graphs`: CUDA without `enforce_eager`, `VLLM_KDA_PREFILL_GRAPHS`), before it
sizes the caches, so the memory held counts as used (the runner logs it): the buffers (about
100 MiB at Kimi-Linear's 32 x 128 heads, 2048 tokens and 16 sequences), each graph's output and
final states (up to 2 MiB a sequence) and one pool of intermediates (0.41 GiB in all on the 48B
model at 256 sequences, H200, with the allocator's cached blocks left out; forty-first run);
its profiling forward turns the replays off (`enabled`), so the peak it measures is the eager
core's, which steps outside the buckets take. Not on ROCm: fla-core's fixed-shape form is not
validated there.

Numerics: the replay runs the kernels an eager `chunk_kda` runs, at the configs fla-core's
autotuner chose for the process (its keys hold no token count), in their fixed-shape form; the
GPU test compares the two bit for bit. On the CPU a "replay" calls the exact reference
(`kda_prefill`'s) on the same padded buffers, which tests the plumbing around the graphs.
"""

import weakref
from collections.abc import Callable, Iterable
from functools import partial

import torch

from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate, fla_chunk_kda, kda_prefill
from vllm.utils.gc_utils import collector_paused

__all__ = [
    "DEFAULT_SEQ_BUCKETS",
    "DEFAULT_TOKEN_BUCKETS",
    "CaptureProgress",
    "KdaPrefillGraphs",
    "buckets_within",
    "pick_bucket",
]

DEFAULT_TOKEN_BUCKETS = (256, 512, 1024, 2048)
DEFAULT_SEQ_BUCKETS = (1, 4, 16)
# What `KdaPrefillGraphs.capture` walks its (token bucket, sequence bucket) pairs through.
CaptureProgress = Callable[[list[tuple[int, int]]], Iterable[tuple[int, int]]]


def buckets_within(buckets: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """`buckets` up to `limit`, and `limit` itself where it falls below the largest: the steps
    a limit allows all find a bucket up to the largest."""
    kept = tuple(b for b in buckets if b <= limit)
    if 0 < limit < max(buckets) and limit not in kept:
        kept += (limit,)
    return kept


def pick_bucket(
    tokens: int, seqs: int, token_buckets: tuple[int, ...], seq_buckets: tuple[int, ...]
) -> tuple[int, int] | None:
    """The smallest (token bucket, sequence bucket) holding `tokens` and `seqs`, or None."""
    t = min((b for b in token_buckets if b >= tokens), default=None)
    n = min((b for b in seq_buckets if b >= seqs), default=None)
    if t is None or n is None or tokens < 1 or seqs < 1:
        return None
    return t, n


def _sequences_ref(q, k, v, g, beta, h0, cu, a_log, dt_bias, lower_bound):
    """The graphed call's contract on the CPU: `[1, T, H, *]` inputs, initial states `[N, H, K, V]`
    for the N sequences of `cu` (empty ones included), the raw gate; returns (out `[1, T, H, V]`,
    final states `[N, H, K, V]`): `kda_prefill`'s reference with slot i for sequence i. Rows
    past `cu[-1]` are left uninitialised, as no sequence covers them."""
    final = h0.clone()
    n = final.shape[0]
    out = kda_prefill(
        q[0], k[0], v[0], g[0], beta[0], final, cu, torch.arange(n),
        torch.ones(n, dtype=torch.bool), KdaGate(a_log, dt_bias, lower_bound),
    )  # fmt: skip
    return out[None], final


class _Replay:
    """One captured call: its CUDA graph and output tensors (on the CPU, the call itself,
    copied into the outputs of its first run)."""

    def __init__(self, fn: Callable, pool: "tuple[int, int] | None") -> None:
        self.fn, self.graph = fn, None
        if pool is None:
            self.out = fn()
            return
        fn()  # fla-core's autotuning and compiles, outside the capture
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.graph is None:
            for dst, src in zip(self.out, self.fn(), strict=True):
                dst.copy_(src)
        else:
            self.graph.replay()
        return self.out


class KdaPrefillGraphs:
    """Static buffers and one replay per bucket pair for the KDA layers of one model rank, which
    must share `heads`, `head_dim`, the activations' `dtype` and the gate's `lower_bound`.
    `capture` records them (CUDA: graphs in one pool; CPU: the reference), `run` replays."""

    def __init__(
        self,
        heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        lower_bound: float | None,
        token_buckets: tuple[int, ...] = DEFAULT_TOKEN_BUCKETS,
        seq_buckets: tuple[int, ...] = DEFAULT_SEQ_BUCKETS,
    ) -> None:
        if not token_buckets or not seq_buckets or min(*token_buckets, *seq_buckets) < 1:
            raise ValueError(f"buckets must be positive, got {token_buckets} / {seq_buckets}")
        self.heads, self.head_dim, self.dtype = heads, head_dim, dtype
        self.lower_bound = lower_bound
        self.token_buckets, self.seq_buckets = tuple(token_buckets), tuple(seq_buckets)
        t, n, d = max(token_buckets), max(seq_buckets), head_dim
        kw = dict(device=device)
        self.qkvg = torch.zeros(4, 1, t, heads, d, dtype=dtype, **kw)
        self.beta = torch.zeros(1, t, heads, dtype=torch.float32, **kw)
        self.h0 = torch.zeros(n, heads, d, d, dtype=torch.float32, **kw)
        self.cu = torch.zeros(n + 1, dtype=torch.int64, **kw)
        self.a_log = torch.zeros(heads, dtype=torch.float32, **kw)
        self.dt_bias = torch.zeros(heads * d, dtype=torch.float32, **kw)
        self.replays: dict[tuple[int, int], _Replay] = {}
        # False: `run` declines every step (the runner's profiling forward measures the eager
        # core's peak memory, which steps outside the buckets still take).
        self.enabled = True

    def _call(self, tokens: int, seqs: int) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v, g = (x[:, :tokens] for x in self.qkvg)
        args = (q, k, v, g, self.beta[:, :tokens], self.h0[:seqs], self.cu[: seqs + 1])
        if self.qkvg.device.type != "cuda":
            return _sequences_ref(*args, self.a_log, self.dt_bias, self.lower_bound)
        gate = KdaGate(self.a_log, self.dt_bias, self.lower_bound)
        return fla_chunk_kda(*args, gate, use_graph=True, max_num_seqs=seqs)

    def capture(
        self,
        progress: CaptureProgress = iter,
    ) -> None:
        """Record every bucket pair, largest first (on CUDA into graphs sharing one memory
        pool). The buffers then hold one sequence filling the bucket, so that every chunk's
        kernels run before the capture. The pairs are walked through `progress` (the model
        runner's progress bar: a fresh machine's capture takes minutes of fla-core tuning), with
        automatic garbage collection paused (`collector_paused`)."""
        pool = torch.cuda.graph_pool_handle() if self.qkvg.device.type == "cuda" else None
        pairs = [
            (t, n)
            for t in sorted(self.token_buckets, reverse=True)
            for n in sorted(self.seq_buckets, reverse=True)
        ]
        with collector_paused():
            for t, n in progress(pairs):
                self.cu.fill_(t)
                self.cu[0] = 0
                # Through a weak proxy: a replay holding its owner would make a reference
                # cycle, which only a collection frees, perhaps inside a later capture.
                call = partial(KdaPrefillGraphs._call, weakref.proxy(self), t, n)
                self.replays[(t, n)] = _Replay(call, pool)

    def _replay_bucket(self, tokens: int, seqs: int) -> tuple[int, int] | None:
        """The captured bucket pair that a step of `tokens` in `seqs` sequences replays, or None
        (no captured bucket holds it, or `enabled` is off)."""
        bucket = pick_bucket(tokens, seqs, self.token_buckets, self.seq_buckets)
        return bucket if self.enabled and bucket in self.replays else None

    def qkv_buffer(
        self, tokens: int, seqs: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        """Where a step of `tokens` prefill tokens in `seqs` sequences of `dtype` on `device`
        would replay: a `[3, tokens, heads * head_dim]` view of the q, k, v buffers, for the
        layer's conv to write them into, so that `run` copies none of them (three copies a KDA
        layer, each a launch of host time in a host-bound step); None where it would not."""
        if self._replay_bucket(tokens, seqs) is None:
            return None
        if dtype != self.dtype or device != self.qkvg.device:
            return None
        return self.qkvg[:3, 0, :tokens].flatten(2)

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        query_start_loc: torch.Tensor,
        slots: torch.Tensor,
        has_initial_state: torch.Tensor,
        gate: KdaGate | None,
    ) -> torch.Tensor | None:
        """`kda_prefill`'s result for its arguments (`gate` a `KdaGate`) from a replay, or None
        where no captured bucket holds the step, an input is not shaped or typed as the buffers,
        or `enabled` is off (module docstring)."""
        tokens, seqs = q.shape[0], slots.shape[0]
        bucket = self._replay_bucket(tokens, seqs)
        if bucket is None or gate is None:
            return None
        if gate.lower_bound != self.lower_bound or q.device != self.qkvg.device:
            return None
        shape = (tokens, self.heads, self.head_dim)
        if any(x.dtype != self.dtype or tuple(x.shape) != shape for x in (q, k, v, g)):
            return None
        if beta.dtype != torch.float32 or tuple(beta.shape) != shape[:2]:
            return None
        t, n = bucket
        for dst, src in zip(self.qkvg, (q, k, v, g), strict=True):
            dst = dst[0, :tokens]
            # Written there already (`qkv_buffer`): the same elements.
            if dst.data_ptr() != src.data_ptr() or dst.stride() != src.stride():
                dst.copy_(src)
        self.beta[0, :tokens].copy_(beta)
        h0 = self.h0[:seqs]
        torch.index_select(state, 0, slots, out=h0)
        h0.masked_fill_(~has_initial_state.view(-1, 1, 1, 1), 0.0)
        self.cu[: seqs + 1].copy_(query_start_loc)
        if n > seqs:  # empty sequences up to the bucket, without reading the total on the host
            self.cu[seqs + 1 : n + 1].copy_(query_start_loc[seqs:].expand(n - seqs))
        self.a_log.copy_(gate.A_log)
        self.dt_bias.copy_(gate.dt_bias)
        out, final = self.replays[bucket]()
        state[slots] = final[:seqs]
        return out[0, :tokens]
