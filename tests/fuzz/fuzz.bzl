"""fuzz_target: a libFuzzer target and the test that replays its corpus."""

def fuzz_target(name, srcs, deps = [], corpus_size = "small"):
    """Defines three targets for the fuzz target `name` (corpus in corpus/<name>/):

    <name>_lib:  the sources, which define LLVMFuzzerTestOneInput;
    <name>:      the libFuzzer binary, tagged manual: it needs clang (bazel build --config=fuzz);
    <name>_corpus_test: a cc_test, built by every configuration (gcc too), that runs
                 LLVMFuzzerTestOneInput over every file of corpus/<name>/ (replay_main.cc).
    """
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    native.cc_binary(
        name = name,
        testonly = True,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = [":" + name + "_lib"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = corpus_size,
        # Tests run in the workspace's runfiles directory, where the corpus files lie.
        args = ["tests/fuzz/corpus/" + name],
        data = native.glob(["corpus/%s/**" % name]),
        deps = [
            ":" + name + "_lib",
            ":replay_main",
        ],
    )
