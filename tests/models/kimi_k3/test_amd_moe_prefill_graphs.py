"""The MoE blocks from captured replays (`MoePrefillGraphs`): buckets, padding rows kept from the
experts, the static buffers' plumbing against the eager block (CPU: the calls themselves; GPU:
CUDA graphs), the fallbacks, and the model's capture hook."""

import pytest
import torch

from tests.models.kimi_k3.engine_harness import EngineHarness
from vllm.model_executor.model_loader.loader import load_model
from vllm.models.kimi_k3.amd.moe_prefill_graphs import (
    MIN_TOKENS,
    MoePrefillGraphs,
    moe_token_buckets,
)

# The CPU tests run the torch references: at their sizes (more than 64 routed rows) the experts
# take the loop both eagerly and in the padded calls, and the router's GEMM gives each row the
# same bits whatever the row count, so a padded call and the eager block agree bit for bit. (Under
# the interpreter the padded and eager calls take different kernels: tile shapes by row count.)
on_references = pytest.mark.usefixtures("torch_reference_kernels")


def test_buckets_are_the_step_limits_from_min_tokens():
    assert moe_token_buckets((256, 512, 1024, 2048), 8192) == (256, 512, 1024, 2048)
    assert moe_token_buckets((256, 512, 1024, 2048), 300) == (256, 300)
    assert moe_token_buckets((256, 512), 200) == (200,)
    assert moe_token_buckets((256, 512), MIN_TOKENS - 1) == ()


def tiny_moes(dtype=torch.float32, device="cpu"):
    model = load_model("kimi-linear-tiny", dtype=dtype, device=device)
    return model, [layer.block_sparse_moe for layer in model.layers if layer.is_moe]


@on_references
def test_local_forward_keeps_the_padding_rows_from_the_experts():
    """`valid_rows`: the rows past it get ids past every expert slot; the rows before it give the
    block's output on those rows alone."""
    _, moes = tiny_moes()
    moe = moes[0]
    h = torch.randn(40, moe.config.hidden_size, generator=torch.Generator().manual_seed(1))
    seen = []
    experts = moe.experts.forward
    moe.experts.forward = lambda x, w, ids: seen.append(ids) or experts(x, w, ids)
    got = moe.local_forward(h, torch.tensor([30]))
    slots = moe.experts.w13_weight.shape[0]
    assert (seen[0][30:] == slots).all() and (seen[0][:30] < slots).all()
    assert torch.equal(got[:30], moe.local_forward(h[:30]))


@on_references
def test_capture_walks_each_bucket_and_layer_and_run_declines_what_it_does_not_hold():
    _, moes = tiny_moes()
    hidden = moes[0].config.hidden_size
    graphs = MoePrefillGraphs(hidden, torch.float32, torch.device("cpu"), (64, 32))
    walked = []

    def progress(pairs):
        walked.extend(pairs)
        return pairs

    graphs.capture(moes, progress)
    assert walked == [(t, i) for t in (64, 32) for i in range(len(moes))]
    assert set(graphs.graphs) == {(m, t) for m in moes for t in (32, 64)}
    gen = torch.Generator().manual_seed(2)
    buckets = []
    call = graphs._call
    graphs._call = lambda moe, t: buckets.append(t) or call(moe, t)
    for tokens in (40, 25, 64, 32):
        h = torch.randn(tokens, hidden, generator=gen)
        got = graphs.run(moes[1], h)
        assert got.data_ptr() == graphs.out.data_ptr() and got.shape == h.shape
        assert torch.equal(got, moes[1].local_forward(h))
    assert buckets == [64, 32, 64, 32]  # the smallest that holds each step
    h = torch.randn(8, hidden, generator=gen)
    assert graphs.run(moes[0], torch.randn(65, hidden)) is None  # no bucket
    assert graphs.run(moes[0], h[:0]) is None
    assert graphs.run(moes[0], h.double()) is None
    assert graphs.run(moes[0], h[:, :-1]) is None
    assert graphs.run(moes[0], h.to("meta")) is None
    other = MoePrefillGraphs(hidden, torch.float32, torch.device("cpu"), (32,))
    assert other.run(moes[0], h) is None  # not captured there
    graphs.enabled = False
    assert graphs.run(moes[0], h) is None


@on_references
def test_the_model_hands_one_capture_to_every_moe_layer_and_computes_the_same():
    """`capture_moe_prefill_graphs` on the tiny model: one `MoePrefillGraphs` shared by its MoE
    layers, buckets within the step limit; a prefill step, then a mixed step, replay every MoE
    block and give the logits of the model without them, bit for bit."""
    gen = torch.Generator().manual_seed(2)
    model, moes = tiny_moes()
    prompt = [torch.randint(1, 100, (n,), generator=gen).tolist() for n in (30, 25, 30)]
    steps = [{0: prompt[0], 1: prompt[1]}, {1: [3], 0: prompt[2]}]

    def logits():
        harness = EngineHarness(model)
        return [harness.step(step) for step in steps]

    want = logits()
    shared = model.capture_moe_prefill_graphs(max_tokens=300)
    assert len(moes) > 1 and all(m.prefill_graphs is shared for m in moes)
    assert shared.token_buckets == (256, 300) and len(shared.graphs) == 2 * len(moes)
    replayed = []
    run = shared.run

    def spy(moe, h):
        out = run(moe, h)
        replayed.append(out is not None)
        return out

    shared.run = spy
    got = logits()
    assert len(replayed) == 2 * len(moes) and all(replayed)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


@on_references
def test_no_moe_graphs_where_the_blocks_would_not_replay():
    """Kimi-K3's AttnRes layers call the block without `forward_with_norm`: nothing captured."""
    model = load_model("kimi-k3-tiny", dtype=torch.float32)
    assert model.capture_moe_prefill_graphs(max_tokens=300) is None
    layers = model.language_model.layers
    assert all(layer.block_sparse_moe.prefill_graphs is None for layer in layers if layer.is_moe)


@pytest.mark.gpu
def test_cuda_graph_replays_give_the_eager_blocks_bits():
    """On the GPU: each replay against the eager block on the same padded buffer, in bf16, bit
    for bit (the same kernels at the bucket's shapes), with rows of earlier steps left past the
    step."""
    _, moes = tiny_moes(torch.bfloat16, "cuda")
    hidden = moes[0].config.hidden_size
    graphs = MoePrefillGraphs(hidden, torch.bfloat16, torch.device("cuda"), (128, 256))
    graphs.capture(moes)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for tokens, moe in ((256, moes[0]), (100, moes[1]), (130, moes[0]), (128, moes[1])):
        h = torch.randn(tokens, hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
        got = graphs.run(moe, h).clone()
        bucket = 128 if tokens <= 128 else 256
        padded = graphs.x[:bucket].clone()
        valid = torch.tensor([tokens], device="cuda")
        want = moe.local_forward(padded, valid)[:tokens]
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_engine_replays_moe_graphs_and_keeps_the_eager_tokens(monkeypatch):
    """kimi-linear-tiny: the runner captures the MoE graphs at start-up, prefill and mixed steps
    replay them, and the greedy tokens are those of the engine without them."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 256, (n,), generator=gen).tolist() for n in (3, 40, 200, 500)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def tokens(enabled: str) -> tuple[list, int]:
        monkeypatch.setenv("VLLM_MOE_PREFILL_GRAPHS", enabled)
        eng = LLMEngine.from_engine_args(
            EngineArgs(model="kimi-linear-tiny", max_num_seqs=8, max_num_batched_tokens=512,
                       kv_cache_memory=1 << 30, max_model_len=1024)
        )  # fmt: skip
        try:
            graphs = eng.executor.runner.moe_prefill_graphs
            replays = []
            if graphs is not None:
                run = graphs.run

                def spy(moe, h):
                    out = run(moe, h)
                    replays.append(out is not None)
                    return out

                graphs.run = spy
            for i, prompt in enumerate(prompts):
                eng.add_request(str(i), prompt, params)
            out = {}
            while eng.has_unfinished_requests():
                for o in eng.step():
                    if o.finished:
                        out[o.request_id] = o.outputs[0].token_ids
            return [out[str(i)] for i in range(len(prompts))], sum(replays)
        finally:
            eng.shutdown()

    with_graphs, replayed = tokens("1")
    without, none = tokens("0")
    assert replayed > 0 and none == 0
    assert with_graphs == without
