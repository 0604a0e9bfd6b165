"""`SamplingMetadata`: the per-row tensors one sampler step needs, built once per step from the
batch's `SamplingParams` and token histories.

Every knob a row leaves at its neutral value is folded away: a field is None when no row of the
batch uses it, so the common all-greedy batch carries only the rows' count and vocabulary size.
Host lists are copied to the device once here (through pinned memory off the CPU, without
blocking); the sampler itself never reads anything back to the host.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vllm.sampling_params import SamplingParams, SamplingType
from vllm.utils.torch_utils import async_tensor_h2d


@dataclass
class SamplingMetadata:
    """Per-row sampling state for a batch of `num_reqs` rows over a vocabulary of `vocab_size`.

    - `temperature` [N] float32 (1.0 on greedy rows, whose random draw is discarded); None when
      every row is greedy. `greedy_mask` [N] bool; None when no row or every row is greedy.
    - `top_k` [N] int64 (`vocab_size` where off) with `max_top_k` the largest active k;
      `top_p`, `min_p` [N] float32 (1.0 / 0.0 where off). Each is None when no row uses it.
    - `generators`: row -> the row's own generator, for random rows that have one; the other
      random rows share one draw from `unseeded_generator` (the engine's, seeded with its
      `seed`; None: the device's default generator).
    - `repetition_penalty` [N] float32 and `seen_mask` [N, V] bool (tokens of the prompt or the
      output so far, only on penalized rows); both None when no row is penalized.
    - `suppress_rows`, `suppress_ids` [S] int64: (row, token) pairs forced to -inf because the
      row has produced fewer than `min_tokens` tokens; None when there are none.
    - `max_num_logprobs`: the largest `logprobs` over the rows that asked; None when none did.
    """

    num_reqs: int
    vocab_size: int
    device: torch.device
    all_greedy: bool
    all_random: bool
    temperature: torch.Tensor | None = None
    greedy_mask: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    max_top_k: int = 0
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    any_unseeded_random: bool = False
    unseeded_generator: torch.Generator | None = None
    repetition_penalty: torch.Tensor | None = None
    seen_mask: torch.Tensor | None = None
    suppress_rows: torch.Tensor | None = None
    suppress_ids: torch.Tensor | None = None
    max_num_logprobs: int | None = None

    @classmethod
    def from_requests(
        cls,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str,
    ) -> "SamplingMetadata":
        """Build the metadata of a batch whose row i is sampled with `params[i]`.

        `generators[i]` is row i's generator (on `device`) when its request has a seed, else None;
        `prompt_token_ids[i]` and `output_token_ids[i]` are row i's prompt and the tokens it has
        generated so far (they drive `repetition_penalty` and `min_tokens`).
        """
        n = len(params)
        if n == 0:
            raise ValueError("params must hold at least one row")
        for name, seq in (
            ("generators", generators),
            ("prompt_token_ids", prompt_token_ids),
            ("output_token_ids", output_token_ids),
        ):
            if len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} rows, params has {n}")
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            # Pin the index so that the sampler can compare it with the logits' device.
            device = torch.device("cuda", torch.cuda.current_device())

        greedy = [p.sampling_type == SamplingType.GREEDY for p in params]
        md = cls(
            num_reqs=n,
            vocab_size=vocab_size,
            device=device,
            all_greedy=all(greedy),
            all_random=not any(greedy),
        )
        for i, (p, g) in enumerate(zip(params, generators, strict=True)):
            if greedy[i]:
                continue
            if g is None:
                if p.seed is not None:
                    raise ValueError(f"generators[{i}] is None but params[{i}] has a seed")
                md.any_unseeded_random = True
            elif not _same_device(g.device, device):
                raise ValueError(f"generators[{i}] is on {g.device}, the batch is on {device}")
            else:
                md.generators[i] = g

        if not md.all_greedy:
            md.temperature = async_tensor_h2d(
                [1.0 if gr else p.temperature for p, gr in zip(params, greedy, strict=True)],
                torch.float32,
                device,
            )
            if not md.all_random:
                md.greedy_mask = async_tensor_h2d(greedy, torch.bool, device)
            # Greedy rows had their knobs reset by SamplingParams, so they never count as active.
            top_k = [vocab_size if p.top_k <= 0 else min(p.top_k, vocab_size) for p in params]
            active_k = [k for k in top_k if k < vocab_size]
            if active_k:
                md.top_k = async_tensor_h2d(top_k, torch.int64, device)
                md.max_top_k = max(active_k)
            if any(p.top_p < 1.0 for p in params):
                md.top_p = async_tensor_h2d([p.top_p for p in params], torch.float32, device)
            if any(p.min_p > 0.0 for p in params):
                md.min_p = async_tensor_h2d([p.min_p for p in params], torch.float32, device)

        md._build_penalty(params, prompt_token_ids, output_token_ids)
        md._build_suppression(params, output_token_ids)
        asked = [p.logprobs for p in params if p.logprobs is not None]
        if asked:
            md.max_num_logprobs = max(asked)
            if md.max_num_logprobs > vocab_size:
                raise ValueError(
                    f"params ask for {md.max_num_logprobs} logprobs, the vocabulary has "
                    f"{vocab_size} tokens"
                )
            if min(asked) < 0:
                # SamplingParams' -1 (the whole vocabulary) is the engine's to resolve.
                raise ValueError(
                    "params ask for -1 logprobs: the engine makes that the vocabulary size "
                    "(LLMEngine.add_request) before a request is sampled"
                )
        return md

    def _build_penalty(
        self,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
    ) -> None:
        rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        if not rows:
            return
        self.repetition_penalty = async_tensor_h2d(
            [p.repetition_penalty for p in params], torch.float32, self.device
        )
        row_ids, token_ids = [], []
        for name, histories in (
            ("prompt_token_ids", prompt_token_ids),
            ("output_token_ids", output_token_ids),
        ):
            for i in rows:
                ids = torch.as_tensor(list(histories[i]), dtype=torch.int64)
                self._check_ids(name, i, ids)
                token_ids.append(ids)
                row_ids.append(torch.full_like(ids, i))
        self.seen_mask = torch.zeros(
            self.num_reqs, self.vocab_size, dtype=torch.bool, device=self.device
        )
        self.seen_mask[
            async_tensor_h2d(torch.cat(row_ids), torch.int64, self.device),
            async_tensor_h2d(torch.cat(token_ids), torch.int64, self.device),
        ] = True

    def _build_suppression(
        self, params: Sequence[SamplingParams], output_token_ids: Sequence[Sequence[int]]
    ) -> None:
        rows, ids = [], []
        for i, p in enumerate(params):
            if len(output_token_ids[i]) < p.min_tokens and p.all_stop_token_ids:
                stop = sorted(p.all_stop_token_ids)
                self._check_ids("params.all_stop_token_ids", i, torch.tensor(stop))
                rows.extend([i] * len(stop))
                ids.extend(stop)
        if rows:
            self.suppress_rows = async_tensor_h2d(rows, torch.int64, self.device)
            self.suppress_ids = async_tensor_h2d(ids, torch.int64, self.device)

    def _check_ids(self, name: str, row: int, ids: torch.Tensor) -> None:
        # An out-of-range id would fault inside a device kernel, far from its cause.
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"{name}[{row}] holds a token id outside [0, {self.vocab_size})")


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)
