"""ModelRunner._sampling_metadata: the last step's SamplingMetadata is reused only while the rows
are the same requests in the same order and nothing in it depends on their token histories."""

import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request
from vllm.v1.worker.model_runner import ModelRunner

VOCAB = 32
CPU = torch.device("cpu")


def bare_runner() -> ModelRunner:
    # Only the sampling state: no model, no caches.
    runner = ModelRunner.__new__(ModelRunner)
    runner.device, runner.vocab_size = CPU, VOCAB
    runner.generators, runner._last_sampling = {}, None
    return runner


def request(name: str, **params) -> Request:
    sp = SamplingParams(**params)
    sp.update_from_tokenizer(eos_token_id=2)
    return Request(name, [5, 6, 7], sp, eos_token_id=2, max_tokens=8, arrival_index=0)


def test_same_requests_reuse_the_metadata_other_rows_rebuild_it():
    runner = bare_runner()
    a, b = request("a", temperature=0.7, top_k=4), request("b", temperature=0.0, seed=None)
    first = runner._sampling_metadata([a, b], CPU)
    a.output_token_ids.append(9)
    assert runner._sampling_metadata([a, b], CPU) is first
    swapped = runner._sampling_metadata([b, a], CPU)
    assert swapped is not first and swapped.greedy_mask.tolist() == [True, False]
    assert runner._sampling_metadata([b], CPU) is not swapped


def test_history_dependent_metadata_is_rebuilt_every_step():
    runner = bare_runner()
    penalized = request("p", repetition_penalty=1.3)
    first = runner._sampling_metadata([penalized], CPU)
    penalized.output_token_ids.append(11)
    second = runner._sampling_metadata([penalized], CPU)
    assert (
        second is not first and bool(second.seen_mask[0, 11]) and not bool(first.seen_mask[0, 11])
    )


def test_min_tokens_suppression_lifts_once_due_and_is_then_reused():
    runner = bare_runner()
    req = request("m", min_tokens=1)
    due = runner._sampling_metadata([req], CPU)
    assert due.suppress_ids.tolist() == [2]  # eos suppressed before the first token
    req.output_token_ids.append(9)
    lifted = runner._sampling_metadata([req], CPU)
    assert lifted is not due and lifted.suppress_rows is None
    req.output_token_ids.append(10)
    assert runner._sampling_metadata([req], CPU) is lifted
