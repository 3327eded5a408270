#!/bin/sh
# A stand-in for loom-trainer used by the worker daemon's unit tests: it speaks the trainer's
# stdout event protocol. Behaviour is chosen by the job spec's "name" field.
spec=""; rank=0
for a in "$@"; do
  case "$a" in
    --spec=*) spec="${a#--spec=}" ;;
    --rank=*) rank="${a#--rank=}" ;;
  esac
done
name=$(sed -n 's/.*"name": *"\([^"]*\)".*/\1/p' "$spec")
echo '{"event":"rendezvous","port":43210}'
echo "{\"event\":\"started\",\"rank\":$rank,\"world_size\":1}"
echo '{"event":"eval","step":0,"loss":5.5}'
case "$name" in
  fail)
    echo "fake trainer: about to fail" >&2
    echo '{"event":"error","message":"CUDA out of memory (simulated)"}'
    exit 3 ;;
  crash)
    echo "fake trainer: segfault-like crash on rank $rank" >&2
    exit 139 ;;
  sigmask)
    # Reports the signal mask this process started with (SigBlk of /proc/self/status).
    mask=$(sed -n 's/^SigBlk:[[:space:]]*//p' /proc/self/status)
    echo "{\"event\":\"error\",\"message\":\"SigBlk=$mask\"}"
    exit 1 ;;
  hang)
    echo '{"event":"step","step":1,"loss":5.0,"tokens_per_s":100,"step_time_s":0.25,"partition_bytes":4096,"peak_gathered_bytes":16384,"comm_s":0.125,"data_s":0.0625,"optimizer_rollbacks":2,"param_bytes":1024,"optimizer_state_bytes":8192}'
    echo '{"event":"checkpoint","step":1,"dir":"/tmp/x"}'
    trap 'exit 143' TERM
    while true; do sleep 0.05; done ;;
esac
echo '{"event":"step","step":1,"loss":5.0,"tokens_per_s":100.5}'
echo '{"event":"step","step":2,"loss":4.25,"tokens_per_s":120}'
echo '{"event":"checkpoint","step":2,"dir":"/tmp/x"}'
echo '{"event":"done","step":2,"initial_eval_loss":5.5,"final_eval_loss":4.5}'
exit 0
