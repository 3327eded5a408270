// POST /v1/jobs: the request body as a SubmitJobRequest, with the job document that loomctl takes
// (issue 49, "REST = the CLI's document": the REST API used to refuse `"accelerator": "cpu"` and a
// `deepspeed_config` given as a file name, so a spec written for loomctl had to be rewritten).
//
//   application/json     {"spec": {...}, "requestId": ..., "validateOnly": ..., "waitForCapacity":
//                        ...} (protobuf's JSON mapping, both field spellings), where the spec may
//                        also use the document's conveniences (services/cli/job_spec_yaml.h):
//                        short accelerator kinds; deepspeed_config / model.config must be inline
//                        JSON objects (a path names a file this request did not send: 400).
//   multipart/form-data  loomctl's files as they are: a part named "spec" holding the job
//                        document (YAML, or JSON), a part per config file it names by path, the
//                        part's filename being that path (curl -F spec=@job.yaml
//                        -F 'f=@ds_config.json;filename=ds_config.json'), and optional text parts
//                        requestId, validateOnly, waitForCapacity ("true"/"false").
// The whole body is bounded by --max_body_bytes either way (413).
//
// Thread-safety: stateless; called on httplib's handler threads.
#ifndef LOOM_SERVICES_GATEWAY_GATEWAY_SUBMIT_H_
#define LOOM_SERVICES_GATEWAY_GATEWAY_SUBMIT_H_

#include <httplib.h>

#include <cstddef>

#include "proto/job_service.pb.h"

namespace loom::gateway::internal {

// Reads and parses the body of `req` into *request. On failure answers (400 naming the field or
// part, 411, 413) and returns false.
bool ReadSubmitJobRequest(const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader, size_t max_body,
                          loom::v1::SubmitJobRequest* request);

}  // namespace loom::gateway::internal

#endif  // LOOM_SERVICES_GATEWAY_GATEWAY_SUBMIT_H_
