#!/usr/bin/env bash
# TP = 2, a call beside tp2_a.sh / tp2_b.sh (prepared for kind nvidia-h200-x2; not run yet): both
# ranks' view of a decode step with the host taken out (tp2_rank_probe.py: every step starts on
# both ranks at once), graph and eager, then again with VLLM_TRITON_PDL=0; and which transport
# NCCL chose between the two GPUs (NCCL_DEBUG=INFO: P2P over NVLink, or SHM through the host).
# tp2_a.sh's engine profile sees rank 0 only and cannot tell a late rank 1 from slow captured
# all-reduces; this can. NVLink multicast stays off (KINDS.md).
source "$(dirname "$0")/tp2_env.sh"
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 330 python docs/perf_h200_2026-12-04/tp2_rank_probe.py \
  --quantization-config "$P" --batch-sizes 1 8 64 --output-json $L/tp2_rank_probe.json \
  > $L/tp2_rank_probe.log 2>&1
echo "probe rc $?"; grep -E "NCCL version| via |rank [01]|^ +[0-9]" $L/tp2_rank_probe.log | head -80
VLLM_TRITON_PDL=0 timeout 230 python docs/perf_h200_2026-12-04/tp2_rank_probe.py \
  --quantization-config "$P" --batch-sizes 8 64 --profile-steps 0 \
  --output-json $L/tp2_rank_probe_nopdl.json > $L/tp2_rank_probe_nopdl.log 2>&1
echo "probe (PDL off) rc $?"; grep -E "^rank [01]" $L/tp2_rank_probe_nopdl.log
