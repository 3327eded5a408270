// Offload and aio sections of the DeepSpeed config (ds_config.h states which keys act).
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/ds_config_internal.h"

namespace loom::spec::ds_config_internal {
namespace {

// The keys of an offload section that Loom reads but does not act on, each with a warning
// naming it (implemented: device, nvme_path, buffer_count; offload_param.buffer_size;
// offload_optimizer.pipeline_read / pipeline_write; offload_optimizer.ratio, refused below 1 in
// ParseOffload). None of them can change results: they tune memory placement and threading.
void WarnIgnoredOffloadKeys(const json& off, const std::string& path, bool is_param,
                            bool super_offload, std::vector<std::string>* warnings) {
  WarnIgnored(off, path, {"pin_memory"},
              "Loom keeps offloaded state in pageable host memory; pinning only speeds "
              "accelerator copies",
              warnings);
  WarnIgnored(off, path, {"max_in_cpu"},
              "Loom keeps no host-memory cache of NVMe-offloaded parameters", warnings);
  WarnIgnored(off, path, {"fast_init"}, "optimizer-state initialisation speed only", warnings);
  if (!super_offload) {  // SuperOffload reserves that share of the threads
    WarnIgnored(off, path, {"cpuadam_cores_perc"},
                "Loom's CPU Adam uses training.threads_per_rank threads", warnings);
  }
  WarnIgnored(off, path, {"pipeline"},
              "DeepSpeed derives it from pipeline_read / pipeline_write; set those", warnings);
  if (is_param) {
    WarnIgnored(off, path, {"pipeline_read", "pipeline_write"},
                "only offload_optimizer pipelines its swaps; offload_param reads ahead along "
                "the stage-3 prefetch trace",
                warnings);
    WarnIgnored(off, path, {"ratio"}, "partial offload applies to offload_optimizer only",
                warnings);
  } else {
    WarnIgnored(off, path, {"buffer_size"},
                "offload_optimizer buffers are sized from sub_group_size", warnings);
  }
}

}  // namespace

absl::Status ParseOffload(const json& zero, const std::string& key, const std::string& zpath,
                          OffloadConfig* o, bool is_param, std::vector<std::string>* warnings) {
  o->buffer_count = is_param ? 5 : 4;
  ASSIGN_OR_RETURN(const json* off, OptObject(zero, key, zpath));
  if (off == nullptr) return absl::OkStatus();
  const std::string path = Join(zpath, key);
  RETURN_IF_ERROR(CheckKeys(*off, path,
                            {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                             "pin_memory", "pipeline_read", "pipeline_write", "fast_init",
                             "ratio", "super_offload", "cpuadam_cores_perc", "speculation",
                             "pipeline"}));
  RETURN_IF_ERROR(ReadString(*off, "device", path, &o->device));
  RETURN_IF_ERROR(ReadString(*off, "nvme_path", path, &o->nvme_path));
  RETURN_IF_ERROR(ReadInt(*off, "buffer_count", path, &o->buffer_count));
  RETURN_IF_ERROR(ReadInt(*off, "buffer_size", path, &o->buffer_size));
  RETURN_IF_ERROR(ReadInt(*off, "max_in_cpu", path, &o->max_in_cpu));
  RETURN_IF_ERROR(ReadBool(*off, "pin_memory", path, &o->pin_memory));
  RETURN_IF_ERROR(ReadBool(*off, "pipeline_read", path, &o->pipeline_read));
  RETURN_IF_ERROR(ReadBool(*off, "pipeline_write", path, &o->pipeline_write));
  RETURN_IF_ERROR(ReadBool(*off, "fast_init", path, &o->fast_init));
  RETURN_IF_ERROR(ReadDouble(*off, "ratio", path, &o->ratio));
  RETURN_IF_ERROR(json_fields::OptBool(*off, "pipeline", path).status());
  if (o->device != "none" && o->device != "cpu" && o->device != "nvme") {
    return Invalid(Join(path, "device"),
                   absl::StrCat("\"", o->device, "\" is not one of none, cpu, nvme"));
  }
  if (o->device == "nvme" && o->nvme_path.empty()) {
    return Invalid(Join(path, "nvme_path"), "required when device is nvme");
  }
  RETURN_IF_ERROR(ParseSuperOffload(*off, path, is_param, o));
  if (!is_param) {  // offload_param's ratio is warned about as ignored below
    if (!(o->ratio >= 0.0 && o->ratio <= 1.0)) {  // whatever the device; NaN too
      return Invalid(Join(path, "ratio"), absl::StrCat(o->ratio, " is not in [0, 1]"));
    }
    if (!o->super_offload && o->ratio != 1.0) {
      if (o->device == "none") {
        warnings->push_back(absl::StrCat(Join(path, "ratio"),
                                         ": ignored (device \"none\": nothing is offloaded)"));
      } else {
        // DeepSpeed's ZeRO-Offload++ partial offload (Twin-Flow) is a feature Loom does not
        // have; refused at parse time so a submission fails at once, ZenFlow or not.
        return Unsupported(Join(path, "ratio"),
                           absl::StrCat("partial offload (", o->ratio,
                                        "; only 1.0 without super_offload)"));
      }
    }
  }
  WarnIgnoredOffloadKeys(*off, path, is_param, o->super_offload, warnings);
  return absl::OkStatus();
}

absl::Status ParseAio(const json& root, DeepSpeedConfig* c) {
  ASSIGN_OR_RETURN(const json* aio, OptObject(root, "aio", kRoot));
  if (aio == nullptr) return absl::OkStatus();
  const std::string path = Join(kRoot, "aio");
  RETURN_IF_ERROR(CheckKeys(*aio, path,
                            {"block_size", "queue_depth", "thread_count", "single_submit",
                             "overlap_events", "use_gds", "intra_op_parallelism"}));
  RETURN_IF_ERROR(ReadInt(*aio, "block_size", path, &c->aio.block_size));
  RETURN_IF_ERROR(ReadInt(*aio, "queue_depth", path, &c->aio.queue_depth));
  // Validated as DeepSpeed types them, then ignored: they tune libaio's threads and submission,
  // which Loom's io_uring swapper does not have.
  RETURN_IF_ERROR(json_fields::OptInt(*aio, "thread_count", path).status());
  RETURN_IF_ERROR(json_fields::OptInt(*aio, "intra_op_parallelism", path).status());
  for (const char* k : {"single_submit", "overlap_events", "use_gds"}) {
    RETURN_IF_ERROR(json_fields::OptBool(*aio, k, path).status());
  }
  WarnIgnored(*aio, path, {"thread_count", "intra_op_parallelism", "single_submit",
                           "overlap_events"},
              "a libaio threading/submission knob; Loom's io_uring swapper submits block_size "
              "pieces with up to queue_depth in flight",
              &c->warnings);
  WarnIgnored(*aio, path, {"use_gds"}, "GPUDirect Storage needs a GPU; Loom trains on CPUs",
              &c->warnings);
  if (c->aio.block_size < 4096 || c->aio.block_size % 4096 != 0) {
    return Invalid(Join(path, "block_size"),
                   absl::StrCat(c->aio.block_size, " is not a positive multiple of 4096"));
  }
  if (c->aio.queue_depth < 1 || c->aio.queue_depth > 4096) {
    return Invalid(Join(path, "queue_depth"),
                   absl::StrCat(c->aio.queue_depth, " is not in [1, 4096]"));
  }
  return absl::OkStatus();
}

}  // namespace loom::spec::ds_config_internal
