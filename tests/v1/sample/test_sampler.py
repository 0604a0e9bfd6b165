"""The on-device sampler: greedy, temperature, top-k/p, min-p, seeds, penalties, min_tokens and
logprobs, checked against direct torch computations on CPU."""

import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler, _top_k_top_p_floor, compute_prompt_logprobs

# Row probabilities with clear gaps, so every cut below has a margin far above float rounding.
PROBS = torch.tensor([0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.02, 0.01])
V = PROBS.numel()


def _metadata(params, prompts=None, outputs=None, generators=None, vocab_size=V):
    n = len(params)
    return SamplingMetadata.from_requests(
        params,
        generators if generators is not None else [None] * n,
        prompts if prompts is not None else [[] for _ in range(n)],
        outputs if outputs is not None else [[] for _ in range(n)],
        vocab_size,
        "cpu",
    )


def _sample(logits, params, **kwargs):
    return Sampler()(logits, _metadata(params, vocab_size=logits.shape[1], **kwargs))


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


def test_greedy_is_argmax_and_does_minimal_work():
    logits = torch.randn(6, 50, generator=_seeded(0))
    params = [SamplingParams(temperature=0.0) for _ in range(6)]
    md = _metadata(params, vocab_size=50)
    assert md.all_greedy and md.temperature is None and md.top_k is None and md.seen_mask is None
    out = Sampler()(logits, md)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.logprobs is None


def test_greedy_rows_take_the_argmax_kernels(triton_launches):
    """Greedy rows go through ops/argmax.py's kernels (the interpreter here), tied maxima included;
    an all-random batch launches none."""
    logits = torch.randint(-2, 3, (4, 3000), generator=_seeded(1)).float()
    out = _sample(logits, [SamplingParams(temperature=0.0) for _ in range(4)])
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    mixed = [SamplingParams(temperature=t) for t in (0.0, 1.0, 0.0, 0.5)]
    _sample(logits, mixed)
    assert triton_launches["_argmax_partial_kernel"] == 2
    _sample(logits, [SamplingParams(temperature=1.0) for _ in range(4)])
    assert triton_launches["_argmax_pick_kernel"] == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_logits_sample_as_their_fp32_widening(dtype, monkeypatch):
    # Logits in the LM head's dtype: every row samples what the same logits widened to fp32 give.
    # Rounding to bf16 makes ties in the argmax: the first index must win, as in fp32.
    logits = (torch.randn(6, 400, generator=_seeded(5)) * 4).to(dtype)
    assert (logits == logits.amax(-1, keepdim=True)).sum() > 6 or dtype == torch.float16
    wide = logits.float()
    cases = [
        [SamplingParams(temperature=0.0) for _ in range(6)],
        [SamplingParams(temperature=0.0, logprobs=3) for _ in range(6)],
        [SamplingParams(temperature=0.0, repetition_penalty=1.7) for _ in range(6)],
        [SamplingParams(temperature=t, seed=9) for t in (0.0, 1.0, 0.5, 0.0, 2.0, 1.0)],
    ]
    widened = []
    real_float = torch.Tensor.float

    def spy(t):
        widened.append(t.dtype)
        return real_float(t)

    monkeypatch.setattr(torch.Tensor, "float", spy)
    for params in cases:
        kw = dict(prompts=[[1, 2, 3]] * 6, outputs=[[4]] * 6)
        got = _sample(logits, params, generators=[_seeded(9)] * 6, **kw)
        want = _sample(wide, params, generators=[_seeded(9)] * 6, **kw)
        assert torch.equal(got.sampled_token_ids, want.sampled_token_ids)
        assert (got.logprobs is None) == (want.logprobs is None)
        if got.logprobs is not None:
            for name in ("token_ids", "logprobs", "ranks"):
                assert torch.equal(getattr(got.logprobs, name), getattr(want.logprobs, name))
        # Plain greedy rows read the logits as they are; everything else widens them once.
        assert widened.count(dtype) == (0 if params is cases[0] else 1)
        widened.clear()
    prompt = compute_prompt_logprobs(logits, torch.arange(6), 2)
    expected = compute_prompt_logprobs(wide, torch.arange(6), 2)
    assert torch.equal(prompt.logprobs, expected.logprobs)


def test_mixed_greedy_and_random_batch():
    logits = torch.randn(4, 50, generator=_seeded(1))
    params = [SamplingParams(temperature=t, seed=3) for t in (0.0, 1.0, 0.0, 1.0)]
    gens = [_seeded(3) for _ in range(4)]
    out = _sample(logits, params, generators=gens).sampled_token_ids
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()
    assert out.dtype == torch.int64 and out.shape == (4,)


def test_top_k_one_is_greedy():
    logits = torch.randn(64, 1000, generator=_seeded(2))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        out = _sample(logits, [SamplingParams(temperature=1.5, top_k=1) for _ in range(64)])
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))


@pytest.mark.parametrize(
    "knobs,allowed",
    [
        (dict(top_k=3), {0, 1, 2}),
        # Mass before each token: 0, .3, .55, .75 -> the first three reach 0.6.
        (dict(top_p=0.6), {0, 1, 2}),
        # Floor 0.2 * 0.3 = 0.06 keeps the five tokens >= 0.08.
        (dict(min_p=0.2), {0, 1, 2, 3, 4}),
        # top_p measured after top_k: of {.3, .25} renormalized, .545 < .6 keeps both.
        (dict(top_k=2, top_p=0.6), {0, 1}),
        # min_p (floor .09) leaves four tokens, renormalized mass before the fourth is .88 > .8.
        (dict(top_k=5, top_p=0.8, min_p=0.3), {0, 1, 2}),
    ],
)
def test_filters_never_sample_outside_allowed_set(knobs, allowed):
    n = 4000
    logits = PROBS.log().expand(n, V).contiguous()
    # Every other row leaves the knobs off: those rows must still reach every token.
    params = [SamplingParams(**(knobs if i % 2 == 0 else {})) for i in range(n)]
    with torch.random.fork_rng():
        torch.manual_seed(1)
        out = _sample(logits, params).sampled_token_ids
    filtered, free = set(out[0::2].tolist()), set(out[1::2].tolist())
    assert filtered == allowed
    assert free == set(range(V))


def test_top_k_without_top_p_keeps_off_rows_whole():
    n = 2000
    logits = PROBS.log().expand(n, V).contiguous()
    params = [SamplingParams(top_k=2 if i % 2 else 0) for i in range(n)]
    with torch.random.fork_rng():
        torch.manual_seed(2)
        out = _sample(logits, params).sampled_token_ids
    assert set(out[1::2].tolist()) == {0, 1}
    assert set(out[0::2].tolist()) == set(range(V))


def test_top_p_off_rows_keep_tokens_below_cumsum_rounding():
    # The last token's mass before it rounds to the row's total in float32, so only the
    # explicit "top_p == 1 keeps everything" rule keeps it for the row that has top_p off.
    probs = torch.tensor([[0.5, 0.25, 0.25 - 2e-9, 2e-9]]).repeat(2, 1)
    md = _metadata([SamplingParams(top_p=0.6), SamplingParams()], vocab_size=4)
    floor = _top_k_top_p_floor(probs, md)
    assert floor[0].item() == pytest.approx(0.25) and floor[1].item() == pytest.approx(2e-9)


def test_top_p_measures_the_mass_of_every_token_top_k_keeps_ties_included():
    # top_k=4 keeps the three 2s and, tied at the 4th place, all three 1s (as the sampler
    # documents). top_p then measures those six: the three 2s hold e / (e + 1) = .731 < .75 of
    # it, so a 1 must be kept too. Measured over only the first four positions (3 e^2 + e), the
    # 2s would already hold .891 and every 1 would be dropped.
    logits = torch.tensor([[2.0, 1.0, 2.0, 1.0, 0.0, 2.0, 1.0, 0.0]]).repeat(2, 1)
    params = [SamplingParams(top_k=4, top_p=0.75) for _ in range(2)]
    floor = _top_k_top_p_floor(logits.softmax(-1), _metadata(params))
    assert floor.flatten().tolist() == pytest.approx([logits.softmax(-1)[0, 1].item()] * 2)
    n = 64
    out = _sample(logits[:1].expand(n, V).contiguous(),
                  [SamplingParams(top_k=4, top_p=0.75, seed=i) for i in range(n)],
                  generators=[_seeded(i) for i in range(n)])  # fmt: skip
    assert set(out.sampled_token_ids.tolist()) == {0, 1, 2, 3, 5, 6}


def test_top_p_measures_the_mass_of_exactly_the_top_k():
    # Without ties top_k=2 keeps .3 and .25; of those .3 / .55 = .545 < .9, so both stay and
    # nothing else: measured over three tokens (an off-by-one), the mass before .2 is .733 < .9
    # and .2 would be kept too.
    probs = PROBS.expand(2, V).contiguous()
    params = [SamplingParams(top_k=2, top_p=0.9), SamplingParams(top_k=3, top_p=0.7)]
    floor = _top_k_top_p_floor(probs, _metadata(params))
    # Row 2: of .3, .25, .2 the mass before .2 is .733 > .7: two kept.
    assert floor.flatten().tolist() == pytest.approx([0.25, 0.25])


def test_top_p_that_float32_rounds_to_zero_keeps_the_most_likely_token():
    # 1e-46 is a valid top_p (> 0) that is 0 in float32: no token's mass before it is below
    # it, and the row must still keep its most likely token rather than index position -1.
    logits = torch.randn(16, 300, generator=_seeded(4))
    out = _sample(logits, [SamplingParams(top_p=1e-46, seed=i) for i in range(16)],
                  generators=[_seeded(i) for i in range(16)])  # fmt: skip
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("seed", 2**64, r"seed must be in \[-9223372036854775808, 18446744073709551615\]"),
        ("seed", -(2**63) - 1, "seed must be in"),
        ("temperature", 1e300, "temperature must be in"),
        ("repetition_penalty", 1e-300, "repetition_penalty must be in"),
        ("repetition_penalty", 0.0, "repetition_penalty must be in"),
        ("repetition_penalty", 1e300, "repetition_penalty must be in"),
    ],
)
def test_params_the_generators_or_float32_cannot_hold_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("stop", 5, "stop must be a string or a list of strings, got 5"),
        ("stop", {"a": 1}, "stop must be a string or a list of strings"),
        ("stop_token_ids", 5, "stop_token_ids must be a list of token ids, got 5"),
        ("stop_token_ids", {1, 2}, "stop_token_ids must be a list of token ids"),
        ("spaces_between_special_tokens", "no", "spaces_between_special_tokens must be a bool"),
        ("spaces_between_special_tokens", None, "spaces_between_special_tokens must be a bool"),
        ("detokenize", 0, "detokenize must be a bool, got 0"),
        # Upstream's range: -1 (max_model_len) or a count of tokens to keep; 0 would keep none.
        ("truncate_prompt_tokens", 0, r"truncate_prompt_tokens must be -1 or .*>= 1, got 0"),
        ("truncate_prompt_tokens", -2, r"truncate_prompt_tokens must be -1 or .*>= 1, got -2"),
        ("truncate_prompt_tokens", 1.5, "truncate_prompt_tokens must be -1 or an integer"),
        ("truncate_prompt_tokens", True, "truncate_prompt_tokens must be -1 or an integer"),
        ("truncate_prompt_tokens", "8", "truncate_prompt_tokens must be -1 or an integer"),
        # One range for top_p, whether it keeps no token (0) or is out of range.
        ("top_p", 0, r"top_p must be in \(0, 1\], got 0"),
        ("top_p", 1.5, r"top_p must be in \(0, 1\], got 1.5"),
        ("top_p", -0.5, r"top_p must be in \(0, 1\], got -0.5"),
        ("top_p", "0.5", "top_p must be a number"),
        # -1 is upstream's "the whole vocabulary"; below it, nothing.
        ("logprobs", -2, r"logprobs must be >= -1, got -2"),
        ("prompt_logprobs", -2, r"prompt_logprobs must be >= -1, got -2"),
        ("logprobs", 1.0, "logprobs must be an integer"),
    ],
)
def test_params_of_the_wrong_kind_are_refused_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("presence_penalty", 0.5, r"presence_penalty is not supported \(use repetition_penalty\)"),
        ("frequency_penalty", -1, "frequency_penalty is not supported"),
        ("frequency_penalty", float("nan"), "frequency_penalty is not supported"),
        ("logit_bias", {7: 0, 5: 100}, r"logit_bias is not supported \(only biases of 0\)"),
        ("logit_bias", [1], "logit_bias must be a dict"),
        # Keys that are no token ids, even at a bias of 0 (upstream reads them with int()).
        ("logit_bias", {"abc": 0}, "logit_bias keys must be token ids .*got 'abc'"),
        ("logit_bias", {"1.5": 0}, "logit_bias keys must be token ids"),
        ("logit_bias", {True: 0}, "logit_bias keys must be token ids"),
        ("allowed_token_ids", [1, 2], r"allowed_token_ids is not supported, got \[1, 2\]"),
        ("bad_words", ["x"], "bad_words is not supported"),
        ("logits_processors", [lambda ids, logits: logits], "per-request logits processors"),
        ("logits_processors", {}, "logits_processors must be a list, got dict"),
    ],
)  # fmt: skip
def test_upstream_fields_not_implemented_are_refused_unless_neutral(field, value, message):
    """Upstream code passing them unchanged runs; a value that would change the sampling is a
    ValueError naming the field (each was a TypeError, at any value)."""
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})
    neutral = {
        "logit_bias": {7: 0, "8": 0},
        "allowed_token_ids": None,
        "bad_words": [],
        "logits_processors": [],
    }
    SamplingParams(**{field: neutral.get(field, 0.0)})


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_a_bool_logprobs_count_is_the_int_it_stands_for(field):
    """As upstream: True asks for one top logprob, False for none beyond the chosen token's (its
    count 0); either becomes that int, which the engine's checks take (a bool was refused as not
    an integer)."""
    for flag, count in ((True, 1), (False, 0)):
        value = getattr(SamplingParams(**{field: flag}), field)
        assert value == count and type(value) is int


def test_stop_strings_need_detokenize():
    """As upstream: stop strings are matched in the text, which `detokenize=False` leaves out;
    stop token ids need none."""
    with pytest.raises(ValueError, match=r"stop strings need detokenize=True"):
        SamplingParams(stop="x", detokenize=False)
    assert SamplingParams(stop_token_ids=[3], detokenize=False).stop_token_ids == [3]


def test_stop_lists_may_be_tuples():
    params = SamplingParams(stop=("a", "b"), stop_token_ids=(1, 2))
    assert params.stop == ["a", "b"] and params.stop_token_ids == [1, 2]


def test_seed_range_is_the_generators_for_every_completion():
    # Completion i uses seed + i: the last one must still be a seed torch takes.
    for seed in (-(2**63), 2**63, 2**64 - 1):
        torch.Generator().manual_seed(SamplingParams(seed=seed).seed)
    SamplingParams(seed=2**64 - 3, n=3)
    with pytest.raises(ValueError, match=r"seed must be in \[-\d+, 18446744073709551613\]"):
        SamplingParams(seed=2**64 - 2, n=3)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_penalty_that_pushes_a_logit_past_float32_samples_that_token(top_p):
    # 10 / 1.2e-38 overflows float32: the token must win outright (probabilities stay real),
    # not turn the row's probabilities into NaN (argmax would then pick token 0).
    logits = torch.randn(8, 50, generator=_seeded(6)) * 0.1
    logits[:, 5] = 10.0
    params = [SamplingParams(seed=i, repetition_penalty=1.2e-38, top_p=top_p) for i in range(8)]
    out = _sample(logits, params, generators=[_seeded(i) for i in range(8)], prompts=[[5]] * 8)
    assert out.sampled_token_ids.tolist() == [5] * 8


def test_temperature_distribution_matches_softmax():
    n, temperature = 40000, 0.7
    logits = torch.randn(V, generator=_seeded(4)) * 1.5
    expected = torch.softmax(logits / temperature, -1)
    with torch.random.fork_rng():
        torch.manual_seed(3)
        out = _sample(
            logits.expand(n, V).contiguous(),
            [SamplingParams(temperature=temperature) for _ in range(n)],
        ).sampled_token_ids
    freq = torch.bincount(out, minlength=V).double() / n
    # Five binomial standard deviations per token: a false alarm has probability ~ V * 6e-7.
    bound = 5 * (expected * (1 - expected) / n).sqrt()
    assert torch.all((freq - expected).abs() <= bound), (freq, expected)
    # The bound is tight enough to tell the temperature apart from none at all.
    untempered = torch.softmax(logits, -1)
    assert torch.any((freq - untempered).abs() > bound)


def _seeded_run(seed, row, batch_params, steps=6):
    """Tokens drawn for the seeded request placed at `row` among `batch_params`, over `steps`."""
    logits = torch.randn(len(batch_params), 500, generator=_seeded(5))
    params = list(batch_params)
    params[row] = SamplingParams(seed=seed, top_p=0.95)
    logits[row] = torch.randn(500, generator=_seeded(6))
    gens = [_seeded(p.seed) if p.seed is not None else None for p in params]
    md = _metadata(params, generators=gens, vocab_size=500)
    return [Sampler()(logits, md).sampled_token_ids[row].item() for _ in range(steps)]


def test_seed_is_independent_of_batch_and_row():
    alone = _seeded_run(7, 0, [SamplingParams()])
    others = [
        SamplingParams(),
        SamplingParams(temperature=0.0),
        SamplingParams(),
        SamplingParams(seed=99, top_k=5),
    ]
    with torch.random.fork_rng():
        torch.manual_seed(4)
        assert _seeded_run(7, 2, others) == alone
        assert _seeded_run(7, 0, others[:2]) == alone
    assert _seeded_run(8, 0, [SamplingParams()]) != alone


def test_repetition_penalty_both_signs_and_history():
    # Token 0 seen with a positive logit (2 -> 1), token 2 seen with a negative one (-1 -> -2).
    logits = torch.tensor([[2.0, 1.5, -5.0, -9.0], [-3.0, -1.5, -1.0, -9.0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0) for _ in range(2)]
    out = _sample(logits, params, prompts=[[0], [2]], outputs=[[], []])
    assert out.sampled_token_ids.tolist() == [1, 1]
    # Output tokens count as seen too; penalty < 1 rewards (2 * 1.0 > 1.5 in row 0 without it).
    out = _sample(logits, params, prompts=[[], []], outputs=[[0, 0], [2]])
    assert out.sampled_token_ids.tolist() == [1, 1]
    rewarded = [SamplingParams(temperature=0.0, repetition_penalty=0.5) for _ in range(2)]
    logits = torch.tensor([[1.0, 1.5, 0.0, 0.0], [-1.0, -1.6, -3.0, -2.0]])
    out = _sample(logits, rewarded, prompts=[[0], [1]])
    assert out.sampled_token_ids.tolist() == [0, 1]
    # Unpenalized rows in the same batch are untouched.
    mixed = [SamplingParams(temperature=0.0, repetition_penalty=3.0), SamplingParams(temperature=0)]
    out = _sample(torch.tensor([[2.0, 1.0], [2.0, 1.0]]), mixed, prompts=[[0], [0]])
    assert out.sampled_token_ids.tolist() == [1, 0]


def test_min_tokens_suppresses_stop_ids_until_reached():
    eos, stop = 3, 1
    logits = torch.tensor([[0.0, 4.0, 1.0, 5.0, 0.5]]).repeat(2, 1)
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[stop])
    p.update_from_tokenizer(eos)
    free = SamplingParams(temperature=0.0)
    free.update_from_tokenizer(eos)
    out = _sample(logits, [p, free], outputs=[[2], [2]])
    assert out.sampled_token_ids.tolist() == [2, eos]
    out = _sample(logits, [p, free], outputs=[[2, 2], [2]])
    assert out.sampled_token_ids.tolist() == [eos, eos]
    # Random rows are suppressed as well.
    rnd = SamplingParams(min_tokens=5, stop_token_ids=[stop])
    rnd.update_from_tokenizer(eos)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        many = _sample(logits[:1].expand(500, 5).contiguous(), [rnd] * 500).sampled_token_ids
    assert not set(many.tolist()) & {eos, stop}


def test_logprobs_are_raw_with_topk_and_ranks():
    logits = torch.randn(5, 40, generator=_seeded(9))
    params = [
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.5, top_k=4, logprobs=1, repetition_penalty=1.7),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0.0, logprobs=0),
        SamplingParams(temperature=1.2, top_p=0.5, seed=1),
    ]
    gens = [None, None, None, None, _seeded(1)]
    with torch.random.fork_rng():
        torch.manual_seed(6)
        out = _sample(logits, params, prompts=[[1, 2]] * 5, generators=gens)
    lp = out.logprobs
    ref = torch.log_softmax(logits, -1)
    top = ref.topk(3, -1)
    assert lp.token_ids.shape == lp.logprobs.shape == (5, 4) and lp.ranks.shape == (5,)
    assert lp.token_ids.dtype == lp.ranks.dtype == torch.int64
    assert lp.logprobs.dtype == torch.float32
    assert torch.equal(lp.token_ids[:, 0], out.sampled_token_ids)
    assert torch.allclose(lp.logprobs[:, 0], ref.gather(1, out.sampled_token_ids[:, None])[:, 0])
    assert torch.equal(lp.token_ids[:, 1:], top.indices)
    assert torch.allclose(lp.logprobs[:, 1:], top.values)
    order = ref.argsort(-1, descending=True)
    expected_ranks = (order == out.sampled_token_ids[:, None]).int().argmax(-1) + 1
    assert torch.equal(lp.ranks, expected_ranks)
    assert lp.ranks[0] == 1 and lp.ranks[3] == 1


def test_prompt_logprobs_and_tie_ranks():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 5.0, 4.0]])
    targets = torch.tensor([2, 3, 0])
    lp = compute_prompt_logprobs(logits, targets, 2)
    ref = torch.log_softmax(logits, -1)
    assert lp.token_ids.shape == (3, 3)
    assert torch.equal(lp.token_ids[:, 0], targets)
    assert torch.allclose(lp.logprobs[:, 0], ref[torch.arange(3), targets])
    assert torch.allclose(lp.logprobs[:, 1:], ref.topk(2, -1).values)
    # Ties share the best rank: 1 + the number of strictly more likely tokens.
    assert lp.ranks.tolist() == [1, 1, 3]
    assert compute_prompt_logprobs(logits, targets, 0).logprobs.shape == (3, 1)
    # Greedy picks the first of tied maxima, which then has rank 1.
    out = _sample(logits[:1], [SamplingParams(temperature=0.0, logprobs=0)])
    assert out.sampled_token_ids.item() == 1 and out.logprobs.ranks.item() == 1


def test_metadata_flags_and_max_logprobs():
    params = [
        SamplingParams(temperature=0.0, logprobs=2),
        SamplingParams(top_k=50, logprobs=5),
        SamplingParams(top_k=3, min_p=0.1),
    ]
    md = _metadata(params, vocab_size=20)
    assert not md.all_greedy and not md.all_random
    assert md.greedy_mask.tolist() == [True, False, False]
    assert md.top_k.tolist() == [20, 20, 3] and md.max_top_k == 3
    assert md.top_p is None and md.min_p.tolist() == pytest.approx([0.0, 0.0, 0.1])
    assert md.max_num_logprobs == 5 and md.seen_mask is None and md.suppress_rows is None
    assert md.temperature.tolist() == [1.0, 1.0, 1.0] and md.any_unseeded_random
    md = _metadata([SamplingParams(repetition_penalty=1.2)], prompts=[[4, 1]], outputs=[[4]])
    assert md.seen_mask[0].nonzero().flatten().tolist() == [1, 4]
    assert md.all_random and md.greedy_mask is None


def test_validation_errors():
    ok = [SamplingParams()]
    with pytest.raises(ValueError, match="params"):
        _metadata([])
    with pytest.raises(ValueError, match="generators"):
        SamplingMetadata.from_requests(ok, [], [[]], [[]], V, "cpu")
    with pytest.raises(ValueError, match="output_token_ids"):
        SamplingMetadata.from_requests(ok, [None], [[]], [], V, "cpu")
    with pytest.raises(ValueError, match="vocab_size"):
        _metadata(ok, vocab_size=0)
    with pytest.raises(ValueError, match=r"generators\[0\] is None"):
        _metadata([SamplingParams(seed=1)])
    with pytest.raises(ValueError, match="prompt_token_ids"):
        _metadata([SamplingParams(repetition_penalty=1.1)], prompts=[[V]])
    with pytest.raises(ValueError, match="output_token_ids"):
        _metadata([SamplingParams(repetition_penalty=1.1)], outputs=[[-1]])
    with pytest.raises(ValueError, match="all_stop_token_ids"):
        _metadata([SamplingParams(min_tokens=1, stop_token_ids=[V])])
    with pytest.raises(ValueError, match="logprobs"):
        _metadata([SamplingParams(logprobs=V + 1)])
    # -1 reaches the sampler only as the vocabulary size, which the engine makes of it.
    with pytest.raises(ValueError, match="-1 logprobs: the engine makes that the vocabulary"):
        _metadata([SamplingParams(logprobs=2), SamplingParams(logprobs=-1)])
    md = _metadata(ok)
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        Sampler()(torch.zeros(1, V, dtype=torch.float64), md)
    with pytest.raises(ValueError, match="shape"):
        Sampler()(torch.zeros(2, V), md)
    with pytest.raises(ValueError, match="k must"):
        compute_prompt_logprobs(torch.zeros(2, V), torch.zeros(2, dtype=torch.int64), -1)
    with pytest.raises(ValueError, match="exceeds"):
        compute_prompt_logprobs(torch.zeros(2, V), torch.zeros(2, dtype=torch.int64), V + 1)
    with pytest.raises(ValueError, match="target_ids"):
        compute_prompt_logprobs(torch.zeros(2, V), torch.zeros(3, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="logits must be"):
        compute_prompt_logprobs(torch.zeros(V), torch.zeros(1, dtype=torch.int64), 1)
