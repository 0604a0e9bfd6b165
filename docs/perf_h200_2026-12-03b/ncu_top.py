"""Summarize an ncu report (call 64): key metrics, warp-state totals and the SASS instructions
with the most stall samples. `python ncu_top.py REPORT.ncu-rep OUT.txt`."""

import csv
import io
import subprocess
import sys

rep, out = sys.argv[1], sys.argv[2]
lines = []
det = subprocess.run(
    ["ncu", "-i", rep, "--page", "details", "--csv"], capture_output=True, text=True
).stdout
rows = list(csv.reader(io.StringIO(det)))
hdr = rows[0]
ki, mi, ui, vi = (
    hdr.index(c) for c in ("Kernel Name", "Metric Name", "Metric Unit", "Metric Value")
)
keep = (
    "Duration",
    "DRAM Throughput",
    "Memory Throughput",
    "Registers Per Thread",
    "Achieved Occupancy",
    "Theoretical Occupancy",
    "Block Limit",
    "Grid Size",
    "Block Size",
    "Issue Slots Busy",
    "Warp Cycles Per Issued Instruction",
    "No Eligible",
    "Dynamic Shared Memory",
    "Static Shared",
    "Elapsed Cycles",
    "L2 Hit Rate",
    "Waves Per SM",
)
for r in rows[1:]:
    if any(k in r[mi] for k in keep):
        lines.append(f"{r[ki][:40]} | {r[mi]} = {r[vi]} {r[ui]}")
raw = subprocess.run(
    ["ncu", "-i", rep, "--page", "raw", "--csv"], capture_output=True, text=True
).stdout
rr = list(csv.reader(io.StringIO(raw)))
if rr:
    h = rr[0]
    for row in rr[2:]:
        stalls = [(h[i], row[i]) for i in range(len(h)) if "pcsamp_warps_issue_stalled" in h[i]]
        stalls = sorted(((float(v.replace(",", "") or 0), k) for k, v in stalls), reverse=True)
        lines.append(
            "stalls: " + ", ".join(f"{k.split('stalled_')[1]}={int(v)}" for v, k in stalls[:10])
        )
src = subprocess.run(
    ["ncu", "-i", rep, "--page", "source", "--csv", "--print-source", "sass"],
    capture_output=True,
    text=True,
).stdout
open(out + ".sass.csv", "w").write(src)
sr = list(csv.reader(io.StringIO(src)))
hi = [i for i, r in enumerate(sr) if any("Source" == c for c in r)]
if hi:
    h = sr[hi[0]]
    body = sr[hi[0] + 1 :]
    si = h.index("Source")
    ci = next(i for i, c in enumerate(h) if "Stall Sampling (All" in c)
    total = sum(float(r[ci] or 0) for r in body if len(r) > ci)
    lines.append(f"sass lines {len(body)}, stall samples {total:.0f}; columns: {h}")
    top = sorted(
        range(len(body)), key=lambda i: -float(body[i][ci] or 0) if len(body[i]) > ci else 0
    )[:45]
    for i in sorted(top):
        r = body[i]
        lines.append(f"{i:5d} {float(r[ci] or 0):7.0f} {r[si][:110]}")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:60]))
