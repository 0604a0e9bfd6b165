"""Ad hoc (fiftieth run): compile record.py's launches.json for sm_90 without the interpreter
(tests/triton_utils/sm90_compile.py) and print each launch's registers, stack and shared memory
(the cubin's resource usage), programs per SM (the least of registers, rounded to 8 a thread, 64
warps, shared memory and 32) and waves on the H200's 132 SMs. Run from the repository root."""

import json
import os
import re
import subprocess
import sys

sys.path[:0] = ["tests/triton_utils", "."]

import sm90_compile  # noqa: E402
import triton.backends.nvidia as nvidia  # noqa: E402

SMS = 132
REGISTERS, WARPS, SHARED, BLOCKS = 65536, 64, 233472, 32


def main() -> None:
    cuobjdump = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    with open("launches.json") as f:
        launches = json.load(f)
    seen = set()
    for launch in launches:
        key = json.dumps([launch[k] for k in ("kernel", "args", "options", "grid")])
        if key in seen:
            continue
        seen.add(key)
        kernel = sm90_compile._compile(launch)
        with open("kernel.cubin", "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run(
            [cuobjdump, "--dump-resource-usage", "kernel.cubin"], capture_output=True, text=True
        ).stdout
        regs, stack, shared = map(
            int, re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", usage).groups()
        )
        shared = max(shared, kernel.metadata.shared)
        warps = launch["options"].get("num_warps", 4)
        per_sm = min(
            REGISTERS // (-(-regs // 8) * 8 * 32 * warps), WARPS // warps,
            SHARED // (shared + 1024) if shared else BLOCKS, BLOCKS,
        )  # fmt: skip
        programs = launch["grid"][0] * launch["grid"][1] * launch["grid"][2]
        waves = programs / (SMS * per_sm) if per_sm else float("inf")
        print(
            f"{launch['tag']:<34} {launch['kernel']:<28} programs {programs:>5} warps {warps} "
            f"regs {regs:>3} stack {stack:>3} smem {shared:>6} per SM {per_sm:>2} "
            f"waves {waves:5.2f}"
        )


if __name__ == "__main__":
    main()
