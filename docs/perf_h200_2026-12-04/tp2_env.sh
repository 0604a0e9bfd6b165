# Sourced by the tp2_*.sh call scripts (kind nvidia-h200-x2, carry [".whl", ".devrun"]): NVLink
# multicast off (KINDS.md), the carried wheels (fla-core; pytest-xdist for the GPU suite) installed
# beside the machine's torch, logs under $OUT/logs ($L), the repository importable.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
