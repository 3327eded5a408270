// Per-decoder-layer activation checkpointing over ZeroProvider stages 0-3 on a 2-rank Gloo gang
// (threads, real collectives): loss and every gradient partition with checkpointing on equal
// those with it off BIT FOR BIT (the recompute replays the same ops, and the layer's backward
// hands the sink the same contributions in the same order), and with the inputs offloaded to
// host memory equal those without offload bit for bit. Also: every parameter raises exactly one
// "gradient ready" event, and the same events as without checkpointing arrive DURING the
// backward (from the provider's count of contributions, not from the end-of-backward sweep in
// FinishMicroStep, which would hide a NoteUse double count in the recompute),
// the offloaded bytes are counted in MemoryKind::kActivationOffload between forward and
// backward and released by it, and a GradDeferral around the backward composes.
#include "worker/engine/model/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/collectives.h"
#include "worker/engine/model/llama_model.h"
#include "worker/engine/testing/thread_gang.h"
#include "worker/engine/testing/tiny_llama.h"
#include "worker/engine/zero/memory_tracker.h"
#include "worker/engine/zero/zero_provider.h"

namespace loom::engine {
namespace {

spec::LlamaConfig Tiny() {
  spec::LlamaConfig c = testing::TinyLlamaConfig(/*tie_word_embeddings=*/true);
  c.num_hidden_layers = 3;
  return c;
}

class CountingListener : public GradReadyListener {
 public:
  void OnPartitionGradReady(ParamId i) override {
    ++events[i];
    if (in_backward) ++during_backward[i];
  }
  std::map<ParamId, int> events;
  std::map<ParamId, int> during_backward;  // raised inside loss.backward() (and the deferral)
  bool in_backward = false;                // CPU autograd runs on the calling thread
};

struct Result {
  double loss = 0;
  std::vector<at::Tensor> grads;   // this rank's gradient (partition), per parameter
  std::map<ParamId, int> events;   // grad-ready events per parameter
  std::map<ParamId, int> during_backward;  // those raised before FinishMicroStep
  int64_t offloaded_after_forward = -1, offloaded_after_backward = -1;
};

enum class Mode { kOff, kCheckpoint, kCheckpointOffload };

// The batch, made once on the test thread (the global generator is shared by the rank threads).
struct Batch {
  at::Tensor ids, labels;
};
Batch MakeBatch() {
  const spec::LlamaConfig c = Tiny();
  at::manual_seed(11);
  return {at::randint(0, c.vocab_size, {4, 13}, at::kLong),
          at::randint(0, c.vocab_size, {4, 13}, at::kLong)};
}

// One training micro-step (the last of its optimizer step) of the tiny model on this rank's
// half of the batch.
Result Step(Collectives& coll, int rank, int stage, Mode mode, bool defer, const Batch& batch) {
  const spec::LlamaConfig c = Tiny();
  const at::Tensor& ids = batch.ids;
  const at::Tensor& labels = batch.labels;
  CountingListener listener;
  ZeroOptions o;
  o.stage = stage;
  o.reduce_bucket_size = 300;
  o.param_persistence_threshold = 0;
  o.grad_ready_listener = &listener;
  auto zero = *ZeroProvider::Create(spec::LlamaParamSpecs(c), &coll, {31, c.initializer_range}, o);
  auto model = *LlamaModel::Create(c, zero.get());
  ActivationCheckpointOptions ck;
  ck.enabled = mode != Mode::kOff;
  ck.cpu_offload = mode == Mode::kCheckpointOffload;
  ck.memory = &zero->memory();
  model->set_activation_checkpointing(ck);
  zero->BeginMicroStep(true);
  LossOutput out = model->Loss(ids.narrow(0, 2 * rank, 2), labels.narrow(0, 2 * rank, 2));
  Result r;
  r.offloaded_after_forward = zero->memory().current(MemoryKind::kActivationOffload);
  listener.in_backward = true;
  if (defer) {
    std::vector<ParamId> all;
    for (ParamId i = 0; i < zero->param_specs().size(); ++i) all.push_back(i);
    GradDeferral deferral(zero.get(), all);
    out.loss.backward();
    deferral.Close();
  } else {
    out.loss.backward();
  }
  listener.in_backward = false;
  zero->FinishMicroStep();
  r.offloaded_after_backward = zero->memory().current(MemoryKind::kActivationOffload);
  r.loss = out.loss.item<double>();
  for (const ZeroParam& p : zero->params()) r.grads.push_back(p.grad.clone());
  r.events = listener.events;
  r.during_backward = listener.during_backward;
  return r;
}

void ExpectBitIdentical(const Result& got, const Result& want, const std::string& what) {
  EXPECT_EQ(got.loss, want.loss) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  const spec::LlamaConfig c = Tiny();
  const std::vector<spec::ParamSpec> specs = spec::LlamaParamSpecs(c);
  for (size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_TRUE(got.grads[i].defined() && want.grads[i].defined()) << what << " " << i;
    EXPECT_TRUE(at::equal(got.grads[i], want.grads[i]))
        << what << " " << specs[i].name << " max |diff| "
        << (got.grads[i] - want.grads[i]).abs().max().item<double>();
  }
}

class ActivationCheckpointTest : public ::testing::TestWithParam<int> {};

TEST_P(ActivationCheckpointTest, OnEqualsOffAndOffloadEqualsNoOffloadBitForBit) {
  const int stage = GetParam();
  const spec::LlamaConfig c = Tiny();
  // Offloaded: one [2, 13, 16] fp32 input per decoder layer on each rank.
  const int64_t layer_input_bytes = 2 * 13 * c.hidden_size * 4;
  std::mutex mu;
  const Batch batch = MakeBatch();
  std::vector<absl::Status> st = testing::RunGang(2, [&](int rank, Collectives& coll) {
    const Result off = Step(coll, rank, stage, Mode::kOff, false, batch);
    const Result on = Step(coll, rank, stage, Mode::kCheckpoint, false, batch);
    const Result offload = Step(coll, rank, stage, Mode::kCheckpointOffload, false, batch);
    std::lock_guard<std::mutex> lock(mu);
    const std::string what = absl::StrCat("stage ", stage, " rank ", rank);
    ExpectBitIdentical(on, off, what + " checkpointing on vs off");
    ExpectBitIdentical(offload, on, what + " offload on vs off");
    // One grad-ready event per parameter, as without checkpointing.
    EXPECT_EQ(on.events, off.events) << what;
    EXPECT_EQ(offload.events, off.events) << what;
    EXPECT_EQ(off.events.size(), spec::LlamaParamSpecs(c).size()) << what;
    for (const auto& [id, n] : on.events) EXPECT_EQ(n, 1) << what << " param " << id;
    // Offloaded bytes: counted while the graph holds them, released by the recompute.
    EXPECT_EQ(on.offloaded_after_forward, 0) << what;
    EXPECT_EQ(offload.offloaded_after_forward, c.num_hidden_layers * layer_input_bytes) << what;
    EXPECT_EQ(offload.offloaded_after_backward, 0) << what;
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

// A NoteUse double count in the recompute (each checkpointed use counted in the no-grad forward
// AND again in its recompute) leaves the provider waiting for contributions that never come:
// no parameter of a checkpointed layer would be ready during backward, and only the
// end-of-backward sweep would raise its event, still once. So: the events raised during the
// backward are the same, once each, with checkpointing (and offload) as without, and without
// checkpointing most parameters are ready during the backward (the test is not vacuous).
TEST_P(ActivationCheckpointTest, GradReadyEventsArriveDuringBackwardOncePerPartition) {
  const int stage = GetParam();
  const size_t num_params = spec::LlamaParamSpecs(Tiny()).size();
  std::mutex mu;
  const Batch batch = MakeBatch();
  std::vector<absl::Status> st = testing::RunGang(2, [&](int rank, Collectives& coll) {
    const Result off = Step(coll, rank, stage, Mode::kOff, false, batch);
    const Result on = Step(coll, rank, stage, Mode::kCheckpoint, false, batch);
    const Result offload = Step(coll, rank, stage, Mode::kCheckpointOffload, false, batch);
    std::lock_guard<std::mutex> lock(mu);
    const std::string what = absl::StrCat("stage ", stage, " rank ", rank);
    EXPECT_GE(2 * off.during_backward.size(), num_params) << what;
    EXPECT_EQ(on.during_backward, off.during_backward) << what << " checkpointing";
    EXPECT_EQ(offload.during_backward, off.during_backward) << what << " offload";
    for (const auto& [id, n] : on.during_backward) EXPECT_EQ(n, 1) << what << " param " << id;
    std::cout << what << ": " << off.during_backward.size() << " of " << num_params
              << " parameters ready during backward, " << on.during_backward.size()
              << " with checkpointing\n";
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

// A deferral around the whole backward (what a tiled op opens around its tiles) composes with
// the recompute: the same gradients as checkpointing off under the same deferral.
TEST_P(ActivationCheckpointTest, ComposesWithGradDeferral) {
  const int stage = GetParam();
  std::mutex mu;
  const Batch batch = MakeBatch();
  std::vector<absl::Status> st = testing::RunGang(2, [&](int rank, Collectives& coll) {
    const Result off = Step(coll, rank, stage, Mode::kOff, true, batch);
    const Result on = Step(coll, rank, stage, Mode::kCheckpointOffload, true, batch);
    std::lock_guard<std::mutex> lock(mu);
    ExpectBitIdentical(on, off, absl::StrCat("stage ", stage, " rank ", rank, " deferred"));
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Stages, ActivationCheckpointTest, ::testing::Values(0, 1, 2, 3));

// Eval (no grad): checkpointing does nothing, the logits are the same tensor values.
TEST(ActivationCheckpointEvalTest, NoGradForwardIsUnchanged) {
  const spec::LlamaConfig c = Tiny();
  std::unique_ptr<Collectives> coll = CreateLocalCollectives();
  ZeroOptions o;
  o.stage = 3;
  o.param_persistence_threshold = 0;
  auto zero =
      *ZeroProvider::Create(spec::LlamaParamSpecs(c), coll.get(), {5, c.initializer_range}, o);
  auto model = *LlamaModel::Create(c, zero.get());
  at::manual_seed(2);
  const at::Tensor ids = at::randint(0, c.vocab_size, {1, 9}, at::kLong);
  at::NoGradGuard no_grad;
  const at::Tensor plain = model->Forward(ids);
  ActivationCheckpointOptions ck;
  ck.enabled = true;
  ck.cpu_offload = true;
  ck.memory = &zero->memory();
  model->set_activation_checkpointing(ck);
  EXPECT_TRUE(at::equal(model->Forward(ids), plain));
  EXPECT_EQ(zero->memory().current(MemoryKind::kActivationOffload), 0);
}

}  // namespace
}  // namespace loom::engine
