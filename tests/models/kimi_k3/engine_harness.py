"""Just enough of an engine to drive the Kimi model (or one attention layer) in tests: block and
KDA-slot bookkeeping per sequence, caches from the model's spec bound once, and the package's
`KimiMetadataBuilder` for every step's metadata."""

import torch

from vllm.models.kimi_k3.amd.metadata import BatchSchedule, KimiMetadata, KimiMetadataBuilder
from vllm.v1.kv_cache_interface import allocate_kv_caches


class SingleLayer(torch.nn.Module):
    """One KDA or MLA layer in the shape `EngineHarness` drives: its spec as layer 0."""

    def __init__(self, layer: torch.nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer = layer
        self.dtype = dtype

    def get_kv_cache_spec(self):
        return {0: self.layer.get_kv_cache_spec(self.dtype)}

    def bind_kv_caches(self, kda_pools, mla_caches) -> None:
        self.layer.bind_kv_cache(kda_pools[0] if kda_pools else mla_caches[0])


class EngineHarness:
    """Blocks and slots are handed out from free lists (LIFO: a freed one is reused first, so
    reuse is exercised); block 0 and slot 0 are the reserved dummies, never handed out."""

    def __init__(
        self,
        model,
        num_blocks: int = 64,
        block_size: int = 4,
        num_kda_slots: int = 9,
        max_num_seqs: int = 8,
        max_num_tokens: int = 256,
        max_blocks_per_seq: int = 16,
        device: str = "cpu",
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.kda_pools, self.mla_caches = allocate_kv_caches(
            model.get_kv_cache_spec(), num_blocks, block_size, num_kda_slots, device
        )
        model.bind_kv_caches(self.kda_pools, self.mla_caches)
        self.builder = KimiMetadataBuilder(
            max_num_tokens, max_num_seqs, max_blocks_per_seq, block_size, num_blocks,
            num_kda_slots, device,
        )  # fmt: skip
        self.device = device
        self.free_blocks = list(range(num_blocks - 1, 0, -1))
        self.free_slots = list(range(num_kda_slots - 1, 0, -1))
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self.slots: dict[int, int] = {}

    def schedule(
        self, new: dict[int, int], pad_to: int | None = None, decodes: bool = True
    ) -> KimiMetadata:
        """Metadata for `new` (sequence id -> number of new tokens, in batch order). The leading
        run of one-token steps of already-started sequences are the decodes (none if not
        `decodes`: they are scheduled as one-token prefill chunks instead)."""
        batch, decoding = BatchSchedule([], [], [], [], 0), decodes
        for sid, count in new.items():
            start = self.lens.get(sid, 0)
            if sid not in self.slots:
                self.slots[sid] = self.free_slots.pop()
            table = self.tables.setdefault(sid, [])
            while len(table) * self.block_size < start + count:
                table.append(self.free_blocks.pop())
            decoding = decoding and start > 0 and count == 1
            batch.num_decodes += decoding
            batch.num_computed.append(start)
            batch.num_new.append(count)
            batch.block_tables.append(list(table))
            batch.kda_slots.append(self.slots[sid])
            self.lens[sid] = start + count
        return self.builder.build(batch, pad_to)

    def free(self, sid: int) -> None:
        """The sequence is finished: its slot and blocks go back (and are reused first)."""
        self.free_slots.append(self.slots.pop(sid))
        self.free_blocks += reversed(self.tables.pop(sid))
        del self.lens[sid]

    def step(self, new_tokens: dict[int, list[int]], pad_to: int | None = None) -> torch.Tensor:
        """One forward of a causal LM; returns logits `[T, vocab]` (padded rows included)."""
        meta = self.schedule({sid: len(t) for sid, t in new_tokens.items()}, pad_to)
        ids = [t for toks in new_tokens.values() for t in toks]
        # Padded rows take any id; not the usual pad id 0, whose embedding is zero: real values
        # show that padded rows write only the dummies.
        ids += [1] * (meta.num_tokens - len(ids))
        with torch.no_grad():
            hidden = self.model(torch.tensor(ids, dtype=torch.long, device=self.device), meta)
            return self.model.compute_logits(hidden)
