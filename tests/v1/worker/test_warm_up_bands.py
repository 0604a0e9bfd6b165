"""warm_up_bands: the prefill step sizes a fresh process runs before its timed or served steps."""

import pytest

from vllm.v1.worker.warm_up_bands import warm_up_bands


def test_two_steps_in_every_band_up_to_the_budget() -> None:
    """Per 2048-token band of the step budget (where fla-core tunes its q / k norm anew), a step
    at the band's top and one a token below it (a count a multiple of 16 and one not), each in
    prompts of at most the given length, its tokens inside its band."""
    k = [1024]
    assert warm_up_bands(1024, 8192) == [
        k + [1023], k * 2, k * 3 + [1023], k * 4, k * 5 + [1023], k * 6, k * 7 + [1023], k * 8,
    ]  # fmt: skip
    assert warm_up_bands(8192, 8192) == [[n] for n in (2047, 2048, 4095, 4096, 6143, 6144,
                                                          8191, 8192)]  # fmt: skip
    assert warm_up_bands(3000, 8192)[2:4] == [[3000, 1095], [3000, 1096]]
    assert warm_up_bands(1024, 5000)[-2:] == [k * 4 + [903], k * 4 + [904]]
    assert warm_up_bands(8, 16) == [[8, 7], [8, 8]]  # the latency benchmark's dry run
    assert warm_up_bands(1, 1) == [[1]]
    for length in (1, 7, 1000, 2048, 8192):
        steps = warm_up_bands(length, 8192)
        totals = [sum(lengths) for lengths in steps]
        assert [-(-t // 2048) for t in totals] == [1, 1, 2, 2, 3, 3, 4, 4]
        assert [t % 16 == 0 for t in totals] == [False, True] * 4
        assert all(max(lengths) <= length for lengths in steps)
    with pytest.raises(ValueError, match="must be >= 1"):
        warm_up_bands(1024, 0)


def test_the_runners_steps_go_a_token_below_the_budget_alone() -> None:
    """`below_each=False` (the model runner's start-up, one forward a step): every band's top and
    one step a token below the budget, so both int classes of the largest steps still run."""
    k = [1024]
    assert warm_up_bands(1024, 8192, below_each=False) == [
        k * 2,
        k * 4,
        k * 6,
        k * 7 + [1023],
        k * 8,
    ]
    assert warm_up_bands(1000, 2500, below_each=False) == [
        [1000, 1000, 48], [1000, 1000, 499], [1000, 1000, 500],
    ]  # fmt: skip
    assert warm_up_bands(16, 16, below_each=False) == [[15], [16]]
