"""loom_cc_proto: C++ (and gRPC) code from a .proto with the system protoc and grpc_cpp_plugin.

Bazel 4 offline has no rules_proto/grpc repositories, so a genrule runs Debian's protoc
(3.21.12, the libprotobuf that LibTorch also links) and grpc_cpp_plugin (1.51.1).
"""

def loom_cc_proto(name, src, deps = [], grpc = False, visibility = None):
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    cmd = "protoc -I. --cpp_out=$(GENDIR) "
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) "
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_src" for d in deps],
        outs = outs,
        cmd = cmd + "$(location " + src + ")",
    )
    native.filegroup(name = name + "_src", srcs = [src])
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc++"] if grpc else []),
        visibility = visibility,
    )
