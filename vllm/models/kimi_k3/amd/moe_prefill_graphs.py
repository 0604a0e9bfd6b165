"""The MoE blocks of prefill and mixed steps replayed from CUDA graphs: each MoE layer's router and
experts (`KimiMoE.local_forward`), captured once per token bucket on static buffers that the
layers share.

Why: prefill and mixed steps run eagerly, and below a few thousand tokens their time is the
host's. Around each MoE block of a 1k-token prompt an H100's host leaves the device idle for about
320 us (docs/performance.md, forty-third run: the router's GEMV and top-k, the grouping, the
grouped gate/up and down launches, their checks and allocations), 26 blocks a step, where a
replay costs the host a few microseconds.

How: `run` copies the block's normed input into the first rows of the input buffer, writes the
step's token count into a one-element device tensor, replays the smallest bucket's graph of that
layer and returns the first rows of the output buffer. In the graph the router runs on every row
of the bucket, then the ids of the rows past the count are set past the experts' slots, so that
no expert computes them (`local_forward`'s `valid_rows`), and the block's output is copied into
the output buffer, which every layer's graphs of a bucket share: a result is valid until the
next replay, which `forward_with_norm`'s caller, the next decoder layer, never reaches before
reading it. Rows past the step keep what an earlier call left in the input buffer (zeros at
first): the router reads them, no expert does.

Which steps: `run` returns None (the caller runs the block eagerly) where no bucket holds the
step's tokens, the input is not shaped, typed or placed as the buffer, a CUDA graph is being
captured (the decode graphs hold their own MoE blocks), or `enabled` is off (the runner's
profiling forward, whose peak memory must be the eager blocks'). The buckets are the KDA prefill
graphs' (`DEFAULT_TOKEN_BUCKETS` within the step limit, `buckets_within`) from `MIN_TOKENS` on:
smaller steps would take the experts' GEMV or gathered forms at the smallest bucket, which read
weights by id and cannot skip the padding rows. Captured at start-up by the model runner with
the KDA graphs (`VLLM_MOE_PREFILL_GRAPHS`), before the caches are sized, in one memory pool: the
input and output buffers (2 x 9 MiB at Kimi-Linear's hidden 2304 and 2048 tokens) and the
largest bucket's intermediates (the routed rows' activations and outputs, ~130 MiB there).
Not at TP > 1 (the all-reduce stays outside the graph, eager, after the replay; not measured).

Numerics: a replay computes what the eager block computes on the bucket's rows, with the valid
rows first: the same kernels at the bucket's shapes (GPU test: bit for bit). Against the eager
block on the step's own rows, the shapes differ, so the router's GEMM and the experts' tiles
may round differently. On the CPU a "replay" calls the block on the same buffers, which tests
the plumbing.
"""

import torch

from vllm.models.kimi_k3.amd.moe import KimiMoE
from vllm.models.kimi_k3.amd.ops.kda_prefill_graphs import CaptureProgress, buckets_within

__all__ = ["MIN_TOKENS", "MoePrefillGraphs", "moe_token_buckets"]

# Smallest bucket: at top-k + shared slots >= 2, 128 tokens are more routed rows than the
# experts' GEMV (32) and gathered (64) forms take (experts.py), which cannot skip padding.
MIN_TOKENS = 128


def moe_token_buckets(buckets: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """The buckets for steps of up to `limit` tokens: `buckets_within`, from `MIN_TOKENS` on."""
    return tuple(b for b in buckets_within(buckets, limit) if b >= MIN_TOKENS)


class MoePrefillGraphs:
    """Static buffers and one graph per (MoE layer, token bucket) for the MoE blocks of one
    model rank, which must share the hidden size and activations' dtype. `capture` records them
    (CUDA: graphs in one pool; CPU: the calls themselves), `run` replays."""

    def __init__(
        self,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
        token_buckets: tuple[int, ...],
    ) -> None:
        if not token_buckets or min(token_buckets) < 1:
            raise ValueError(f"token_buckets must be positive, got {token_buckets}")
        self.token_buckets = tuple(sorted(token_buckets))
        t = self.token_buckets[-1]
        self.x = torch.zeros(t, hidden, dtype=dtype, device=device)
        self.out = torch.zeros(t, hidden, dtype=dtype, device=device)
        self.valid = torch.zeros(1, dtype=torch.int64, device=device)
        # (layer, bucket) -> its graph (None on the CPU, where `run` calls the block).
        self.graphs: dict[tuple[KimiMoE, int], torch.cuda.CUDAGraph | None] = {}
        # False: `run` declines every step (module docstring).
        self.enabled = True

    def _call(self, moe: KimiMoE, tokens: int) -> None:
        self.out[:tokens].copy_(moe.local_forward(self.x[:tokens], self.valid))

    def capture(
        self,
        moes: list[KimiMoE],
        progress: CaptureProgress = iter,
    ) -> None:
        """Record every (layer, bucket) of `moes`, largest bucket first (on CUDA into graphs
        sharing one memory pool), each after an eager call of its shapes (the kernels' compiles
        and tuning, outside the capture), walking (bucket, layer index) pairs through
        `progress`."""
        cuda = self.x.device.type == "cuda"
        pool = torch.cuda.graph_pool_handle() if cuda else None
        pairs = [(t, i) for t in reversed(self.token_buckets) for i in range(len(moes))]
        for t, i in progress(pairs):
            moe = moes[i]
            self.valid.fill_(t)
            self._call(moe, t)
            graph = None
            if cuda:
                torch.cuda.synchronize(self.x.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._call(moe, t)
            self.graphs[(moe, t)] = graph

    def run(self, moe: KimiMoE, h: torch.Tensor) -> torch.Tensor | None:
        """`moe.local_forward(h)` from a replay (a view of the shared output buffer, valid until
        the next replay), or None where the step is not replayed (module docstring)."""
        tokens = h.shape[0]
        bucket = next((b for b in self.token_buckets if b >= tokens), None)
        if not self.enabled or bucket is None or tokens < 1 or (moe, bucket) not in self.graphs:
            return None
        if h.dtype != self.x.dtype or h.device != self.x.device or h.shape[1:] != self.x.shape[1:]:
            return None
        if h.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        self.x[:tokens].copy_(h)
        self.valid.fill_(tokens)
        graph = self.graphs[(moe, bucket)]
        if graph is None:
            self._call(moe, bucket)
        else:
            graph.replay()
        return self.out[:tokens]
