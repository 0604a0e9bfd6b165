"""ModelRunner._sampling_metadata: the last step's SamplingMetadata is reused only while the rows
are the same requests in the same order and nothing in it depends on their token histories; and
`execute` returns the logits of the rows asked."""

import pytest
import torch

import vllm.v1.worker.model_runner as runner_module
from vllm.models.kimi_k3.amd.metadata import BatchSchedule
from vllm.sampling_params import SamplingParams
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.request import Request
from vllm.v1.worker.model_runner import ModelRunner, StepInput

VOCAB = 32
CPU = torch.device("cpu")


def bare_runner() -> ModelRunner:
    # Only the sampling state: no model, no caches.
    runner = ModelRunner.__new__(ModelRunner)
    runner.device, runner.vocab_size = CPU, VOCAB
    runner.generators, runner._last_sampling = {}, None
    runner.prompt_logprobs_done = {}
    runner.unseeded_generator = torch.Generator(CPU).manual_seed(0)
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


class _EchoModel:
    """hidden = the token ids as one float column; logits = hidden."""

    def __call__(self, input_ids: torch.Tensor, metadata) -> torch.Tensor:
        return input_ids.float()[:, None]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


class _UploadingBuilder:
    """Writes the step's ids into the runner's input buffer, as the metadata builder does."""

    def __init__(self, input_ids: torch.Tensor) -> None:
        self.input_ids = input_ids

    def build(self, batch, input_ids=None):
        self.input_ids[: len(input_ids)] = torch.from_numpy(input_ids)


@pytest.mark.parametrize(
    "rows,consecutive",
    [([], True), ([0, 1], True), ([5], True), ([2, 3, 4], True), ([0, 1, 5], False),
     ([4, 2], False)],
)  # fmt: skip
def test_execute_computes_the_logits_of_exactly_the_rows_asked(rows, consecutive, monkeypatch):
    """Consecutive rows are sliced (no index upload), others gathered: either way the rows
    asked, in order."""
    runner = bare_runner()
    runner.max_num_tokens, runner.graphs, runner.last_sampled = 16, {}, None
    runner.input_ids = torch.zeros(16, dtype=torch.long)
    runner.builder, runner.model = _UploadingBuilder(runner.input_ids), _EchoModel()
    uploads = []

    def upload(data, dtype, device):
        uploads.append(list(data))
        return async_tensor_h2d(data, dtype, device)

    monkeypatch.setattr(runner_module, "async_tensor_h2d", upload)
    ids = [10 + i for i in range(6)]
    batch = BatchSchedule([0], [6], [[1]], [1], 0)
    logits = runner.execute(StepInput(ids, batch, rows))
    assert logits[:, 0].tolist() == [float(ids[r]) for r in rows]
    assert uploads == ([] if consecutive else [rows])


def test_freeing_a_row_drops_the_cached_metadata_and_a_request_outside_it_does_not():
    runner = bare_runner()
    a, b = request("a", temperature=0.7, seed=3), request("b", temperature=0.0)
    first = runner._sampling_metadata([a, b], CPU)
    runner.free_requests(["waiting"])  # not a row: the cache still serves the next step
    assert runner._sampling_metadata([a, b], CPU) is first
    runner.free_requests(["a"])
    # Not kept for rows that cannot come back (it held `a` and its generator alive).
    assert runner._last_sampling is None and "a" not in runner.generators
