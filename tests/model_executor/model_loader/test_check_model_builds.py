"""`check_model_builds`: the model built on the meta device before any worker starts, so that what
its layers refuse (a TP size that does not split them, `ignore` patterns that split a fused layer)
is an argument error up front; the dry run leaves the process's TP state as it was and logs
nothing (the real build logs)."""

import logging
import threading

import pytest
import torch

from vllm.config.quantization import parse_quantization_config
from vllm.distributed.parallel_state import get_tensor_model_parallel_world_size
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.model_executor.model_loader.loader import build_model, check_model_builds
from vllm.models.registry import model_class
from vllm.transformers_utils.configs import load_model_config

BIG = "kimi-linear-48b-a3b"
PR_RECIPE = '{"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\\\.o_proj$).*"]}'


def big_args(**kwargs) -> EngineArgs:
    return EngineArgs(BIG, load_format="dummy", skip_tokenizer_init=True, **kwargs)


@pytest.mark.parametrize("tp", [2, 8, 32])
def test_sizes_the_48b_model_splits_over_pass(tp: int) -> None:
    config = big_args(tensor_parallel_size=tp, quantization_config=PR_RECIPE)
    assert config.create_engine_config().parallel_config.tensor_parallel_size == tp


@pytest.mark.parametrize("tp", [3, 64])
def test_a_size_that_does_not_split_is_refused_up_front(tp: int) -> None:
    with pytest.raises(ValueError) as error:
        big_args(tensor_parallel_size=tp).create_engine_config()
    message = str(error.value)
    assert message.startswith(f"tensor_parallel_size: {tp} does not shard this model: model.")
    assert f"TP {tp}" in message or f"TP size {tp}" in message
    assert get_tensor_model_parallel_world_size() == 1


def test_the_tp_layout_is_restored_after_a_refusal() -> None:
    config = load_model_config(resolve_model(BIG)[0])
    with pytest.raises(ValueError, match="KDA heads do not split over TP 64"):
        check_model_builds(config, torch.bfloat16, None, 64)
    assert get_tensor_model_parallel_world_size() == 1
    check_model_builds(config, torch.bfloat16, None, 1)


def test_the_layout_holds_in_its_own_thread_only() -> None:
    """An engine stepping on another thread (a server's loop, at its own TP size) keeps its size
    while a config is checked."""
    from vllm.distributed import parallel_state

    seen: list[tuple[int, int]] = []

    def look() -> None:
        seen.append(
            (
                get_tensor_model_parallel_world_size(),
                parallel_state.get_tensor_model_parallel_rank(),
            )
        )

    with parallel_state.tensor_parallel_layout(4):
        other = threading.Thread(target=look)
        other.start()
        other.join()
        look()
    look()
    assert seen == [(1, 0), (4, 0), (1, 0)]


def test_the_dry_run_logs_nothing_that_the_real_build_logs() -> None:
    config = load_model_config(resolve_model(BIG)[0])
    quant = OnlineQuantizationConfig(
        parse_quantization_config(PR_RECIPE), model_class(config).packed_modules_mapping
    )
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    root = logging.getLogger("vllm")
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        check_model_builds(config, torch.bfloat16, quant, 2)
        assert records == []
        build_model(config, torch.bfloat16, quant, "meta")  # the kernel choice of each o_proj
        assert records
        assert root.level == logging.INFO and handler.filters == []
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_the_quiet_dry_run_leaves_other_threads_logging() -> None:
    """A server's engine loop logs on another thread while an engine config is checked."""
    from vllm.logger import init_logger, quiet_below

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    root = logging.getLogger("vllm")
    root.addHandler(handler)
    logger = init_logger("vllm.test_quiet")
    try:
        with quiet_below(logging.ERROR):
            logger.warning("from the dry run")
            other = threading.Thread(target=lambda: logger.warning("from the engine loop"))
            other.start()
            other.join()
            logger.error("an error still shows")
        logger.warning("after")
    finally:
        root.removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "from the engine loop",
        "an error still shows",
        "after",
    ]
