// The training loop of one rank: a Llama (worker/engine/model/llama_model.h) over the ZeRO stage
// 0-3 parameter provider (worker/engine/zero/zero_provider.h), trained on the
// byte-level corpus with DeepSpeed semantics (gradient accumulation, bf16 or fp16 with dynamic
// loss scaling, global-norm clipping fused with unscaling, Adam/AdamW on the fp32 partition per
// sub-group via ApplyOptimizerStep (worker/engine/optimizer.h), DeepSpeed LR schedules),
// held-out evaluation, checkpoint shards (one layout for every stage) and resume.
//
// Header is torch-free so that binaries link the engine without compiling LibTorch headers.
// RunTraining is not thread-safe: one call per process (it sets LibTorch's global thread count).
#ifndef LOOM_WORKER_ENGINE_ENGINE_H_
#define LOOM_WORKER_ENGINE_ENGINE_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "proto/trainer_events.pb.h"
#include "worker/engine/engine_options.h"

namespace loom::engine {

class Collectives;

// One progress event, a loom.TrainerEvent (proto/trainer_events.proto: its field comments are
// the schema), built where the engine makes it; loom-trainer prints it as one line of protobuf
// JSON (worker/trainer/trainer_events.h). Called on the training thread.
using EventCallback = std::function<void(const loom::TrainerEvent& event)>;

// Runs training for this rank (options.rank of options.world_size; `collectives` must match).
// Emits, in order: started; eval (step 0 or the resume step); per step: step, then eval every
// eval_every_steps and checkpoint every checkpoint_interval_steps; after the last step: eval,
// checkpoint (when checkpoint_dir is set) and done. Rank 0 writes
// <checkpoint_dir>/final_logits.json (32 held-out tokens and the model's logits for them).
// `stop_requested` (may be null) is polled at each step boundary and agreed on by all ranks
// (all-reduce MAX), so every rank stops after the same step.
// `checkpoint_and_stop` (may be null) asks for a graceful stop, agreed on the same way (one
// all-reduced int per step boundary: 0 go on, 1 checkpoint and stop, 2 stop now; a rank that
// got the request at a later step still stops at the first boundary where any rank had it): at
// that boundary every rank writes its shard of a checkpoint of the steps done so far (unless one
// of that step exists), passes a barrier (so the checkpoint is complete), emits
// stopped {step: s, checkpoint_step: s} and RunTraining returns OK. Without a
// checkpoint_dir it returns CANCELLED like a plain stop.
// Config keys accepted but ignored are emitted first as warning {message}.
// Errors: CANCELLED when stopped; INVALID_ARGUMENT / FAILED_PRECONDITION for bad data or resume
// checkpoints (naming the field or file), and INVALID_ARGUMENT naming the key for offload Loom
// refuses (offload_optimizer.ratio < 1, offload at stage 0, offload_param without
// offload_optimizer); DEADLINE_EXCEEDED / UNAVAILABLE for collective
// failures; INTERNAL for LibTorch errors. Never throws.
absl::Status RunTraining(const EngineOptions& options, Collectives& collectives,
                         const EventCallback& emit, const std::atomic<bool>* stop_requested,
                         const std::atomic<bool>* checkpoint_and_stop = nullptr);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_ENGINE_H_
