"""`SchedulerOutput`: what one engine step computes (scheduler -> model runner)."""

from dataclasses import dataclass, field

from vllm.v1.request import Request


# Not frozen: a frozen dataclass costs ~2 us more to build, per request per step; slots: cheaper
# to build and read.
@dataclass(slots=True)
class ScheduledRequest:
    """One request's row group in a step: `num_new_tokens` tokens starting at position
    `num_computed_tokens`.

    `block_table` is the KV cache manager's live list (see `KVCacheManager.get_block_table`).
    `is_decode`: exactly one token with some history already cached. `is_new_slot`: the KDA slot
    was just assigned (nothing computed yet), so its state must start at zero. `samples`: the chunk
    reaches the last known token, so the row's logits are sampled.
    """

    request_id: str
    request: Request
    token_ids: list[int]
    num_computed_tokens: int
    num_new_tokens: int
    is_decode: bool
    block_table: list[int]
    kda_slot: int
    is_new_slot: bool
    samples: bool


@dataclass(frozen=True)
class SchedulerOutput:
    """The step's requests, decodes first (in running order), then prefill chunks.

    `follows`: a decode-only step scheduled while the step before it was still running (see
    `AsyncScheduler`): its entries are that step's, in the same order, and their input tokens are
    that step's samples, which only the device holds yet (their `token_ids` are empty).
    """

    entries: list[ScheduledRequest]
    preempted_request_ids: list[str] = field(default_factory=list)
    follows: bool = False

    @property
    def num_decodes(self) -> int:
        return sum(e.is_decode for e in self.entries)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(e.num_new_tokens for e in self.entries)
