"""Record the MLA split kernel's launches at one 8k sequence (the default and 64-head configs) to
/tmp/mla_launches.json for mla_count_ptx.py (twenty-fifth run). Run from the repository root
under TRITON_INTERPRET=1."""

import json
import sys

import pytest

sys.path[:0] = [".", "tests", "tests/triton_utils"]

import tests.triton_utils.test_kernels_compile_for_hopper as compile_test  # noqa: E402
from vllm.models.kimi_k3.amd.ops.mla_decode_config import MlaDecodeConfig  # noqa: E402

SHAPES = [(64, 64, 4, 2, 1), (64, 64, 4, 2, 4), (64, 64, 4, 3, 4), (64, 32, 4, 3, 4),
          (64, 64, 8, 2, 4), (64, 32, 4, 4, 2)]  # fmt: skip

launches: list[dict] = []
configs = [MlaDecodeConfig(64, h, n, w, s, latent_chunks=c) for h, n, w, s, c in SHAPES]
with pytest.MonkeyPatch.context() as mp:
    compile_test._record(mp, launches, pdl=True)
    compile_test._drive_mla(1, 32, 512, 64, 16, 8240, configs)
split = [launch for launch in launches if launch["kernel"] == "_mla_decode_split_kernel"]
with open("/tmp/mla_launches.json", "w") as f:
    json.dump(split, f)
