"""The TP step message: decoding gives the step rank 0 ran, a decode step's message does not grow
with the context, and the worker's tables are the same lists grown in place (so its metadata
builder writes only new tails, as rank 0's does)."""

import pickle

import numpy as np

from vllm.models.kimi_k3.amd.metadata import BatchSchedule, KimiMetadataBuilder
from vllm.v1.executor.step_message import StepDecoder, StepEncoder
from vllm.v1.worker.model_runner import StepInput


def decode_step(tables: list[list[int]], computed: list[int]) -> StepInput:
    n = len(tables)
    batch = BatchSchedule(list(computed), [1] * n, list(tables), list(range(1, n + 1)), n)
    return StepInput(list(range(n)), batch, list(range(n)))


def through_pipe(encoder: StepEncoder, decoder: StepDecoder, step: StepInput) -> StepInput:
    return decoder.decode(pickle.loads(pickle.dumps(encoder.encode(step))))


def test_decoded_steps_equal_rank_0s_through_growth_reorder_shrink_and_new_tables():
    enc, dec = StepEncoder(), StepDecoder()
    a, b, c = [1, 2], [3], [4, 5, 6]
    steps = [
        decode_step([a, b], [20, 10]),
        decode_step([a, b, c], [21, 11, 40]),  # a new row
        decode_step([a, b, c], [22, 12, 41]),  # unchanged
    ]
    a.append(7)  # grows by appending, as the KV cache manager's tables do
    steps.append(decode_step([a, b, c], [32, 13, 42]))
    steps.append(decode_step([c, a], [43, 33]))  # b finished: rows move
    steps.append(decode_step([[8, 9], c, a], [5, 44, 34]))  # a new request in front
    steps.append(decode_step([[1, 2, 7]], [35]))  # a copy of a's table: sent whole
    for step in steps:
        got = through_pipe(enc, dec, step)
        assert got == step


def test_a_table_cut_in_place_is_sent_whole():
    # Not what the KV cache manager does today (its tables only grow while a request holds
    # them), but a same-list shrink must not leave the worker a stale, longer table.
    enc, dec = StepEncoder(), StepDecoder()
    a = [1, 2, 3]
    assert through_pipe(enc, dec, decode_step([a], [40])) == decode_step([[1, 2, 3]], [40])
    del a[1:]
    a.append(9)
    assert through_pipe(enc, dec, decode_step([a], [41])).batch.block_tables[0] == [1, 9]
    a.append(5)
    assert through_pipe(enc, dec, decode_step([a], [42])).batch.block_tables[0] == [1, 9, 5]


def test_a_decode_steps_message_carries_only_the_changed_tails():
    enc, num_blocks = StepEncoder(), 512
    tables = [list(range(1 + i * num_blocks, 1 + (i + 1) * num_blocks)) for i in range(64)]
    enc.encode(decode_step(tables, [16 * num_blocks - 1] * 64))
    tables[5].append(10**6)  # one row crosses into a new block
    step = decode_step(tables, [16 * num_blocks] * 64)
    message = enc.encode(step)
    assert message.table_changes == [(5, num_blocks, [10**6])]
    # The whole tables (what was sent before) are ~50x the message.
    assert len(pickle.dumps(message)) * 50 < len(pickle.dumps(step))


def test_worker_tables_grow_in_place_and_its_builder_writes_only_new_tails():
    enc, dec = StepEncoder(), StepDecoder()
    tables = [[1, 2], [3, 4]]
    first = through_pipe(enc, dec, decode_step(tables, [20, 20]))
    builder = KimiMetadataBuilder(8, 2, 4, 16, 16, 4, "cpu")
    builder.stage(first.batch, input_ids=np.zeros(2, dtype=np.int64))
    tables[1].append(5)
    second = through_pipe(enc, dec, decode_step(tables, [21, 32]))
    assert second.batch.block_tables[0] is first.batch.block_tables[0]
    assert second.batch.block_tables[1] is first.batch.block_tables[1] == [3, 4, 5]
    # A stale host row proves that the builder took the in-place path (tail only) for row 1.
    builder.block_tables[1, 0] = 15  # on the CPU the staged bytes are the buffers
    builder.stage(second.batch, input_ids=np.zeros(2, dtype=np.int64))
    assert builder.block_tables[1, :3].tolist() == [15, 4, 5]
