"""Request bodies and response pieces in-process (no server): field limits and the legacy
completion logprobs."""

import pytest

from vllm.entrypoints.openai.protocol import MAX_N, ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize("n", [MAX_N + 1, 2**62])
def test_n_over_the_limit_is_refused_before_the_engine_sees_it(n: int) -> None:
    # Every completion becomes a sequence when the request is added: 2**62 of them allocated
    # until the server was killed for memory.
    for request in (
        CompletionRequest(prompt="hi", n=n),
        ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], n=n),
    ):
        with pytest.raises(ValueError, match=f"n must be <= {MAX_N}"):
            request.sampling_params(max_tokens=1, logprobs=None)
    assert CompletionRequest(prompt="hi", n=MAX_N).sampling_params(1, None).n == MAX_N
