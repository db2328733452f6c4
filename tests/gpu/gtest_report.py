"""Reads a gtest XML report (--gtest_output=xml:FILE) for tests/gpu/run.sh and says whether the
binary did what the GPU check needs, in one line; exit status 0 if so, 1 if not.

    gtest_report.py FILE --mode gpu [--require Suite.Test ...]
    gtest_report.py FILE --mode dry

--mode gpu (a GPU machine): no failure, and no skip except the tests that exist for the build
without CUDA (named *SaysHowTo*, *SayHowTo* or WithoutCuda*) and the optimizer rows of the core table that
have no CUDA kernel (skipped with "not implemented on the cuda backend"); every --require test
must have run and passed.
--mode dry (no GPU here): no failure, and every skip says why the GPU is missing ("no CUDA
device", or the build's "--config=cuda"): the binary reached its first GPU call and stopped there.
"""
import argparse
import sys
import xml.etree.ElementTree as ET

BUILD_ONLY = ("SaysHowTo", "SayHowTo", "WithoutCuda")
NO_KERNEL = "not implemented on the cuda backend"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("xml")
    parser.add_argument("--mode", choices=["gpu", "dry"], required=True)
    parser.add_argument("--require", nargs="*", default=[])
    args = parser.parse_args()
    try:
        root = ET.parse(args.xml).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"no gtest report ({e})")
        return 1
    passed, failed, allowed, bad_skips, no_kernel = [], [], [], [], []
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        failure = case.find("failure")
        skipped = case.find("skipped")
        if failure is not None or case.find("error") is not None:
            failed.append(name)
        elif skipped is not None or case.get("result") == "skipped":
            message = ""
            if skipped is not None:
                message = skipped.get("message") or skipped.text or ""
            if any(k in name for k in BUILD_ONLY):
                allowed.append(name)
            elif args.mode == "gpu" and NO_KERNEL in message:
                no_kernel.append(name)
            elif args.mode == "dry" and ("no CUDA device" in message or "--config=cuda" in message):
                allowed.append(name)
            else:
                why = " ".join(message.split())[:160] or "no message"
                bad_skips.append(f"{name} ({why})")
        elif case.get("status", "run") == "run":
            passed.append(name)
    missing = [r for r in args.require if r not in passed]
    line = (f"{len(passed)} passed, {len(failed)} failed, {len(allowed) + len(no_kernel)} skipped as "
            f"allowed")
    if no_kernel:
        line += f" (optimizers without a CUDA kernel: {', '.join(no_kernel)})"
    if failed:
        line += f"; failed: {', '.join(failed)}"
    if bad_skips:
        line += f"; skipped but must run {'here' if args.mode == 'gpu' else 'until the GPU'}: " + "; ".join(bad_skips)
    if missing:
        line += f"; required but not passed: {', '.join(missing)}"
    print(line)
    return 1 if failed or bad_skips or missing else 0


if __name__ == "__main__":
    sys.exit(main())
