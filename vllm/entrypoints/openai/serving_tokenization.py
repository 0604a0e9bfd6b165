"""POST /tokenize, POST /detokenize and GET /tokenizer_info: the remote tokenizer that lm_eval's
`local-completions` probes for (with them it never downloads a tokenizer from the hub)."""

from typing import Any

from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_engine import OpenAIError, OpenAIServing


class OpenAIServingTokenization(OpenAIServing):
    def __init__(self, *args, chat: OpenAIServingChat, **kw) -> None:
        super().__init__(*args, **kw)
        self.chat = chat

    def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        if (request.prompt is None) == (request.messages is None):
            raise OpenAIError("give exactly one of prompt and messages", 400, "prompt")
        if request.messages is not None:
            chat = ChatCompletionRequest(
                messages=request.messages,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                chat_template=request.chat_template,
                chat_template_kwargs=request.chat_template_kwargs,
                tools=request.tools,
            )
            ids = self.encode(self.chat.render(chat), False, "messages")
        else:
            ids = self.encode(request.prompt, request.add_special_tokens, "prompt")
        strs = self.tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None
        return TokenizeResponse(
            count=len(ids), max_model_len=self.max_model_len, tokens=ids, token_strs=strs
        )

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        ids = self.encode(request.tokens, False, "tokens")
        return DetokenizeResponse(prompt=self.tokenizer.decode(ids, skip_special_tokens=False))

    def tokenizer_info(self) -> dict[str, Any]:
        # The length the engine serves, as /v1/models and /tokenize report it: not the tokenizer
        # file's own model_max_length, which generation does not go by (as upstream).
        return dict(self.tokenizer.tokenizer_info(), model_max_length=self.max_model_len)
