#!/usr/bin/env bash
# The main job: installs what is missing, builds Loom, starts a local cluster (scheduler, two
# workers, checkpoint service) on loopback, trains the example Llama-style model on the fortunes
# corpus with ZeRO-3 on 2 ranks, consolidates the last checkpoint into model.safetensors, checks
# the export independently with PyTorch and loads it with transformers, prints the held-out loss before and after training and
# the path of the safetensors file, and shuts everything down.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOB="${1:-examples/fortunes-llama/job.yaml}"
export LOOM_HOME="${LOOM_HOME:-$ROOT/.loom}"

bash scripts/install_deps.sh
echo "== building (first build takes a few minutes on 2 cores)"
bash scripts/build.sh

cleanup() {
  scripts/local_cluster.sh stop || true
  bazel shutdown 2>/dev/null || true
}
trap cleanup EXIT

scripts/local_cluster.sh stop >/dev/null 2>&1 || true
echo "== starting a local cluster under $LOOM_HOME"
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
