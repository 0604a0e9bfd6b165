"""The on-device sampler: one next token per row of a [N, V] logits tensor.

Logits come in the LM head's dtype (bf16 for the served models; fp16 or fp32 also taken). They are
widened to fp32 first, exactly (every bf16 / fp16 value is an fp32 value), unless the batch is all
greedy with no penalty and no logprobs: then the argmax reads them as they are, which picks the
same token as the fp32 copy would, without writing that copy ([256, 163840] fp32 is 168 MB).

Order, per row: repetition penalty (a seen token's positive logit is divided by the penalty, a
negative one multiplied), then eos / stop ids forced to -inf while `min_tokens` is not reached.
Greedy rows then take the exact argmax (the first index among equal maxima; ops/argmax.py, Triton
on the GPU). Random rows divide by their temperature and take probabilities, drop tokens below
`min_p` times the row's largest probability, keep the `top_k` most likely, keep the smallest
most-likely prefix whose mass reaches `top_p` of what is left, and sample by an exponential race:
argmax of p / E with E ~ Exp(1) i.i.d., which picks token i with probability p_i / sum(p). A
seeded row draws its E from its own generator, so its tokens depend only on its seed and its
logits; unseeded rows share one draw from `unseeded_generator`: the engine's, seeded with its
`seed` by the model runner (the device's default one where the metadata has none). The
top-k / top-p cut keeps every token tied with the last one kept.

Logprobs are of the raw model distribution (log_softmax of the logits as given, before penalties,
suppression, temperature and filtering). Rank policy: a token's rank is 1 + the number of tokens
strictly more likely, so tied tokens share the best rank and the greedy token always has rank 1
(upstream counts ties against the token instead).

Nothing here reads a device value back to the host.
"""

from dataclasses import dataclass

import torch
from torch import nn

from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.argmax import argmax


@dataclass
class LogprobsTensors:
    """Per row: `token_ids` [N, 1+k] int64 and `logprobs` [N, 1+k] float32, column 0 the sampled
    (or target) token, columns 1..k the k most likely tokens, best first; `ranks` [N] int64, the
    1-based rank of the column-0 token in the vocabulary."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    ranks: torch.Tensor


@dataclass
class SamplerOutput:
    """`sampled_token_ids` [N] int64; `logprobs` when some row asked for them, else None."""

    sampled_token_ids: torch.Tensor
    logprobs: LogprobsTensors | None


class Sampler(nn.Module):
    """Samples one token per row as `SamplingMetadata` says (see the module docstring)."""

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        _check_logits(logits, metadata.num_reqs, metadata.vocab_size)
        if logits.device != metadata.device:
            raise ValueError(f"logits are on {logits.device}, metadata on {metadata.device}")
        plain_greedy = (
            metadata.all_greedy and metadata.seen_mask is None and metadata.max_num_logprobs is None
        )
        if not plain_greedy:
            logits = logits.float()
        raw_logprobs = (
            torch.log_softmax(logits, dim=-1) if metadata.max_num_logprobs is not None else None
        )
        logits = _apply_penalty_and_suppression(logits, metadata)
        greedy = None if metadata.all_random else argmax(logits)
        if metadata.all_greedy:
            sampled = greedy
        else:
            sampled = _sample_random(logits, metadata)
            if metadata.greedy_mask is not None:
                sampled = torch.where(metadata.greedy_mask, greedy, sampled)
        logprobs = None
        if raw_logprobs is not None:
            logprobs = _gather_logprobs(raw_logprobs, sampled, metadata.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)


def compute_prompt_logprobs(
    logits: torch.Tensor, target_ids: torch.Tensor, k: int
) -> LogprobsTensors:
    """Logprobs of each prompt token: row j of `logits` [P, V] (bf16 / fp16 / fp32, computed in
    fp32) predicts `target_ids[j]`.

    Column 0 is the target token, columns 1..k the top k; the ids are trusted to lie in [0, V)
    (checking them would read device memory back). Needs one extra [P, V] float32 buffer (two for
    bf16 / fp16 logits: their fp32 copy too), so the caller bounds P.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [P, V], got shape {tuple(logits.shape)}")
    _check_logits(logits, logits.shape[0], logits.shape[1])
    if target_ids.shape != (logits.shape[0],) or target_ids.dtype != torch.int64:
        raise ValueError(
            f"target_ids must be int64 of shape ({logits.shape[0]},), got "
            f"{target_ids.dtype} {tuple(target_ids.shape)}"
        )
    if k > logits.shape[1]:
        raise ValueError(f"k ({k}) exceeds the vocabulary size ({logits.shape[1]})")
    return _gather_logprobs(torch.log_softmax(logits.float(), dim=-1), target_ids, k)


_LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_logits(logits: torch.Tensor, num_rows: int, vocab_size: int) -> None:
    if logits.dtype not in _LOGIT_DTYPES:
        raise ValueError(f"logits must be bfloat16, float16 or float32, got {logits.dtype}")
    if logits.shape != (num_rows, vocab_size):
        raise ValueError(
            f"logits must have shape ({num_rows}, {vocab_size}), got {tuple(logits.shape)}"
        )


def _apply_penalty_and_suppression(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    # Out of place: the caller's logits stay the raw model output.
    if md.seen_mask is not None:
        penalty = md.repetition_penalty.unsqueeze(1)
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(md.seen_mask, penalized, logits)
    if md.suppress_rows is not None:
        suppressed = (md.suppress_rows, md.suppress_ids)
        logits = logits.index_put(suppressed, logits.new_tensor(-torch.inf))
    return logits


def _sample_random(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    scaled = logits / md.temperature.unsqueeze(1)
    if md.seen_mask is not None:
        # A penalty far below 1 can push a logit past float32's range: +inf would make the row
        # NaN, the largest float keeps it the row's clear winner.
        scaled.clamp_(max=torch.finfo(torch.float32).max)
    probs = torch.softmax(scaled, dim=-1)
    if md.min_p is not None:
        floor = md.min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
        probs = probs.masked_fill(probs < floor, 0.0)
    if md.top_p is not None:
        probs = probs.masked_fill(probs < _top_k_top_p_floor(probs, md), 0.0)
    elif md.top_k is not None:
        best = probs.topk(md.max_top_k, dim=-1).values
        floor = best.gather(1, md.top_k.clamp(max=md.max_top_k).unsqueeze(1) - 1)
        floor = floor.masked_fill((md.top_k == md.vocab_size).unsqueeze(1), 0.0)
        probs = probs.masked_fill(probs < floor, 0.0)

    noise = torch.empty_like(probs)
    if md.any_unseeded_random:
        noise.exponential_(generator=md.unseeded_generator)
    for row, generator in md.generators.items():
        noise[row].exponential_(generator=generator)
    # An Exp(1) draw can round to 0; 0/0 would be NaN, which argmax would pick.
    noise.clamp_min_(torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


def _top_k_top_p_floor(probs: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """[N, 1] smallest probability kept by top-k then top-p (top-p measured after top-k)."""
    ordered = probs.sort(dim=-1, descending=True).values
    if md.top_k is not None:
        # Top-k keeps the tokens tied with its k-th: top-p measures their mass too.
        in_k = ordered >= ordered.gather(1, md.top_k.unsqueeze(1) - 1)
    else:
        in_k = torch.ones_like(ordered, dtype=torch.bool)
    ordered_k = ordered.masked_fill(~in_k, 0.0)
    cumulative = ordered_k.cumsum(dim=-1)
    top_p = md.top_p.unsqueeze(1)
    # Rows with top_p == 1 keep all of top-k outright: rounding in the cumulative sum could
    # otherwise drop their least likely tokens.
    keep = in_k & ((cumulative - ordered_k < top_p * cumulative[:, -1:]) | (top_p >= 1.0))
    # At least the most likely token: a top_p that float32 rounds to 0 keeps nothing above.
    return ordered.gather(1, keep.sum(dim=-1, keepdim=True).clamp_min(1) - 1)


def _gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int) -> LogprobsTensors:
    token_logprobs = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs > token_logprobs).sum(dim=-1) + 1
    top = logprobs.topk(k, dim=-1)
    return LogprobsTensors(
        token_ids=torch.cat([token_ids.unsqueeze(1), top.indices], dim=1),
        logprobs=torch.cat([token_logprobs, top.values], dim=1),
        ranks=ranks,
    )
