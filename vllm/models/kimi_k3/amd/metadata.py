"""The engine <-> model seam of the Kimi text model: building (and validating) the per-step
metadata. (The caches come from `vllm.v1.kv_cache_interface.allocate_kv_caches` over the model's
`get_kv_cache_spec()` and are bound to the layers once by `model.bind_kv_caches`.)

The model runner schedules a step as a `BatchSchedule`: per sequence (row), how many tokens are
already cached, how many are new, its MLA blocks and its KDA state slot, decodes first, one list
per field so that a step costs a few list and numpy passes rather than Python work per row.
`KimiMetadataBuilder.build` turns it into a `KimiMetadata` for `model.forward(input_ids,
metadata)`. Every rule the kernels rely on is checked there, with a ValueError, so that nothing
is checked inside the (CUDA-graph captured) forward:

- decodes come first, each exactly one token continuing a sequence (`num_computed > 0`);
- a sequence with `num_computed == 0` is a prefill starting from zero state, even a one-token
  prompt: a reused slot or block is never read for a new sequence;
- `T == sum(num_new) == query_start_loc[-1] <= max_num_tokens`, `N <= max_num_seqs`;
- KDA slots lie in `[1, num_kda_slots)` and are distinct; block ids lie in `[1, num_blocks)`, a
  table covers `num_computed + num_new` tokens and has at most `max_blocks_per_seq` entries.

A row's block table given again as the same list object, longer or as long, is taken to have
grown by appending only (as the KV cache manager's tables do): just its new tail is checked and
written, so a decode step costs O(changed blocks), not O(context). Another list that starts with
the blocks written (a copy, as the tensor-parallel workers receive) is compared to them and only
its tail written; any other table rewrites the row.

Padding rule (decode-only batches padded to a captured batch size with `pad_to`): block 0 and KDA
slot 0 are reserved dummies, never handed to a sequence. A padded row is a decode on KDA slot 0
with block table `[0, 0, ...]`, seq_len 1 and its slot mapping at block 0, offset 0, so padded
rows read and write only the dummies; real rows and real slots / blocks are untouched. The runner
feeds any token id for padded rows and ignores their outputs. `dummy_prompt` appends one more
dummy row to a padded batch: a prompt of that many tokens (at most a block) from zero state on KDA
slot 0, written at block 0 from offset 0. A batch of dummies alone then takes the mixed-step path,
which the runner warms up at start-up (`ModelRunner.warm_up_mixed_steps`).

The returned metadata views the builder's persistent fixed-capacity device buffers (staged in
pinned host memory and copied without blocking on CUDA): a CUDA graph captured on them replays
with whatever the next `build` (or `stage`, which fills the buffers without making the views)
wrote. A `KimiMetadata` is therefore valid until the next `build` or `stage`.
"""

import math
import operator
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch

from vllm.models.kimi_k3.amd.kda import KDAMetadata
from vllm.models.kimi_k3.amd.mla import MLAMetadata

# Reserved for padded rows (see the module docstring).
DUMMY_BLOCK = 0
DUMMY_KDA_SLOT = 0


@dataclass(slots=True)
class BatchSchedule:
    """A step's sequences, decodes first: row i has `num_new[i]` new tokens after `num_computed[i]`
    cached ones, its MLA cache blocks in order `block_tables[i]` and its KDA state slot (the same
    in every KDA layer) `kda_slots[i]`; the first `num_decodes` rows are decodes."""

    num_computed: list[int]
    num_new: list[int]
    block_tables: list[list[int]]
    kda_slots: list[int]
    num_decodes: int


@dataclass
class KimiMetadata:
    """What one forward needs besides the token ids: both attention kinds' view of the batch."""

    kda: KDAMetadata
    mla: MLAMetadata
    num_tokens: int  # T, padded rows included: the length of the runner's input_ids


class KimiMetadataBuilder:
    """Validates a step's schedule and fills the persistent buffers the metadata views."""

    def __init__(
        self,
        max_num_tokens: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        num_blocks: int,
        num_kda_slots: int,
        device: torch.device | str,
    ) -> None:
        for name, value, low in (
            ("max_num_tokens", max_num_tokens, 1), ("max_num_seqs", max_num_seqs, 1),
            ("max_blocks_per_seq", max_blocks_per_seq, 1), ("block_size", block_size, 1),
            ("num_blocks", num_blocks, 2), ("num_kda_slots", num_kda_slots, 2),
        ):  # fmt: skip
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        self.max_num_tokens = max_num_tokens
        self.max_num_seqs = max_num_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_kda_slots = num_kda_slots
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        n, t = max_num_seqs, max_num_tokens
        # Every buffer is a view of one packed byte buffer, staged in (pinned) host memory and
        # uploaded with a single copy per step; the block tables come last so that the copy can
        # stop after the rows in use.
        fields = (
            ("query_start_loc", torch.int32, (n + 1,)),
            # int64: fla-core's chunked KDA takes int64 offsets (see `KDAMetadata`).
            ("prefill_query_start_loc", torch.int64, (n + 1,)),
            ("seq_lens", torch.int32, (n,)),
            ("kda_slots", torch.int64, (n,)),
            ("has_initial_state", torch.bool, (n,)),
            ("slot_mapping", torch.int64, (t,)),
            ("input_ids", torch.int64, (t,)),  # the step's token ids, when `stage` gets them
            ("block_tables", torch.int32, (n, max_blocks_per_seq)),
        )
        offsets, size = [], 0
        for _, dtype, shape in fields:
            offsets.append(size)
            size += -(-math.prod(shape) * dtype.itemsize // 8) * 8  # 8-byte aligned views
        self._host = torch.zeros(size, dtype=torch.uint8, pin_memory=pin)
        # On the CPU the staged bytes are the metadata: nothing to copy.
        self._dev = torch.zeros(size, dtype=torch.uint8, device=self.device) if pin else self._host
        self._np: dict[str, np.ndarray] = {}
        for (name, dtype, shape), off in zip(fields, offsets, strict=True):
            nbytes = math.prod(shape) * dtype.itemsize
            view = self._dev[off : off + nbytes].view(dtype).view(shape)
            setattr(self, name, view)
            self._np[name] = self._host[off : off + nbytes].view(dtype).view(shape).numpy()
        self._tables_offset = offsets[-1]
        # Per host row: the block table list last written there and how many of its entries
        # were (validated and) written; see `_num_written`.
        self._row_tables: list[list[int] | None] = [None] * n
        self._row_lens = np.zeros(n, dtype=np.int64)
        self._copied = torch.cuda.Event() if pin else None
        self._slot_ids = frozenset(range(1, num_kda_slots))

    def build(
        self, batch: BatchSchedule, pad_to: int | None = None, input_ids: np.ndarray | None = None,
        dummy_prompt: int = 0,
    ) -> KimiMetadata:  # fmt: skip
        """Metadata for `batch`; `pad_to` pads a decode-only batch with dummy rows to that many
        sequences, and `dummy_prompt` (with `pad_to`) appends a dummy prompt of that many tokens
        (see the module docstring). `input_ids` (int64, one per new token), when given, are
        uploaded into `self.input_ids`."""
        t = self.stage(batch, pad_to, input_ids, dummy_prompt)
        num_decodes = batch.num_decodes
        nd = num_decodes if pad_to is None else pad_to  # padded rows are decodes too
        num_prefills = len(batch.num_new) - num_decodes + (dummy_prompt > 0)
        n = nd + num_prefills
        start = int(self._np["query_start_loc"][num_decodes])
        kda = KDAMetadata(
            query_start_loc=self.query_start_loc[: n + 1],
            state_slots=self.kda_slots[:n],
            has_initial_state=self.has_initial_state[:n],
            num_decodes=nd,
            num_prefills=num_prefills,
            prefill_query_start_loc=self.prefill_query_start_loc[: num_prefills + 1],
        )
        prefills = self._prefill_contexts(batch, start)
        if dummy_prompt:  # nothing cached: its context is its new tokens, the step's last
            prefills.append((t - dummy_prompt, t, self.slot_mapping[t - dummy_prompt : t]))
        mla = MLAMetadata(
            num_decodes=nd,
            slot_mapping=self.slot_mapping[:t],
            decode_block_tables=self.block_tables[:nd],
            decode_seq_lens=self.seq_lens[:nd],
            prefills=prefills,
        )
        return KimiMetadata(kda, mla, t)

    def stage(
        self, batch: BatchSchedule, pad_to: int | None = None, input_ids: np.ndarray | None = None,
        dummy_prompt: int = 0,
    ) -> int:  # fmt: skip
        """`build` without making the metadata's views: fills and uploads the buffers, which is
        all a CUDA-graph replay needs (the graph holds its own views). Returns the step's token
        count T (dummy rows included)."""
        computed, new, lens = self._validate(batch, pad_to, dummy_prompt)
        n_real = len(new)
        t_real = int(new.sum())
        if input_ids is not None and len(input_ids) != t_real:
            raise ValueError(f"input_ids: {len(input_ids)} ids for {t_real} new tokens")
        if self._copied is not None:
            # The staging buffers are about to be overwritten: the last build's copies out of
            # them must have run (they normally have, long before the next step is built).
            self._copied.synchronize()
        n = n_real if pad_to is None else pad_to
        n_all = n + (dummy_prompt > 0)
        self._write_tables(batch.block_tables, lens, n_real, n_all)
        h, bs = self._np, self.block_size
        t = t_real + n - n_real
        qsl = h["query_start_loc"][: n_all + 1]
        qsl[0] = 0
        np.cumsum(new, out=qsl[1 : n_real + 1])
        h["seq_lens"][:n_real] = computed + new
        h["kda_slots"][:n_real] = batch.kda_slots
        h["has_initial_state"][:n_real] = computed > 0
        # Slot of every token: its sequence's block at position // block_size.
        if t_real == n_real:  # one token per row (decode-only steps): no per-token expansion
            rows, positions = np.arange(n_real), computed
        else:
            rows = np.repeat(np.arange(n_real), new)
            positions = np.repeat(computed - qsl[:n_real], new) + np.arange(t_real)
        blocks = h["block_tables"][rows, positions // bs].astype(np.int64)
        h["slot_mapping"][:t_real] = blocks * bs + positions % bs
        if n > n_real:
            # Padded rows: one new token at position 0 of block 0, with "initial state" (slot 0).
            qsl[n_real + 1 : n + 1] = np.arange(t_real + 1, t + 1)
            h["seq_lens"][n_real:n] = 1
            h["kda_slots"][n_real:n] = DUMMY_KDA_SLOT
            h["has_initial_state"][n_real:n] = True
            h["slot_mapping"][t_real:t] = DUMMY_BLOCK * bs
        if dummy_prompt:
            # The dummy prompt: from zero state on slot 0, its tokens at block 0 from offset 0.
            qsl[n_all] = t + dummy_prompt
            h["seq_lens"][n] = dummy_prompt
            h["kda_slots"][n] = DUMMY_KDA_SLOT
            h["has_initial_state"][n] = False
            h["slot_mapping"][t : t + dummy_prompt] = DUMMY_BLOCK * bs + np.arange(dummy_prompt)
            t += dummy_prompt
        nd = n if pad_to is not None else batch.num_decodes  # padded rows are decodes too
        h["prefill_query_start_loc"][: n_all - nd + 1] = qsl[nd:] - qsl[nd]
        if input_ids is not None:
            h["input_ids"][:t_real] = input_ids
        if self._copied is not None:
            end = self._tables_offset + h["block_tables"][:n_all].nbytes
            self._dev[:end].copy_(self._host[:end], non_blocking=True)
            self._copied.record()
        return t

    def _write_tables(self, tables: list[list[int]], lens: np.ndarray, n_real: int, n: int) -> None:
        """Write the rows whose table is not the list last written there at the same length
        (range-checking what is new), and empty the dummy rows `n_real` to `n`."""
        old_lens = self._row_lens
        same = np.fromiter(map(operator.is_, tables, self._row_tables), bool, n_real)
        host = self._np["block_tables"]
        for i in np.flatnonzero(~same | (lens != old_lens[:n_real])).tolist():
            table = tables[i]
            done = self._num_written(i, table)
            tail = table[done:]
            if tail and (min(tail) < 1 or max(tail) >= self.num_blocks):
                raise ValueError(
                    f"batch.block_tables[{i}] {table} has a block outside [1, {self.num_blocks})"
                )
            end, old_end = len(table), int(old_lens[i])
            host[i, done:end] = tail
            if end < old_end:
                host[i, end:old_end] = DUMMY_BLOCK
            self._row_tables[i], old_lens[i] = table, end
        if n > n_real:
            for i in (np.flatnonzero(old_lens[n_real:n]) + n_real).tolist():
                host[i, : old_lens[i]] = DUMMY_BLOCK
                self._row_tables[i], old_lens[i] = None, 0

    def _prefill_contexts(
        self, batch: BatchSchedule, start: int
    ) -> list[tuple[int, int, torch.Tensor]]:
        """(start, end, context slots) of each prefill sequence, on the device (prefill steps
        are not captured). A sequence with nothing cached has its new tokens as
        its whole context: their slots are the step's slot mapping, already uploaded, viewed in
        place. Continued sequences' context slots go up in one host-to-device copy for all."""
        nd = batch.num_decodes
        computed, new = batch.num_computed[nd:], batch.num_new[nd:]
        if not new:
            return []
        bs = self.block_size
        ctx_lens = [c + w for c, w in zip(computed, new, strict=True)]
        host = []
        for table, c, ctx in zip(batch.block_tables[nd:], computed, ctx_lens, strict=True):
            if c:
                positions = torch.arange(ctx)
                host.append(torch.tensor(table)[positions // bs] * bs + positions % bs)
        uploaded = iter(())
        if host:
            lens = [len(h) for h in host]
            uploaded = iter(torch.cat(host).to(self.device, non_blocking=True).split(lens))
        out = []
        for c, w in zip(computed, new, strict=True):
            ctx_slots = next(uploaded) if c else self.slot_mapping[start : start + w]
            out.append((start, start + w, ctx_slots))
            start += w
        return out

    def _num_written(self, row: int, table: list[int]) -> int:
        """How many leading entries of `table` host row `row` already holds (see the module
        docstring)."""
        old, written = self._row_tables[row], int(self._row_lens[row])
        if written and len(table) >= written and (table is old or table[:written] == old[:written]):
            return written
        return 0

    def _validate(
        self, batch: BatchSchedule, pad_to: int | None, dummy_prompt: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Check everything but the block ids with a few whole-batch checks (a Python check per
        row cost microseconds per sequence per step); only a bad schedule is walked row by row,
        to name its first bad row. Block ids are checked where they are written, the new ones
        only (`_write_tables`). Returns each row's num_computed, num_new and table length
        (int64)."""
        computed, new = batch.num_computed, batch.num_new
        tables, slots = batch.block_tables, batch.kda_slots
        n, nd = len(new), batch.num_decodes
        if not len(computed) == len(tables) == len(slots) == n:
            raise ValueError(
                f"batch: {len(computed)} num_computed, {n} num_new, {len(tables)} block_tables "
                f"and {len(slots)} kda_slots: one per sequence each"
            )
        if not 0 <= nd <= n:
            raise ValueError(f"num_decodes must be in [0, {n}], got {nd}")
        if n > self.max_num_seqs:
            raise ValueError(f"batch: {n} sequences exceed max_num_seqs {self.max_num_seqs}")
        if pad_to is not None:
            if nd != n:
                raise ValueError("pad_to: only a decode-only batch can be padded")
            top = self.max_num_seqs - (dummy_prompt > 0)  # the dummy prompt takes a row too
            if not n <= pad_to <= top:
                raise ValueError(f"pad_to must be in [{n}, {top}], got {pad_to}")
        if not 0 <= dummy_prompt <= (0 if pad_to is None else self.block_size):
            raise ValueError(
                f"dummy_prompt must be in [0, {self.block_size}] (one block) with pad_to, 0 "
                f"without, got {dummy_prompt}"
            )
        tokens = sum(new)
        total = max(tokens, pad_to or 0) + dummy_prompt  # the dummy rows' tokens included
        if total > self.max_num_tokens:
            raise ValueError(f"batch: {total} tokens exceed max_num_tokens {self.max_num_tokens}")
        lens, slot_set = list(map(len, tables)), set(slots)
        # Given min(new) >= 1, the decodes have one token each iff they sum to their count.
        if n and (
            min(new) < 1
            or sum(new[:nd]) != nd
            or min(computed[:nd], default=1) < 1
            or min(computed[nd:], default=0) < 0
            or len(slot_set) < n
            or not self._slot_ids.issuperset(slot_set)
            or max(lens) > self.max_blocks_per_seq
        ):
            self._raise_for_first_bad_row(batch)
        computed, lens = np.array(computed, dtype=np.int64), np.array(lens, dtype=np.int64)
        # One token per row (decode-only steps): no list to convert.
        new = np.ones(n, dtype=np.int64) if tokens == n else np.array(new, dtype=np.int64)
        if (lens * self.block_size < computed + new).any():
            self._raise_for_first_bad_row(batch)
        return computed, new, lens

    def _raise_for_first_bad_row(self, batch: BatchSchedule) -> NoReturn:
        seen_slots = set()
        rows = zip(
            batch.num_computed, batch.num_new, batch.block_tables, batch.kda_slots, strict=True
        )
        for i, (computed, new, table, slot) in enumerate(rows):
            if i < batch.num_decodes and (new != 1 or computed < 1):
                raise ValueError(
                    f"batch row {i} is a decode: it needs num_new == 1 and num_computed >= 1 (a "
                    f"new sequence is a prefill), got {new} new after {computed}"
                )
            if new < 1 or computed < 0:
                raise ValueError(
                    f"batch row {i}: num_new must be >= 1 and num_computed >= 0, got {new} and "
                    f"{computed}"
                )
            if not 1 <= slot < self.num_kda_slots:
                raise ValueError(
                    f"batch.kda_slots[{i}] {slot} is outside [1, {self.num_kda_slots})"
                )
            if slot in seen_slots:
                raise ValueError(f"batch.kda_slots[{i}] {slot} is used by another sequence")
            seen_slots.add(slot)
            if len(table) > self.max_blocks_per_seq:
                raise ValueError(
                    f"batch.block_tables[{i}] has {len(table)} blocks, more than "
                    f"max_blocks_per_seq {self.max_blocks_per_seq}"
                )
            if len(table) * self.block_size < computed + new:
                raise ValueError(
                    f"batch.block_tables[{i}]: {len(table)} blocks of {self.block_size} do not "
                    f"hold {computed + new} tokens"
                )
        # Only reached if the whole-batch checks and this walk ever disagreed: still refuse.
        raise ValueError("batch: the schedule failed a batch check that no single row fails")
