#!/usr/bin/env bash
# The main job: installs what is missing, builds Loom, starts a local cluster of its own
# (scheduler, two workers, checkpoint service, gateway; state under .loom-main-job, or
# $LOOM_MAIN_JOB_HOME) on loopback, trains the example Llama-style model on the fortunes
# corpus with ZeRO-3 on 2 ranks, consolidates the last checkpoint into model.safetensors, checks
# the export independently with PyTorch and loads it with transformers, prints the held-out loss
# before and after training and the path of the safetensors file, and shuts its cluster down.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOB="${1:-examples/fortunes-llama/job.yaml}"
# A cluster of its own: its own state directory (SQLite file, checkpoints, ready files) and
# OS-chosen ports, so a local cluster you run under .loom (or $LOOM_HOME) is never stopped or
# written to. Its settings are the defaults (the fortunes corpus as the data root, no
# authentication), whatever your shell exports for your own cluster.
export LOOM_HOME="${LOOM_MAIN_JOB_HOME:-$ROOT/.loom-main-job}"
unset LOOM_GATEWAY_PORT LOOM_QUEUES_CONFIG LOOM_DATA_ROOTS LOOM_SCRATCH_ROOTS \
  LOOM_AUTH_TOKENS_FILE LOOM_WORKER_TOKEN_FILE
# Not recorded as the cluster loomctl finds from any directory: that stays yours.
export LOOM_RECORD_CLUSTER=0

bash scripts/install_deps.sh
echo "== building (the first build takes ~20 min on 2 cores; later ones seconds)"
bash scripts/build.sh

cleanup() {
  scripts/local_cluster.sh stop || true
  bazel shutdown 2>/dev/null || true
}
trap cleanup EXIT

if compgen -G "$LOOM_HOME/cluster/*.pid" >/dev/null; then
  echo "== stopping the main job's own cluster that an earlier, interrupted run left under $LOOM_HOME"
  scripts/local_cluster.sh stop
fi
echo "== starting the main job's own local cluster under $LOOM_HOME (a cluster under .loom is left alone)"
scripts/local_cluster.sh start --workers 2
LOOMCTL="bazel-bin/services/cli/loomctl --cluster_dir=$LOOM_HOME/cluster"

echo "== submitting $JOB"
job_id=$($LOOMCTL submit "$JOB")
echo "job $job_id"
$LOOMCTL wait "$job_id" | tee "$LOOM_HOME/$job_id.progress.log"

echo "== consolidating the last checkpoint"
$LOOMCTL consolidate "$job_id" | tee "$LOOM_HOME/$job_id.consolidate.log"
safetensors=$(sed -n 's/^safetensors: //p' "$LOOM_HOME/$job_id.consolidate.log")
model_dir=$(dirname "$safetensors")

echo "== independent check: PyTorch rebuilds the model from model.safetensors + config.json"
/opt/loom/venv/bin/python3 tests/python/check_export.py --model_dir "$model_dir" \
  --logits "$LOOM_HOME/checkpoints/$job_id/final_logits.json"

echo "== transformers loads the export (AutoModelForCausalLM.from_pretrained, offline)"
/opt/loom/venv/bin/python3 tests/python/hf_load_export.py --model_dir "$model_dir" \
  --logits "$LOOM_HOME/checkpoints/$job_id/final_logits.json"

$LOOMCTL get "$job_id"
echo
grep '^held-out loss' "$LOOM_HOME/$job_id.progress.log" || true
echo "model.safetensors: $safetensors"
echo "config.json:       $model_dir/config.json"
