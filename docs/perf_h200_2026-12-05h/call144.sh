#!/usr/bin/env bash
# Thirty-ninth run, call 144 (carry [".whl", ".devrun"]; the working tree with the KDA prefill
# graphs): their GPU tests (call 143 had stopped them at set-up: a CPU-only fixture imported the
# API server), then kda_graph_probe.py, fla-core's chunk_kda in its fixed-shape form eager and
# replayed from a CUDA graph, bits and host / device time.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_kda_prefill_graphs.py -x 2>&1 | tail -25
timeout 200 python docs/perf_h200_2026-12-05h/kda_graph_probe.py 2>&1 | grep -v "^WARN" | tail -25
