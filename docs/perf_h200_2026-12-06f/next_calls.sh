#!/usr/bin/env bash
# Prepared in the forty-fifth run for the next device session (carry [".whl", ".devrun"]). One
# PART per call:
#   gpu   (~3 min, any GPU) call181.sh: the MLA prefill GPU tests on c679e50 (the second
#         reading's changes around the operands kernel), the operands at 8192 tokens, the GEMV
#         tiles at Kimi-K3's two-token expert shapes (76.8% of copy in call 177);
#   grid  (~9 min, an H200: needs_h200) the grid, last on an H200 in call 148; now with
#         the MLA operands in one launch and the 256-wide down tiles (both measured as kernels
#         on an H100 only), and everything since call 148.
set -u
case "${PART:-gpu}" in
  gpu) bash docs/perf_h200_2026-12-06f/call181.sh ;;
  grid) PART=grid bash docs/perf_h200_2026-12-06d/next_calls.sh ;;
esac
