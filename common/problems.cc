#include "common/problems.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace loom {
namespace {

// --- Protocol Buffers wire format, the few pieces these messages use (all strings: wire type 2).

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutBytes(int field, absl::string_view bytes, std::string* out) {
  PutVarint((static_cast<uint64_t>(field) << 3) | 2, out);
  PutVarint(bytes.size(), out);
  out->append(bytes.data(), bytes.size());
}

bool GetVarint(absl::string_view* in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && !in->empty(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    *v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// Calls on_bytes(field, bytes) for each length-delimited field of `in`; skips varint and fixed
// fields. False when `in` is not a well-formed message.
template <typename F>
bool ForEachBytesField(absl::string_view in, F on_bytes) {
  while (!in.empty()) {
    uint64_t tag = 0, n = 0;
    if (!GetVarint(&in, &tag)) return false;
    switch (tag & 7) {
      case 0:
        if (!GetVarint(&in, &n)) return false;
        break;
      case 1:
      case 5: {
        const size_t width = (tag & 7) == 1 ? 8 : 4;
        if (in.size() < width) return false;
        in.remove_prefix(width);
        break;
      }
      case 2:
        if (!GetVarint(&in, &n) || n > in.size()) return false;
        on_bytes(static_cast<int>(tag >> 3), in.substr(0, n));
        in.remove_prefix(n);
        break;
      default:
        return false;
    }
  }
  return true;
}

// At most `max` bytes of `s`, cut at a UTF-8 character boundary.
absl::string_view CutUtf8(absl::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t keep = max;
  while (keep > 0 && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80) --keep;
  return s.substr(0, keep);
}

std::string Violation(absl::string_view field, absl::string_view description) {
  constexpr size_t kMaxPart = 1024;
  std::string v;
  PutBytes(1, CutUtf8(field, kMaxPart), &v);
  PutBytes(2, CutUtf8(description, kMaxPart), &v);
  return v;
}

}  // namespace

void Problems::Add(absl::string_view path, absl::string_view what) {
  for (const Problem& p : problems_) {
    // A field's first problem only: later checks of a field usually follow from its first
    // (a 5000-byte path also "does not exist").
    if (p.path == path && (!path.empty() || p.what == what)) return;
  }
  problems_.push_back(Problem{std::string(path), std::string(what)});
}

bool Problems::Merge(const absl::Status& s) {
  if (s.ok()) return true;
  if (s.code() != absl::StatusCode::kInvalidArgument) {
    if (!other_.has_value()) other_ = s;
    return false;
  }
  for (Problem& p : ProblemsOf(s)) Add(p.path, p.what);
  return false;
}

absl::Status Problems::ToStatus() const {
  if (problems_.empty()) return other_.value_or(absl::OkStatus());
  absl::Status s = absl::InvalidArgumentError(ProblemsMessage(problems_));
  s.SetPayload(kBadRequestTypeUrl, absl::Cord(EncodeBadRequest(problems_)));
  return s;
}

std::string ProblemsMessage(const std::vector<Problem>& problems) {
  auto line = [](const Problem& p) {
    return p.path.empty() ? p.what : absl::StrCat(p.path, ": ", p.what);
  };
  if (problems.size() == 1) return line(problems.front());
  std::string out = absl::StrCat(problems.size(), " problems:");
  for (const Problem& p : problems) absl::StrAppend(&out, "\n  ", line(p));
  return out;
}

std::vector<Problem> ProblemsOf(const absl::Status& s, absl::string_view fallback_path) {
  if (s.ok()) return {};
  if (auto payload = s.GetPayload(kBadRequestTypeUrl)) {
    std::optional<std::vector<Problem>> decoded = DecodeBadRequest(std::string(*payload));
    if (decoded.has_value() && !decoded->empty()) return *std::move(decoded);
  }
  const absl::string_view message = s.message();
  const size_t colon = message.find(": ");
  if (colon != absl::string_view::npos && colon > 0 &&
      message.substr(0, colon).find_first_of(" \n\t") == absl::string_view::npos) {
    return {Problem{std::string(message.substr(0, colon)),
                    std::string(message.substr(colon + 2))}};
  }
  return {Problem{std::string(fallback_path), std::string(message)}};
}

std::string EncodeBadRequest(const std::vector<Problem>& problems, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < problems.size(); ++i) {
    std::string entry;
    PutBytes(1, Violation(problems[i].path, problems[i].what), &entry);
    const size_t left = problems.size() - i;
    // Room is kept for the "more problems" entry (under 64 bytes).
    if (out.size() + entry.size() + 64 > max_bytes) {
      PutBytes(1, Violation("", absl::StrCat(left, " more problem", left > 1 ? "s" : "",
                                             " not shown")),
               &out);
      break;
    }
    out += entry;
  }
  return out;
}

std::optional<std::vector<Problem>> DecodeBadRequest(absl::string_view bytes) {
  std::vector<Problem> problems;
  bool ok = ForEachBytesField(bytes, [&](int field, absl::string_view violation) {
    if (field != 1) return;
    Problem p;
    if (!ForEachBytesField(violation, [&](int f, absl::string_view v) {
          if (f == 1) p.path = std::string(v);
          if (f == 2) p.what = std::string(v);
        })) {
      return;
    }
    problems.push_back(std::move(p));
  });
  if (!ok) return std::nullopt;
  return problems;
}

std::string EncodeRpcStatusWithBadRequest(int code, absl::string_view message,
                                          absl::string_view bad_request) {
  std::string out;
  PutVarint(1 << 3, &out);  // code, wire type 0
  PutVarint(static_cast<uint64_t>(code), &out);
  PutBytes(2, message, &out);
  std::string any;
  PutBytes(1, kBadRequestTypeUrl, &any);
  PutBytes(2, bad_request, &any);
  PutBytes(3, any, &out);
  return out;
}

std::optional<std::string> BadRequestOfRpcStatus(absl::string_view rpc_status) {
  std::optional<std::string> found;
  (void)ForEachBytesField(rpc_status, [&](int field, absl::string_view any) {
    if (field != 3 || found.has_value()) return;
    std::string type_url, value;
    if (!ForEachBytesField(any, [&](int f, absl::string_view v) {
          if (f == 1) type_url = std::string(v);
          if (f == 2) value = std::string(v);
        })) {
      return;
    }
    if (type_url == kBadRequestTypeUrl) found = std::move(value);
  });
  return found;
}

}  // namespace loom
