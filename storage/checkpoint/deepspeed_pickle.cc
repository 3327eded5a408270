#include "storage/checkpoint/deepspeed_pickle.h"

#include <cstring>
#include <map>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom::storage::deepspeed {
namespace {

// Python's pickle opcodes (Lib/pickle.py) of protocols 0-4 that torch.save output can contain.
enum Op : uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', NONE = 'N', BININT = 'J', BININT1 = 'K',
  BININT2 = 'M', BINFLOAT = 'G', BINUNICODE = 'X', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d,
  BINBYTES = 'B', SHORT_BINBYTES = 'C', EMPTY_LIST = ']', APPEND = 'a', APPENDS = 'e', LIST = 'l',
  EMPTY_TUPLE = ')', TUPLE = 't', TUPLE1 = 0x85, TUPLE2 = 0x86, TUPLE3 = 0x87, EMPTY_DICT = '}',
  DICT = 'd', SETITEM = 's', SETITEMS = 'u', BINGET = 'h', LONG_BINGET = 'j', BINPUT = 'q',
  LONG_BINPUT = 'r', MEMOIZE = 0x94, GLOBAL = 'c', STACK_GLOBAL = 0x93, REDUCE = 'R',
  BUILD = 'b', NEWOBJ = 0x81, BINPERSID = 'Q', PROTO = 0x80, NEWTRUE = 0x88, NEWFALSE = 0x89,
  LONG1 = 0x8a, FRAME = 0x95,
};

struct StorageType {
  const char* dtype;
  int bytes;
};

const std::map<std::string, StorageType>& StorageTypes() {
  static const auto* m = new std::map<std::string, StorageType>{
      {"torch.FloatStorage", {"F32", 4}},   {"torch.DoubleStorage", {"F64", 8}},
      {"torch.HalfStorage", {"F16", 2}},    {"torch.BFloat16Storage", {"BF16", 2}},
      {"torch.LongStorage", {"I64", 8}},    {"torch.IntStorage", {"I32", 4}},
      {"torch.ShortStorage", {"I16", 2}},   {"torch.CharStorage", {"I8", 1}},
      {"torch.ByteStorage", {"U8", 1}},     {"torch.BoolStorage", {"BOOL", 1}},
  };
  return *m;
}

// GLOBALs with a fixed meaning here (everything else is refused).
bool AllowedGlobal(const std::string& g) {
  return g == "collections.OrderedDict" || g == "torch._utils._rebuild_tensor_v2" ||
         g == "torch._utils._rebuild_parameter" || g == "torch.Size" ||
         g == "deepspeed.runtime.zero.config.ZeroStageEnum" ||
         // Only as getattr(ZeroStageEnum, "<member>"), how Python 3.11+ pickles an Enum member.
         g == "__builtin__.getattr" || g == "builtins.getattr" ||
         g == "deepspeed.runtime.fp16.loss_scaler.LossScaler" ||
         g == "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler" ||
         // torch dtypes pickle as GLOBAL torch.<name>: DeepSpeed's DynamicLossScaler keeps its
         // dtype (torch.half by default), so every real fp16 checkpoint carries one. Inert
         // values here (never called).
         g == "torch.float16" || g == "torch.bfloat16" || g == "torch.float32" ||
         g == "torch.float64" || g == "torch.half" || g == "torch.float" ||
         StorageTypes().count(g) > 0;
}

PyRef Make(PyValue::Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

class Unpickler {
 public:
  Unpickler(absl::string_view b, absl::string_view file) : b_(b), file_(file) {}

  absl::StatusOr<PyRef> Run() {
    while (true) {
      if (pos_ >= b_.size()) return Bad("ends before STOP (truncated data.pkl)");
      op_at_ = pos_;
      const uint8_t op = static_cast<uint8_t>(b_[pos_++]);
      absl::Status s = Step(op);
      if (!s.ok()) return s;
      if (op == STOP) {
        if (stack_.size() != 1) return Bad("STOP with a stack of " + std::to_string(stack_.size()));
        return stack_.back();
      }
    }
  }

 private:
  absl::Status Bad(const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": data.pkl: byte ", op_at_, ": ", what));
  }
  absl::Status Need(size_t n) {
    if (b_.size() - pos_ < n) return Bad("ends inside an opcode's argument (truncated data.pkl)");
    return absl::OkStatus();
  }
  uint64_t Le(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  absl::StatusOr<PyRef> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return Bad("pops an empty stack");
    }
    PyRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  absl::StatusOr<std::vector<PyRef>> PopMark() {
    if (marks_.empty()) return Bad("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> out(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return out;
  }
  absl::Status PushString(size_t n, PyValue::Kind k) {
    if (absl::Status s = Need(n); !s.ok()) return s;
    PyRef v = Make(k);
    v->s.assign(b_.data() + pos_, n);
    pos_ += n;
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }
  absl::Status PushInt(int64_t i) {
    PyRef v = Make(PyValue::Kind::kInt);
    v->i = i;
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }
  absl::Status Global(const std::string& module, const std::string& name) {
    const std::string g = absl::StrCat(module, ".", name);
    if (!AllowedGlobal(g)) {
      return Bad(absl::StrCat("GLOBAL '", module, " ", name,
                              "' is outside the subset torch.save writes; refusing to unpickle "
                              "(nothing is executed)"));
    }
    PyRef v = Make(PyValue::Kind::kGlobal);
    v->s = g;
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }
  absl::Status Append(const PyRef& list, std::vector<PyRef> items) {
    if (!list->is(PyValue::Kind::kList)) return Bad("APPEND to a non-list");
    for (auto& i : items) list->items.push_back(std::move(i));
    return absl::OkStatus();
  }
  absl::Status SetItems(const PyRef& dict, const std::vector<PyRef>& kv) {
    if (!dict->is(PyValue::Kind::kDict)) return Bad("SETITEM on a non-dict");
    if (kv.size() % 2 != 0) return Bad("SETITEMS with an odd number of items");
    for (size_t i = 0; i < kv.size(); i += 2) dict->entries.emplace_back(kv[i], kv[i + 1]);
    return absl::OkStatus();
  }
  static bool IntTuple(const PyValue& v, std::vector<int64_t>* out) {
    if (!v.is(PyValue::Kind::kTuple)) return false;
    out->clear();
    for (const PyRef& e : v.items) {
      if (!e->is(PyValue::Kind::kInt)) return false;
      out->push_back(e->i);
    }
    return true;
  }
  absl::Status Reduce(const PyRef& callable, const PyRef& args) {
    if (!callable->is(PyValue::Kind::kGlobal) || !args->is(PyValue::Kind::kTuple)) {
      return Bad("REDUCE of something that is not an allowed global with a tuple");
    }
    const std::string& g = callable->s;
    const auto& a = args->items;
    if (g == "collections.OrderedDict") {
      if (!a.empty()) return Bad("OrderedDict with arguments");
      stack_.push_back(Make(PyValue::Kind::kDict));
    } else if (g == "torch.Size") {
      std::vector<int64_t> dims;
      if (a.size() != 1 || !IntTuple(*a[0], &dims)) return Bad("torch.Size of a non-int tuple");
      stack_.push_back(a[0]);
    } else if (g == "deepspeed.runtime.zero.config.ZeroStageEnum") {
      if (a.size() != 1 || !a[0]->is(PyValue::Kind::kInt)) return Bad("ZeroStageEnum of a non-int");
      stack_.push_back(a[0]);
    } else if (g == "__builtin__.getattr" || g == "builtins.getattr") {
      static const auto* members = new std::map<std::string, int64_t>{
          {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
      if (a.size() != 2 || !a[0]->is(PyValue::Kind::kGlobal) ||
          a[0]->s != "deepspeed.runtime.zero.config.ZeroStageEnum" ||
          !a[1]->is(PyValue::Kind::kString) || members->count(a[1]->s) == 0) {
        return Bad("getattr other than ZeroStageEnum.<disabled|optimizer_states|gradients|weights>");
      }
      return PushInt(members->at(a[1]->s));
    } else if (g == "torch._utils._rebuild_parameter") {
      if (a.size() < 1 || !a[0]->is(PyValue::Kind::kTensor)) return Bad("_rebuild_parameter of a non-tensor");
      stack_.push_back(a[0]);
    } else if (g == "torch._utils._rebuild_tensor_v2") {
      if (a.size() < 4 || !a[0]->is(PyValue::Kind::kStorage) || !a[1]->is(PyValue::Kind::kInt)) {
        return Bad("_rebuild_tensor_v2 without (storage, offset, size, stride, ...)");
      }
      PyRef t = Make(PyValue::Kind::kTensor);
      t->tensor = a[0]->tensor;
      t->tensor.storage_offset = a[1]->i;
      if (!IntTuple(*a[2], &t->tensor.sizes) || !IntTuple(*a[3], &t->tensor.strides) ||
          t->tensor.sizes.size() != t->tensor.strides.size()) {
        return Bad("_rebuild_tensor_v2 with a bad size or stride");
      }
      for (int64_t d : t->tensor.sizes) {
        if (d < 0) return Bad("_rebuild_tensor_v2 with a negative size");
      }
      stack_.push_back(std::move(t));
    } else {
      return Bad(absl::StrCat("REDUCE of ", g, " (not callable here)"));
    }
    return absl::OkStatus();
  }

  absl::Status Step(uint8_t op) {
    using K = PyValue::Kind;
    switch (op) {
      case PROTO:
        if (absl::Status s = Need(1); !s.ok()) return s;
        if (Le(1) > 5) return Bad("pickle protocol above 5");
        return absl::OkStatus();
      case FRAME:
        if (absl::Status s = Need(8); !s.ok()) return s;
        Le(8);
        return absl::OkStatus();
      case STOP:
        return absl::OkStatus();
      case MARK:
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case POP:
        return Pop().status();
      case POP_MARK:
        return PopMark().status();
      case NONE:
        stack_.push_back(Make(K::kNone));
        return absl::OkStatus();
      case NEWTRUE:
      case NEWFALSE: {
        PyRef v = Make(K::kBool);
        v->b = op == NEWTRUE;
        stack_.push_back(std::move(v));
        return absl::OkStatus();
      }
      case BININT:
        if (absl::Status s = Need(4); !s.ok()) return s;
        return PushInt(static_cast<int32_t>(Le(4)));
      case BININT1:
        if (absl::Status s = Need(1); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(Le(1)));
      case BININT2:
        if (absl::Status s = Need(2); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(Le(2)));
      case LONG1: {
        if (absl::Status s = Need(1); !s.ok()) return s;
        const size_t n = Le(1);
        if (n > 8) return Bad("LONG1 integer wider than 64 bits");
        if (absl::Status s = Need(n); !s.ok()) return s;
        uint64_t v = Le(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign
        return PushInt(static_cast<int64_t>(v));
      }
      case BINFLOAT: {
        if (absl::Status s = Need(8); !s.ok()) return s;
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(b_[pos_ + i]);
        pos_ += 8;
        PyRef v = Make(K::kFloat);
        std::memcpy(&v->f, &bits, 8);  // big-endian IEEE double
        stack_.push_back(std::move(v));
        return absl::OkStatus();
      }
      case SHORT_BINUNICODE:
        if (absl::Status s = Need(1); !s.ok()) return s;
        return PushString(Le(1), K::kString);
      case BINUNICODE:
        if (absl::Status s = Need(4); !s.ok()) return s;
        return PushString(Le(4), K::kString);
      case BINUNICODE8:
        if (absl::Status s = Need(8); !s.ok()) return s;
        return PushString(Le(8), K::kString);
      case SHORT_BINBYTES:
        if (absl::Status s = Need(1); !s.ok()) return s;
        return PushString(Le(1), K::kBytes);
      case BINBYTES:
        if (absl::Status s = Need(4); !s.ok()) return s;
        return PushString(Le(4), K::kBytes);
      case EMPTY_LIST:
        stack_.push_back(Make(K::kList));
        return absl::OkStatus();
      case EMPTY_DICT:
        stack_.push_back(Make(K::kDict));
        return absl::OkStatus();
      case EMPTY_TUPLE:
        stack_.push_back(Make(K::kTuple));
        return absl::OkStatus();
      case LIST:
      case TUPLE: {
        auto items = PopMark();
        if (!items.ok()) return items.status();
        PyRef v = Make(op == LIST ? K::kList : K::kTuple);
        v->items = std::move(*items);
        stack_.push_back(std::move(v));
        return absl::OkStatus();
      }
      case DICT: {
        auto items = PopMark();
        if (!items.ok()) return items.status();
        PyRef v = Make(K::kDict);
        stack_.push_back(v);
        return SetItems(v, *items);
      }
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        const size_t n = op - TUPLE1 + 1;
        PyRef v = Make(K::kTuple);
        v->items.resize(n);
        for (size_t i = n; i-- > 0;) {
          auto e = Pop();
          if (!e.ok()) return e.status();
          v->items[i] = std::move(*e);
        }
        stack_.push_back(std::move(v));
        return absl::OkStatus();
      }
      case APPEND: {
        auto item = Pop();
        if (!item.ok()) return item.status();
        if (stack_.empty()) return Bad("APPEND without a list");
        return Append(stack_.back(), {std::move(*item)});
      }
      case APPENDS: {
        auto items = PopMark();
        if (!items.ok()) return items.status();
        if (stack_.empty()) return Bad("APPENDS without a list");
        return Append(stack_.back(), std::move(*items));
      }
      case SETITEM: {
        auto v = Pop();
        if (!v.ok()) return v.status();
        auto k = Pop();
        if (!k.ok()) return k.status();
        if (stack_.empty()) return Bad("SETITEM without a dict");
        return SetItems(stack_.back(), {*k, *v});
      }
      case SETITEMS: {
        auto items = PopMark();
        if (!items.ok()) return items.status();
        if (stack_.empty()) return Bad("SETITEMS without a dict");
        return SetItems(stack_.back(), *items);
      }
      case BINPUT:
      case LONG_BINPUT:
      case MEMOIZE: {
        uint64_t idx = memo_.size();
        if (op != MEMOIZE) {
          const size_t n = op == BINPUT ? 1 : 4;
          if (absl::Status s = Need(n); !s.ok()) return s;
          idx = Le(n);
        }
        if (stack_.empty()) return Bad("PUT with an empty stack");
        memo_[idx] = stack_.back();
        return absl::OkStatus();
      }
      case BINGET:
      case LONG_BINGET: {
        const size_t n = op == BINGET ? 1 : 4;
        if (absl::Status s = Need(n); !s.ok()) return s;
        auto it = memo_.find(Le(n));
        if (it == memo_.end()) return Bad("GET of an unset memo entry");
        stack_.push_back(it->second);
        return absl::OkStatus();
      }
      case GLOBAL: {
        std::string parts[2];
        for (std::string& p : parts) {
          const size_t nl = b_.find('\n', pos_);
          if (nl == absl::string_view::npos) return Bad("GLOBAL without a newline");
          p.assign(b_.data() + pos_, nl - pos_);
          pos_ = nl + 1;
        }
        return Global(parts[0], parts[1]);
      }
      case STACK_GLOBAL: {
        auto name = Pop();
        if (!name.ok()) return name.status();
        auto module = Pop();
        if (!module.ok()) return module.status();
        if (!(*name)->is(K::kString) || !(*module)->is(K::kString)) return Bad("STACK_GLOBAL of non-strings");
        return Global((*module)->s, (*name)->s);
      }
      case REDUCE: {
        auto args = Pop();
        if (!args.ok()) return args.status();
        auto callable = Pop();
        if (!callable.ok()) return callable.status();
        return Reduce(*callable, *args);
      }
      case NEWOBJ: {
        auto args = Pop();
        if (!args.ok()) return args.status();
        auto cls = Pop();
        if (!cls.ok()) return cls.status();
        if (!(*cls)->is(K::kGlobal) || (*cls)->s.find("loss_scaler.") == std::string::npos) {
          return Bad("NEWOBJ of a class other than DeepSpeed's loss scalers");
        }
        PyRef obj = Make(K::kObject);
        obj->s = (*cls)->s;
        stack_.push_back(std::move(obj));
        return absl::OkStatus();
      }
      case BUILD: {
        auto state = Pop();
        if (!state.ok()) return state.status();
        if (stack_.empty() || !stack_.back()->is(K::kObject) || !(*state)->is(K::kDict)) {
          return Bad("BUILD of something other than a loss scaler's attribute dict");
        }
        stack_.back()->entries = (*state)->entries;
        return absl::OkStatus();
      }
      case BINPERSID: {
        auto pid = Pop();
        if (!pid.ok()) return pid.status();
        const auto& a = (*pid)->items;
        if (!(*pid)->is(K::kTuple) || a.size() != 5 || !a[0]->is(K::kString) || a[0]->s != "storage" ||
            !a[1]->is(K::kGlobal) || !a[2]->is(K::kString) || !a[4]->is(K::kInt)) {
          return Bad("persistent id other than ('storage', <torch storage type>, key, location, numel)");
        }
        auto st = StorageTypes().find(a[1]->s);
        if (st == StorageTypes().end()) return Bad(absl::StrCat("storage type ", a[1]->s));
        PyRef v = Make(K::kStorage);
        v->tensor.storage_key = a[2]->s;
        v->tensor.dtype = st->second.dtype;
        v->tensor.element_bytes = st->second.bytes;
        v->tensor.storage_numel = a[4]->i;
        stack_.push_back(std::move(v));
        return absl::OkStatus();
      }
      default:
        return Bad(absl::StrFormat("opcode 0x%02x is outside the subset torch.save writes", op));
    }
  }

  absl::string_view b_;
  absl::string_view file_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyRef> memo_;
};

}  // namespace

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t d : sizes) n *= d;
  return n;
}

bool TensorRef::contiguous() const {
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] != 1 && strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

const PyValue* PyValue::Get(absl::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : entries) {
    if (k->is(Kind::kString) && k->s == key) return v.get();
  }
  return nullptr;
}

const char* KindName(PyValue::Kind kind) {
  using K = PyValue::Kind;
  switch (kind) {
    case K::kNone: return "None";
    case K::kBool: return "bool";
    case K::kInt: return "int";
    case K::kFloat: return "float";
    case K::kString: return "str";
    case K::kBytes: return "bytes";
    case K::kList: return "list";
    case K::kTuple: return "tuple";
    case K::kDict: return "dict";
    case K::kTensor: return "tensor";
    case K::kStorage: return "storage";
    case K::kGlobal: return "global";
    case K::kObject: return "object";
  }
  return "?";
}

absl::StatusOr<PyRef> Unpickle(absl::string_view bytes, absl::string_view file) {
  return Unpickler(bytes, file).Run();
}

}  // namespace loom::storage::deepspeed
