"""`AsyncScheduler`: a decode step scheduled one step ahead, while the step before it still runs.

A decode step's host work (scheduling, metadata staging, the graph launch, then the scheduler and
output updates once its tokens are back) otherwise leaves the device idle: at batch 1 on the H200
that was ~0.45 ms of a ~3 ms step (docs/performance.md). With the next step launched before the
current one's tokens are read back, the device runs the steps back to back.

`schedule_ahead(step)` schedules the continuation of a decode-only step `step` that is launched
but not yet recorded: the same sequences in the same order, one token further, each fed the token
that `step` samples for it (the model runner copies those on the device; their ids are unknown
here). It schedules nothing, and returns None, unless that continuation is what `schedule()`
would give once `step` is recorded, up to the rows of sequences that end with `step`'s token:

- nothing waits, or the running sequences fill `max_num_seqs` (so no prefill would be admitted),
  and every running sequence is in `step`;
- a sequence that ends with `step`'s token (on a stop token, which cannot be foreseen, or at
  `max_tokens` or `max_model_len`, which can) keeps its row, and the engine drops what the
  continuation computed for it: its cache is freed when `step` is recorded and only reused by
  steps enqueued after the continuation. Leaving such rows out would reorder the rows that the
  device feeds from `step`'s samples, and a sequence ends in most steps of a large batch. A
  continuation in which every sequence ends by length is not scheduled: it would all be waste;
- each sequence's cache can grow by the continuation's token without preempting anything (its
  position stays below `max_model_len`: `step`'s token is at most the last one).
"""

from vllm.v1.core.sched.output import ScheduledRequest, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler


class AsyncScheduler(Scheduler):
    """`Scheduler` with `schedule_ahead` (module docstring)."""

    def schedule_ahead(self, step: SchedulerOutput) -> SchedulerOutput | None:
        if len(self._pending) != 1 or step is not self._pending[0]:
            raise ValueError("step must be the only scheduled step not yet recorded")
        entries = step.entries
        # Waiting requests would be admitted unless the running ones fill max_num_seqs.
        admits = self.waiting and len(self.running) < self.max_num_seqs
        if admits or len(entries) != len(self.running):
            return None
        # Equal counts: every entry is still running (an ended one has left `running`).
        max_len = self.max_model_len
        goes_on = False
        for entry in entries:
            request = entry.request
            if not entry.is_decode:
                return None
            goes_on = goes_on or (
                len(request.output_token_ids) + 1 < request.max_tokens
                and request.num_tokens + 1 < max_len
            )
        if not goes_on:
            return None
        kv = self.kv_cache_manager
        # The cache holds the step's tokens so far; the continuation writes one more, which needs
        # a new block where the step fills its last one. Counted first: None changes nothing.
        size = kv.block_size
        grows = sum(len(e.block_table) * size < e.num_computed_tokens + 2 for e in entries)
        if grows > kv.num_free_blocks:
            return None
        ahead = []
        for entry in entries:
            kv.allocate_slots(entry.request, entry.num_new_tokens + 1)
            row = ScheduledRequest(
                entry.request_id, entry.request, [], entry.num_computed_tokens + 1, 1, True,
                entry.block_table, entry.kda_slot, False, True,
            )  # fmt: skip
            ahead.append(row)
        out = SchedulerOutput(ahead, follows=True)
        self._pending.append(out)
        return out
