#!/bin/sh
# A stand-in for loom-trainer for the device binding test (services/worker/
# device_binding_process_test.cc): it writes its whole environment to env_rank_<rank>.txt next
# to its spec (the attempt's run directory), speaks the trainer's event protocol
# (proto/trainer_events.proto), and finishes once the file named by the job's run directory's
# ../../release exists (so the test can hold every rank alive at once).
spec=""; rank=0
for a in "$@"; do
  case "$a" in
    --spec=*) spec="${a#--spec=}" ;;
    --rank=*) rank="${a#--rank=}" ;;
  esac
done
dir=$(dirname "$spec")
# The environment block exactly as execve passed it (/proc/$$/environ), duplicates included: the
# shell itself would keep only one of two entries with the same name, a C program's getenv the
# first.
tr '\0' '\n' < /proc/$$/environ > "$dir/env_rank_$rank.tmp" && mv "$dir/env_rank_$rank.tmp" "$dir/env_rank_$rank.txt"
[ "$rank" = 0 ] && echo "{\"rendezvous\":{\"port\":$((29500 + $(od -An -N1 -tu1 /dev/urandom)))}}"
echo "{\"started\":{\"rank\":$rank,\"world_size\":${WORLD_SIZE:-1}}}"
echo '{"step":{"step":"1","loss":5.0,"tokens_per_s":100}}'
while [ ! -e "$dir/../../release" ]; do sleep 0.05; done
echo '{"done":{"step":"1","initial_eval_loss":5.5,"final_eval_loss":4.5}}'
exit 0
