#!/bin/bash
# docs/operations.md §5 as a test: back up the scheduler's SQLite database (WAL mode) with
# `sqlite3 .backup` while the scheduler runs and writes, check the copy, and restore it into a
# fresh scheduler that then lists the same jobs.
set -euo pipefail
T="$TEST_TMPDIR"
SCHED=services/scheduler/loom-scheduler
CTL=services/cli/loomctl
JOB=examples/fortunes-llama/job.yaml
mkdir -p "$T/ckpt"
pids=()
cleanup() { for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start_scheduler() {  # start_scheduler DB READY_FILE LOG; sets $addr and appends to $pids
  "$SCHED" --db="$1" --checkpoint_root="$T/ckpt" --ready_file="$2" >"$3" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$2" ] && break; sleep 0.1; done
  [ -s "$2" ] || { echo "scheduler not ready:"; cat "$3"; exit 1; }
  addr=$(sed -n 's/.*"grpc_address":"\([^"]*\)".*/\1/p' "$2")
}

start_scheduler "$T/loom.db" "$T/s1.json" "$T/s1.log"
for i in 1 2 3; do "$CTL" --scheduler="$addr" submit "$JOB" > "$T/submit$i.out"; done
# Writes keep coming while the backup runs (a submission loop in the background).
( for i in $(seq 5); do "$CTL" --scheduler="$addr" submit "$JOB" >/dev/null; done ) &
writer=$!
# Back up once the writer's first submission is in (deadline 10 s), so that the backup overlaps
# its writes.
for _ in $(seq 100); do
  [ "$(sqlite3 "$T/loom.db" "SELECT count(*) FROM jobs")" -gt 3 ] && break
  sleep 0.1
done
[ "$(sqlite3 "$T/loom.db" "SELECT count(*) FROM jobs")" -gt 3 ] || { echo "writer made no submission in 10 s"; exit 1; }
sqlite3 "$T/loom.db" ".backup '$T/backup.db'"
wait "$writer"
[ "$(sqlite3 "$T/loom.db" "SELECT count(*) FROM jobs")" = 8 ]

[ "$(sqlite3 "$T/backup.db" 'PRAGMA integrity_check')" = ok ]
backed_up=$(sqlite3 "$T/backup.db" 'SELECT count(*) FROM jobs')
[ "$backed_up" -ge 3 ] && [ "$backed_up" -le 8 ] || { echo "backup holds $backed_up jobs"; exit 1; }
[ "$(sqlite3 "$T/loom.db" 'PRAGMA journal_mode')" = wal ]

# Restore: a new scheduler on the copy serves exactly the backed-up jobs.
kill -TERM "${pids[0]}"; wait "${pids[0]}" || true
cp "$T/backup.db" "$T/restored.db"
start_scheduler "$T/restored.db" "$T/s2.json" "$T/s2.log"
"$CTL" --scheduler="$addr" --json list > "$T/list.json"
listed=$(/opt/loom/venv/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1])).get("jobs", [])))' "$T/list.json")
[ "$listed" = "$backed_up" ] || { echo "restored scheduler lists $listed jobs, backup had $backed_up"; cat "$T/list.json"; exit 1; }
for i in 1 2 3; do
  id=$(grep -o 'job-[0-9a-f]\{8\}' "$T/submit$i.out" | head -1)
  grep -q "$id" "$T/list.json" || { echo "job $id missing after restore"; exit 1; }
done
echo "sqlite_backup_test: PASS ($backed_up jobs backed up and restored)"
