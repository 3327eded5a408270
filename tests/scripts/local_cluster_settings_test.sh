#!/bin/bash
# A newcomer's local cluster (issue 49): LOOM_DATA_ROOTS alone lets jobs read the operator's own
# data (the scheduler's queues config is written from it; both had to be set); the data roots
# given at its first start are its saved settings, so a stop and a start (or an add-worker) in a
# shell without LOOM_DATA_ROOTS keep them (they used to fall back to the fortunes corpus,
# failing a running job's attempts); and loomctl
# finds the cluster from a subdirectory (the nearest .loom/cluster) and from any directory (the
# cluster recorded in ~/.config/loom/cluster by start, forgotten by stop). Real daemons, one
# worker, nothing trains.
set -euo pipefail
RUNFILES="$PWD"
LOOMCTL="$RUNFILES/services/cli/loomctl"
export LOOM_BIN="$RUNFILES"
export HOME="$TEST_TMPDIR/home"
unset XDG_CONFIG_HOME LOOM_QUEUES_CONFIG LOOM_SCRATCH_ROOTS LOOM_DATA_ROOTS LOOM_RECORD_CLUSTER \
  LOOM_SCHEDULER LOOM_AUTH_TOKENS_FILE LOOM_WORKER_TOKEN_FILE LOOM_GATEWAY_PORT
proj="$TEST_TMPDIR/proj"
data="$TEST_TMPDIR/my data"  # a space: the saved value must be quoted
mkdir -p "$HOME" "$TEST_TMPDIR/empty-home" "$proj/a/b" "$data" "$TEST_TMPDIR/elsewhere"
export LOOM_HOME="$proj/.loom"
cleanup() { bash scripts/local_cluster.sh stop >/dev/null 2>&1 || true; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
data_roots_of() {  # data_roots_of WORKER: its --data_roots value, from the saved command line
  tr '\0' '\n' < "$LOOM_HOME/cluster/$1.cmd" | sed -n 's/^--data_roots=//p'
}

LOOM_DATA_ROOTS="$data" bash scripts/local_cluster.sh start --workers 1 > /dev/null
[ "$(data_roots_of worker-0)" = "$data" ] || fail "first start: worker-0 data roots '$(data_roots_of worker-0)'"
# One setting for own data: the scheduler allows what the workers do (a queues config written
# from LOOM_DATA_ROOTS), so a job reading a file there passes admission, one outside does not.
for i in $(seq 400); do printf 'document %d of the operator'"'"'s own corpus, plain text\n\n' "$i"; done \
  > "$data/corpus.txt"
spec() {  # spec DATASET_PATH: a tiny job reading it
  cat <<YAML
name: own-data
model:
  config: {vocab_size: 256, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
           num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 32,
           rms_norm_eps: 1.0e-5, rope_theta: 10000, tie_word_embeddings: true}
dataset: {path: "$1", format: text, tokenizer: byte}
deepspeed_config:
  train_micro_batch_size_per_gpu: 2
  optimizer: {type: AdamW, params: {lr: 0.001}}
  zero_optimization: {stage: 2}
resources: {num_ranks: 1}
training: {steps: 3, sequence_length: 16}
YAML
}
spec "$data/corpus.txt" > "$TEST_TMPDIR/own.yaml"
"$LOOMCTL" submit "$TEST_TMPDIR/own.yaml" --dry_run > "$TEST_TMPDIR/own.out" 2>&1 \
  || { cat "$TEST_TMPDIR/own.out"; fail "a job reading $data/corpus.txt is refused"; }
mkdir -p "$TEST_TMPDIR/elsewhere-data" && cp "$data/corpus.txt" "$TEST_TMPDIR/elsewhere-data/"
spec "$TEST_TMPDIR/elsewhere-data/corpus.txt" > "$TEST_TMPDIR/outside.yaml"
set +e
out=$("$LOOMCTL" submit "$TEST_TMPDIR/outside.yaml" --dry_run 2>&1)
code=$?
set -e
[ "$code" = 7 ] || fail "a job reading outside the data roots: exit $code, want 7: $out"
echo "$out" | grep -q "dataset.path: .* is outside the data roots" || fail "outside: $out"
echo "own data: admitted inside LOOM_DATA_ROOTS, PERMISSION_DENIED outside"
bash scripts/local_cluster.sh stop > /dev/null

bash scripts/local_cluster.sh start --workers 1 > /dev/null 2> "$TEST_TMPDIR/start2.err"
cat "$TEST_TMPDIR/start2.err"
grep -qF "LOOM_DATA_ROOTS=$data (saved in $LOOM_HOME/settings.env" "$TEST_TMPDIR/start2.err" \
  || fail "the second start does not say it uses the saved LOOM_DATA_ROOTS"
[ "$(data_roots_of worker-0)" = "$data" ] || fail "second start: worker-0 data roots '$(data_roots_of worker-0)'"
bash scripts/local_cluster.sh add-worker > /dev/null 2>&1
[ "$(data_roots_of worker-1)" = "$data" ] || fail "add-worker: worker-1 data roots '$(data_roots_of worker-1)'"
echo "settings: the data roots survive stop/start and reach add-worker"

# loomctl from a subdirectory, with neither LOOM_HOME nor a recorded cluster.
out=$(cd "$proj/a/b" && env -u LOOM_HOME HOME="$TEST_TMPDIR/empty-home" "$LOOMCTL" nodes) \
  || fail "loomctl nodes from $proj/a/b: exit $?"
echo "$out" | grep -q "worker-1" || fail "loomctl nodes from a subdirectory: $out"
# From any directory: the recorded cluster.
[ "$(cat "$HOME/.config/loom/cluster")" = "$LOOM_HOME/cluster" ] \
  || fail "recorded cluster: '$(cat "$HOME/.config/loom/cluster" 2>&1)'"
out=$(cd "$TEST_TMPDIR/elsewhere" && env -u LOOM_HOME "$LOOMCTL" nodes) \
  || fail "loomctl nodes from elsewhere: exit $?"
echo "$out" | grep -q "worker-0" || fail "loomctl nodes from elsewhere: $out"
echo "loomctl: finds the cluster from a subdirectory and from elsewhere"

bash scripts/local_cluster.sh stop > /dev/null
[ ! -e "$HOME/.config/loom/cluster" ] || fail "stop left the record of the cluster"
set +e
out=$(cd "$TEST_TMPDIR/elsewhere" && env -u LOOM_HOME "$LOOMCTL" --timeout=5s nodes 2>&1)
code=$?
set -e
[ "$code" = 14 ] || fail "loomctl with no cluster: exit $code, want 14 (UNAVAILABLE): $out"
echo "$out" | grep -q "no scheduler address: pass --scheduler, set LOOM_SCHEDULER or LOOM_HOME" \
  || fail "loomctl with no cluster: $out"
echo "PASS"
