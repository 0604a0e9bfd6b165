"""`KVCacheManager`: bookkeeping of the hybrid model's two caches, per request.

- MLA layers keep paged latents: `num_blocks` blocks of `block_size` tokens; a request owns a block
  table (block ids in token order) long enough for the tokens it has computed or is computing.
- KDA layers keep one fixed-size recurrent state per sequence: a request owns one of
  `num_kda_slots` slots from its first scheduled step until it finishes or is preempted.

Block 0 and slot 0 are never handed out: the padded rows of a CUDA-graph step write there, so a
padded row can never clobber a live request's cache.

There is no prefix caching: a KDA state summarises the whole prefix recurrently and is not a
function of one block of tokens, so shared MLA blocks alone could not skip any compute.
"""

from vllm.v1.request import Request

PAD_BLOCK_ID = 0
PAD_KDA_SLOT = 0


class KVCacheManager:
    """Hands out MLA blocks and KDA slots; all-or-nothing per allocation."""

    def __init__(self, num_blocks: int, block_size: int, num_kda_slots: int) -> None:
        for name, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("num_kda_slots", num_kda_slots),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        if num_kda_slots < 2:
            raise ValueError(
                f"num_kda_slots must be >= 2 (slot 0 is reserved), got {num_kda_slots}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kda_slots = num_kda_slots
        # Reversed so that pop() hands out low ids first (easier to read in logs and tests).
        self._free_blocks = list(range(num_blocks - 1, PAD_BLOCK_ID, -1))
        self._free_slots = list(range(num_kda_slots - 1, PAD_KDA_SLOT, -1))
        self.initial_num_free_blocks = len(self._free_blocks)
        self.initial_num_free_kda_slots = len(self._free_slots)
        # Request id -> its block table / KDA slot. Read only outside this class; the scheduler
        # reads them directly in its per-request decode loop (a method call each costs there).
        self.block_tables: dict[str, list[int]] = {}
        self.kda_slots: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def num_free_kda_slots(self) -> int:
        return len(self._free_slots)

    @property
    def usage(self) -> float:
        """Fraction of the usable (non-reserved) blocks held by requests."""
        return 1.0 - self.num_free_blocks / self.initial_num_free_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow `request`'s cache to hold `num_computed_tokens + num_new_tokens` tokens and give it
        a KDA slot if it has none. Returns False, changing nothing, when blocks or a slot run
        short."""
        if not isinstance(num_new_tokens, int) or num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be an integer >= 1, got {num_new_tokens!r}")
        rid = request.request_id
        table = self.block_tables.get(rid, [])
        if len(table) * self.block_size >= request.num_computed_tokens + num_new_tokens:
            # The common decode: the last block has room (a request with blocks has its slot).
            return True
        num_needed = self.num_blocks_for(request.num_computed_tokens + num_new_tokens) - len(table)
        needs_slot = rid not in self.kda_slots
        if num_needed > len(self._free_blocks) or (needs_slot and not self._free_slots):
            return False
        if needs_slot:
            self.kda_slots[rid] = self._free_slots.pop()
        for _ in range(num_needed):
            table.append(self._free_blocks.pop())
        self.block_tables[rid] = table
        return True

    def free(self, request: Request) -> None:
        """Return all of `request`'s blocks and its slot; a no-op for a request holding none."""
        self._free_blocks.extend(reversed(self.block_tables.pop(request.request_id, [])))
        slot = self.kda_slots.pop(request.request_id, None)
        if slot is not None:
            self._free_slots.append(slot)

    def get_block_table(self, request_id: str) -> list[int]:
        """The request's block table itself, not a copy (empty when it holds no blocks): read
        only. While the request holds it, it only grows, by appending, so a consumer that keeps
        the list needs to look only at its new tail (copying it would cost every step in
        proportion to the context)."""
        return self.block_tables.get(request_id, [])

    def get_kda_slot(self, request_id: str) -> int:
        if request_id not in self.kda_slots:
            raise ValueError(f"request_id {request_id!r} holds no KDA slot")
        return self.kda_slots[request_id]
