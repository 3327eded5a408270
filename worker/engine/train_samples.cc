#include "worker/engine/train_samples.h"

#include "data/corpus.h"

namespace loom::engine {

int64_t GlobalTrainSample(int64_t micro_step, int64_t data_rank, int64_t data_ranks,
                          int64_t micro, int64_t i) {
  return (micro_step * data_ranks + data_rank) * micro + i;
}

std::vector<int64_t> TrainMicroStepStarts(uint64_t seed, int64_t step, int64_t micro_step,
                                          int64_t data_rank, int64_t data_ranks, int64_t micro,
                                          int64_t stream_len, int64_t window) {
  std::vector<int64_t> starts;
  starts.reserve(micro);
  for (int64_t i = 0; i < micro; ++i) {
    starts.push_back(data::TrainWindowStart(
        seed, step, 0, GlobalTrainSample(micro_step, data_rank, data_ranks, micro, i), stream_len,
        window));
  }
  return starts;
}

}  // namespace loom::engine
