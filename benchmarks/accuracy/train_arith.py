"""Train a small Kimi-Linear model on GSM8K-format arithmetic word problems (`arith_data.py`).

The model is transformers' `KimiLinearForCausalLM` (fla-core's KDA kernels on a GPU, its torch
path on CPU) with the architecture's features that the fork's PTPC recipe touches: KDA layers
(gated output RMSNorm before `o_proj`, low-rank output gate) and MLA layers, a dense first MLP and
MoE layers with a shared expert. The tokenizer has one token per character (digits included,
which is what makes the arithmetic learnable), plus bos / eos / pad / unk.

Training rows look like lm_eval's 5-shot prompts: bos, then problems formatted as
`Question: ...\\nAnswer: ...` joined by a blank line, packed to `--seq-len` tokens, `--rows` rows
per step. The loss covers only what the model generates at evaluation time: each answer with its
blank line and the `Question:` that follows (where lm_eval stops). The question bodies (names,
items, random numbers) are left out: they cannot be predicted, so they would only add a floor of
noise to the loss and pull gradient away from the reasoning.

Held-out accuracy is greedy exact match measured by teacher forcing: a question counts as solved
iff, given the 5-shot prompt, the argmax at every position of the reference answer through
`#### N` and its newline is the reference token. By induction that is exactly "greedy decoding
reproduces the reference answer", so it is a lower bound of lm_eval's strict-match (which also
accepts a different reasoning that reaches N), from forward passes of the training shape only
(on a GPU no new kernels are compiled, which matters inside a fixed time budget).

Time: `--max-minutes` bounds the training loop from the start of the script (the first step
includes fla's kernel compilation, about 3.5 minutes on an H200); the learning rate follows a
cosine over that wall-clock budget (or over `--steps`). Then the final evaluation runs and the
model is saved. A checkpoint is also written every `--save-every-minutes`, so a killed run leaves a
loadable model (the untrained model is saved and loaded by the fork's loader first, so that a
config or naming mismatch stops the run before minutes of compilation). The output folder holds
config.json, model.safetensors (bf16; the fp32 parameters of the reference, A_log, dt_bias and
the router, stay fp32), tokenizer.json, tokenizer_config.json and train_log.jsonl.
"""

import argparse
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, processors

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository: `vllm`

from arith_data import (  # noqa: E402
    FEWSHOT_SEED,
    TEST_SEED,
    Problem,
    distinct_problems,
    iter_problems,
)

# -- tokenizer -----------------------------------------------------------------------------------

CHARS = ["\n"] + [chr(c) for c in range(32, 127)]  # newline and printable ASCII
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>"]
CHAR_ID = {c: i for i, c in enumerate(CHARS)}
BOS, EOS, PAD, UNK = (len(CHARS) + i for i in range(len(SPECIALS)))
# The embedding table is padded to a multiple of 64 (ids past the tokenizer are never seen).
VOCAB_SIZE = 128
MAX_MODEL_LEN = 4096
# The same simple template as the built-in tiny models.
CHAT_TEMPLATE = (
    "{{- bos_token -}}{%- for message in messages -%}{{- message['role'] + ': ' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endfor -%}{%- endif -%}{{- eos_token + '\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}"
)


def build_tokenizer() -> Tokenizer:
    """One token per character; encoding prepends bos (so do the engine, the server and lm_eval's
    requests, as the model was trained); unknown characters become <|unk|>."""
    vocab = {token: i for i, token in enumerate(CHARS + SPECIALS)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", BOS)]
    )
    return tokenizer


def save_tokenizer(folder: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json into `folder`."""
    build_tokenizer().save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "unk_token": "<|unk|>",
        "model_max_length": MAX_MODEL_LEN,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode(text: str) -> list[int]:
    """Token ids of `text` without bos (the tokenizer's, checked at start-up, ~10x faster)."""
    return [CHAR_ID.get(c, UNK) for c in text]


# -- model ---------------------------------------------------------------------------------------


def model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Config fields in Kimi's config.json names (which transformers and the fork both read)."""
    d = args.d_model
    kda_heads = args.kda_heads or max(1, d // 64)
    mla_heads = args.mla_heads or max(1, d // 64)
    kda_head_dim = args.kda_head_dim or d // kda_heads
    mla_dim = args.mla_head_dim or d // mla_heads
    kv_rank = args.kv_lora_rank or 1 << (d // 2 - 1).bit_length()
    layers = args.layers.upper()
    if set(layers) - {"K", "M"} or "K" not in layers or "M" not in layers:
        raise SystemExit(f"--layers {args.layers!r}: a string of K (KDA) and M (MLA), with both")
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=d, intermediate_size=args.dense_intermediate or 4 * d,
        num_hidden_layers=len(layers), num_attention_heads=mla_heads,
        num_key_value_heads=mla_heads, kv_lora_rank=kv_rank,
        qk_nope_head_dim=mla_dim, qk_rope_head_dim=mla_dim // 2, v_head_dim=mla_dim,
        q_lora_rank=None, mla_use_nope=True, num_experts=args.experts,
        num_experts_per_token=args.experts_per_token,
        moe_intermediate_size=args.moe_intermediate or d, num_shared_experts=1,
        first_k_dense_replace=1, moe_layer_freq=1, moe_renormalize=True,
        moe_router_activation_func="sigmoid", routed_scaling_factor=2.446, num_expert_group=1,
        topk_group=1, hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        max_position_embeddings=MAX_MODEL_LEN,
        linear_attn_config={
            "kda_layers": [i + 1 for i, t in enumerate(layers) if t == "K"],
            "full_attn_layers": [i + 1 for i, t in enumerate(layers) if t == "M"],
            "num_heads": kda_heads, "head_dim": kda_head_dim, "short_conv_kernel_size": 4,
        },
    )  # fmt: skip


def import_modeling(device: str) -> ModuleType:
    """transformers' Kimi-Linear modeling module for `device`: on CPU, fla and causal_conv1d are
    hidden while it is imported (transformers binds their GPU kernels at import whenever they
    import, and they fail on CPU), so that it runs its torch references."""
    if device != "cpu":
        from transformers.models.kimi_linear import modeling_kimi_linear

        return modeling_kimi_linear
    hidden = ("fla", "causal_conv1d")
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in hidden}
    for name in hidden:
        sys.modules[name] = None
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear
    finally:
        for name in hidden:
            del sys.modules[name]
        sys.modules.update(saved)
    return modeling_kimi_linear


def use_fast_cpu_functions(modeling: ModuleType) -> None:
    """Replace the module's KDA core and short convolution by `cpu_chunk_kda` and
    `cpu_causal_conv1d` for training on CPU: the same functions, vectorized, because the
    backward of transformers' loop-based references costs ~5x more CPU time."""
    modeling.chunk_kimi_delta_attention = cpu_chunk_kda
    modeling.causal_conv1d_fn = cpu_causal_conv1d


def _l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)  # + eps inside, as fla


def cpu_chunk_kda(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 32,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The KDA delta rule over `[B, T, H, D]` inputs in chunks (transformers' `chunk_kda` call).

    Per chunk, with cumulative log-decays `G` and strictly lower-triangular
    `L[i, j] = beta_i <k_i * exp(G_i - G_j), k_j>`, the WY form `Tm = (I + L)^-1` gives the
    pseudo-values `u = Tm (beta v)` and `w = Tm (beta k exp(G))`; then chunk by chunk
    `v' = u - w S`, `o = (q exp(G)) S + (causal q.k decay) v'` and the state moves to the chunk's
    end. `exp(G_i - G_j)` is formed only for `j <= i`, where it is <= 1 (no overflow). fp32.
    """
    dtype = query.dtype
    q, k, v, g = (x.transpose(1, 2).float() for x in (query, key, value, g))
    b = beta.transpose(1, 2).float()
    if use_qk_l2norm_in_kernel:
        q, k = _l2_normalize(q), _l2_normalize(k)
    batch, heads, length, dim = k.shape
    c = chunk_size
    pad = -length % c
    q = F.pad(q, (0, 0, 0, pad)) * dim**-0.5
    k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (k, v, g))
    b = F.pad(b, (0, pad)).reshape(batch, heads, -1, c, 1)
    q, k, v, g = (x.reshape(batch, heads, -1, c, x.shape[-1]) for x in (q, k, v, g))
    g = g.cumsum(-2)
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = (g.unsqueeze(-2) - g.unsqueeze(-3)).masked_fill(~causal[..., None], -math.inf).exp()
    strict = (b * (k.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)).tril(-1)
    eye = torch.eye(c, device=q.device)
    wy = torch.linalg.solve_triangular(eye + strict, eye.expand_as(strict), upper=False)
    u, w = wy @ (b * v), wy @ (b * k * g.exp())
    qk = (q.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)
    state = q.new_zeros(batch, heads, dim, v.shape[-1]) if initial_state is None else initial_state
    state = state.float()
    outs = []
    # unbind, not indexing: one backward for all chunks instead of one full-size zero per chunk
    for qn, kn, gn, un, wn, qkn in zip(*(x.unbind(2) for x in (q, k, g, u, w, qk)), strict=True):
        fresh = un - wn @ state
        outs.append((qn * gn.exp()) @ state + qkn @ fresh)
        last = gn[:, :, -1:]
        state = state * last.transpose(-1, -2).exp() + (kn * (last - gn).exp()).mT @ fresh
    out = torch.stack(outs, 2).reshape(batch, heads, -1, v.shape[-1])[:, :, :length]
    return out.transpose(1, 2).to(dtype), state if output_final_state else None


def cpu_causal_conv1d(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Causal depthwise conv of `[B, C, T]` by `weight [C, W]` (then SiLU), as shifted sums: CPU
    depthwise `conv1d` backward is slow on long rows."""
    width, length = weight.shape[-1], hidden_states.shape[-1]
    x = F.pad(hidden_states.to(weight.dtype), (width - 1, 0))
    out = sum(x[:, :, i : i + length] * weight[:, i : i + 1] for i in range(width))
    if bias is not None:
        out = out + bias[:, None]
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation {activation!r}: only SiLU is implemented")
    if activation is not None:
        out = F.silu(out)
    return out.to(hidden_states.dtype)


# Parameters the reference keeps in fp32 (and the fork loads as fp32): saved as fp32.
FP32_SUFFIXES = ("A_log", "dt_bias", ".gate.weight", "e_score_correction_bias")


def read_log(folder: Path) -> list[dict]:
    """The records of `folder`'s train_log.jsonl, then one naming the run that continues it."""
    path = folder / "train_log.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return records + [{"continued_from": str(folder)}]


def save_checkpoint(model: torch.nn.Module, folder: Path, log: list[dict]) -> None:
    """Write a loadable model folder, replacing `folder` only once the new one is complete."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)  # transformers writes the Kimi checkpoint names
    weights = tmp / "model.safetensors"
    tensors = load_file(weights)
    for name, tensor in tensors.items():
        if tensor.dtype == torch.float32 and not name.endswith(FP32_SUFFIXES):
            tensors[name] = tensor.to(torch.bfloat16)
    save_file(tensors, weights, metadata={"format": "pt"})
    # Generation defaults are not read by the fork; fewer files also come back from a GPU run.
    (tmp / "generation_config.json").unlink(missing_ok=True)
    config = json.loads((tmp / "config.json").read_text())
    # transformers writes the context length as model_max_length; the fork reads Kimi's name
    config["max_position_embeddings"] = MAX_MODEL_LEN
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_tokenizer(tmp)
    (tmp / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    old = folder.with_name(folder.name + ".old")
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def check_fork_loads(folder: Path, fatal: bool) -> None:
    """Load the saved folder with the fork's loader on CPU (config validation, every checkpoint
    tensor named and shaped as the fork expects). A failure ends the run if `fatal` (the check
    of the untrained model, before minutes of compilation are spent), else it is reported."""
    try:
        from vllm.model_executor.model_loader.loader import load_model
    except ImportError as e:  # a dependency of the fork missing on this machine
        print(f"WARNING: the fork's loader does not import here ({e}); not checked", flush=True)
        return
    try:
        load_model(folder, dtype=torch.float32, device="cpu")
    except Exception as e:
        message = f"the fork cannot load {folder}: {e}"
        if fatal:
            raise SystemExit(message) from e
        print(f"WARNING: {message}", flush=True)
        return
    print(f"the fork's loader loads {folder}", flush=True)


class RouterBalancer:
    """Auxiliary-loss-free load balancing of the MoE routers (DeepSeek-V3's rule): after each
    step every router's `e_score_correction_bias` moves by `rate` towards the experts that got
    fewer tokens than the mean. The bias only steers the top-k choice, not the expert weights.

    Without it nothing spreads the tokens: a few experts would take most of them, and the
    quantization comparison would exercise a model that is MoE in name only.
    """

    def __init__(self, model: torch.nn.Module, rate: float) -> None:
        self.rate = rate
        self.routers = [
            m for m in model.modules()
            if type(m).__name__.endswith("TopkRouter") and hasattr(m, "e_score_correction_bias")
        ]  # fmt: skip
        self.loads = [torch.zeros_like(r.e_score_correction_bias) for r in self.routers]
        for router, load in zip(self.routers, self.loads, strict=True):
            router.register_forward_hook(self._counter(load))

    @staticmethod
    def _counter(load: torch.Tensor):
        def hook(module, inputs, output):
            # The top-k expert ids are the router's integer output; its position differs between
            # transformers versions, and a router that leaves top-k to its MoE block has none
            # (then nothing is counted, the biases stay 0 and the log shows
            # router_max_over_mean 0).
            ids = (
                [t for t in output if not t.is_floating_point()]
                if isinstance(output, tuple)
                else []
            )
            if module.training and ids:
                indices = ids[0].flatten()
                load.scatter_add_(0, indices, torch.ones_like(indices, dtype=load.dtype))

        return hook

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Update the biases from the loads counted since the last call. Returns the busiest
        expert's load over the mean load of the worst router (1: balanced; 0: nothing counted),
        left on the device so that the step does not wait for it."""
        worst = torch.zeros(())
        for router, load in zip(self.routers, self.loads, strict=True):
            router.e_score_correction_bias += self.rate * torch.sign(load.mean() - load)
            worst = torch.maximum(worst.to(load.device), load.max() / load.mean().clamp(min=1))
            load.zero_()
        return worst


# -- data ----------------------------------------------------------------------------------------


def rows_stream(seed: int, seq_len: int) -> Iterator[tuple[list[int], list[bool]]]:
    """Endless training rows: `seq_len + 1` token ids and, per id, whether it is a loss target."""
    problems = iter_problems(seed, "train")
    while True:
        ids, target = [BOS], [False]
        first = True
        while len(ids) <= seq_len:
            problem = next(problems)
            for text, scored in (
                ("Question:", not first),  # the stop string after an answer
                (f" {problem.question}\nAnswer:", False),
                (f" {problem.answer}\n\n", True),
            ):
                piece = encode(text)
                ids += piece
                target += [scored] * len(piece)
            first = False
        yield ids[: seq_len + 1], target[: seq_len + 1]


def next_batch(rows: Iterator, count: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [count, seq_len], targets [count, seq_len] with -100 where not scored)."""
    batch = [next(rows) for _ in range(count)]
    ids = torch.tensor([r[0] for r in batch])
    scored = torch.tensor([r[1] for r in batch])
    targets = torch.where(scored[:, 1:], ids[:, 1:], -100)
    return ids[:, :-1].to(device, non_blocking=True), targets.to(device, non_blocking=True)


def fewshot_prompt(problem: Problem, pool: list[Problem], shots: int, seed: int) -> str:
    """lm_eval's gsm8k prompt: `shots` pool problems with answers, then the question."""
    examples = random.Random(seed).sample(pool, shots)
    parts = [f"Question: {p.question}\nAnswer: {p.answer}" for p in examples]
    return "\n\n".join([*parts, f"Question: {problem.question}\nAnswer:"])


class HeldOut:
    """Held-out questions as fixed eval rows: the 5-shot prompt, then the reference answer
    through `#### N` and its newline as the checked span."""

    def __init__(self, problems: list[Problem], pool: list[Problem], shots: int, seq_len: int):
        self.rows, self.spans = [], []
        for i, problem in enumerate(problems):
            prompt = [BOS] + encode(fewshot_prompt(problem, pool, shots, seed=i))
            answer = encode(f" {problem.answer}\n")
            if len(prompt) + len(answer) > seq_len:
                raise SystemExit(
                    f"a {shots}-shot eval prompt needs {len(prompt) + len(answer)} tokens, more "
                    f"than --seq-len {seq_len}: lower --eval-shots or raise --seq-len"
                )
            row = prompt + answer
            self.rows.append(row + [PAD] * (seq_len - len(row)))
            self.spans.append((len(prompt), len(row)))

    @torch.no_grad()
    def accuracy(self, model: torch.nn.Module, rows: int, device: str, autocast: Any) -> float:
        """Fraction of questions whose reference answer is the greedy continuation."""
        was_training = model.training
        model.eval()
        solved = 0
        for start in range(0, len(self.rows), rows):
            chunk = self.rows[start : start + rows]
            # Same batch shape as training: no new kernel specializations on the GPU.
            padded = chunk + [[PAD] * len(chunk[0])] * (rows - len(chunk))
            ids = torch.tensor(padded, device=device)
            with autocast:
                logits = model(input_ids=ids, use_cache=False).logits
            predicted = logits.argmax(dim=-1).tolist()
            for j, (a, b) in enumerate(self.spans[start : start + len(chunk)]):
                row = chunk[j]
                solved += predicted[j][a - 1 : b - 1] == row[a:b]
        model.train(was_training)
        return solved / len(self.rows)


# -- training ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--out", type=Path, required=True, help="output model folder")
    add("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda or cpu")
    add("--seed", type=int, default=0, help="seed of the weights and the training stream")
    add(
        "--init",
        type=Path,
        default=None,
        help="continue from this saved folder (its architecture; the model flags are ignored); "
        "give another --seed for problems it has not seen",
    )
    add(
        "--max-minutes",
        type=float,
        default=8.0,
        help="wall-clock budget of the training loop from script start (compilation included)",
    )
    add(
        "--steps",
        type=int,
        default=None,
        help="fixed number of steps (the cosine follows steps, not time); still capped by time",
    )
    add("--save-every-minutes", type=float, default=2.0, help="periodic checkpoint interval")
    add("--log-every", type=int, default=50, help="steps between loss lines")
    add("--eval-every", type=int, default=500, help="steps between held-out evaluations")
    add("--eval-questions", type=int, default=48, help="held-out questions per evaluation")
    add(
        "--final-eval-questions",
        type=int,
        default=200,
        help="questions of the lm_eval test set scored at the end",
    )
    add("--eval-shots", type=int, default=5, help="few-shot examples in eval prompts")
    # model
    add("--d-model", type=int, default=256, help="hidden size")
    add("--layers", default="KKMK", help="layer types in order: K = KDA, M = MLA")
    add("--kda-heads", type=int, default=None, help="KDA heads (default d-model / 64)")
    add(
        "--kda-head-dim",
        type=int,
        default=None,
        help="KDA head dim, a power of two <= 256 (default d-model / kda-heads)",
    )
    add("--mla-heads", type=int, default=None, help="MLA heads (default d-model / 64)")
    add(
        "--mla-head-dim",
        type=int,
        default=None,
        help="MLA qk_nope and v head dim (default d-model / mla-heads; rope part: half)",
    )
    add(
        "--kv-lora-rank",
        type=int,
        default=None,
        help="MLA latent rank (default d-model / 2 rounded up to a power of two)",
    )
    add("--experts", type=int, default=8, help="routed experts per MoE layer")
    add("--experts-per-token", type=int, default=2, help="routed experts per token")
    add("--moe-intermediate", type=int, default=None, help="expert hidden size (default d-model)")
    add(
        "--dense-intermediate",
        type=int,
        default=None,
        help="hidden size of the dense first MLP (default 4 * d-model)",
    )
    # optimisation
    add("--seq-len", type=int, default=2048, help="tokens per packed row")
    add("--rows", type=int, default=8, help="rows per step (8 x 2048 = 16k tokens)")
    add("--lr", type=float, default=1.5e-3, help="peak learning rate (AdamW)")
    add("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr")
    add("--warmup-steps", type=int, default=100, help="linear warm-up steps")
    add("--weight-decay", type=float, default=0.1, help="AdamW decay of the matrices")
    add("--router-bias-rate", type=float, default=1e-3, help="load-balancing bias step")
    return parser.parse_args(argv)


def learning_rate(args: argparse.Namespace, step: int, progress: float) -> float:
    """Linear warm-up, then a cosine from the peak to `min_lr_ratio` of it over `progress`."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)


def check_tokenizer() -> None:
    """`encode` must equal the saved tokenizer's encoding (minus bos) on the problem texts."""
    tokenizer = build_tokenizer()
    problem = next(iter_problems(0, "train"))
    text = f"Question: {problem.question}\nAnswer: {problem.answer}\n\n"
    assert tokenizer.encode(text).ids == [BOS] + encode(text), "tokenizer and encode() differ"
    assert tokenizer.decode(encode(text)) == text


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Train, evaluate and save; returns the final summary (also printed)."""
    start = time.monotonic()
    deadline = start + 60 * args.max_minutes
    device = args.device
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    check_tokenizer()
    modeling = import_modeling(device)
    if device == "cpu":
        use_fast_cpu_functions(modeling)
    if args.init is None:
        config = modeling.KimiLinearConfig(**model_kwargs(args))
        model = modeling.KimiLinearForCausalLM(config).to(device)
    else:  # continue a saved run: its architecture and weights, router biases included
        model = modeling.KimiLinearForCausalLM.from_pretrained(args.init, dtype=torch.float32)
        model = model.to(device)
    if any("rotary" in name.lower() for name, _ in model.named_modules()):
        print("WARNING: this transformers version builds a rotary embedding; the fork's MLA is "
              "NoPE (mla_use_nope), so its logits would not match", flush=True)  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    kinds = "".join("M" if t == "full_attention" else "K" for t in model.config.layer_types)
    print(f"model: {params / 1e6:.2f}M parameters, layers {kinds}, hidden "
          f"{model.config.hidden_size}, device {device}", flush=True)  # fmt: skip
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda",
    )  # fmt: skip
    save_checkpoint(model, args.out, [])
    check_fork_loads(args.out, fatal=True)
    balancer = RouterBalancer(model, args.router_bias_rate)
    # bf16 autocast on the GPU (the fp32 master weights stay in AdamW); fp32 on CPU, where
    # bf16 matmuls are slower and the torch reference path is the one being exercised.
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device == "cuda")

    pool = distinct_problems(FEWSHOT_SEED, "train", 200)  # = the task's train.jsonl
    monitor = HeldOut(distinct_problems(7, "test", args.eval_questions), pool, args.eval_shots,
                      args.seq_len)  # fmt: skip
    rows = rows_stream(args.seed + 1, args.seq_len)
    tokens_per_step = args.rows * args.seq_len
    # A continued run keeps the history of the one it starts from, so the shipped log is complete.
    log = read_log(args.init) if args.init is not None else []
    step, loop_start, last_save = 0, None, time.monotonic()
    loss_sum = torch.zeros((), device=device)
    window_start = time.monotonic()  # of the current loss window, shifted past evals and saves
    model.train()
    while time.monotonic() < deadline and (args.steps is None or step < args.steps):
        if loop_start is None:
            progress = 0.0
        elif args.steps is not None:
            progress = step / args.steps
        else:
            progress = (time.monotonic() - loop_start) / max(deadline - loop_start, 1e-9)
        lr = learning_rate(args, step, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        ids, targets = next_batch(rows, args.rows, device)
        with autocast:
            logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        imbalance = balancer.step()
        step += 1
        if loop_start is None:  # the first step compiles the kernels: time the rest from here
            loop_start = window_start = time.monotonic()
            print(f"step 1 done after {loop_start - start:.0f} s (compilation included), "
                  f"loss {loss.item():.3f}", flush=True)  # fmt: skip
            continue
        loss_sum += loss.detach()
        record: dict[str, Any] = {}
        if step % args.log_every == 0:
            now = time.monotonic()
            window = min(args.log_every, step - 1)  # step 1 is not in any window
            record.update(
                step=step, minutes=round((now - start) / 60, 2),
                loss=round(loss_sum.item() / window, 4), lr=float(f"{lr:.3g}"),
                tokens=step * tokens_per_step,
                tokens_per_s=round(window * tokens_per_step / (now - window_start)),
                router_max_over_mean=round(float(imbalance), 2),
            )  # fmt: skip
            loss_sum.zero_()
            window_start = now
        paused = time.monotonic()
        if step % args.eval_every == 0:
            record.update(step=step, heldout_greedy=monitor.accuracy(model, args.rows, device,
                                                                     autocast))  # fmt: skip
        if record:
            log.append(record)
            print(" | ".join(f"{k} {v}" for k, v in record.items()), flush=True)
        if time.monotonic() - last_save > 60 * args.save_every_minutes:
            save_checkpoint(model, args.out, log)
            last_save = time.monotonic()
            print(f"checkpoint saved to {args.out} at step {step}", flush=True)
        window_start += time.monotonic() - paused
    final_set = distinct_problems(TEST_SEED, "test", args.final_eval_questions)
    final = HeldOut(final_set, pool, args.eval_shots, args.seq_len)
    summary = {
        "final": True, "steps": step, "tokens": step * tokens_per_step,
        "minutes": round((time.monotonic() - start) / 60, 2), "parameters": params,
        "heldout_greedy_final": final.accuracy(model, args.rows, device, autocast),
        "final_eval_questions": len(final_set), "args": {k: str(v) for k, v in vars(args).items()},
    }  # fmt: skip
    log.append(summary)
    save_checkpoint(model, args.out, log)
    print(json.dumps({k: v for k, v in summary.items() if k != "args"}), flush=True)
    print(f"saved to {args.out}", flush=True)
    check_fork_loads(args.out, fatal=False)
    return summary


def main() -> None:
    train(parse_args())


if __name__ == "__main__":
    main()
