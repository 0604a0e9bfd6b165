"""The step message that rank 0 sends the tensor-parallel workers: a `StepInput` whose block tables
travel as changes.

Sending every sequence's whole block table each step made the message, its pickling on rank 0 and
its unpickling on the worker O(batch x context) (536 KB, ~2 ms each way at 256 sequences of 8k
tokens on a CPU), and the worker's metadata builder, handed fresh copies, compared every table by
value. Rank 0 gets the KV cache manager's live lists, which only grow by appending while a
sequence holds them, so its encoder sends, per row, nothing for an unchanged table, the appended
tail for the same list grown, and the whole table otherwise. The worker's decoder keeps one list
per row and extends it in place, so that its builder, like rank 0's, sees the same list object
grown and writes only the new tail.

The encoder and the decoder hold mirrored per-row state: every message must reach every worker,
in order (the executor's pipes do that; a worker that fails ends the engine).
"""

from dataclasses import dataclass

from vllm.models.kimi_k3.amd.metadata import BatchSchedule
from vllm.v1.worker.model_runner import StepInput


@dataclass(slots=True)
class StepMessage:
    """A `StepInput` with its block tables' changes instead of the tables."""

    input_ids: list[int] | None  # None: a step launched ahead (ids broadcast from rank 0)
    num_decodes: int
    logits_rows: list[int]
    num_computed: list[int]
    num_new: list[int]
    kda_slots: list[int]
    # (row, entries of the row's previous table kept (0: a new table), entries appended after
    # them), only for the rows whose table changed since the previous message.
    table_changes: list[tuple[int, int, list[int]]]


class StepEncoder:
    """Rank 0's side: remembers, per row, the table list it last sent and how long it was."""

    def __init__(self) -> None:
        self._sent: list[list[int] | None] = []
        self._sent_lens: list[int] = []

    def encode(self, step: StepInput) -> StepMessage:
        batch = step.batch
        tables, lens = batch.block_tables, list(map(len, batch.block_tables))
        extra = len(tables) - len(self._sent)
        sent, sent_lens = self._sent + [None] * extra, self._sent_lens + [0] * extra
        changes = []
        # One pass finds the rows to look at (few in a decode step), then only those are read.
        rows = zip(tables, sent, lens, sent_lens, strict=False)
        for row in [i for i, (t, s, n, m) in enumerate(rows) if t is not s or n != m]:
            table, kept = tables[row], sent_lens[row]
            if table is not sent[row] or lens[row] < kept:
                changes.append((row, 0, list(table)))
            else:
                changes.append((row, kept, table[kept:]))
        self._sent, self._sent_lens = list(tables), lens
        return StepMessage(
            step.input_ids, batch.num_decodes, step.logits_rows, batch.num_computed, batch.num_new,
            batch.kda_slots, changes,
        )  # fmt: skip


class StepDecoder:
    """A worker's side: one block-table list per row, replaced or extended in place as told."""

    def __init__(self) -> None:
        self._tables: list[list[int]] = []

    def decode(self, message: StepMessage) -> StepInput:
        n, tables = len(message.num_new), self._tables
        del tables[n:]
        tables.extend([] for _ in range(n - len(tables)))
        for row, kept, tail in message.table_changes:
            if not kept:
                tables[row] = tail  # a fresh list (unpickled): this row's from now on
            elif len(tables[row]) == kept:
                tables[row] += tail
            else:
                raise RuntimeError(
                    f"step message: row {row} keeps {kept} blocks of a table of "
                    f"{len(tables[row])}: the worker missed a message"
                )
        batch = BatchSchedule(
            message.num_computed, message.num_new, list(tables), message.kda_slots,
            message.num_decodes,
        )  # fmt: skip
        return StepInput(message.input_ids, batch, message.logits_rows)
