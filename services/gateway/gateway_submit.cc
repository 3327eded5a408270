#include "services/gateway/gateway_submit.h"

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "services/cli/job_spec_yaml.h"
#include "services/gateway/gateway_http.h"

namespace loom::gateway::internal {
namespace {

using json = nlohmann::json;

bool Invalid(httplib::Response& res, const std::string& message) {
  WriteError(res, grpc::StatusCode::INVALID_ARGUMENT, message);
  return false;
}

// {"spec": <document>, ...}: the other fields by protobuf's JSON mapping, the spec with the
// document's conveniences first.
bool ParseJsonRequest(const std::string& body, loom::v1::SubmitJobRequest* request,
                      httplib::Response& res) {
  json j;
  if (FirstInvalidUtf8(body) == std::string::npos) {
    j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  }
  if (!j.is_object() || !j.contains("spec") || !j["spec"].is_object()) {
    return ParseBody(body, request, res);  // its errors
  }
  const std::map<std::string, std::string> none;  // a JSON body sends no files
  loom::cli::SpecFiles files;
  files.uploaded = &none;
  if (absl::Status s = loom::cli::ApplyDocumentConveniences(j["spec"], files); !s.ok()) {
    return Invalid(res, absl::StrCat("spec.", s.message()));
  }
  return ParseBody(SafeDump(j), request, res);
}

bool ParseBool(const std::string& part, const std::string& value, bool* out,
               httplib::Response& res) {
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (v == "true" || v == "1") {
    *out = true;
  } else if (v == "false" || v == "0" || v.empty()) {
    *out = false;
  } else {
    return Invalid(res, absl::StrCat("multipart part '", part, "': want true or false, got '",
                                     value.substr(0, 32), "'"));
  }
  return true;
}

bool ParseMultipartRequest(const std::vector<httplib::MultipartFormData>& parts,
                           loom::v1::SubmitJobRequest* request, httplib::Response& res) {
  const httplib::MultipartFormData* spec_part = nullptr;
  std::map<std::string, std::string> uploaded;
  for (const httplib::MultipartFormData& part : parts) {
    if (part.name == "spec") {
      if (spec_part != nullptr) return Invalid(res, "multipart: more than one part named 'spec'");
      spec_part = &part;
    } else if (part.name == "requestId" || part.name == "request_id") {
      request->set_request_id(part.content);
    } else if (part.name == "validateOnly" || part.name == "validate_only") {
      bool v = false;
      if (!ParseBool(part.name, part.content, &v, res)) return false;
      request->set_validate_only(v);
    } else if (part.name == "waitForCapacity" || part.name == "wait_for_capacity") {
      bool v = false;
      if (!ParseBool(part.name, part.content, &v, res)) return false;
      request->set_wait_for_capacity(v);
    } else if (!part.filename.empty()) {
      if (!uploaded.emplace(part.filename, part.content).second) {
        return Invalid(res, absl::StrCat("multipart: two files named '",
                                         part.filename.substr(0, 256), "'"));
      }
    } else {
      return Invalid(res, absl::StrCat(
                              "multipart: unknown part '", part.name.substr(0, 64),
                              "' (want spec, requestId, validateOnly, waitForCapacity, or a "
                              "file part whose filename is the path the spec names)"));
    }
  }
  if (spec_part == nullptr) {
    return Invalid(res, "multipart: no part named 'spec' (the job document, as loomctl reads it)");
  }
  loom::cli::SpecFiles files;
  files.uploaded = &uploaded;
  const std::string name = spec_part->filename.empty() ? "spec" : spec_part->filename;
  absl::StatusOr<loom::v1::JobSpec> spec =
      loom::cli::JobSpecFromYaml(spec_part->content, files, name);
  if (!spec.ok()) return Invalid(res, std::string(spec.status().message()));
  *request->mutable_spec() = *std::move(spec);
  return true;
}

}  // namespace

bool ReadSubmitJobRequest(const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader, size_t max_body,
                          loom::v1::SubmitJobRequest* request) {
  if (!req.is_multipart_form_data()) {
    std::string body;
    if (!ReadBody(req, res, reader, max_body, /*required=*/true, &body)) return false;
    return ParseJsonRequest(body, request, res);
  }
  if (!req.has_header("Content-Length") && !absl::EqualsIgnoreCase(req.get_header_value("Transfer-Encoding"), "chunked")) {
    WriteHttpError(res, 411, grpc::StatusCode::INVALID_ARGUMENT,
                   "POST /v1/jobs needs a body with a Content-Length header (or chunked "
                   "transfer encoding)");
    return false;
  }
  std::vector<httplib::MultipartFormData> parts;
  size_t total = 0;
  bool too_large = false;
  const bool read = reader(
      [&](const httplib::MultipartFormData& header) {
        parts.push_back(header);
        return true;
      },
      [&](const char* data, size_t n) {
        total += n;
        if (total > max_body || parts.empty()) {
          too_large = total > max_body;
          return false;
        }
        parts.back().content.append(data, n);
        return true;
      });
  if (too_large) {
    WriteHttpErrorAndClose(res, 413, grpc::StatusCode::INVALID_ARGUMENT, TooLarge(-1, max_body));
    return false;
  }
  if (!read) {
    WriteHttpErrorAndClose(res, 400, grpc::StatusCode::INVALID_ARGUMENT,
                           "the multipart/form-data body could not be read (truncated, or not "
                           "multipart: check its boundary)");
    return false;
  }
  for (const httplib::MultipartFormData& part : parts) {
    if (FirstInvalidUtf8(part.content) != std::string::npos) {
      return Invalid(res, absl::StrCat("multipart part '", part.name.substr(0, 64),
                                       "' is not UTF-8 text"));
    }
  }
  return ParseMultipartRequest(parts, request, res);
}

}  // namespace loom::gateway::internal
