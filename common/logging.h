// Logging facade: glog 0.6 (Debian) provides LOG/VLOG/CHECK with the same spelling as absl/log,
// which this Abseil release lacks; switching later changes only this header.
#ifndef LOOM_COMMON_LOGGING_H_
#define LOOM_COMMON_LOGGING_H_

#include <glog/logging.h>

#endif  // LOOM_COMMON_LOGGING_H_
