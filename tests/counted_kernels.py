"""The fork's Triton kernels, by module: the registry that tests/conftest.py's `triton_launches`
fixture counts and tests/triton_utils/test_kernels_compile_for_hopper.py compiles. A module of its
own (not conftest.py) so that tests import it unambiguously: several test folders have a
conftest.py."""

# module -> Triton kernels launched from it (by `kernel[grid](...)`)
COUNTED_KERNELS = {
    "vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token": (
        "_rmsnorm_gated_fp8_kernel", "_rmsnorm_gated_fp8_wide_kernel",
    ),
    "vllm.model_executor.layers.quantization.utils.fp8_per_token": (
        "_per_token_fp8_quant_kernel",
    ),
    "vllm.models.kimi_k3.amd.ops.fused_kda_decode": (
        "_fused_kda_decode_kernel", "_kda_decode_epilogue_kernel",
    ),
    "vllm.model_executor.layers.fused_moe.experts_triton": (
        "_moe_gate_up_kernel", "_moe_down_kernel",
    ),
    "vllm.model_executor.layers.fused_moe.router": ("_grouped_topk_kernel",),
    "vllm.model_executor.layers.fused_moe.fused_router": ("_fused_router_topk_kernel",),
    "vllm.model_executor.layers.fused_moe.group_rows": (
        "_moe_group_rows_kernel", "_moe_group_count_kernel", "_moe_group_place_kernel",
    ),
    "vllm.model_executor.layers.fused_moe.experts_triton_grouped": (
        "_moe_grouped_gate_up_kernel", "_moe_grouped_down_kernel",
    ),
    "vllm.model_executor.layers.fused_moe.weighted_sum": ("_moe_weighted_sum_kernel",),
    "vllm.model_executor.layers.fused_moe.gather_rows": ("_gather_rows_kernel",),
    "vllm.model_executor.kernels.linear.gemv": (
        "_gemv_kernel", "_gemv_split_reduce_kernel",
    ),
    "vllm.model_executor.kernels.linear.rms_norm_gemv": ("_rms_norm_gemv_kernel",),
    "vllm.model_executor.layers.ops.rms_norm": ("_rms_norm_kernel",),
    "vllm.model_executor.layers.ops.silu_and_mul": ("_silu_and_mul_kernel",),
    "vllm.models.kimi_k3.amd.ops.causal_conv1d": (
        "_causal_conv1d_prefill_kernel", "_conv_state_update_kernel",
    ),
    "vllm.models.kimi_k3.amd.ops.mla_cache_write": ("_mla_cache_write_kernel",),
    "vllm.models.kimi_k3.amd.ops.mla_prefill": ("_mla_prefill_operands_kernel",),
    "vllm.v1.sample.ops.argmax": ("_argmax_partial_kernel", "_argmax_pick_kernel"),
}  # fmt: skip


class _RecordedKernel:
    """A Triton kernel whose launches append their keyword arguments (constexprs and launch
    options) to a list, then run."""

    def __init__(self, kernel, launches: list[dict]) -> None:
        self._kernel, self._launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self._launches.append(kwargs)
            return self._kernel[grid](*args, **kwargs)

        return launch


def record_launches(monkeypatch, module, name: str) -> list[dict]:
    """Replace `module.name` for the test by a kernel that records each launch's keyword
    arguments and runs; returns the list they go to (checks that a launch choice reached the
    kernel, which numeric checks alone would not see)."""
    launches: list[dict] = []
    monkeypatch.setattr(module, name, _RecordedKernel(getattr(module, name), launches))
    return launches
