#include "worker/engine/process_groups.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::engine {

namespace {

std::vector<int> AllRanks(int world_size) {
  std::vector<int> r(world_size);
  for (int i = 0; i < world_size; ++i) r[i] = i;
  return r;
}

}  // namespace

std::vector<int> ProcessGroups::SequenceParallelRanks(int rank, int world_size, int sp_size) {
  (void)world_size;
  std::vector<int> r;
  const int first = rank - rank % sp_size;
  for (int i = 0; i < sp_size; ++i) r.push_back(first + i);
  return r;
}

std::vector<int> ProcessGroups::DataParallelRanks(int rank, int world_size, int sp_size) {
  std::vector<int> r;
  for (int q = rank % sp_size; q < world_size; q += sp_size) r.push_back(q);
  return r;
}

absl::StatusOr<std::unique_ptr<ProcessGroups>> ProcessGroups::Create(Collectives& world,
                                                                     int sequence_parallel_size,
                                                                     SequenceLoss loss) {
  const int w = world.world_size(), p = sequence_parallel_size, rank = world.rank();
  if (p < 1 || w % p != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence_parallel_size: ", p, " must be >= 1 and divide the world size ", w));
  }
  std::unique_ptr<ProcessGroups> g(new ProcessGroups());
  const int d = w / p;
  const int sp_factor = loss == SequenceLoss::kShareOfSample ? 1 : p;
  g->world_ = {"world", &world, AllRanks(w), static_cast<double>(w)};
  g->zero_partition_ = {"zero_partition", &world, AllRanks(w),
                        static_cast<double>(d * sp_factor)};
  g->sequence_parallel_ = {"sequence_parallel", nullptr, SequenceParallelRanks(rank, w, p),
                           static_cast<double>(sp_factor)};
  g->data_parallel_ = {"data_parallel", nullptr, DataParallelRanks(rank, w, p),
                       static_cast<double>(d)};
  // Every rank walks the same list of groups in the same order (NewSubgroup is collective over
  // the world); only groups that are neither the world nor a single rank need a process group.
  auto build = [&](ProcessGroup& mine, int group_size, int n_groups, auto ranks_of,
                   const char* name) -> absl::Status {
    if (group_size == w) {
      mine.collectives = &world;
      return absl::OkStatus();
    }
    if (group_size == 1) {
      g->owned_.push_back(CreateLocalCollectives());
      mine.collectives = g->owned_.back().get();
      return absl::OkStatus();
    }
    for (int k = 0; k < n_groups; ++k) {
      const std::vector<int> ranks = ranks_of(k);
      absl::StatusOr<std::unique_ptr<Collectives>> sub = world.NewSubgroup(ranks, name);
      if (!sub.ok()) return sub.status();
      if (*sub != nullptr) {
        ++g->created_;
        g->owned_.push_back(std::move(*sub));
        mine.collectives = g->owned_.back().get();
      }
    }
    return absl::OkStatus();
  };
  absl::Status s = build(
      g->sequence_parallel_, p, d, [&](int k) { return SequenceParallelRanks(k * p, w, p); },
      "sequence_parallel");
  if (!s.ok()) return s;
  s = build(
      g->data_parallel_, d, p, [&](int k) { return DataParallelRanks(k, w, p); },
      "data_parallel");
  if (!s.ok()) return s;
  return g;
}

}  // namespace loom::engine
