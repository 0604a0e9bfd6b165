"""What a step's sampling hands back to the engine: `SampledStep`, the samples on their way to
the host (the model runner's `sample` enqueues the copies; the engine reads them when it needs
them, which lets it launch the next step first), and `ModelRunnerOutput`, their host form."""

from dataclasses import dataclass

import torch


@dataclass
class ModelRunnerOutput:
    sampled: dict[str, list[int]]
    # request_id -> (token ids, logprobs, rank of the sampled token) of its sampled token
    logprobs: dict[str, tuple[list[int], list[float], int]]
    # request_id -> one (token ids, logprobs, rank) per prompt position this step
    prompt_logprobs: dict[str, list[tuple[list[int], list[float], int]]]


@dataclass
class SampledStep:
    """A step's samples on their way to the host: tensors that the device is copying into host
    memory, complete once `ready` has passed (None on the CPU: already there)."""

    request_ids: list[str]  # per sampling row
    tokens: torch.Tensor  # [rows] int64
    # (token ids, logprobs, ranks) of the sampling rows, when some row asked for logprobs
    logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    num_logprobs: list[int | None]  # per sampling row
    # (request_id, (token ids, logprobs, ranks)) per prompt-logprob slice
    prompt_logprobs: list[tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]
    ready: "torch.cuda.Event | None"

    def result(self) -> ModelRunnerOutput:
        """Wait for the copies (not for anything enqueued after them) and unpack them."""
        if self.ready is not None:
            self.ready.synchronize()
        result = ModelRunnerOutput({}, {}, {})
        ids = self.request_ids
        result.sampled = dict(zip(ids, [[t] for t in self.tokens.tolist()], strict=True))
        if self.logprobs is not None:
            tokens, values, ranks = (t.tolist() for t in self.logprobs)
            for i, k in enumerate(self.num_logprobs):
                if k is not None:
                    result.logprobs[ids[i]] = (tokens[i][: k + 1], values[i][: k + 1], ranks[i])
        for request_id, lp in self.prompt_logprobs:
            rows = zip(*(t.tolist() for t in lp), strict=True)
            result.prompt_logprobs[request_id] = list(rows)
        return result


def copy_to_host(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Device tensors copied into pinned host memory without waiting (a copy into pageable
    memory would wait for the stream); CPU tensors as they are."""
    out = []
    for t in tensors:
        if t.device.type == "cpu":
            out.append(t)
            continue
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.append(host.copy_(t, non_blocking=True))
    return tuple(out)
