#!/bin/sh
# A stand-in for loom-trainer used by the worker daemon's unit tests: it speaks the trainer's
# stdout event protocol (one loom.TrainerEvent per line in protobuf JSON,
# proto/trainer_events.proto). Behaviour is chosen by the job spec's "name" field.
spec=""; rank=0
for a in "$@"; do
  case "$a" in
    --spec=*) spec="${a#--spec=}" ;;
    --rank=*) rank="${a#--rank=}" ;;
  esac
done
name=$(sed -n 's/.*"name": *"\([^"]*\)".*/\1/p' "$spec")
echo '{"process_start":{"rss_bytes":"1048576"}}'
echo '{"rendezvous":{"port":43210}}'
echo "{\"started\":{\"rank\":$rank,\"world_size\":1}}"
echo '{"eval":{"step":"0","loss":5.5}}'
case "$name" in
  fail)
    echo "fake trainer: about to fail" >&2
    echo '{"error":{"message":"CUDA out of memory (simulated)"}}'
    exit 3 ;;
  crash)
    echo "fake trainer: segfault-like crash on rank $rank" >&2
    exit 139 ;;
  sigmask)
    # Reports the signal mask this process started with (SigBlk of /proc/self/status).
    mask=$(sed -n 's/^SigBlk:[[:space:]]*//p' /proc/self/status)
    echo "{\"error\":{\"message\":\"SigBlk=$mask\"}}"
    exit 1 ;;
  graceful)
    # Runs (one stderr line every 50 ms) until SIGUSR1, then "checkpoints" and stops gracefully.
    trap 'echo "{\"checkpoint\":{\"step\":3,\"dir\":\"/tmp/x\"}}"; echo "{\"stopped\":{\"step\":3,\"checkpoint_step\":3}}"; exit 0' USR1
    echo '{"step":{"step":3,"loss":5.0,"tokens_per_s":100}}'
    i=0
    while true; do i=$((i+1)); echo "fake trainer: tick $i" >&2; sleep 0.05; done ;;
  peer_stopped)
    # A rank whose peer got the SIGUSR1: the gang agreed on step 4, this rank wrote its part of
    # the final checkpoint and exits 0 without a signal of its own.
    echo '{"step":{"step":4,"loss":5.0,"tokens_per_s":100}}'
    echo '{"checkpoint":{"step":4,"dir":"/tmp/x"}}'
    echo '{"stopped":{"step":4,"checkpoint_step":4}}'
    exit 0 ;;
  superoffload)
    # A SuperOffload rank: its "started" names the casting choice; two steps with cumulative
    # sub-group counts, then it runs until SIGTERM.
    echo "{\"started\":{\"rank\":$rank,\"world_size\":1,\"superoffload_casting\":\"no transfer\"}}"
    echo '{"step":{"step":"1","loss":5.0,"speculated_sub_groups":"4","speculation_hits":"3","rollbacks_clip":"1","replays":"1","optimizer_overlap_fraction":0.75,"optimizer_work_s":0.5}}'
    echo '{"step":{"step":"2","loss":4.5,"speculated_sub_groups":"8","speculation_hits":"6","rollbacks_overflow":"1","rollbacks_clip":"1","replays":"1","optimizer_overlap_fraction":0.875,"optimizer_work_s":0.25}}'
    echo '{"checkpoint":{"step":"2","dir":"/tmp/x"}}'
    trap 'exit 143' TERM
    while true; do sleep 0.05; done ;;
  resumed)
    # An attempt resumed from the checkpoint of step 40: two steps of 25 global tokens per
    # second for 2 s (50 tokens each), then it runs until SIGTERM.
    echo "{\"started\":{\"rank\":$rank,\"world_size\":1,\"start_step\":\"40\"}}"
    echo '{"step":{"step":"41","loss":3.0,"tokens_per_s":25,"step_time_s":2}}'
    echo '{"step":{"step":"42","loss":2.9,"tokens_per_s":25,"step_time_s":2}}'
    trap 'exit 143' TERM
    while true; do sleep 0.05; done ;;
  hang)
    echo '{"step":{"step":"1","loss":5.0,"tokens_per_s":100,"step_time_s":0.25,"partition_bytes":"4096","peak_gathered_bytes":"16384","comm_s":0.125,"data_s":0.0625,"optimizer_rollbacks":"2","param_bytes":"1024","optimizer_state_bytes":"8192","activation_offload_bytes":"512","peak_bytes":"9728","zenflow_stall_s":0.03125,"zenflow_selected_mass_fraction":0.5,"zenflow_update_interval":"4","zenflow_bytes_moved":"65536"}}'
    echo '{"checkpoint":{"step":"1","dir":"/tmp/x"}}'
    trap 'exit 143' TERM
    while true; do sleep 0.05; done ;;
esac
echo '{"step":{"step":"1","loss":5.0,"tokens_per_s":100.5}}'
echo '{"step":{"step":"2","loss":4.25,"tokens_per_s":120}}'
echo '{"checkpoint":{"step":"2","dir":"/tmp/x"}}'
echo '{"done":{"step":"2","initial_eval_loss":5.5,"final_eval_loss":4.5}}'
exit 0
