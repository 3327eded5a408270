#include "scheduler/scheduler_internal.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "scheduler/placement.h"
#include "scheduler/scheduler.h"
#include "spec/job_spec_settings.h"
#include "spec/memory_fit.h"
#include "spec/memory_plan.h"
#include "spec/technique_choice.h"

namespace loom {

// The job's progress once rank 0 of its current attempt reports `reported`. A new attempt's rank
// starts with empty progress and, when it resumed, evaluates first at the resume step: the job
// keeps its "before training" loss, and its last evaluation, checkpoint and step until the new
// attempt reports newer ones.
loom::v1::Progress MergeProgress(const loom::v1::Progress& job,
                                 const loom::v1::Progress& reported) {
  loom::v1::Progress merged = reported;
  if (job.has_eval_loss()) {
    merged.set_initial_eval_loss(job.initial_eval_loss());
    if (!reported.has_eval_loss()) {
      merged.set_has_eval_loss(true);
      merged.set_eval_loss(job.eval_loss());
      merged.set_eval_step(job.eval_step());
    }
  }
  if (reported.step() == 0) {
    merged.set_step(job.step());
    merged.set_loss(job.loss());
  }
  merged.set_last_checkpoint_step(std::max(job.last_checkpoint_step(), reported.last_checkpoint_step()));
  return merged;
}


AcceleratorKind KindOf(const loom::v1::JobSpec& spec) { return loom::KindOf(spec.resources()); }

std::string KindName(AcceleratorKind kind) { return AcceleratorKindName(kind); }

namespace {

// The registered node shapes of `kind` as spec/memory_fit.h takes them; `*memory_known` says
// whether any of them reports its memory.
std::vector<spec::NodeShape> NodesOfKind(AcceleratorKind kind,
                                         const std::map<NodeShapeKey, int>& shapes,
                                         bool* memory_known) {
  std::vector<spec::NodeShape> nodes;
  *memory_known = false;
  for (const auto& [key, count] : shapes) {
    const auto& [node_kind, slots, host, accelerator] = key;
    if (count <= 0 || node_kind != kind) continue;
    *memory_known |= host > 0 || accelerator > 0;
    nodes.push_back({node_kind, slots, host, accelerator, count});
  }
  return nodes;
}

}  // namespace

absl::Status CheckJobFitsNodeMemory(const loom::v1::JobSpec& spec,
                                    const std::map<NodeShapeKey, int>& shapes) {
  const AcceleratorKind kind = KindOf(spec);
  bool memory_known = false;
  const std::vector<spec::NodeShape> nodes = NodesOfKind(kind, shapes, &memory_known);
  if (!memory_known) return absl::OkStatus();
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(spec);
  if (!in.ok()) {
    VLOG(1) << "memory check skipped: " << in.status();
    return absl::OkStatus();
  }
  absl::Status fits =
      spec::CheckJobFitsMemory(*in, kind, spec.resources().accelerators_per_node(), nodes);
  if (fits.ok() || absl::IsFailedPrecondition(fits)) return fits;
  VLOG(1) << "memory check skipped: " << fits;  // the plan refused its input: nothing to tell
  return absl::OkStatus();
}

absl::StatusOr<AutoTechnique> ChooseTechniqueOnNodes(const loom::v1::JobSpec& spec,
                                                     const std::map<NodeShapeKey, int>& shapes) {
  const AcceleratorKind kind = KindOf(spec);
  bool memory_known = false;
  const std::vector<spec::NodeShape> nodes = NodesOfKind(kind, shapes, &memory_known);
  if (!memory_known) {
    return absl::FailedPreconditionError(absl::StrCat(
        "technique: auto chooses against the memory of the registered nodes, and no registered ",
        KindName(kind), " node reports its memory; submit it once a worker of that kind has "
        "registered, or write the technique's keys yourself (`loomctl plan JOB.yaml "
        "--nodes=COUNT:SLOTS:HOST_GIB[:ACCEL_GIB]` shows what it would choose)"));
  }
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(spec);
  if (!in.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("technique: auto: ", in.status().message()));
  }
  absl::StatusOr<spec::TechniqueChoice> choice =
      spec::ChooseTechnique(*in, kind, spec.resources().accelerators_per_node(), nodes);
  if (!choice.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("technique: auto: ", choice.status().message()));
  }
  if (choice->technique == spec::Technique::kNoneFits) {
    return absl::FailedPreconditionError(absl::StrCat(
        "technique: auto: no technique fits the registered ", KindName(kind), " nodes: ",
        choice->why));
  }
  AutoTechnique out;
  out.spec = spec;
  if (absl::Status s = spec::ApplyJobSpecSettings(choice->settings, &out.spec); !s.ok()) {
    return absl::InternalError(absl::StrCat("technique: auto chose ",
                                            spec::TechniqueName(choice->technique),
                                            " but could not write it into the spec: ",
                                            s.message()));
  }
  out.choice.set_name(spec::TechniqueName(choice->technique));
  out.choice.set_why(choice->why);
  for (const std::string& setting : choice->settings) out.choice.add_settings(setting);
  out.choice.set_planned_rank_host_bytes(choice->plan.host_bytes());
  if (!choice->plan.cpu_rank) {
    out.choice.set_planned_rank_device_bytes(choice->plan.device_bytes());
  }
  return out;
}

bool SameSubmittedSpec(const JobRecord& earlier, const loom::v1::JobSpec& spec) {
  if (!earlier.state.has_chosen_technique()) {
    return google::protobuf::util::MessageDifferencer::Equals(earlier.spec, spec);
  }
  // technique: auto stored the spec with its choice written in: write the same into this one.
  loom::v1::JobSpec applied = spec;
  const auto& settings = earlier.state.chosen_technique().settings();
  return spec::ApplyJobSpecSettings({settings.begin(), settings.end()}, &applied).ok() &&
         google::protobuf::util::MessageDifferencer::Equals(earlier.spec, applied);
}

void RecordPlannedRankMemory(const loom::v1::JobSpec& spec,
                             loom::internal::JobSchedulingState* state) {
  absl::StatusOr<spec::MemoryPlanInput> in = spec::MemoryPlanInputFromJobSpec(spec);
  if (!in.ok()) return;
  absl::StatusOr<spec::RankMemoryPlan> plan = spec::PlanRankMemory(*in);
  if (!plan.ok()) return;
  state->set_planned_rank_host_bytes(spec::WithAdmissionMargin(plan->host_bytes()));
  if (!plan->cpu_rank) {
    state->set_planned_rank_device_bytes(spec::WithAdmissionMargin(plan->device_bytes()));
  }
}

bool IsInfraClass(loom::v1::FailureClass c) {
  return c == v1::FAILURE_CLASS_INFRA || c == v1::FAILURE_CLASS_SETUP;
}

std::string RestartNote(bool infra, int32_t restart, int32_t max_restarts) {
  return absl::StrCat(infra ? "infra" : "user", " restart ", restart, " of ", max_restarts);
}

std::string ResumeHint(const JobRecord& job) {
  const int64_t step = job.progress.last_checkpoint_step();
  if (step <= 0) return "";
  return absl::StrCat("; `loomctl resume ", job.id, "` continues it from step ", step);
}

void AddSuspect(JobRecord* job, const std::string& node_id) {
  if (node_id.empty()) return;
  for (const std::string& n : job->state.suspect_nodes()) {
    if (n == node_id) return;
  }
  job->state.add_suspect_nodes(node_id);
}

void SetTimestamp(absl::Time t, google::protobuf::Timestamp* ts) {
  const int64_t micros = absl::ToUnixMicros(t);
  int64_t seconds = micros / 1000000;
  int64_t rem = micros % 1000000;
  if (rem < 0) {
    rem += 1000000;
    --seconds;
  }
  ts->set_seconds(seconds);
  ts->set_nanos(static_cast<int32_t>(rem * 1000));
}

// INVALID_ARGUMENT for an id too long to be real (and to be echoed back in an error).
absl::Status CheckIdLength(absl::string_view field, const std::string& id) {
  if (id.size() <= kMaxIdBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", id.size(), " bytes, longer than ",
                                                 kMaxIdBytes, " (starts with '",
                                                 absl::CEscape(id.substr(0, 32)), "')"));
}

absl::Status CheckRequiredId(absl::string_view field, const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
  return CheckIdLength(field, id);
}

std::string NodeAddress(const NodeRecord& node) {
  if (!node.inventory.address().empty()) return node.inventory.address();
  if (!node.inventory.hostname().empty()) return node.inventory.hostname();
  return node.id;
}

}  // namespace loom
