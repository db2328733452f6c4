"""Compiles .proto files with Debian's protoc and grpc_cpp_plugin.

substrax_proto_library(name = "jobs", src = "substrax/v1/jobs.proto", deps = [...]) makes
  :jobs_proto      a filegroup with the .proto (and those of its deps) for other languages,
  :jobs_cc_proto   the C++ messages (jobs.pb.h),
  :jobs_cc_grpc    the C++ gRPC stubs (jobs.grpc.pb.h), only when has_services = True.
Messages and stubs are separate targets so that code that only handles messages never links gRPC.
Generated headers are included as "substrax/v1/jobs.pb.h".
"""

def substrax_proto_library(name, src, deps = [], has_services = False, visibility = None):
    base = src[:-len(".proto")]
    proto_outs = [base + ".pb.h", base + ".pb.cc"]
    grpc_outs = [base + ".grpc.pb.h", base + ".grpc.pb.cc"] if has_services else []

    native.filegroup(
        name = name + "_proto",
        srcs = [src] + [d + "_proto" for d in deps],
        visibility = visibility,
    )

    # Protoc sees our sources relative to this package's directory (imports read
    # "substrax/v1/..."), and the well-known types from Debian's /usr/include.
    pkg = native.package_name()
    cmd = ("$(execpath @system_tools//:protoc) -I{pkg} -I/usr/include " +
           "--cpp_out=$(GENDIR)/{pkg} ").format(pkg = pkg)
    tools = ["@system_tools//:protoc"]
    if has_services:
        cmd += ("--grpc_out=$(GENDIR)/{pkg} " +
                "--plugin=protoc-gen-grpc=$(execpath @system_tools//:grpc_cpp_plugin) ").format(pkg = pkg)
        tools.append("@system_tools//:grpc_cpp_plugin")
    cmd += "$(execpath %s)" % src

    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_proto" for d in deps],
        outs = proto_outs + grpc_outs,
        cmd = cmd,
        tools = tools,
    )

    native.cc_library(
        name = name + "_cc_proto",
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        includes = ["."],
        deps = [d + "_cc_proto" for d in deps] + ["@protobuf"],
        visibility = visibility,
    )

    if has_services:
        native.cc_library(
            name = name + "_cc_grpc",
            srcs = [base + ".grpc.pb.cc"],
            hdrs = [base + ".grpc.pb.h"],
            includes = ["."],
            deps = [":" + name + "_cc_proto", "@grpc//:grpc++"],
            visibility = visibility,
        )
