"""`KimiK3DeltaAttention`: the KDA (Kimi Delta Attention) layer of Kimi-K3 / Kimi-Linear, with the
PTPC FP8 `o_proj` epilogue.

Parameters use the names of upstream's layer (upstream-facts D.2, D.7):
`in_proj_qkvgfab` (q, k, v, g [full-rank gate only], f_a, g_a [low-rank gate only], b; f_a and
g_a replicated on every rank), `g_b_proj` (with g_a, Kimi-Linear's low-rank output gate; the
checkpoint's `g_a_proj.weight` loads into its shard of `in_proj_qkvgfab`), `f_b_proj`, `conv1d`
(depthwise short conv on q, k, v), `A_log`, `dt_bias`, `o_norm` (gated RMSNorm, sigmoid, per
head, weight shared by heads) and `o_proj` (row-parallel). Tensor parallel over heads.

The layer runs on a flattened batch described by `KDAMetadata` (decodes first, one token each,
then prefill chunks) and reads / updates its sequences' slots in place in the `KDAStatePool` bound
to it once by `bind_kv_cache` (its shapes are `get_kv_cache_spec`'s).

A batch of decodes only runs `fused_kda_decode` on `kda_decode_config`'s launch. Where that says
`gate_proj` (small batches), `f_b_proj` and `g_b_proj` do not run: each one that is a plain linear
(unquantized bf16 / fp16, no bias) is handed to the kernel as `LowRankProj(input, weight)`, and the
kernel computes its output as the linear would (fp32 sums, one rounding to the model dtype): two
launches fewer per layer. Any other batch, or linear, runs the linears.

Epilogue, decided once per forward from the same metadata the core uses:
- `o_proj` consumes `kFp8DynamicTokenSym` (`get_input_quant_key`) and
  `VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE` is on (the default): the gated norm and the per-token FP8
  quantization run as one fused op (a decode-only batch: inside the fused decode's epilogue,
  which returns the codes and scales; a core that already applied the norm any other way: only
  the quantization) and `o_proj` receives a `QuantizedActivation`;
- otherwise `o_norm`, then `o_proj` (which quantizes for itself if it is FP8): with the variable
  set to 0 this is the unfused baseline of the same PTPC model.
Every core reports whether it normed, and the epilogue applies the norm iff it did not: never twice,
never zero times.

`o_norm.eps` is the config's `rms_norm_eps` (what transformers' Kimi-Linear reference uses);
upstream vLLM hard-codes 1e-5, which equals Kimi-K3's `rms_norm_eps`, so K3 is unchanged.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from vllm import envs
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.model_executor.kernels.linear.rms_norm_gemv import (
    fused_add_rms_norm_gemv,
    use_rms_norm_gemv,
)
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    get_input_quant_key,
)
from vllm.model_executor.layers.layernorm import RMSNorm, RMSNormGated
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8DynamicTokenSym
from vllm.model_executor.model_loader.weight_utils import check_shape
from vllm.models.kimi_k3.amd.ops.causal_conv1d import causal_conv1d_prefill
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import (
    KdaDecodeConfig,
    LowRankProj,
    fused_kda_decode,
    kda_decode_config,
)
from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate, kda_prefill
from vllm.models.kimi_k3.amd.ops.kda_prefill_graphs import KdaPrefillGraphs
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import (
    per_token_fp8_quant,
    rmsnorm_gated_fp8_per_token,
)
from vllm.triton_utils import num_sms
from vllm.v1.kv_cache_interface import KDAStatePool, KDAStateSpec

# Loaded through their own `weight_loader` (TP sharding, shape checks).
_MODULES = ("f_b_proj", "o_proj", "g_b_proj", "o_norm")


def _is_plain_linear(linear: LinearBase) -> bool:
    """Unquantized bf16 / fp16 without bias: `x @ weight^T` summed in fp32 and rounded once to
    the model dtype, which the decode kernel reproduces from a `LowRankProj`."""
    return (
        type(linear.quant_method) is UnquantizedLinearMethod
        and linear.bias is None
        and linear.weight.dtype in (torch.bfloat16, torch.float16)
    )


@dataclass
class KDAMetadata:
    """The flattened batch as the KDA core sees it, built by `KimiMetadataBuilder`.

    Sequences are ordered decodes first (one token each), then prefill chunks. Every slot is a
    real one or the reserved dummy slot 0 of a padded row (no -1 entries: the kernels index the
    pools unchecked). Every field is filled at build time; nothing is derived lazily, so a
    builder may refill the tensors it views for the next step.
    """

    query_start_loc: torch.Tensor  # [N + 1] int32, on the device
    state_slots: torch.Tensor  # [N] long: each sequence's slot in the state pool
    has_initial_state: torch.Tensor  # [N] bool: continue from the slot, or start from zero
    num_decodes: int
    num_prefills: int
    # The prefill sequences alone: start offsets within the prefill tokens `[num_prefills + 1]`
    # int64 on the device, so that every KDA layer of a step hands fla-core the same tensor:
    # fla reads the offsets back to the host (a sync) and caches the result per tensor object.
    prefill_query_start_loc: torch.Tensor


class KimiK3DeltaAttention(torch.nn.Module):
    """One KDA layer (see the module docstring)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        conv_kernel_size: int = 4,
        full_rank_gate: bool = True,
        gate_lower_bound: float | None = None,
        norm_eps: float = 1e-5,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        if num_heads % tp_size:
            raise ValueError(f"{prefix}: {num_heads} KDA heads do not split over TP {tp_size}")
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.local_heads = num_heads // tp_size
        self.head_dim = head_dim
        self.conv_kernel_size = conv_kernel_size
        self.full_rank_gate = full_rank_gate
        self.gate_lower_bound = gate_lower_bound
        self.prefix = prefix
        dtype = params_dtype or torch.get_default_dtype()
        proj = num_heads * head_dim
        local_proj = self.local_heads * head_dim

        # q, k, v, [g], f_a, [g_a], b; the low-rank heads f_a and g_a are replicated on every
        # rank. g_a reads the same input as the rest, so it is one more shard, not a GEMV.
        names = ["q_proj", "k_proj", "v_proj"] + (["g_proj"] if full_rank_gate else [])
        names += ["f_a_proj"] + ([] if full_rank_gate else ["g_a_proj"]) + ["b_proj"]
        rank_dims = {"f_a_proj": head_dim, "g_a_proj": head_dim, "b_proj": num_heads}
        sizes = [rank_dims.get(name, proj) for name in names]
        self.shard_ids = {name: i for i, name in enumerate(names)}
        replicated = frozenset(self.shard_ids[n] for n in ("f_a_proj", "g_a_proj") if n in names)
        self.in_proj_qkvgfab = MergedColumnParallelLinear(
            hidden_size, sizes, bias=False, params_dtype=dtype, quant_config=quant_config,
            prefix=f"{prefix}.in_proj_qkvgfab", replicated_shards=replicated, shard_names=names,
        )  # fmt: skip
        self.local_sizes = list(self.in_proj_qkvgfab.output_partition_sizes)
        if not full_rank_gate:
            self.g_b_proj = ColumnParallelLinear(
                head_dim, proj, bias=False, params_dtype=dtype,
                quant_config=quant_config, prefix=f"{prefix}.g_b_proj",
            )  # fmt: skip
        self.f_b_proj = ColumnParallelLinear(
            head_dim, proj, bias=False, params_dtype=dtype, quant_config=quant_config,
            prefix=f"{prefix}.f_b_proj",
        )  # fmt: skip
        self.conv1d_weight = torch.nn.Parameter(
            torch.zeros(3 * local_proj, conv_kernel_size, dtype=torch.float32), requires_grad=False
        )
        # fp32 whatever the model dtype, as upstream: the gate is computed in fp32.
        f32 = torch.float32
        self.A_log = torch.nn.Parameter(
            torch.zeros(self.local_heads, dtype=f32), requires_grad=False
        )
        self.dt_bias = torch.nn.Parameter(torch.zeros(local_proj, dtype=f32), requires_grad=False)
        self.o_norm = RMSNormGated(head_dim, norm_eps, dtype, f"{prefix}.o_norm")
        self.o_proj = RowParallelLinear(
            proj, hidden_size, bias=False, params_dtype=dtype, quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        self.state_pool: KDAStatePool | None = None  # set once by `bind_kv_cache`
        # The model's `KdaPrefillGraphs`, shared by its KDA layers; set by the model runner's
        # `capture_prefill_graphs` (None: the prefill core always runs eagerly).
        self.prefill_graphs: KdaPrefillGraphs | None = None

    # -- cache ----------------------------------------------------------------------------------

    def get_kv_cache_spec(self, dtype: torch.dtype) -> KDAStateSpec:
        """This rank's per-slot state: the conv window in `dtype` (the model's), fp32 recurrence."""
        channels = 3 * self.local_heads * self.head_dim
        return KDAStateSpec(
            conv_shape=(channels, self.conv_kernel_size - 1),
            conv_dtype=dtype,
            ssm_shape=(self.local_heads, self.head_dim, self.head_dim),
            ssm_dtype=torch.float32,
        )

    def bind_kv_cache(self, pool: KDAStatePool) -> None:
        """Keep `pool` as this layer's state (checked against the spec of its conv dtype)."""
        spec = self.get_kv_cache_spec(pool.conv_state.dtype)
        conv, ssm = pool.conv_state, pool.ssm_state
        if tuple(conv.shape[1:]) != spec.conv_shape or tuple(ssm.shape[1:]) != spec.ssm_shape:
            raise ValueError(
                f"pool of {self.prefix}: conv {tuple(conv.shape)} / ssm {tuple(ssm.shape)}, "
                f"expected [S, {spec.conv_shape}] / [S, {spec.ssm_shape}]"
            )
        if ssm.dtype != spec.ssm_dtype or conv.shape[0] != ssm.shape[0]:
            raise ValueError(f"pool of {self.prefix}: ssm state must be fp32 with the conv's slots")
        self.state_pool = pool

    def release_kv_cache(self) -> None:
        self.state_pool = None

    # -- forward --------------------------------------------------------------------------------

    def forward(
        self,
        hidden_states: "torch.Tensor | QuantizedActivation",
        metadata: KDAMetadata,
    ) -> torch.Tensor:
        self._check_bound()
        return self._forward_projected(self.in_proj_qkvgfab(hidden_states)[0], metadata)

    def forward_with_norm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        norm: RMSNorm,
        metadata: KDAMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder layer's input norm, then the layer: ``(output, new residual)``, where the
        norm adds ``residual`` first (None: ``x`` is the stream, the first layer's embeddings).
        Where `use_rms_norm_gemv` holds (one row on NVIDIA into a plain `in_proj`) the
        norm runs inside the input projection's launch (`fused_add_rms_norm_gemv`): the
        projection and residual of the norm's launch then the projection's, bit for bit
        (rms_norm_gemv.py); elsewhere the norm's own launch, then `forward`."""
        if not isinstance(norm, RMSNorm):
            raise TypeError(f"norm must be an RMSNorm, got {type(norm).__name__}")
        self._check_bound()
        in_proj = self.in_proj_qkvgfab
        if _is_plain_linear(in_proj) and use_rms_norm_gemv(
            x, residual, norm.weight, in_proj.weight
        ):
            projected, residual = fused_add_rms_norm_gemv(
                x, residual, norm.weight, norm.eps, in_proj.weight
            )
            return self._forward_projected(projected, metadata), residual
        if residual is None:
            h, residual = norm(x), x
        else:
            h, residual = norm(x, residual)
        return self._forward_projected(self.in_proj_qkvgfab(h)[0], metadata), residual

    def _check_bound(self) -> None:
        if self.state_pool is None:
            raise RuntimeError(f"{self.prefix}: no state pool bound (call bind_kv_cache first)")

    def _forward_projected(self, projected: torch.Tensor, metadata: KDAMetadata) -> torch.Tensor:
        """The layer after its input projection: conv, core, epilogue and o_proj."""
        pool = self.state_pool
        tokens = projected.shape[0]
        h, d = self.local_heads, self.head_dim
        parts = torch.split(projected, self.local_sizes, dim=-1)
        mixed_qkv = projected[:, : 3 * h * d]
        config = None
        if metadata.num_prefills == 0 and metadata.num_decodes:
            config = kda_decode_config(tokens, h, d, num_sms(projected.device))
        fuse = config is not None and config.gate_proj
        raw_g = self._b_proj(self.f_b_proj, parts[self.shard_ids["f_a_proj"]], fuse)
        if self.full_rank_gate:
            gate = parts[3]
        else:
            gate = self._b_proj(self.g_b_proj, parts[self.shard_ids["g_a_proj"]], fuse)
        if isinstance(gate, torch.Tensor):
            gate = gate.view(tokens, h, d)  # a strided view of `projected` for the full-rank gate

        quantize = self.o_proj_is_ptpc_fp8() and envs.VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE
        core, normed = self._core(
            mixed_qkv, raw_g, parts[-1], gate, metadata, pool, quantize, config
        )
        return self._epilogue(core, gate, normed, quantize, projected.dtype)

    @staticmethod
    def _b_proj(linear: LinearBase, a: torch.Tensor, fuse: bool) -> "torch.Tensor | LowRankProj":
        """`linear(a)`, or with `fuse` and a plain linear its factors, for the decode kernel."""
        if fuse and _is_plain_linear(linear):
            return LowRankProj(a, linear.weight)
        return linear(a)[0]

    def _core(
        self, mixed_qkv, raw_g, b, gate, metadata: KDAMetadata, pool: KDAStatePool,
        quantize: bool = False, config: KdaDecodeConfig | None = None,
    ):  # fmt: skip
        """Conv + delta rule for the batch. Returns (core `[T, H, D]`, whether it is normed).

        A batch of decodes only runs the fused decode kernel (on `config`, the forward's launch,
        which `raw_g` / `gate` may be `LowRankProj` for) with its norm epilogue, which with
        `quantize` also quantizes per token: its core is then the `(codes, scales)` pair.
        Otherwise the prefill rows run the conv and the chunked core (which applies the gate
        itself), and the decode rows before them, if any, the fused decode kernel without its
        norm: each row is computed as in a step of its own kind, and the state of the decodes is
        updated in place at their slots, not gathered and scattered. The epilogue norms them all.
        """
        nd = metadata.num_decodes
        if metadata.num_prefills == 0 and nd:
            core = fused_kda_decode(
                mixed_qkv, self.conv1d_weight, pool.conv_state, raw_g, self.A_log, self.dt_bias,
                self.gate_lower_bound, b, pool.ssm_state, metadata.state_slots,
                self.o_norm.weight, gate, self.o_norm.eps, config=config, quantize=quantize,
            )  # fmt: skip
            return core, True
        tokens = mixed_qkv.shape[0]
        h, d = self.local_heads, self.head_dim
        slots, rows = metadata.state_slots, tokens - nd
        # On the GPU fla-core's chunked cumsum of the decay applies the gate to the raw input, one
        # pass where our gate kernel and fla's cumsum took two, with the fp32 decay written and
        # read between them; on the CPU the reference applies `kda_gate`, our gate kernel's
        # reference.
        decay_gate = KdaGate(self.A_log, self.dt_bias, self.gate_lower_bound)
        # q | k | v written group-major, so that each is contiguous: fla-core's chunk_kda makes
        # its inputs contiguous, which for column views of one [T, 3HD] buffer is a copy each.
        # Where the core will replay a graph, into the graph's own input buffers.
        graphs, dtype, device = self.prefill_graphs, mixed_qkv.dtype, mixed_qkv.device
        seqs = slots.shape[0] - nd
        conv = None if graphs is None else graphs.qkv_buffer(rows, seqs, dtype, device)
        if conv is None:
            conv = torch.empty(3, rows, h * d, dtype=dtype, device=device)
        causal_conv1d_prefill(
            mixed_qkv[nd:], self.conv1d_weight, pool.conv_state, metadata.prefill_query_start_loc,
            slots[nd:], metadata.has_initial_state[nd:], out=conv,
        )  # fmt: skip
        q, k, v = conv.view(3, rows, h, d).unbind(0)
        prefilled = kda_prefill(
            q, k, v, raw_g[nd:].view(rows, h, d), torch.sigmoid(b[nd:].float()), pool.ssm_state,
            metadata.prefill_query_start_loc, slots[nd:], metadata.has_initial_state[nd:],
            decay_gate, self.prefill_graphs,
        )  # fmt: skip
        if not nd:
            # Prefill only: the core's output is the layer's, no copy into a [T, H, D] buffer.
            return prefilled, False
        core = torch.empty(tokens, h, d, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
        core[nd:] = prefilled
        core[:nd] = fused_kda_decode(
            mixed_qkv[:nd], self.conv1d_weight, pool.conv_state, raw_g[:nd], self.A_log,
            self.dt_bias, self.gate_lower_bound, b[:nd], pool.ssm_state, slots[:nd],
        )  # fmt: skip
        return core, False

    def o_proj_is_ptpc_fp8(self) -> bool:
        return get_input_quant_key(self.o_proj) == kFp8DynamicTokenSym

    def _epilogue(
        self, core: "torch.Tensor | tuple[torch.Tensor, torch.Tensor]",
        gate: "torch.Tensor | LowRankProj", normed: bool, quantize: bool, dtype: torch.dtype,
    ) -> torch.Tensor:  # fmt: skip
        """`o_proj` of the core: `[T, H, D]`, or the FP8 `(codes, scales)` of a normed core.
        `quantize`: the forward's one decision that `o_proj` takes the fused PTPC epilogue;
        `gate`: a tensor where the core is not normed; `dtype`: the activations' (the model's)."""
        tokens = (core[0] if isinstance(core, tuple) else core).shape[0]
        width = self.local_heads * self.head_dim
        if isinstance(core, tuple):
            x = QuantizedActivation(*core, dtype, torch.Size([tokens, width]), kFp8DynamicTokenSym)
        elif quantize:
            if normed:
                q, scale = per_token_fp8_quant(core.reshape(tokens, width))
            else:
                q, scale = rmsnorm_gated_fp8_per_token(
                    core, self.o_norm.weight, gate, self.o_norm.eps
                )
            x = QuantizedActivation(
                q, scale, core.dtype, torch.Size([tokens, width]), kFp8DynamicTokenSym
            )
        else:
            x = (core if normed else self.o_norm(core, gate)).reshape(tokens, width)
        return self.o_proj(x)[0]

    # -- weights --------------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load checkpoint tensors named relative to this layer (`q_proj.weight`, `q_conv1d.weight`,
        `A_log`, ...). Returns the names loaded; raises on an unknown name."""
        loaded = set()
        tp_rank = get_tensor_model_parallel_rank()
        local_proj = self.local_heads * self.head_dim
        for name, tensor in weights:
            module = name.rsplit(".", 1)[0]
            if module in self.shard_ids and name.endswith(".weight"):
                p = self.in_proj_qkvgfab.weight
                self.in_proj_qkvgfab.weight_loader(p, tensor, self.shard_ids[module])
            elif module in ("q_conv1d", "k_conv1d", "v_conv1d") and name.endswith(".weight"):
                shard = ("q_conv1d", "k_conv1d", "v_conv1d").index(module)
                # Checked whole: the slice assignment below would broadcast a width-1 kernel
                # and `narrow` would drop surplus channels without a word.
                full = (self.num_heads * self.head_dim, 1, self.conv_kernel_size)
                check_shape(tensor, full, f"{self.prefix}.{name}")
                w = tensor.reshape(tensor.shape[0], -1)  # [P, 1, W] -> [P, W]
                mine = w.narrow(0, tp_rank * local_proj, local_proj)
                self.conv1d_weight.data[shard * local_proj : (shard + 1) * local_proj] = mine
            elif name == "A_log":
                if tuple(tensor.shape) not in ((self.num_heads,), (1, 1, self.num_heads, 1)):
                    raise ValueError(
                        f"{self.prefix}.A_log: checkpoint shape {tuple(tensor.shape)}, expected "
                        f"({self.num_heads},) or legacy (1, 1, {self.num_heads}, 1)"
                    )
                heads = tensor.reshape(-1)  # legacy checkpoints store (1, 1, H, 1)
                self.A_log.data.copy_(heads.narrow(0, tp_rank * self.local_heads, self.local_heads))
            elif name == "dt_bias":
                check_shape(tensor, (self.num_heads * self.head_dim,), f"{self.prefix}.{name}")
                self.dt_bias.data.copy_(tensor.narrow(0, tp_rank * local_proj, local_proj))
            elif module in _MODULES and name.endswith(".weight") and hasattr(self, module):
                layer = getattr(self, module)
                layer.weight_loader(layer.weight, tensor)
            else:
                raise ValueError(f"{self.prefix}: unexpected checkpoint tensor {name!r}")
            loaded.add(name)
        return loaded
