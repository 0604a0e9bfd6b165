#!/usr/bin/env bash
# Device call 82 (prepared, not run: no device time was left): why the new two-launch merge's bits differ from the one-launch merge on the GPU:
# the failing test as is, without PDL, and with the merge's loads through L2 (.cg): mla_decode_cg.py is
# branch mlamerge's mla_decode.py with cache_modifier=".cg" on the merge kernel's three loads.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
T="tests/models/kimi_k3/test_amd_mla_decode.py::test_gpu_one_launch_merge_kimi_sizes"
run() { # tag, env...
  tag=$1; shift
  env "$@" timeout 70 python -m pytest -q -x -p no:cacheprovider "$T[1-1024]" "$T[16-8192]" > $L/call82_$tag.log 2>&1
  echo "$tag rc $?"; tail -1 $L/call82_$tag.log
}
export PYTHONPATH=/tmp/site:$PWD
run asis
run nopdl VLLM_TRITON_PDL=0
rm -rf /tmp/cgtree && mkdir /tmp/cgtree && cp -r vllm tests pyproject.toml /tmp/cgtree/ && cp .devrun/mla_decode_cg.py /tmp/cgtree/vllm/models/kimi_k3/amd/ops/mla_decode.py
(cd /tmp/cgtree && export PYTHONPATH=/tmp/site:/tmp/cgtree && run cg)
