"""The request log of the OpenAI server (`vllm serve --enable-log-requests`, as upstream's flag):
one INFO line per request the server hands to the engine, with its id, its prompt token ids (the
first `--max-log-len` of them) and its sampling parameters."""

from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams

__all__ = ["RequestLogger"]

logger = init_logger(__name__)


class RequestLogger:
    """Logs requests as they are added; `max_log_len` caps the token ids shown (None: all)."""

    def __init__(self, max_log_len: int | None = None) -> None:
        if max_log_len is not None and max_log_len < 0:
            raise ValueError(f"max_log_len must be >= 0 or None, got {max_log_len}")
        self.max_log_len = max_log_len

    def log_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        shown = prompt_ids if self.max_log_len is None else prompt_ids[: self.max_log_len]
        cut = f" (first {len(shown)})" if len(shown) < len(prompt_ids) else ""
        logger.info(
            "Received request %s: %d prompt tokens%s %s, params: %s",
            request_id, len(prompt_ids), cut, shown, params,
        )  # fmt: skip
