"""(Ad hoc, fiftieth run) Compile /tmp/occ/launches.json (record.py) for sm_90 and print each
launch's registers, shared memory, programs per SM and waves on 132 SMs."""
import json, sys, subprocess, os
sys.path[:0] = ["/work/main/tests/triton_utils", "/work/main"]
import sm90_compile as C
import triton.backends.nvidia as nv
tool = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
launches = json.load(open("/tmp/occ/launches.json"))
seen = set()
for l in launches:
    key = json.dumps([l["kernel"], l["args"], l["options"], l["grid"]], sort_keys=True)
    if key in seen: continue
    seen.add(key)
    try:
        k = C._compile(l)
    except Exception as e:
        print(l["tag"], l["kernel"], "compile failed", str(e)[:100]); continue
    open("/tmp/occ/k.cubin", "wb").write(k.asm["cubin"])
    r = subprocess.run([tool, "--dump-resource-usage", "/tmp/occ/k.cubin"], capture_output=True, text=True).stdout
    import re
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", r)
    regs, stack, smem = map(int, m.groups())
    smem = max(smem, k.metadata.shared)
    warps = l["options"].get("num_warps", 4)
    threads = warps * 32
    regs_alloc = ((regs + 7) // 8) * 8
    per_sm_regs = 65536 // (regs_alloc * threads)
    per_sm_warps = 64 // warps
    per_sm_smem = (233472 // (smem + 1024)) if smem else 32
    per_sm = max(0, min(per_sm_regs, per_sm_warps, per_sm_smem, 32))
    grid = l["grid"]; progs = grid[0] * grid[1] * grid[2]
    waves = progs / (132 * per_sm) if per_sm else float("inf")
    print(f"{l['tag']:<26} {l['kernel']:<30} grid {progs:>6} warps {warps} regs {regs:>3} stack {stack:>3} smem {smem:>6} per_SM {per_sm:>2} (r{per_sm_regs} w{per_sm_warps} s{per_sm_smem}) waves {waves:5.2f}")
