"""Device-call probe (thirty-sixth run): `benchmarks/benchmark_latency.py` (argv) with the decode
launches chosen for the batch class (this tree) or, with AB_OLD=1, for the exact count as before
af2246d / cb9c88b: `decode_batch_class` is replaced by the identity in the modules that choose
decode launches. The graphs are captured at class sizes either way, so only the eager decode
rows of mixed steps differ: the batch phase (prompts prefilled while earlier ones decode) shows
what compiling a kernel in each mixed step cost.

    AB_OLD=1 python ab_mixed.py <benchmark_latency.py arguments>
"""

import os
import sys

sys.path.insert(0, "benchmarks")

if os.environ.get("AB_OLD") == "1":
    import vllm.model_executor.layers.fused_moe.experts_triton_grouped as grouped
    import vllm.model_executor.layers.fused_moe.group_rows as group_rows
    import vllm.models.kimi_k3.amd.ops.fused_kda_decode_config as kda_config
    import vllm.models.kimi_k3.amd.ops.mla_decode_config as mla_config

    for module in (grouped, group_rows, kda_config, mla_config):
        module.decode_batch_class = lambda n: n

import benchmark_latency  # noqa: E402

if __name__ == "__main__":
    sys.exit(benchmark_latency.main(sys.argv[1:]))
