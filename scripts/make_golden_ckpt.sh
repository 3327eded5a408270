#!/usr/bin/env bash
# Writes worker/trainer/testdata/golden_ckpt/ (golden.json: per-tensor SHA-256 of the tiny 2-rank
# fp32 job's step-3 and step-6 checkpoints for ZeRO stages 0-3 and its per-step losses;
# stage3_step3/: that job's complete stage-3 step-3 checkpoint) with the loom-trainer built from
# the current tree. First run at the commit before the issue-12 restructuring; rerun only for a
# deliberate numeric change (said in the commit: last, the global-sample-index window order);
# otherwise //worker/trainer:restructure_golden_test compares new runs against these files.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/worker/trainer/testdata/golden_ckpt"
rm -rf "$out" && mkdir -p "$out"
bazel test //worker/trainer:restructure_golden_test --test_env=LOOM_GOLDEN_OUT="$out" \
  --spawn_strategy=standalone --cache_test_results=no --test_output=errors
ls -l "$out" "$out/stage3_step3"
