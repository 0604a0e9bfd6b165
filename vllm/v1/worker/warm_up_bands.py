"""The prefill step sizes that a fresh process should run once before its timed or served steps.

fla-core 0.6.0 tunes its q / k L2 norm (the first kernels of the KDA prefill core, `chunk_kda` with
`use_qk_l2norm_in_kernel`) once per process for each count of 65536-row blocks of q: per 2048
tokens at Kimi-Linear's 32 heads. On a fresh H100 one such tuning took 9.1 s of the step that first
met its band (docs/performance.md, "Forty-first run"), and Triton compiles the fork's kernels per
class of their int arguments (1, a multiple of 16, other), which follow the step's token count.
So the model runner's start-up (its profiling run, or `warm_up_prefill_steps` where the cache
budget is given) and the engine benchmarks' warm-ups run a step at the top of every band, and steps
a token below (the benchmarks below every top, the runner below its largest).
"""

# Tokens per band: 65536 rows of q over Kimi-Linear's 32 heads (fewer heads: wider bands, still
# met; more heads would need narrower ones).
WARM_UP_BAND_TOKENS = 2048


def warm_up_bands(
    length: int, budget: int, band: int = WARM_UP_BAND_TOKENS, below_each: bool = True
) -> list[list[int]]:
    """Prompt lengths of the warm-up steps that cover every band of `band` tokens up to `budget`
    tokens a step: per band b, a step of min(budget, b * band) prompt tokens, and one of a token
    fewer (a count a multiple of 16 and one not) after every band's top with `below_each`, else
    after the budget's alone (one step per int class of the largest steps: the model runner's
    start-up, where each step costs a forward of up to the budget), each in prompts of at most
    `length` tokens (the last one shorter where needed)."""
    if min(length, budget, band) < 1:
        raise ValueError(f"length, budget and band must be >= 1, got {length}, {budget}, {band}")
    tops = {min(budget, b * band) for b in range(1, -(-budget // band) + 1)}
    below = tops if below_each else {budget}
    steps = []
    for tokens in sorted(tops | {t - 1 for t in below if t > 1}):
        full, rest = divmod(tokens, length)
        steps.append([length] * full + ([rest] if rest else []))
    return steps
