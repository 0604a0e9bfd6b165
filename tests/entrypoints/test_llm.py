"""The offline `LLM` API (CPU, torch reference kernels): bad arguments fail at construction with a
message naming the argument, before any worker starts; prompts as text or as token ids; `chat`
through the tiny model's chat template; the `use_tqdm` progress bar."""

import dataclasses
import io
import multiprocessing
from dataclasses import replace

import numpy as np
import pytest
import torch
from tqdm import tqdm

from vllm import LLM, SamplingParams, TextPrompt
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import SEED_MAX, SEED_MIN

MODEL = "kimi-linear-tiny"
ARGS = dict(max_model_len=128, max_num_seqs=4, kv_cache_memory=16 << 20)
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(torch_reference_kernels):
    llm = LLM(MODEL, **ARGS)
    yield llm
    llm.shutdown()


def tokens_of(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


# -- bad arguments --------------------------------------------------------------------------------

BAD_ARGUMENTS = [
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1"),
    (dict(tensor_parallel_size=1.5), "tensor_parallel_size must be an integer"),
    (dict(max_model_len=10**6), "max_model_len 1000000 exceeds the model's max_position"),
    (dict(max_model_len="many"), "max_model_len: cannot parse 'many'"),
    (dict(dtype="float8"), "dtype must be auto or one of"),
    (dict(dtype=["bfloat16"]), r"dtype must be auto or one of .*, got \['bfloat16'\]"),
    (dict(load_format="pt"), "load_format must be one of"),
    (dict(quantization_config="{linear: fp8}"), "quantization_config is not valid JSON"),
    (dict(quantization_config='{"linear": "fp4"}'), "quantization config field 'linear'"),
    (
        dict(quantization_config='{"linear": "fp8_per_token"}'),
        "field 'linear': no online method for 'fp8_per_token'; online quantization supports",
    ),
    (dict(quantization_config='{"lienar": "fp8_per_channel"}'), "unknown field 'lienar'"),
    (dict(tokenizer="/no/such/folder"), "tokenizer '/no/such/folder' is neither a folder"),
    (dict(generation_config="/no/such/folder"), "generation_config '/no/such/folder' does not"),
    (dict(enforce_eager="yes"), "enforce_eager must be a bool"),
    (dict(disable_log_stats="no"), "disable_log_stats must be a bool"),
    (dict(enable_prefix_caching="yes"), "enable_prefix_caching must be a bool or None"),
    (dict(disable_custom_all_reduce=1), "disable_custom_all_reduce must be a bool, got 1"),
    (dict(tokenizer_mode="slow"), "tokenizer_mode 'slow' is not supported: 'auto' only"),
    (dict(revision="main"), "revision 'main' cannot be honoured: vllm-k3 loads the model folder"),
    (dict(enable_chunked_prefill=False), "enable_chunked_prefill: turning it off is not supp"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype 'fp8' is not supported"),
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization must be in"),
    (dict(gpu_memory_utilization=True), "gpu_memory_utilization must be in"),
    (dict(max_model_len=1), "max_model_len must be >= 2"),
    (dict(max_model_len=2.5), "max_model_len: 2.5 is not a whole number of tokens"),
    (dict(tokenizer=123), "tokenizer must be a folder or a built-in model, got 123"),
    (dict(max_num_seqs=8, max_num_batched_tokens=4), r"max_num_batched_tokens \(4\) must be >="),
    (dict(tensor_parallel_size=2, tensor_paralel_size=2), "unknown arguments.*tensor_paralel_size"),
    (dict(seed=2**64), f"seed must be <= {2**64 - 1}"),  # was wrapped: the tokens of seed 0
    (dict(seed=-(2**63) - 1), f"seed must be >= {-(2**63)}"),
]


@pytest.mark.parametrize("kwargs, message", BAD_ARGUMENTS, ids=lambda v: str(v)[:40])
def test_bad_argument_fails_at_construction_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(MODEL, **dict(ARGS, **kwargs))
    assert multiprocessing.active_children() == []  # refused before any worker started


def test_every_bad_argument_is_named_in_one_error():
    """Each independent refusal, not only the first: a fix-and-retry loop per argument otherwise.
    A check that needs a refused value is skipped (no dtype: no model is built to check), and
    a single refusal is still raised as the error it is."""
    bad = dict(kv_cache_dtype="fp8", revision="main", max_num_seqs=0, dtype="float8")
    with pytest.raises(ValueError) as info:
        LLM(MODEL, **dict(ARGS, **bad))
    message = str(info.value)
    assert message.startswith("4 engine arguments refused:\n  "), message
    said = ["revision 'main' cannot be honoured", "max_num_seqs must be >= 1, got 0",
            "kv_cache_dtype 'fp8' is not supported", "dtype must be auto or one of"]  # fmt: skip
    assert [str(e)[: len(s)] for e, s in zip(info.value.errors, said, strict=True)] == said, message
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="^kv_cache_dtype 'fp8' is not supported") as info:
        LLM(MODEL, **dict(ARGS, kv_cache_dtype="fp8"))
    assert not hasattr(info.value, "errors")


def test_a_refused_bool_is_not_read_by_the_checks_after_it(vllm_records):
    """A bool field refused as no bool was still read by the checks that take the field: the
    truthy "no" was warned of as prefix caching asked for, and "yes" for skip_tokenizer_init
    was refused again beside a tokenizer ("exclude each other"), judged as if it were True."""
    bad = dict(skip_tokenizer_init="yes", tokenizer=MODEL, enable_prefix_caching="no")
    with pytest.raises(ValueError) as info:
        LLM(MODEL, **dict(ARGS, **bad))
    assert [str(e).split(" must ")[0] for e in info.value.errors] == [
        "skip_tokenizer_init",
        "enable_prefix_caching",
    ], str(info.value)
    assert not any("enable_prefix_caching has no" in r.getMessage() for r in vllm_records)


def test_a_refused_quantization_config_leaves_the_tp_check_to_run(monkeypatch):
    """The model is still built unquantized to check the TP size, and a bad `VLLM_*` variable
    among the refusals is named as such in the header."""
    with pytest.raises(ValueError) as info:
        LLM(MODEL, **dict(ARGS, quantization_config="{bad", tensor_parallel_size=3))
    message = str(info.value)
    assert message.startswith("2 engine arguments refused:"), message
    assert "quantization_config is not valid JSON" in message, message
    assert "tensor_parallel_size: 3 does not shard this model" in message, message
    monkeypatch.setenv("VLLM_TRITON_PDL", "maybe")
    with pytest.raises(ValueError) as info:
        LLM(MODEL, **dict(ARGS, max_num_seqs=0))
    message = str(info.value)
    assert message.startswith("2 engine arguments and environment variables refused:"), message


def test_unknown_model_is_named():
    with pytest.raises(ValueError, match="model 'kimi-huge' is neither a folder nor a built-in"):
        LLM("kimi-huge")
    with pytest.raises(ValueError, match="model must be a folder or a built-in model, got ''"):
        LLM("")


def test_model_that_is_a_file_is_named(tmp_path):
    """A weights file or config.json given for the folder that holds them."""
    for name in ("model.safetensors", "config.json"):
        (tmp_path / name).write_bytes(b"\x90\x00")
        with pytest.raises(
            ValueError, match=f"model '{tmp_path / name}' is a file, not a folder; pass the"
        ):
            LLM(str(tmp_path / name), skip_tokenizer_init=True)
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    with pytest.raises(ValueError, match=f"tokenizer '{tokenizer}' is a file, not a folder"):
        LLM(MODEL, tokenizer=str(tokenizer))


def test_tensor_parallel_size_that_does_not_divide_the_heads(torch_reference_kernels, monkeypatch):
    """Checked on the meta device before any worker starts: the error names the argument, the
    layer and the TP size."""
    from vllm.v1.engine import llm_engine

    def no_workers(config):
        raise AssertionError("an executor was started for a model that does not shard")

    monkeypatch.setattr(llm_engine, "Executor", no_workers)
    with pytest.raises(
        ValueError,
        match="tensor_parallel_size: 3 does not shard this model: .*KDA heads do not split over "
        "TP 3",
    ):
        LLM(MODEL, **dict(ARGS, tensor_parallel_size=3))
    assert multiprocessing.active_children() == []


def test_a_tp_engine_that_fails_late_leaves_the_process_free(torch_reference_kernels, monkeypatch):
    """A failure after the workers started (here the scheduler's construction) stops them and
    the process group: a later engine starts."""
    from vllm.v1.engine import llm_engine

    def refuse(*args, **kwargs):
        raise ValueError("refused on purpose")

    with monkeypatch.context() as patch:
        patch.setattr(llm_engine.Scheduler, "__init__", refuse)
        with pytest.raises(ValueError, match="refused on purpose"):
            LLM(MODEL, **dict(ARGS, tensor_parallel_size=2))
    assert multiprocessing.active_children() == []
    LLM(MODEL, **ARGS).shutdown()


@pytest.mark.parametrize("tp", [1, 2])
def test_generate_after_shutdown_is_refused(torch_reference_kernels, tp):
    """After `shutdown()` the engine refuses work by name (at TP 2 it used to run rank 0's shard
    alone and fail on the logits' shape; at TP 1 it silently went on); shutdown is idempotent."""
    llm = LLM(MODEL, **dict(ARGS, tensor_parallel_size=tp))
    llm.shutdown()
    llm.shutdown()
    for call in (
        lambda: llm.generate(["a"], GREEDY, use_tqdm=False),
        lambda: llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False),
        lambda: llm.llm_engine.step(),
    ):
        with pytest.raises(RuntimeError, match=r"the engine was shut down \(shutdown\(\)\)"):
            call()
    assert multiprocessing.active_children() == []
    assert llm.llm_engine.get_num_unfinished_requests() == 0


# -- prompts --------------------------------------------------------------------------------------


def test_text_and_token_id_prompts(llm):
    tokenizer = llm.get_tokenizer()
    texts = ["Question: 12 + 30 = ?", "héllo wörld"]
    ids = [tokenizer.encode(t) for t in texts]
    by_text = llm.generate(texts, GREEDY, use_tqdm=False)
    by_ids = llm.generate(ids, GREEDY, use_tqdm=False)
    assert [out.prompt for out in by_text] == texts
    assert [out.prompt for out in by_ids] == [None, None]
    assert [out.prompt_token_ids for out in by_text] == ids
    assert tokens_of(by_text) == tokens_of(by_ids)
    # One prompt, bare: a string, or a list of ints (not a list of one-token prompts).
    assert tokens_of(llm.generate(texts[0], GREEDY, use_tqdm=False)) == tokens_of(by_text[:1])
    assert tokens_of(llm.generate(ids[1], GREEDY, use_tqdm=False)) == tokens_of(by_ids[1:])
    # Upstream's dict forms (TextPrompt / TokensPrompt), in a list or bare (one prompt, not its
    # keys taken as prompts).
    by_dicts = llm.generate(
        [{"prompt": texts[0]}, {"prompt_token_ids": ids[1]}], GREEDY, use_tqdm=False
    )
    assert [out.prompt for out in by_dicts] == [texts[0], None]
    assert [out.prompt_token_ids for out in by_dicts] == ids
    assert tokens_of(by_dicts) == tokens_of(by_text)
    # Built as upstream scripts build them.
    typed = [TextPrompt(prompt=texts[0]), TokensPrompt(prompt_token_ids=ids[1], prompt="t")]
    by_types = llm.generate(typed, GREEDY, use_tqdm=False)
    assert [out.prompt for out in by_types] == [texts[0], "t"]
    assert tokens_of(by_types) == tokens_of(by_text)
    for bare in ({"prompt": texts[0]}, {"prompt_token_ids": ids[0]}):
        (one,) = llm.generate(bare, GREEDY, use_tqdm=False)
        assert one.prompt_token_ids == ids[0]
        assert tokens_of([one]) == tokens_of(by_text[:1])
    # Mixed, with one SamplingParams per prompt, outputs in prompt order.
    longer = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    mixed = llm.generate([ids[1], texts[0]], [longer, GREEDY], use_tqdm=False)
    assert [len(t) for t in tokens_of(mixed)] == [6, 4]
    assert tokens_of(mixed)[1] == tokens_of(by_text)[0]
    assert tokens_of(mixed)[0][:4] == tokens_of(by_ids)[1]


def test_numpy_token_ids_are_token_ids(llm):
    """Prompt and stop token ids as numpy integers (`list(array)`'s elements) are taken as the
    Python ints they hold: the same tokens, and the stop id stops."""
    ids = llm.get_tokenizer().encode("Question: 12 + 30 = ?")
    want = llm.generate([ids], GREEDY, use_tqdm=False)
    for prompts in ([list(np.array(ids))], list(np.array(ids))):  # in a list, and bare
        got = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert got[0].prompt_token_ids == ids and tokens_of(got) == tokens_of(want)
        assert all(type(t) is int for t in got[0].prompt_token_ids)
    first = tokens_of(want)[0][0]
    stop = SamplingParams(temperature=0.0, max_tokens=4, stop_token_ids=[np.int64(first)])
    assert stop.stop_token_ids == [first] and type(stop.stop_token_ids[0]) is int
    (out,) = llm.generate([ids], stop, use_tqdm=False)
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == first


@pytest.mark.parametrize("prompts", [None, 5, 2.0])
def test_prompts_that_are_not_prompts_are_a_value_error(llm, prompts):
    with pytest.raises(ValueError, match="^prompts must be a prompt or a sequence of prompts"):
        llm.generate(prompts, GREEDY, use_tqdm=False)


def test_a_max_tokens_past_max_model_len_ends_the_reply_there(llm):
    """As upstream: one prompt too long for its max_tokens fails no batch (max_model_len 128)."""
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    long, short = llm.generate([[5] * 120, "fine"], params, use_tqdm=False)
    assert len(long.outputs[0].token_ids) == 8 and long.outputs[0].finish_reason == "length"
    assert len(short.outputs[0].token_ids) == 50


def test_dict_prompts_take_upstreams_optional_keys_when_they_change_nothing(llm):
    """Upstream's TextPrompt / TokensPrompt have optional keys that some callers always set:
    null ones, and `cache_salt` (no prefix cache is shared between requests here), are taken."""
    (plain,) = llm.generate(["fine"], GREEDY, use_tqdm=False)
    text = {"prompt": "fine", "multi_modal_data": None, "cache_salt": "a"}
    ids = {"prompt_token_ids": plain.prompt_token_ids, "mm_processor_kwargs": None}
    # TokensPrompt's optional text: the ids are the prompt, the text what the output reports.
    both = {"prompt_token_ids": plain.prompt_token_ids, "prompt": "its text"}
    for prompt, reported in ((text, "fine"), (ids, None), (both, "its text")):
        (out,) = llm.generate([prompt], GREEDY, use_tqdm=False)
        assert out.outputs[0].token_ids == plain.outputs[0].token_ids
        assert out.prompt == reported


def test_truncate_prompt_tokens_runs_the_last_tokens_and_reports_them(llm):
    """As upstream: only the last k prompt tokens run (left truncation), checked against
    max_model_len once truncated. The output reports the prompt that ran: its token ids and their
    text (the given text would claim tokens that did not run)."""
    tokenizer = llm.get_tokenizer()
    text = "Question: 12 + 30 = ? Answer with a number."
    ids = tokenizer.encode(text)
    truncated = replace(GREEDY, truncate_prompt_tokens=5)
    (cut,) = llm.generate([text], truncated, use_tqdm=False)
    (last,) = llm.generate([ids[-5:]], GREEDY, use_tqdm=False)
    assert cut.prompt_token_ids == ids[-5:] and tokens_of([cut]) == tokens_of([last])
    assert cut.prompt == tokenizer.decode(ids[-5:], skip_special_tokens=False) != text
    # Nothing to cut (-1 is max_model_len): the prompt as given.
    for value in (len(ids), 128, -1):
        (whole,) = llm.generate(
            [text], replace(GREEDY, truncate_prompt_tokens=value), use_tqdm=False
        )
        assert whole.prompt == text and whole.prompt_token_ids == ids
    # A prompt longer than max_model_len runs once truncated to fit.
    long = list(range(5, 205))
    (fits,) = llm.generate([long], replace(GREEDY, truncate_prompt_tokens=100), use_tqdm=False)
    assert fits.prompt_token_ids == long[-100:] and len(tokens_of([fits])[0]) == 4
    # A chat's rendering is cut the same way, and its text follows.
    (chat,) = llm.chat([{"role": "user", "content": text}], truncated, use_tqdm=False)
    assert len(chat.prompt_token_ids) == 5
    assert chat.prompt == tokenizer.decode(chat.prompt_token_ids, skip_special_tokens=False)
    # detokenize=False decodes nothing, so the cut prompt has no text.
    (raw,) = llm.generate([text], replace(truncated, detokenize=False), use_tqdm=False)
    assert raw.prompt is None and raw.prompt_token_ids == ids[-5:]
    assert tokens_of([raw]) == tokens_of([cut])


@pytest.mark.parametrize(
    "prompts, params, message",
    [
        ([[1, "2"]], GREEDY, "^prompt 1: prompt must be a string or a list of token ids"),
        (["a", "b"], [GREEDY], "sampling_params has 1 entries for 3 prompts"),
        (["b"], [GREEDY, None], r"^sampling_params\[1\] must be a SamplingParams, got None"),
        (["b"], (GREEDY, {"temperature": 0}), r"^sampling_params\[1\] must be a SamplingParams"),
        ([""], GREEDY, "^prompt 1: the prompt is empty"),
        ([[5, 100000]], GREEDY, "^prompt 1: prompt token ids outside the vocabulary"),
        (["a \ud800"], GREEDY, "^prompt 1: .*not valid Unicode"),
        ([list(range(5, 205))], GREEDY, "^prompt 1: the prompt has 200 tokens; max_model_len 128"),
        (["a", "b", [5] * 128], GREEDY, "^prompt 3: the prompt has 128 tokens"),
        (
            [{"prompt_ids": [5]}],
            GREEDY,
            r"^prompt 1: a dict prompt holds 'prompt' .*\['prompt_ids'\]",
        ),
        (
            [{"prompt": "a", "multi_modal_data": {"image": 1}}],
            GREEDY,
            r"^prompt 1: a dict prompt holds 'prompt' .*\['multi_modal_data', 'prompt'\]",
        ),
        ([{"prompt": None}], GREEDY, r"^prompt 1: a dict prompt holds 'prompt' .*got keys \[\]"),
        ([{"prompt": [5]}], GREEDY, "^prompt 1: 'prompt' must be a string"),
        ([{"prompt_token_ids": "5"}], GREEDY, "^prompt 1: 'prompt_token_ids' must be a list"),
        # As upstream, a truncation longer than max_model_len is refused.
        (
            [[5] * 10],
            [GREEDY, replace(GREEDY, truncate_prompt_tokens=129)],
            r"^prompt 1: truncate_prompt_tokens \(129\) must be <= max_model_len \(128\)",
        ),
        # Truncated before the length check: -1 keeps 128 tokens, which leave no room.
        (
            [list(range(5, 205))],
            replace(GREEDY, truncate_prompt_tokens=-1),
            "^prompt 1: the prompt has 128 tokens; max_model_len 128",
        ),
    ],
)
def test_bad_prompts_are_refused_and_leave_nothing_queued(llm, prompts, params, message):
    """The error names the prompt's index; nothing of the call is left in the engine, and the
    next call runs."""
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine", *prompts], params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    kv = llm.llm_engine.kv_cache_manager
    assert kv.num_free_blocks == kv.initial_num_free_blocks
    (after,) = llm.generate(["fine"], GREEDY, use_tqdm=False)
    assert len(after.outputs[0].token_ids) == 4


def test_an_interrupt_while_adding_leaves_nothing_queued(llm, monkeypatch):
    """Ctrl-C while the prompts are tokenized and added (a long batch spends a while there):
    those already added are aborted, not left to run in the next call."""
    engine = llm.llm_engine
    add, calls = engine.add_request, []

    def interrupted_at_the_third(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 3:
            raise KeyboardInterrupt
        add(*args, **kwargs)

    monkeypatch.setattr(engine, "add_request", interrupted_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["a", "b", "c", "d"], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    assert engine.get_num_unfinished_requests() == 0
    assert not engine.has_unfinished_requests()
    kv = engine.kv_cache_manager
    assert kv.num_free_blocks == kv.initial_num_free_blocks


def test_the_engine_seed_makes_unseeded_sampling_reproducible(torch_reference_kernels):
    """As upstream documents for its `seed` (default 0): two engines built with the same seed
    sample the same tokens for requests without a seed of their own; the caller's global torch
    generator is neither read nor advanced."""
    prompts = ["alpha beta", "the quick brown fox", "x"]
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    runs = []
    for seed in (0, 0, 1):
        other = LLM(MODEL, **dict(ARGS, seed=seed))
        state = torch.random.get_rng_state()
        runs.append(tokens_of(other.generate(prompts, params, use_tqdm=False)))
        assert torch.equal(torch.random.get_rng_state(), state)
        other.shutdown()
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    for seed in (SEED_MIN, SEED_MAX):  # the ends of torch's generators' seeds are seeds
        LLM(MODEL, **dict(ARGS, seed=seed)).shutdown()


# -- chat -----------------------------------------------------------------------------------------


def test_chat_renders_the_models_template(llm):
    tokenizer = llm.get_tokenizer()
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    second = [{"role": "user", "content": "2 + 2?"}]
    outputs = llm.chat([first, second], GREEDY, use_tqdm=False)
    for conversation, out in zip([first, second], outputs, strict=True):
        rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        # The template's own markers, then each message in order, ending on the reply's cue.
        assert rendered.startswith(tokenizer.bos_token)
        positions = [rendered.index(m["content"]) for m in conversation]
        assert positions == sorted(positions)
        assert tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False) == rendered
        assert out.prompt == rendered  # as upstream: the rendered conversation
        (expected,) = llm.generate([out.prompt_token_ids], GREEDY, use_tqdm=False)
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    (single,) = llm.chat(second, GREEDY, use_tqdm=False)  # one conversation, not a list of them
    assert single.prompt_token_ids == outputs[1].prompt_token_ids
    # Tuples for lists, as sequences: each message had a role, yet they were refused as if not.
    for messages in (tuple(second), (tuple(second),), [tuple(second)]):
        (same,) = llm.chat(messages, GREEDY, use_tqdm=False)
        assert same.prompt_token_ids == single.prompt_token_ids
    (closed,) = llm.chat(second, GREEDY, use_tqdm=False, add_generation_prompt=False)
    assert len(closed.prompt_token_ids) < len(single.prompt_token_ids)
    # chat_template_kwargs win over add_generation_prompt (as upstream), and may not set the
    # call's own messages or tokenize.
    kwargs = {"add_generation_prompt": False}
    (again,) = llm.chat(second, GREEDY, use_tqdm=False, chat_template_kwargs=kwargs)
    assert again.prompt_token_ids == closed.prompt_token_ids
    with pytest.raises(ValueError, match="chat_template_kwargs may not set tokenize"):
        llm.chat(second, GREEDY, use_tqdm=False, chat_template_kwargs={"tokenize": False})
    for kwargs in ("x", [1]):  # were dict()'s errors, naming no argument
        with pytest.raises(ValueError, match="chat_template_kwargs must be a dict"):
            llm.chat(second, GREEDY, use_tqdm=False, chat_template_kwargs=kwargs)
    for messages in (None, 5, "hi"):  # None and 5 were TypeErrors from len()
        with pytest.raises(ValueError, match="^messages must be a conversation"):
            llm.chat(messages, GREEDY, use_tqdm=False)
    # A conversation that cannot be rendered or run is named by its index; nothing is left.
    with pytest.raises(ValueError, match="^conversation 1: messages must be a list of dicts"):
        llm.chat([second, [{"content": "no role"}]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="^conversation 1: .*not valid Unicode"):
        llm.chat([second, [{"role": "user", "content": "a \ud800"}]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="^conversation 2: the prompt has [0-9]+ tokens"):
        llm.chat([first, second, [{"role": "user", "content": "x " * 200}]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params has 1 entries for 2 conversations"):
        llm.chat([first, second], [GREEDY], use_tqdm=False)
    assert llm.llm_engine.get_num_unfinished_requests() == 0


def test_chat_passes_tools_to_the_template(llm, monkeypatch):
    """`tools` (upstream's argument, as the server's request field) reaches the template."""
    tokenizer = llm.get_tokenizer()
    template = (
        "{{ bos_token }}{% for t in tools or [] %}tool {{ t['function']['name'] }};{% endfor %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    monkeypatch.setattr(tokenizer, "chat_template", template)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    conversation = [{"role": "user", "content": "hi"}]

    def prompt_of(**kwargs) -> str:
        (out,) = llm.chat(conversation, GREEDY, use_tqdm=False, **kwargs)
        return tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)

    assert prompt_of(tools=tools) == tokenizer.bos_token + "tool get_weather;hi"
    assert prompt_of() == tokenizer.bos_token + "hi"
    other = [{"type": "function", "function": {"name": "other", "parameters": {}}}]
    # chat_template_kwargs win, as over add_generation_prompt.
    assert prompt_of(tools=tools, chat_template_kwargs={"tools": other}).endswith("tool other;hi")


def test_chat_continues_the_final_message(llm):
    """The prompt ends with the final message's text (no end of turn after it), as the server's
    `continue_final_message` renders it, whatever its role; with a generation prompt it is
    refused."""
    tokenizer = llm.get_tokenizer()
    conversation = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "It"}]
    (out,) = llm.chat(
        conversation, GREEDY, use_tqdm=False, add_generation_prompt=False,
        continue_final_message=True,
    )  # fmt: skip
    prompt = tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
    assert prompt == "<|bos|>user: 2 + 2?<|eos|>\nassistant: It"
    (closed,) = llm.chat(conversation, GREEDY, use_tqdm=False, add_generation_prompt=False)
    end_of_turn = tokenizer.encode("<|eos|>\n", add_special_tokens=False)
    assert closed.prompt_token_ids == [*out.prompt_token_ids, *end_of_turn]
    # chat_template_kwargs may set it too, as they may set add_generation_prompt.
    kwargs = {"add_generation_prompt": False, "continue_final_message": True}
    (again,) = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template_kwargs=kwargs)
    assert again.prompt_token_ids == out.prompt_token_ids
    with pytest.raises(ValueError, match="cannot both be true"):
        llm.chat(conversation, GREEDY, use_tqdm=False, continue_final_message=True)
    # As upstream, a final message of another role is continued too: a user's text completed.
    (user,) = llm.chat(
        conversation[:1], GREEDY, use_tqdm=False, add_generation_prompt=False,
        continue_final_message=True,
    )  # fmt: skip
    prompt = tokenizer.decode(user.prompt_token_ids, skip_special_tokens=False)
    assert prompt == "<|bos|>user: 2 + 2?" and len(user.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="^conversation 1: continue_final_message .*there is none"):
        llm.chat(
            [conversation, []], GREEDY, use_tqdm=False, add_generation_prompt=False,
            continue_final_message=True,
        )  # fmt: skip
    assert llm.llm_engine.get_num_unfinished_requests() == 0


def test_chat_renders_a_template_of_its_own(llm):
    """`chat_template` replaces the tokenizer's for this call; `chat_template_kwargs` reach it."""
    tokenizer = llm.get_tokenizer()
    own = "{{ bos_token }}{{ greeting }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    conversation = [{"role": "user", "content": "hi"}]
    kwargs = {"greeting": "hey "}
    (out,) = llm.chat(
        conversation, GREEDY, use_tqdm=False, chat_template=own, chat_template_kwargs=kwargs
    )
    prompt = tokenizer.decode(out.prompt_token_ids, skip_special_tokens=False)
    assert prompt == tokenizer.bos_token + "hey [hi]"
    (default,) = llm.chat(conversation, GREEDY, use_tqdm=False)
    assert tokenizer.decode(default.prompt_token_ids, skip_special_tokens=False).endswith(
        "user: hi<|eos|>\nassistant: "
    )
    with pytest.raises(ValueError, match="^conversation 0: chat_template does not parse"):
        llm.chat(conversation, GREEDY, use_tqdm=False, chat_template="{% if %}")
    with pytest.raises(ValueError, match="chat_template_kwargs may not set chat_template"):
        llm.chat(conversation, GREEDY, use_tqdm=False, chat_template_kwargs={"chat_template": own})


# -- progress bar ---------------------------------------------------------------------------------


def test_use_tqdm_shows_a_progress_bar(llm, capsys):
    llm.generate(["a", "b", "c"], GREEDY, use_tqdm=True)
    shown = capsys.readouterr().err
    assert "Processed prompts" in shown and "3/3" in shown
    llm.generate(["a", "b", "c"], GREEDY, use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err


def test_use_tqdm_takes_a_bar_factory(llm, capsys):
    """As upstream: a callable builds the bar (`functools.partial(tqdm, ...)`, a notebook tqdm),
    called with the total and description; it is updated once per prompt and closed."""
    made = []

    def factory(**kwargs):
        made.append((kwargs, tqdm(file=io.StringIO(), **kwargs)))
        return made[-1][1]

    llm.generate(["a", "b", "c"], GREEDY, use_tqdm=factory)
    ((kwargs, bar),) = made
    assert kwargs["total"] == 3 and kwargs["desc"] == "Processed prompts"
    assert bar.n == 3
    assert "Processed prompts" in bar.fp.getvalue()
    assert "Processed prompts" not in capsys.readouterr().err  # not the default bar as well
    llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=factory)
    assert len(made) == 2 and made[1][1].n == 1


def test_upstream_keyword_names_are_accepted():
    # Upstream's `kv_cache_memory_bytes=` is our `kv_cache_memory`; both at once is ambiguous.
    args = {k: v for k, v in ARGS.items() if k != "kv_cache_memory"}
    llm = LLM("kimi-linear-tiny", kv_cache_memory_bytes=16 << 20, **args)
    try:
        assert llm.llm_engine.config.cache_config.kv_cache_memory == 16 << 20
    finally:
        llm.shutdown()
    with pytest.raises(ValueError, match="both kv_cache_memory_bytes and kv_cache_memory"):
        LLM("kimi-linear-tiny", kv_cache_memory_bytes=1 << 20, **ARGS)


def test_upstream_keywords_that_change_nothing_here_are_taken(llm):
    """Upstream's engine keywords whose effect is already this engine's behaviour are taken
    (they were unknown arguments), and the outputs are the same (docs/engine.md)."""
    neutral = LLM(
        MODEL, **ARGS, disable_log_stats=True, enable_prefix_caching=True,
        enable_chunked_prefill=True, disable_custom_all_reduce=True, tokenizer_mode="auto",
        revision=None,
    )  # fmt: skip
    try:
        prompts = ["Question: 12 + 30 = ?", [5, 6, 7]]
        got = neutral.generate(prompts, GREEDY, use_tqdm=False)
        assert tokens_of(got) == tokens_of(llm.generate(prompts, GREEDY, use_tqdm=False))
        # Upstream's output fields, as upstream's LLM fills them with stats logging off: no
        # metrics; and with the prefix cache asked for, still no cached token (there is none).
        assert [(out.metrics, out.num_cached_tokens) for out in got] == [(None, 0), (None, 0)]
    finally:
        neutral.shutdown()


def test_engine_args_build_an_llm_through_its_keywords(llm):
    """Upstream's benchmarks build their engine as `LLM(**dataclasses.asdict(engine_args))`, and
    so does benchmarks/benchmark_tp_greedy.py: every field, at its default (disable_log_stats
    False included, which the offline engine takes though it keeps no stats log), is a keyword
    that `LLM` takes."""
    built = LLM(**dataclasses.asdict(EngineArgs(MODEL, **ARGS)))
    try:
        prompts = ["Question: 12 + 30 = ?"]
        got = built.generate(prompts, GREEDY, use_tqdm=False)
        assert tokens_of(got) == tokens_of(llm.generate(prompts, GREEDY, use_tqdm=False))
        # Upstream's disable_log_stats=False would fill `metrics` with timestamps; this engine
        # records none, so it is None rather than made up (docs/engine.md).
        assert got[0].metrics is None and got[0].num_cached_tokens == 0
    finally:
        built.shutdown()
