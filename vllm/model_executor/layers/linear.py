"""Linear layers that shard for tensor parallelism and delegate their math to a quant method.

Weights are stored as upstream does, `[N_local, K_local]` before quantization, with a
`weight_loader` attribute that cuts the local shard out of a full checkpoint tensor:

- `ReplicatedLinear`: every rank holds the whole weight.
- `ColumnParallelLinear`: output features split across ranks; output stays sharded.
- `MergedColumnParallelLinear`: several column-parallel projections stored as one weight; each
  checkpoint tensor is loaded by its shard index.
- `RowParallelLinear`: input features split across ranks; the partial outputs are all-reduced.
  Its input may be a `QuantizedActivation`, passed untouched to the quant method.

`forward` returns `(output, output_bias)` as upstream: the bias is returned separately only when
`skip_bias_add` is set.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn import Parameter

from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.kernels.linear import gemv as gemv_op
from vllm.model_executor.kernels.linear import gemv_config as gemv_cfg
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    as_quantized_activation,
)
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)
from vllm.model_executor.model_loader.weight_utils import copy_checked

WeightLoader = Callable[..., None]


class LinearMethodBase(QuantizeMethodBase):
    """Quant methods for linear layers.

    The default `create_weights` registers the unquantized `[N_local, K_local]` weight that the
    loaders fill: the unquantized method uses it as is, online methods quantize it after loading.
    """

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        weight_loader: WeightLoader,
    ) -> None:
        weight = Parameter(
            torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            requires_grad=False,
        )
        weight.weight_loader = weight_loader
        layer.register_parameter("weight", weight)

    def apply(
        self,
        layer: torch.nn.Module,
        x: "torch.Tensor | QuantizedActivation",
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethodBase):
    """`F.linear` in the parameter dtype; on NVIDIA GPUs, bf16 / fp16 inputs of at most
    `BF16_GEMV_MAX_M` rows (kernels/linear/gemv_config.py) take the Triton GEMV (gemv.py), which
    reads the weight at a higher share of HBM bandwidth than cuBLAS at decode sizes."""

    def apply(self, layer, x, bias=None) -> torch.Tensor:
        as_quantized_activation(x, None)  # a pre-quantized input here is a producer bug: raise
        weight = layer.weight
        if gemv_cfg.use_bf16_gemv(x, weight):
            # Not passed as static (gemv.py, "Static weights"): at one row the bf16 GEMVs after
            # a short launch took 0.4-0.7 us longer with their first tiles loaded early.
            out = gemv_op.gemv(x.reshape(-1, weight.shape[1]), weight, bias)
            return out.reshape(*x.shape[:-1], weight.shape[0])
        return F.linear(x, weight, bias)


class LinearBase(torch.nn.Module):
    """Common setup: sizes, dtype, and the quant method chosen by the quantization config.

    `shard_names` (fused layers): the checkpoint modules the layer holds, one per output shard,
    set before the quant method is chosen so that an ignore rule weighs exactly those shards.
    """

    # True for layers that need the raw activation (LoRA): producers must not pre-quantize.
    requires_unquantized_input = False

    def __init__(
        self,
        input_size: int,
        output_size: int,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        shard_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.shard_names = shard_names
        self.input_size = input_size
        self.output_size = output_size
        self.skip_bias_add = skip_bias_add
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.prefix = prefix
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        method = quant_config.get_quant_method(self, prefix) if quant_config else None
        self.quant_method: LinearMethodBase = method or UnquantizedLinearMethod()

    def _create(self, input_size_per_partition: int, output_partition_sizes: list[int]) -> None:
        self.input_size_per_partition = input_size_per_partition
        self.output_partition_sizes = output_partition_sizes
        self.output_size_per_partition = sum(output_partition_sizes)
        self.quant_method.create_weights(
            self,
            input_size_per_partition,
            output_partition_sizes,
            self.input_size,
            self.output_size,
            self.params_dtype,
            self.weight_loader,
        )

    def _create_bias(self, bias: bool, size: int) -> None:
        if bias:
            self.bias = Parameter(torch.zeros(size, dtype=self.params_dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    def _output(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return out, (self.bias if self.skip_bias_add else None)

    def forward(self, x):
        """Layers whose output needs no reduction: the quant method adds the bias."""
        bias = None if self.skip_bias_add else self.bias
        return self._output(self.quant_method.apply(self, x, bias))

    def extra_repr(self) -> str:
        return (
            f"in={self.input_size}, out={self.output_size}, tp={self.tp_size}, "
            f"quant_method={type(self.quant_method).__name__}"
        )


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        self._create(input_size, [output_size])
        self._create_bias(bias, output_size)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        copy_checked(param.data, loaded_weight, self.prefix)


class ColumnParallelLinear(LinearBase):
    """Output features split over the TP ranks; each rank returns its slice of the output."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        output_sizes: list[int] | None = None,
        prefix: str = "",
        replicated_shards: frozenset[int] = frozenset(),
        shard_names: list[str] | None = None,
    ) -> None:
        super().__init__(
            input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix, shard_names
        )
        self.output_sizes = output_sizes or [output_size]
        if shard_names is not None and len(shard_names) != len(self.output_sizes):
            raise ValueError(f"{prefix}: {len(shard_names)} shard names for {self.output_sizes}")
        self.replicated_shards = replicated_shards
        for i, size in enumerate(self.output_sizes):
            if size % self.tp_size and i not in replicated_shards:
                raise ValueError(
                    f"{prefix}: output size {size} is not divisible by TP size {self.tp_size}"
                )
        self._create(input_size, [self._local_size(i) for i in range(len(self.output_sizes))])
        self._create_bias(bias, self.output_size_per_partition)

    def _local_size(self, shard: int) -> int:
        size = self.output_sizes[shard]
        return size if shard in self.replicated_shards else size // self.tp_size

    def weight_loader(
        self, param: Parameter, loaded_weight: torch.Tensor, shard_id: int | None = None
    ) -> None:
        """Copy this rank's rows of one output shard, or of all of them when `shard_id` is None."""
        if shard_id is None:
            if loaded_weight.shape[0] != self.output_size:
                raise ValueError(
                    f"{self.prefix}: checkpoint tensor has shape {tuple(loaded_weight.shape)}, "
                    f"expected {self.output_size} rows"
                )
            offset = 0
            for i, size in enumerate(self.output_sizes):
                self.weight_loader(param, loaded_weight.narrow(0, offset, size), i)
                offset += size
            return
        if not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"{self.prefix}: shard_id {shard_id} out of range")
        if loaded_weight.shape[0] != self.output_sizes[shard_id]:
            raise ValueError(
                f"{self.prefix} shard {shard_id}: checkpoint tensor has shape "
                f"{tuple(loaded_weight.shape)}, expected {self.output_sizes[shard_id]} rows"
            )
        local = self._local_size(shard_id)
        offset = sum(self._local_size(i) for i in range(shard_id))
        rank = 0 if shard_id in self.replicated_shards else self.tp_rank
        shard = loaded_weight.narrow(0, rank * local, local)
        target = param.data.narrow(0, offset, local)
        copy_checked(target, shard, f"{self.prefix} shard {shard_id}")


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections in one weight (e.g. gate and up).

    Shards listed in `replicated_shards` are not split: every rank holds all of them (KDA's
    `f_a` projection, which feeds a per-rank low-rank product).
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool = True,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        replicated_shards: frozenset[int] = frozenset(),
        shard_names: list[str] | None = None,
    ) -> None:
        super().__init__(
            input_size,
            sum(output_sizes),
            bias,
            skip_bias_add,
            params_dtype,
            quant_config,
            output_sizes=list(output_sizes),
            prefix=prefix,
            replicated_shards=replicated_shards,
            shard_names=shard_names,
        )


class RowParallelLinear(LinearBase):
    """Input features split over the TP ranks; partial products are all-reduced.

    With `input_is_parallel` (the default) the input is already this rank's slice and goes to the
    quant method as is, so a `QuantizedActivation` reaches the kernel untouched.
    """

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = True,
        input_is_parallel: bool = True,
        skip_bias_add: bool = False,
        params_dtype: torch.dtype | None = None,
        reduce_results: bool = True,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix)
        if input_size % self.tp_size:
            raise ValueError(
                f"{prefix}: input size {input_size} is not divisible by TP size {self.tp_size}"
            )
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        self._create(input_size // self.tp_size, [output_size])
        self._create_bias(bias, output_size)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        if param.dim() == 2 and loaded_weight.shape[-1] != self.input_size:
            raise ValueError(
                f"{self.prefix}: checkpoint tensor has shape {tuple(loaded_weight.shape)}, "
                f"expected {self.input_size} input features"
            )
        if param.dim() == 2 and self.tp_size > 1:
            local = param.shape[1]
            loaded_weight = loaded_weight.narrow(1, self.tp_rank * local, local)
        copy_checked(param.data, loaded_weight, self.prefix)

    def forward(self, x):
        if not self.input_is_parallel and self.tp_size > 1:
            if isinstance(x, QuantizedActivation):
                raise ValueError(f"{self.prefix}: cannot split a QuantizedActivation over ranks")
            x = x.chunk(self.tp_size, dim=-1)[self.tp_rank].contiguous()
        # The bias is added once: after the reduction, or by rank 0 when the caller reduces.
        out = self.quant_method.apply(self, x, None)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        add_bias = self.reduce_results or self.tp_rank == 0
        if self.bias is not None and not self.skip_bias_add and add_bias:
            out = out + self.bias
        return self._output(out)
