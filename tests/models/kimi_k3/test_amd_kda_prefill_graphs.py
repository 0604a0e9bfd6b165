"""The KDA prefill core from captured replays (`KdaPrefillGraphs`): buckets, the static buffers'
plumbing against the eager `kda_prefill` (CPU: the reference "replays"; GPU: CUDA graphs of
fla-core's fixed-shape `chunk_kda`), the fallbacks, and the model's capture hook."""

import gc
import weakref

import pytest
import torch

from tests.models.kimi_k3.engine_harness import EngineHarness
from vllm.model_executor.model_loader.loader import load_model
from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate, kda_prefill
from vllm.models.kimi_k3.amd.ops.kda_prefill_graphs import (
    KdaPrefillGraphs,
    buckets_within,
    pick_bucket,
)
from vllm.utils.gc_utils import collector_paused

H, D = 2, 16


def test_pick_bucket_takes_the_smallest_that_holds_the_step():
    tokens, seqs = (256, 512, 1024), (1, 4, 16)
    assert pick_bucket(1, 1, tokens, seqs) == (256, 1)
    assert pick_bucket(256, 2, tokens, seqs) == (256, 4)
    assert pick_bucket(257, 16, tokens, seqs) == (512, 16)
    assert pick_bucket(1025, 1, tokens, seqs) is None
    assert pick_bucket(10, 17, tokens, seqs) is None
    assert pick_bucket(0, 1, tokens, seqs) is None


def test_step_limits_below_a_bucket_are_buckets_of_their_own():
    assert buckets_within((256, 512, 1024), 4096) == (256, 512, 1024)
    assert buckets_within((256, 512, 1024), 512) == (256, 512)
    assert buckets_within((256, 512, 1024), 300) == (256, 300)
    assert buckets_within((256, 512, 1024), 100) == (100,)
    assert buckets_within((1, 4, 16), 8) == (1, 4, 8)


def step_inputs(gen, lens, device="cpu", dtype=torch.float32, heads=H, dim=D):
    t = sum(lens)
    q, k, v, g = (torch.randn(t, heads, dim, generator=gen).to(device, dtype) for _ in range(4))
    beta = torch.rand(t, heads, generator=gen).to(device)
    qsl = torch.tensor([0, *lens], dtype=torch.int64).cumsum(0).to(device)
    return q, k, v, g, beta, qsl


def make_gate(gen, device="cpu", lower_bound=None, heads=H, dim=D):
    a_log = torch.log(torch.rand(heads, generator=gen) * 15 + 1).to(device)
    dt_bias = (torch.randn(heads * dim, generator=gen) * 0.1).to(device)
    return KdaGate(a_log, dt_bias, lower_bound)


def check_against_eager(graphs, gen, lens, slots, init, device="cpu", dtype=torch.float32):
    """One step through `graphs` and through the eager core, from the same pool: the outputs and
    every slot of the pool (written or not) are the same bits."""
    heads, dim = graphs.heads, graphs.head_dim
    q, k, v, g, beta, qsl = step_inputs(gen, lens, device, dtype, heads, dim)
    gate = make_gate(gen, device, graphs.lower_bound, heads, dim)
    slots = torch.tensor(slots, device=device)
    init = torch.tensor(init, device=device)
    pool = torch.randn(7, heads, dim, dim, generator=gen).to(device) * 0.1
    got_pool, want_pool = pool.clone(), pool.clone()
    got = graphs.run(q, k, v, g, beta, got_pool, qsl, slots, init, gate)
    want = kda_prefill(q, k, v, g, beta, want_pool, qsl, slots, init, gate)
    assert got is not None
    assert torch.equal(got, want)
    assert torch.equal(got_pool, want_pool)
    return qsl


def test_replays_give_the_eager_results_with_padded_rows_and_sequences():
    """Steps that fill a bucket and steps that leave rows and sequences over (which must hold
    empty sequences at the end of the offsets: a stale larger offset would cover the next
    step's rows), some without an initial state (zeros, whatever their slot holds), one after
    another on the same buffers."""
    gen = torch.Generator().manual_seed(0)
    graphs = KdaPrefillGraphs(H, D, torch.float32, torch.device("cpu"), None, (16, 32), (1, 4))
    graphs.capture()
    assert sorted(graphs.replays) == [(16, 1), (16, 4), (32, 1), (32, 4)]
    # Each pair was recorded after a call on one sequence filling its tokens (the last: 16, 1),
    # so that fla-core tunes its kernels on real chunks rather than on grid rows that return.
    assert graphs.cu.tolist() == [0, 16, 16, 16, 16]
    check_against_eager(graphs, gen, [32], [3], [True])
    check_against_eager(graphs, gen, [9, 11, 5, 7], [1, 5, 2, 6], [True, False, True, False])
    qsl = check_against_eager(graphs, gen, [3, 4], [4, 2], [False, True])
    total = int(qsl[-1])
    assert graphs.cu[:5].tolist() == [*qsl.tolist(), total, total]
    check_against_eager(graphs, gen, [1], [6], [False])


def test_capture_walks_the_bucket_pairs_through_progress_largest_first():
    """The runner's progress bar gets every pair, in the capture's order, and the capture
    records each pair it yields."""
    walked = []

    def progress(pairs):
        walked.append(list(pairs))
        return pairs

    graphs = KdaPrefillGraphs(H, D, torch.float32, torch.device("cpu"), None, (16, 32), (1, 4))
    graphs.capture(progress)
    assert walked == [[(32, 4), (32, 1), (16, 4), (16, 1)]]
    assert list(graphs.replays) == walked[0]


def test_capture_pauses_the_garbage_collector():
    """No automatic collection runs while the replays are recorded (`collector_paused`: one
    inside a CUDA-graph capture can destroy a dropped graph and fail the capture), and the
    collector is back on after."""
    seen = []

    def progress(pairs):
        for pair in pairs:
            seen.append(gc.isenabled())
            yield pair

    graphs = KdaPrefillGraphs(H, D, torch.float32, torch.device("cpu"), None, (16,), (1, 2))
    assert gc.isenabled()
    graphs.capture(progress)
    assert seen == [False, False] and gc.isenabled()


def test_a_dropped_capture_is_freed_without_a_collection():
    """No reference cycle holds a capture: dropping its last reference frees it and its replays
    (on CUDA, their graphs) at once, not in some later collection, which might run inside
    another capture."""
    graphs = KdaPrefillGraphs(H, D, torch.float32, torch.device("cpu"), None, (16,), (1, 2))
    graphs.capture()
    owner, replay = weakref.ref(graphs), weakref.ref(graphs.replays[(16, 2)])
    assert graphs.replays[(16, 1)]()[0].shape == (1, 16, H, D)
    with collector_paused():
        del graphs
        assert owner() is None and replay() is None


def test_steps_outside_the_buckets_or_gate_run_eagerly():
    gen = torch.Generator().manual_seed(1)
    graphs = KdaPrefillGraphs(H, D, torch.float32, torch.device("cpu"), None, (16,), (2,))
    graphs.capture()
    pool = torch.zeros(4, H, D, D)

    def run(lens, slots, gate=True, dtype=torch.float32, device="cpu", change=None):
        q, k, v, g, beta, qsl = step_inputs(gen, lens, dtype=dtype)
        init = torch.ones(len(slots), dtype=torch.bool)
        gate = make_gate(gen) if gate is True else gate
        q = q.to(device)
        inputs = dict(q=q, k=k, v=v, g=g, beta=beta)
        if change is not None:
            inputs[change[0]] = change[1](inputs[change[0]])
        return graphs.run(*inputs.values(), pool, qsl, torch.tensor(slots), init, gate)

    assert run([8], [1]) is not None
    assert run([8], [1], gate=None) is None  # the decay already applied: not this call
    assert run([8], [1], change=("g", lambda g: g.double())) is None
    assert run([8], [1], change=("k", lambda k: k[:, :1])) is None
    assert run([8], [1], change=("beta", lambda b: b.half())) is None
    graphs.enabled = False
    assert run([8], [1]) is None
    graphs.enabled = True
    assert run([17], [1]) is None  # more tokens than the largest bucket
    assert run([2, 2, 2], [1, 2, 3]) is None  # more sequences
    assert run([8], [1], gate=make_gate(gen, lower_bound=-5.0)) is None  # another lower bound
    assert run([8], [1], dtype=torch.float64) is None  # another dtype
    assert run([8], [1], device="meta") is None  # another device


@pytest.mark.usefixtures("torch_reference_kernels")
def test_the_model_hands_one_capture_to_every_kda_layer_and_computes_the_same(monkeypatch):
    """`capture_prefill_graphs` on the tiny model: one `KdaPrefillGraphs` shared by its KDA
    layers, buckets within the step limits; a prefill step, then a mixed step (decode rows and a
    continued prompt), give the logits of the model without them, bit for bit."""
    gen = torch.Generator().manual_seed(2)
    model = load_model("kimi-linear-tiny", dtype=torch.float32)
    prompts = {0: torch.randint(1, 100, (13,), generator=gen).tolist(), 1: [5, 6, 7, 8, 9]}
    steps = [prompts, {1: [3], 0: [4, 5, 6]}]

    def logits():
        harness = EngineHarness(model)
        return [harness.step(step) for step in steps]

    want = logits()
    shared = model.capture_prefill_graphs(max_tokens=300, max_seqs=8)
    kda = [layer.self_attn for layer in model.layers if hasattr(layer.self_attn, "prefill_graphs")]
    assert len(kda) > 1 and all(a.prefill_graphs is shared for a in kda)
    assert shared.token_buckets == (256, 300) and shared.seq_buckets == (1, 4, 8)
    assert len(shared.replays) == 6
    replayed, copied = [], []
    run = shared.run

    def spy(*args):
        seen = copies_into(shared.qkvg[:3], monkeypatch)
        out = run(*args)
        monkeypatch.undo()
        copied.extend(seen)
        replayed.append(out is not None)
        return out

    shared.run = spy
    got = logits()
    # Every KDA layer of both steps replayed (none declined the layer's inputs), its conv having
    # written q, k and v into the graphs' buffers: `run` copied none into them.
    assert len(replayed) == 2 * len(kda) and all(replayed)
    assert copied == []
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def copies_into(buffers: torch.Tensor, monkeypatch) -> list[int]:
    """The `copy_` calls from now on whose destination starts inside `buffers` (their start
    addresses, appended as they come)."""
    lo = buffers.data_ptr()
    hi = lo + buffers.numel() * buffers.element_size()
    seen: list[int] = []
    copy = torch.Tensor.copy_

    def spy(dst, src, *args, **kwargs):
        if lo <= dst.data_ptr() < hi:
            seen.append(dst.data_ptr())
        return copy(dst, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", spy)
    return seen


def test_qkv_buffer_is_where_a_replayed_step_reads_q_k_v(monkeypatch):
    """`qkv_buffer`: views of the q, k, v buffers for the steps `run` replays (None for the
    others); q, k and v written there are not copied again, and the replay gives the eager
    result."""
    gen = torch.Generator().manual_seed(6)
    graphs = KdaPrefillGraphs(H, D, torch.float32, torch.device("cpu"), None, (16, 32), (1, 4))
    graphs.capture()
    cpu = torch.device("cpu")
    buffer = graphs.qkv_buffer(20, 2, torch.float32, cpu)
    assert buffer.shape == (3, 20, H * D)
    for i in range(3):
        assert buffer[i].data_ptr() == graphs.qkvg[i, 0].data_ptr()
    assert graphs.qkv_buffer(33, 1, torch.float32, cpu) is None  # no bucket
    assert graphs.qkv_buffer(8, 5, torch.float32, cpu) is None
    assert graphs.qkv_buffer(8, 1, torch.float64, cpu) is None
    assert graphs.qkv_buffer(8, 1, torch.float32, torch.device("meta")) is None
    graphs.enabled = False
    assert graphs.qkv_buffer(8, 1, torch.float32, cpu) is None
    graphs.enabled = True
    q, k, v, g, beta, qsl = step_inputs(gen, [12, 8])
    want_pool = torch.randn(4, H, D, D, generator=gen) * 0.1
    got_pool = want_pool.clone()
    slots, init = torch.tensor([1, 3]), torch.tensor([True, False])
    gate = make_gate(gen)
    want = kda_prefill(q, k, v, g, beta, want_pool, qsl, slots, init, gate)
    buffer = graphs.qkv_buffer(20, 2, torch.float32, cpu).view(3, 20, H, D)
    for dst, src in zip(buffer, (q, k, v), strict=True):
        dst.copy_(src)
    copied = copies_into(graphs.qkvg, monkeypatch)
    got = graphs.run(*buffer.unbind(0), g, beta, got_pool, qsl, slots, init, gate)
    monkeypatch.undo()
    assert copied == [graphs.qkvg[3, 0].data_ptr()]  # only g
    assert torch.equal(got, want) and torch.equal(got_pool, want_pool)


@pytest.mark.gpu
@pytest.mark.parametrize("lower_bound", [None, -5.0])
@pytest.mark.parametrize("lens", [[64], [100, 3, 77], [1000]])
def test_cuda_graph_replays_give_fla_core_eager_bits(lens, lower_bound):
    """On the GPU: CUDA graphs of fla-core's fixed-shape `chunk_kda` against its eager call, at
    Kimi-Linear's 32 heads of 128 in bf16, bit for bit (the same kernels and autotuned configs;
    with Kimi-K3's lower bound, both through fla-core's `safe_gate` path), each case after a step
    of another shape on the same buffers."""
    gen = torch.Generator().manual_seed(3)
    graphs = KdaPrefillGraphs(32, 128, torch.bfloat16, torch.device("cuda"), lower_bound,
                              (128, 1024), (1, 4))  # fmt: skip
    graphs.capture()
    check_against_eager(graphs, gen, [50, 60], [5, 6], [True, True], "cuda", torch.bfloat16)
    slots = list(range(1, len(lens) + 1))
    init = [i % 2 == 0 for i in range(len(lens))]
    check_against_eager(graphs, gen, lens, slots, init, "cuda", torch.bfloat16)


@pytest.mark.gpu
def test_engine_replays_prefill_graphs_and_keeps_the_eager_tokens(monkeypatch):
    """kimi-k3-tiny under the PTPC recipe: the runner captures the graphs at start-up, prefill
    steps replay them, and the greedy tokens are those of the engine without them."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    ptpc = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 256, (n,), generator=gen).tolist() for n in (3, 40, 200, 500)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def tokens(enabled: str) -> tuple[list, int]:
        monkeypatch.setenv("VLLM_KDA_PREFILL_GRAPHS", enabled)
        eng = LLMEngine.from_engine_args(
            EngineArgs(model="kimi-k3-tiny", quantization_config=ptpc, max_num_seqs=8,
                       max_num_batched_tokens=512, kv_cache_memory=1 << 30, max_model_len=1024)
        )  # fmt: skip
        try:
            layers = eng.executor.runner.model.language_model.layers
            attn = [layer.self_attn for layer in layers]
            graphs = {id(a.prefill_graphs) for a in attn if getattr(a, "prefill_graphs", None)}
            for i, prompt in enumerate(prompts):
                eng.add_request(str(i), prompt, params)
            out = {}
            while eng.has_unfinished_requests():
                for o in eng.step():
                    if o.finished:
                        out[o.request_id] = o.outputs[0].token_ids
            return [out[str(i)] for i in range(len(prompts))], len(graphs)
        finally:
            eng.shutdown()

    with_graphs, shared = tokens("1")
    without, none = tokens("0")
    assert (shared, none) == (1, 0)
    assert with_graphs == without
