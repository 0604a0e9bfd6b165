"""The Triton causal conv1d prefill kernels (under TRITON_INTERPRET=1 on CPU) against their torch
reference: outputs, the conv state written for every slot (exactly), short sequences that keep
part of their old state, strided inputs; the same bits whatever the launch and however a sequence
is cut into continued chunks; and at Kimi-Linear sizes on a GPU."""

import pytest
import torch

from vllm.models.kimi_k3.amd.ops.causal_conv1d import (
    Conv1dPrefillConfig,
    causal_conv1d_prefill,
    causal_conv1d_prefill_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_batch(lens, channels, width, dtype, state_dtype, has_init, seed, device=DEVICE):
    """x as a strided column slice of a wider projection (as the layer passes it), a pool with
    unused slots, the sequences on shuffled slots."""
    gen = torch.Generator(device=device).manual_seed(seed)
    n, tokens = len(lens), sum(lens)
    proj = torch.randn(tokens, channels + 40, generator=gen, device=device).to(dtype)
    qsl = torch.zeros(n + 1, dtype=torch.int64)
    qsl[1:] = torch.tensor(lens).cumsum(0)
    slots = torch.randperm(n + 3, generator=torch.Generator().manual_seed(seed))[:n] + 1
    state = torch.randn(n + 4, channels, width - 1, generator=gen, device=device)
    return dict(
        x=proj[:, 8 : 8 + channels],
        weight=torch.randn(channels, width, generator=gen, device=device) * 0.5,
        conv_state=state.to(state_dtype),
        query_start_loc=qsl.to(device),
        slots=slots.to(device),
        has_initial_state=torch.tensor(has_init, dtype=torch.bool, device=device),
    )


def check(batch, out_tol, launches):
    ref_state, got_state = batch["conv_state"].clone(), batch["conv_state"].clone()
    args = {k: v for k, v in batch.items() if k != "conv_state"}
    ref = causal_conv1d_prefill_ref(conv_state=ref_state, **args)
    got = causal_conv1d_prefill(conv_state=got_state, **args)
    # The kernels ran, so the reference was not compared with itself.
    assert launches["_causal_conv1d_prefill_kernel"] == 1
    assert launches["_conv_state_update_kernel"] == 1
    assert got.shape == batch["x"].shape and got.dtype == batch["x"].dtype
    torch.testing.assert_close(got.float(), ref.float(), rtol=out_tol, atol=out_tol)
    # The state only moves values (through x's dtype, as the reference): exact, every slot.
    assert torch.equal(got_state, ref_state)
    return ref_state


LENS = [1, 2, 3, 5, 17]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("init", ["none", "all", "mixed"])
def test_prefill_matches_reference(dtype, init, triton_launches):
    has_init = {"none": [False] * 5, "all": [True] * 5, "mixed": [True, False, True, True, False]}
    batch = make_batch(LENS, 24, 4, dtype, dtype, has_init[init], seed=len(init))
    assert batch["x"].stride() == (64, 1)
    # fp32 math in both, summed in a different order (and maybe fused multiply-adds): fp32
    # outputs agree to ulps; bf16 outputs are rounded once from those, so at most one bf16 ulp.
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    new_state = check(batch, tol, triton_launches)
    # Length 1 < W - 1: the new window keeps the old state's last two inputs, then the token.
    slot, x = batch["slots"][0], batch["x"]
    old = batch["conv_state"][slot] if has_init[init][0] else torch.zeros_like(new_state[slot])
    assert torch.equal(new_state[slot][:, :2], old[:, 1:])
    assert torch.equal(new_state[slot][:, 2], x[0])
    # Length 17: the last three tokens, oldest first.
    assert torch.equal(new_state[batch["slots"][4]], x[-3:].t())
    # Unused slots untouched.
    unused = torch.ones(new_state.shape[0], dtype=torch.bool, device=DEVICE)
    unused[batch["slots"]] = False
    assert torch.equal(new_state[unused], batch["conv_state"][unused])


@pytest.mark.parametrize("channels,width", [(96, 4), (40, 3), (130, 4), (24, 2)])
def test_prefill_shapes_and_int32_offsets(channels, width, triton_launches):
    """Channel counts off the block size, another width, int32 offsets, an empty sequence
    (whose slot the reference leaves untouched) and an fp32 state under bf16 inputs."""
    lens = [3, 0, 2, 9, 1, 40]
    batch = make_batch(lens, channels, width, torch.bfloat16, torch.float32, [True] * 6, seed=7)
    batch["query_start_loc"] = batch["query_start_loc"].to(torch.int32)
    state = check(batch, 2**-7, triton_launches)
    # The empty sequence's slot keeps its fp32 state; the others went through bf16.
    assert torch.equal(state[batch["slots"][1]], batch["conv_state"][batch["slots"][1]])


def test_out_argument_and_strided_out(triton_launches):
    """The layer writes the prefill rows of its conv buffer in place: a strided `out`."""
    batch = make_batch([5, 17], 32, 4, torch.float32, torch.float32, [True, False], seed=3)
    buf = torch.full((30, 48), 7.0, device=DEVICE)
    out = buf[4 : 4 + 22, 16:]
    args = {k: v for k, v in batch.items() if k != "conv_state"}
    ref = causal_conv1d_prefill_ref(conv_state=batch["conv_state"].clone(), **args)
    got = causal_conv1d_prefill(conv_state=batch["conv_state"].clone(), out=out, **args)
    assert got.data_ptr() == out.data_ptr()
    assert triton_launches["_causal_conv1d_prefill_kernel"] == 1  # the kernel, not its reference
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert (buf[:4] == 7).all() and (buf[26:] == 7).all() and (buf[:, :16] == 7).all()


def test_grouped_out_gives_contiguous_groups(triton_launches):
    """`out` `[3, T, C / 3]`: q, k and v each contiguous (what the layer hands fla-core)."""
    batch = make_batch([5, 1, 17], 48, 4, torch.bfloat16, torch.bfloat16, [True, False, True], 5)
    args = {k: v for k, v in batch.items() if k != "conv_state"}
    ref = causal_conv1d_prefill_ref(conv_state=batch["conv_state"].clone(), **args)
    out = torch.empty(3, 23, 16, dtype=torch.bfloat16, device=DEVICE)
    causal_conv1d_prefill(conv_state=batch["conv_state"].clone(), out=out, **args)
    assert triton_launches["_causal_conv1d_prefill_kernel"] == 1
    for i in range(3):
        torch.testing.assert_close(
            out[i].float(), ref[:, 16 * i : 16 * (i + 1)].float(), rtol=2**-7, atol=2**-7
        )


def test_grouped_out_in_a_larger_buffer(triton_launches):
    """`out` `[3, T, C / 3]` as the first T rows of three larger planes (the KDA prefill graphs'
    q, k, v buffers, `KdaPrefillGraphs.qkv_buffer`): each group lands in its own plane, the
    rows past T untouched."""
    batch = make_batch([5, 1, 17], 48, 4, torch.bfloat16, torch.bfloat16, [True, False, True], 5)
    args = {k: v for k, v in batch.items() if k != "conv_state"}
    ref = causal_conv1d_prefill_ref(conv_state=batch["conv_state"].clone(), **args)
    planes = torch.full((3, 40, 16), 7.0, dtype=torch.bfloat16, device=DEVICE)
    causal_conv1d_prefill(conv_state=batch["conv_state"].clone(), out=planes[:, :23], **args)
    assert triton_launches["_causal_conv1d_prefill_kernel"] == 1
    for i in range(3):
        torch.testing.assert_close(
            planes[i, :23].float(), ref[:, 16 * i : 16 * (i + 1)].float(), rtol=2**-7, atol=2**-7
        )
    assert (planes[:, 23:] == 7).all()


# Small blocks, so that most steps take 4 or 8 rows of one sequence and the others start a
# sequence (several in one block), or run past T.
SMALL_BLOCKS = [Conv1dPrefillConfig(4, 16, 2), Conv1dPrefillConfig(8, 8, 1, step=8)]


def config_id(config):
    return f"t{config.block_t}c{config.block_c}s{config.step}"


@pytest.mark.parametrize("config", SMALL_BLOCKS, ids=config_id)
@pytest.mark.parametrize("grouped", [False, True], ids=["flat", "qkv"])
def test_steps_and_boundaries_match_reference(config, grouped, triton_launches):
    """Sequences shorter than W - 1 and empty ones, several in one block, continued prefill
    from a state and new sequences, strided x, T off the block size; `out` flat or as q, k, v
    (each group a whole number of channel blocks)."""
    lens = [1, 2, 9, 0, 13, 3, 20, 1]
    init = [True, False, True, True, False, True, True, False]
    batch = make_batch(lens, 48, 4, torch.bfloat16, torch.bfloat16, init, seed=11)
    out = torch.empty(3, sum(lens), 16, dtype=torch.bfloat16, device=DEVICE) if grouped else None
    args = {k: v for k, v in batch.items() if k != "conv_state"}
    ref_state, got_state = batch["conv_state"].clone(), batch["conv_state"].clone()
    ref = causal_conv1d_prefill_ref(conv_state=ref_state, **args)
    got = causal_conv1d_prefill(conv_state=got_state, out=out, config=config, **args)
    assert triton_launches["_causal_conv1d_prefill_kernel"] == 1
    flat = got.transpose(0, 1).reshape(ref.shape) if grouped else got
    torch.testing.assert_close(flat.float(), ref.float(), rtol=2**-7, atol=2**-7)
    assert torch.equal(got_state, ref_state)


def test_block_layouts_give_the_same_bits(triton_launches):
    """Rows computed in 8-row steps give the bits of rows computed in 4-row steps and one at a
    time: one block of 64 covers all tokens against blocks of 4; the channel groups split across
    blocks (per-element output offsets) against whole groups per block."""
    lens = [6, 30, 1, 20]
    batch = make_batch(lens, 48, 4, torch.float32, torch.float32, [True, False, True, True], 13)
    args = {k: v for k, v in batch.items() if k != "conv_state"}
    outs = []
    for config in (Conv1dPrefillConfig(64, 64, 4, step=8), Conv1dPrefillConfig(4, 32, 2)):
        out = torch.empty(3, sum(lens), 16, device=DEVICE)
        causal_conv1d_prefill(
            conv_state=batch["conv_state"].clone(), out=out, config=config, **args
        )
        outs.append(out)
    assert triton_launches["_causal_conv1d_prefill_kernel"] == 2
    assert torch.equal(outs[0], outs[1])


def split_prefill(x, weight, lens, config=None):
    """`x` as one new sequence, and as chunks of `lens` where each continues from the previous
    chunk's last W - 1 inputs (a continued prefill's state, in x's dtype): (one, chunked)
    outputs and (one, chunked) final states."""
    tokens, channels = x.shape
    width = weight.shape[1]
    device = x.device
    state = torch.zeros(len(lens) + 1, channels, width - 1, dtype=x.dtype, device=device)
    # The one sequence's window: zeros before its first token.
    window = torch.cat([x.new_zeros(width - 1, channels), x])
    bounds = torch.tensor([0, *lens]).cumsum(0).tolist()
    for i, start in enumerate(bounds[1:-1], start=1):
        state[i + 1] = window[start : start + width - 1].t()
    one_state = state.clone()
    one = causal_conv1d_prefill(
        x, weight, one_state, torch.tensor([0, tokens], device=device),
        torch.tensor([0], device=device), torch.tensor([False], device=device), config=config,
    )  # fmt: skip
    chunked = causal_conv1d_prefill(
        x, weight, state, torch.tensor(bounds, device=device),
        torch.arange(1, len(lens) + 1, device=device),
        torch.arange(len(lens), device=device) > 0, config=config,
    )  # fmt: skip
    return (one, chunked), (one_state[0], state[len(lens)])


@pytest.mark.parametrize("step", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_continued_chunks_give_one_sequences_bits(dtype, step, triton_launches):
    """A sequence prefilled in chunks (each from the state the previous one left) gives the bits
    of the same tokens prefilled at once: inputs read from the state, row by row at sequence
    starts, equal inputs read from x in 4- or 8-row steps. Chunks of 1-3 tokens (shorter than
    W - 1) and chunks crossing blocks."""
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    x = torch.randn(60, 40, generator=gen, device=DEVICE).to(dtype)
    weight = torch.randn(40, 4, generator=gen, device=DEVICE)
    (one, chunked), (one_state, chunked_state) = split_prefill(
        x, weight, [1, 2, 3, 11, 1, 25, 17], Conv1dPrefillConfig(16, 32, 2, step)
    )
    assert triton_launches["_causal_conv1d_prefill_kernel"] == 2
    assert torch.equal(one, chunked)
    assert torch.equal(one_state, chunked_state)


def test_prefill_rejects_bad_inputs():
    batch = make_batch([2, 3], 24, 4, torch.float32, torch.float32, [True, True], seed=1)
    bad = [
        ("weight", batch["weight"][:, :3].contiguous()[:20]),
        ("conv_state", batch["conv_state"][:, :, :2]),
        ("query_start_loc", batch["query_start_loc"][:2]),
        ("slots", batch["slots"].float()),
        ("has_initial_state", batch["has_initial_state"].int()),
        ("out", torch.empty(5, 25, device=DEVICE)),
        ("out", torch.empty(3, 5, 9, device=DEVICE)),
        ("out", torch.empty(5, 24, device="meta")),
        ("weight", batch["weight"].to("meta")),
        ("conv_state", batch["conv_state"].to("meta")),
    ]
    # The kernels index the metadata at unit stride: strided views were read wrong, silently.
    for name in ("query_start_loc", "slots", "has_initial_state"):
        strided = batch[name].repeat_interleave(2)[::2]
        with pytest.raises(ValueError, match=f"{name} must have unit stride"):
            causal_conv1d_prefill(**{**batch, name: strided})
    for name, value in bad:
        with pytest.raises(ValueError, match=name):
            causal_conv1d_prefill(**{**batch, name: value})
    with pytest.raises(ValueError, match="block_t"):
        causal_conv1d_prefill(**batch, config=Conv1dPrefillConfig(12, 16, 2))
    with pytest.raises(ValueError, match="num_warps"):
        causal_conv1d_prefill(**batch, config=Conv1dPrefillConfig(4, 16, 3))
    for step in (2, 16):
        with pytest.raises(ValueError, match="step must be 4 or 8"):
            causal_conv1d_prefill(**batch, config=Conv1dPrefillConfig(16, 16, 2, step))
    with pytest.raises(ValueError, match="at most block_t"):
        causal_conv1d_prefill(**batch, config=Conv1dPrefillConfig(4, 16, 2, step=8))
    wide = make_batch([2, 3], 24, 5, torch.float32, torch.float32, [True, True], seed=1)
    with pytest.raises(ValueError, match="2 <= W <= 4"):
        causal_conv1d_prefill(**wide)


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[8192], [3000, 1, 2, 5189]], ids=["1seq", "4seq"])
def test_gpu_prefill_at_kimi_linear_sizes(lens, triton_launches):
    """C = 3 * 32 heads * 128 (q | k | v of Kimi-Linear's KDA at TP 1), T = 8192, bf16: the
    kernels against the reference on the same GPU."""
    channels = 3 * 4096
    init = [False, True, True, False][: len(lens)]
    batch = make_batch(lens, channels, 4, torch.bfloat16, torch.bfloat16, init, len(lens), "cuda")
    check(batch, 2**-7, triton_launches)


@pytest.mark.gpu
def test_gpu_chunks_and_launches_give_the_same_bits(triton_launches):
    """At Kimi-Linear's q | k | v width, 8192 tokens as one sequence and as continued chunks
    (row-by-row steps at each chunk start) give the same bits; so do the benchmark's launches."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(8192, 3 * 4096 + 288, generator=gen, device="cuda").to(torch.bfloat16)
    x = x[:, : 3 * 4096]
    weight = torch.randn(3 * 4096, 4, generator=gen, device="cuda") * 0.5
    launches = ((64, 1024, 4, 8), (64, 1024, 4, 4), (32, 256, 4, 4), (128, 512, 4, 8))
    configs = [Conv1dPrefillConfig(*c) for c in launches]
    ones = []
    for config in configs:
        (one, chunked), (one_state, chunked_state) = split_prefill(
            x, weight, [3000, 1, 2, 5, 5184], config
        )
        assert torch.equal(one, chunked)
        assert torch.equal(one_state, chunked_state)
        ones.append(one)
    assert all(torch.equal(ones[0], one) for one in ones[1:])
