#include "services/cli/admin_commands.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/accelerator_kind.h"
#include "common/grpc_status.h"
#include "services/cli/terminal_text.h"
#include "google/protobuf/util/json_util.h"
#include "proto/admin_service.grpc.pb.h"

namespace loom {
namespace {

int Fail(const grpc::Status& g) {
  absl::Status s = FromGrpcStatus(g);
  std::fprintf(stderr, "loomctl: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
               cli::TerminalSafe(s.message()).c_str());
  return static_cast<int>(s.code());
}

void PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  std::printf("%s", out.c_str());
}

std::string Kind(loom::v1::AcceleratorKind k) { return AcceleratorKindName(k); }

std::string State(const loom::v1::NodeInfo& n) {
  std::string s = n.live() ? "live" : "lost";
  if (n.draining()) {
    absl::StrAppend(&s, ",draining");
  } else if (n.cordoned()) {
    absl::StrAppend(&s, ",cordoned");
  }
  return s;
}

std::string KindMap(const google::protobuf::Map<std::string, int64_t>& m) {
  if (m.empty()) return "-";
  std::map<std::string, int64_t> sorted(m.begin(), m.end());
  std::vector<std::string> parts;
  for (const auto& [k, v] : sorted) parts.push_back(absl::StrCat(k, ":", v));
  return absl::StrJoin(parts, ",");
}

void PrintNode(const loom::v1::NodeInfo& n) {
  const loom::v1::NodeInventory& inv = n.inventory();
  std::vector<std::string> labels;
  std::map<std::string, std::string> sorted(inv.labels().begin(), inv.labels().end());
  for (const auto& [k, v] : sorted) labels.push_back(absl::StrCat(k, "=", v));
  // Node ids, labels and reasons come from workers and admins: escaped (terminal_text.h).
  const std::string line = absl::StrFormat("%-20s %-6s %5d/%-5d %-12s %-8s %-16s %-24s %s%s", n.node_id().c_str(),
              (Kind(inv.accelerator()) + (inv.superchip() ? "*" : "")).c_str(), n.used_slots(),
              inv.slots(), inv.topology_domain().empty() ? "-" : inv.topology_domain().c_str(),
              inv.cpu_arch().empty() ? "-" : inv.cpu_arch().c_str(), State(n).c_str(),
              labels.empty() ? "-" : absl::StrJoin(labels, ",").c_str(),
              n.job_ids().empty() ? "-" : absl::StrJoin(n.job_ids(), ",").c_str(),
              n.admin_reason().empty() ? "" : absl::StrCat("  (", n.admin_reason(), ")").c_str());
  std::printf("%s\n", cli::TerminalSafe(line).c_str());
}

}  // namespace

bool IsAdminCommand(const std::string& cmd) {
  return cmd == "nodes" || cmd == "cordon" || cmd == "uncordon" || cmd == "drain" ||
         cmd == "queues";
}

int RunAdminCommand(const std::string& cmd, const std::string& arg,
                    std::shared_ptr<grpc::Channel> channel,
                    const std::function<std::unique_ptr<grpc::ClientContext>()>& make_context,
                    const std::string& reason, bool json) {
  auto stub = loom::v1::AdminService::NewStub(channel);
  std::unique_ptr<grpc::ClientContext> context = make_context();
  grpc::ClientContext& ctx = *context;
  const char* header = "%-20s %-6s %11s %-12s %-8s %-16s %-24s %s\n";
  if (cmd == "nodes") {
    loom::v1::ListNodesResponse resp;
    grpc::Status s = stub->ListNodes(&ctx, {}, &resp);
    if (!s.ok()) return Fail(s);
    if (json) {
      PrintJson(resp);
      return 0;
    }
    std::printf(header, "NODE", "KIND", "USED/SLOTS", "DOMAIN", "ARCH", "STATE", "LABELS", "JOBS");
    for (const auto& n : resp.nodes()) PrintNode(n);
    return 0;
  }
  if (cmd == "queues") {
    loom::v1::ListQueuesResponse resp;
    grpc::Status s = stub->ListQueues(&ctx, {}, &resp);
    if (!s.ok()) return Fail(s);
    if (json) {
      PrintJson(resp);
      return 0;
    }
    std::printf("%-20s %-14s %-7s %-20s %-20s %-20s %-8s %s\n", "QUEUE", "TENANT", "WEIGHT",
                "QUOTA", "BORROW", "USAGE", "PENDING", "RUNNING");
    for (const auto& q : resp.queues()) {
      std::printf("%-20s %-14s %-7g %-20s %-20s %-20s %-8d %d\n", q.name().c_str(),
                  q.tenant().empty() ? "*" : q.tenant().c_str(), q.tenant_weight(),
                  q.has_quota() ? KindMap(q.nominal_quota()).c_str() : "unlimited",
                  KindMap(q.borrowing_limit()).c_str(), KindMap(q.usage()).c_str(),
                  q.pending_jobs(), q.running_jobs());
    }
    return 0;
  }
  if (arg.empty()) {
    std::fprintf(stderr, "loomctl %s: missing NODE_ID\n", cmd.c_str());
    return 2;
  }
  if (cmd == "drain") {
    loom::v1::DrainNodeRequest req;
    req.set_node_id(arg);
    req.set_reason(reason);
    loom::v1::DrainNodeResponse resp;
    grpc::Status s = stub->DrainNode(&ctx, req, &resp);
    if (!s.ok()) return Fail(s);
    if (json) {
      PrintJson(resp);
      return 0;
    }
    std::printf("node %s draining; requeued %d job(s)%s%s\n", arg.c_str(),
                resp.requeued_job_ids_size(), resp.requeued_job_ids().empty() ? "" : ": ",
                absl::StrJoin(resp.requeued_job_ids(), ", ").c_str());
    return 0;
  }
  loom::v1::NodeInfo info;
  grpc::Status s;
  if (cmd == "cordon") {
    loom::v1::CordonNodeRequest req;
    req.set_node_id(arg);
    req.set_reason(reason);
    s = stub->CordonNode(&ctx, req, &info);
  } else {
    loom::v1::UncordonNodeRequest req;
    req.set_node_id(arg);
    s = stub->UncordonNode(&ctx, req, &info);
  }
  if (!s.ok()) return Fail(s);
  if (json) {
    PrintJson(info);
    return 0;
  }
  std::printf("node %s %s\n", arg.c_str(), info.cordoned() ? "cordoned" : "schedulable");
  return 0;
}

}  // namespace loom
