"""Tensor parallelism on torch.distributed (NCCL on GPU, gloo on CPU); no-ops at TP=1."""

from vllm.distributed.parallel_state import (
    destroy_model_parallel,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    initialize_model_parallel,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_broadcast,
)

__all__ = [
    "destroy_model_parallel",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "initialize_model_parallel",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
    "tensor_model_parallel_broadcast",
]
