// Which training windows a data-parallel rank reads in one micro-step, as a function of the
// step's GLOBAL sample index only (issue 13). The train_batch_size B = micro · GAS · D samples of
// optimizer step `step` are g = 0 .. B-1; sample i of micro-step m on data-parallel rank d of D
// is
//   g = (m · D + d) · micro + i,
// and its window starts at TrainWindowStart(seed, step, /*micro_step=*/0, g, stream_len, window)
// (data/corpus.h). So every split of the same B over data-parallel ranks and micro-steps trains
// on the same set of samples per step, with or without sequence parallelism (where D = world / P
// and the P ranks of a group read the same window): (D=1, GAS=2), (D=2, GAS=1), (D=1, SP=2,
// GAS=2) and (D=2, SP=1, GAS=1) read samples {0, 1}. This is DeepSpeed's behaviour (a
// DistributedSampler over one global order, whatever the layout) and docs/design/TECHNIQUES.md §3.7
// #6's recipe needs it.
//
// The sequence-parallel path of the Trainer already reads windows this way; the plain
// data-parallel path keyed windows by (micro-step, index within the micro-step), so a 1-rank
// GAS-2 job and the same job with sequence_parallel_size 2 read different samples from micro-step
// 1 on (found by worker/trainer/sp_compose_test). Thread-safe (pure functions).
#ifndef LOOM_WORKER_ENGINE_TRAIN_SAMPLES_H_
#define LOOM_WORKER_ENGINE_TRAIN_SAMPLES_H_

#include <cstdint>
#include <vector>

namespace loom::engine {

// g = (micro_step · data_ranks + data_rank) · micro + i. Requires 0 <= data_rank < data_ranks,
// 0 <= i < micro.
int64_t GlobalTrainSample(int64_t micro_step, int64_t data_rank, int64_t data_ranks,
                          int64_t micro, int64_t i);

// The `micro` window starts of micro-step `micro_step` on data-parallel rank `data_rank` of
// `data_ranks` in optimizer step `step` (0-based): each uniform in [0, stream_len - window].
// Requires stream_len >= window.
std::vector<int64_t> TrainMicroStepStarts(uint64_t seed, int64_t step, int64_t micro_step,
                                          int64_t data_rank, int64_t data_ranks, int64_t micro,
                                          int64_t stream_len, int64_t window);

}  // namespace loom::engine

#endif  // LOOM_WORKER_ENGINE_TRAIN_SAMPLES_H_
