"""Compile the launches mla_record_launches.py recorded for sm_90 and count the MMA, barrier and
shared-memory instructions of each one's PTX (twenty-fifth run). Run from the repository root
without the interpreter."""

import json
import re
import sys

sys.path[:0] = [".", "tests/triton_utils"]

import sm90_compile  # noqa: E402

PATTERNS = [r"wgmma\.mma_async", r"mma\.sync", r"bar\.sync", r"ldmatrix", r"cp\.async\.c[ag]",
            r"st\.shared"]  # fmt: skip

with open("/tmp/mla_launches.json") as f:
    launches = json.load(f)
for launch in launches:
    compiled = sm90_compile._compile(launch)
    ptx = compiled.asm["ptx"]
    args, options = launch["args"], launch["options"]
    counts = {p: len(re.findall(p, ptx)) for p in PATTERNS}
    shape = [args[k] for k in ("BLOCK_H", "BLOCK_N", "LATENT_CHUNKS", "FUSED_MERGE")]
    shape += [options["num_warps"], options["num_stages"]]
    print(*shape, counts, "smem", compiled.metadata.shared)
