#!/usr/bin/env bash
# Device call 71: torch.bmm of MLA's absorbs in the previous weight layout against the new one
# (the path every decode batch of 2 or more rows now takes), kernel level.
set -u
export PYTHONPATH=$PWD
timeout 120 python .devrun/exp_bmm_layout.py 2>&1 | grep -v -i warn
