// Per-decoder-layer activation checkpointing (Chen et al. 2016, "Training Deep Nets with
// Sublinear Memory Cost"; DeepSpeed's activation_checkpointing, docs/design/TECHNIQUES.md §3.4)
// with optional offload of the checkpointed layer inputs to host memory (DeepSpeed's
// cpu_checkpointing, ArcticTraining's activation_checkpoint_cpu_offload).
//
// CheckpointLayer(fn, h) is a custom autograd function: its forward runs fn(h, kForward) under
// no-grad (no activation of the layer is saved) and keeps only h, [B,S,H] in the activation
// dtype — on the host when offloaded (pinned when an accelerator exists; on a CPU node a copy
// into a separate host buffer, so the path is the same and its bytes are counted). Its backward
// brings h back, re-runs fn(h, kRecompute) with grad enabled and backpropagates the incoming
// gradient through that recompute (one reentrant autograd pass per layer). Parameter gradients
// reach the ParamAccess sink from inside that pass, in the same op order as without
// checkpointing, so results are bit-identical (tested).
//
// ParamAccess contract (docs/engine.md): NoteUse(i) counts one backward contribution per forward
// use. `fn` tells the model which phase runs: in kForward (grad mode off) the model must still
// count its uses (LlamaModel turns grad mode on around NoteUse), in kRecompute it must not count
// them again (each use of the recompute yields the one contribution already counted). Stage 3
// re-acquires (all-gathers) every weight in the recompute. GradDeferral scopes opened inside fn
// (tiled ops) open and close inside the recompute's backward.
//
// Offloaded bytes are counted in `memory` (MemoryKind::kActivationOffload) from forward until
// the recompute has brought them back (or the graph is freed without a backward).
// Errors: whatever fn throws (CollectiveError, c10::Error) propagates. Not thread-safe.
#ifndef LOOM_WORKER_ENGINE_MODEL_ACTIVATION_CHECKPOINT_H_
#define LOOM_WORKER_ENGINE_MODEL_ACTIVATION_CHECKPOINT_H_

#include <ATen/core/Tensor.h>

#include <functional>

namespace loom::engine {

class MemoryTracker;  // worker/engine/zero/memory_tracker.h

enum class CheckpointPhase {
  kNone,       // not checkpointed: ordinary forward with grad
  kForward,    // the checkpointed forward, grad mode off
  kRecompute,  // the recompute in backward, grad mode on
};

struct ActivationCheckpointOptions {
  bool enabled = false;      // checkpoint every decoder layer
  bool cpu_offload = false;  // keep the checkpointed inputs in host memory
  MemoryTracker* memory = nullptr;  // optional: counts the offloaded bytes; must outlive backward
};

// fn(x, phase) -> the layer's output for x [B,S,H]; it must be deterministic (the recompute
// must see what forward saw) and may be called once more during backward, so what it
// captures must outlive the backward pass. `anchor`: ParamAccess::anchor().
using CheckpointedFn = std::function<at::Tensor(const at::Tensor& x, CheckpointPhase phase)>;
at::Tensor CheckpointLayer(CheckpointedFn fn, const at::Tensor& h, const at::Tensor& anchor,
                           const ActivationCheckpointOptions& options);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_MODEL_ACTIVATION_CHECKPOINT_H_
