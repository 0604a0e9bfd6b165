"""The OpenAI-compatible HTTP server (`vllm serve`): FastAPI app, request/response models, and
one handler module per endpoint family."""
