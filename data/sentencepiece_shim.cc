// The only translation unit that includes libsentencepiece's headers (see the header comment).
#include "data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

namespace loom::data::spm {

struct SpModel {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return s_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& s_;
  size_t i_ = 0;
};

std::string PieceOrEmpty(const sentencepiece::SentencePieceProcessor& p, int id) {
  return id < 0 ? std::string() : p.IdToPiece(id);
}

}  // namespace

namespace {

std::string Load(const std::string& serialized, std::shared_ptr<const SpModel>* model,
                 SpInfo* info) {
  auto m = std::make_shared<SpModel>();
  sentencepiece::util::Status s = m->processor.LoadFromSerializedProto(serialized);
  if (!s.ok()) return s.ToString();
  const auto& p = m->processor;
  info->vocab_size = p.GetPieceSize();
  info->unk_id = p.unk_id();
  info->bos_id = p.bos_id();
  info->eos_id = p.eos_id();
  info->pad_id = p.pad_id();
  info->unk_piece = PieceOrEmpty(p, info->unk_id);
  info->bos_piece = PieceOrEmpty(p, info->bos_id);
  info->eos_piece = PieceOrEmpty(p, info->eos_id);
  info->pad_piece = PieceOrEmpty(p, info->pad_id);
  *model = std::move(m);
  return "";
}

std::string Encode(const SpModel& model, const std::string& text, std::vector<int>* ids) {
  sentencepiece::util::Status s = model.processor.Encode(text, ids);
  return s.ok() ? "" : s.ToString();
}

std::string Decode(const SpModel& model, const std::vector<int>& ids, std::string* text) {
  sentencepiece::util::Status s = model.processor.Decode(ids, text);
  return s.ok() ? "" : s.ToString();
}

std::string Train(const std::vector<std::string>& sentences,
                  const std::map<std::string, std::string>& options, std::string* serialized) {
  std::unordered_map<std::string, std::string> kwargs(options.begin(), options.end());
  VectorIterator it(sentences);
  sentencepiece::util::Status s = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, serialized);
  return s.ok() ? "" : s.ToString();
}

const SpApi kApi = {&Load, &Encode, &Decode, &Train};

}  // namespace

}  // namespace loom::data::spm

extern "C" __attribute__((visibility("default"))) const loom::data::spm::SpApi*
loom_sentencepiece_api() {
  return &loom::data::spm::kApi;
}
