"""safetensors files written by substrax's C++ (worker/checkpoint) load in Python's safetensors
package with numpy, value for value; files Python writes load in C++; and a sharded checkpoint's
shard files (placed by its manifest) and what `substrax-job export-checkpoint` made of it load
in Python, bit for bit, as docs/checkpoints.md says."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

TOOL = None
WORKER = None


def tool(*args):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"safetensors_tool {args} exited {r.returncode}: {r.stderr}")
    return r.stdout


def printed_arrays(text):
    """Arrays as safetensors_tool prints them ("NAME F32 [8,6] v0 v1 ..."), as float32."""
    arrays = {}
    for line in text.splitlines():
        name, dtype, shape, *values = line.split(" ")
        assert dtype == "F32", line
        dims = tuple(int(d) for d in shape[1:-1].split(",") if d)
        # %.9g round-trips every float32 exactly.
        arrays[name] = np.array([float(v) for v in values], dtype=np.float32).reshape(dims)
    return arrays


def assert_bits_equal(got, want, what):
    """Equal shapes and float32 bit patterns (-0.0 and 0.0 differ here)."""
    if got.dtype != np.float32 or got.shape != want.shape:
        raise AssertionError(f"{what}: {got.dtype} {got.shape}, want float32 {want.shape}")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=what)


class InteropTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def test_python_reads_what_cpp_wrote(self):
        path = os.path.join(self.dir, "cpp.safetensors")
        tool("write", path)
        with safe_open(path, framework="numpy") as f:
            self.assertEqual(f.metadata(), {"format": "substrax", "step": "1234"})
            self.assertEqual(sorted(f.keys()), ["dense/kernel", "f64", "half", "mask", "step"])
            kernel = f.get_tensor("dense/kernel")
            self.assertEqual(kernel.dtype, np.float32)
            np.testing.assert_array_equal(
                kernel, np.array([[-1.0, -0.5, 0.0], [0.5, 1.0, 1.5]], dtype=np.float32))
            step = f.get_tensor("step")
            self.assertEqual((step.dtype, step.shape, int(step)), (np.int64, (), 1234))
            np.testing.assert_array_equal(f.get_tensor("mask"), [True, False, True, True])
            self.assertEqual(f.get_tensor("f64")[0], 0.1)
        # bfloat16 has no numpy dtype: its bytes are read by the format's own rules (an 8-byte
        # little-endian header length, the JSON header, then the data) and compared.
        with open(path, "rb") as f:
            raw = f.read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        self.assertEqual(header["half"]["dtype"], "BF16")
        begin, end = header["half"]["data_offsets"]
        half = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype="<u2")
        np.testing.assert_array_equal(half, [0x3F80, 0xC000])  # 1.0, -2.0

    def test_cpp_reads_what_python_wrote(self):
        path = os.path.join(self.dir, "py.safetensors")
        rng = np.random.default_rng(7)
        tensors = {
            "layer/w": rng.standard_normal((3, 4)).astype(np.float32),
            "layer/b": np.arange(4, dtype=np.float64) / 3,
            "count": np.array([5, -6], dtype=np.int32),
            "h": np.array([1.5, -0.25], dtype=np.float16),
            "flags": np.array([True, False]),
            "empty": np.zeros((0, 2), dtype=np.float32),
        }
        save_file(tensors, path, metadata={"writer": "python"})
        lines = dict(line.split(" ", 1) for line in tool("read", path).splitlines())
        self.assertEqual(lines["meta"], "writer python")
        for name, array in tensors.items():
            dtype, shape, *values = lines[name].split()
            self.assertEqual(shape, "[%s]" % ",".join(str(d) for d in array.shape), name)
            # Printed with enough digits to round-trip the element type exactly.
            np.testing.assert_array_equal(
                np.array([float(v) for v in values]).astype(array.dtype), array.reshape(-1),
                err_msg=name)
        self.assertEqual(lines["h"].split(" ")[0], "F16")
        self.assertEqual(lines["flags"].split(" ")[0], "BOOL")

    def test_python_reads_a_sharded_checkpoint_and_its_export(self):
        jobs = os.path.join(self.dir, "checkpoints")
        want = printed_arrays(tool("checkpoint", jobs))
        step_dir = os.path.join(jobs, "step-000000000100")

        # Each shard file on its own, each block placed by the manifest's index ranges (protobuf's
        # JSON: camelCase names, int64 as strings, a start of 0 left out).
        with open(os.path.join(step_dir, "manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(int(manifest["step"]), 100)
        placed = {a["name"]: np.full([int(d) for d in a["globalShape"]], np.nan, np.float32)
                  for a in manifest["arrays"]}
        self.assertEqual(sorted(placed), sorted(want))
        for entry in manifest["files"]:
            path = os.path.join(step_dir, entry["name"])
            tensors = load_file(path)
            with safe_open(path, framework="numpy") as f:
                self.assertEqual(f.metadata(), {"format": "substrax-checkpoint",
                                                "process_index": str(entry.get("processIndex", 0))})
            self.assertEqual(sorted(tensors), sorted(s["tensor"] for s in entry["shards"]))
            for shard in entry["shards"]:
                index = tuple(slice(int(r.get("start", 0)), int(r["limit"]))
                              for r in shard["index"])
                block = tensors[shard["tensor"]]
                assert_bits_equal(block, want[shard["array"]][index], shard["tensor"])
                placed[shard["array"]][index] = block
        # Process 1 (host-1: data coordinate 1) holds the kernels' lower halves and no bias, whose
        # replica 0 lives on host-0.
        process1 = load_file(os.path.join(step_dir, "process-00001.safetensors"))
        self.assertEqual(sorted(process1), ["optimizer/dense_0/kernel/mu@4:8,0:3",
                                            "optimizer/dense_0/kernel/mu@4:8,3:6",
                                            "params/dense_0/kernel@4:8,0:3",
                                            "params/dense_0/kernel@4:8,3:6"])
        assert_bits_equal(process1["params/dense_0/kernel@4:8,3:6"],
                          want["params/dense_0/kernel"][4:8, 3:6], "process 1's kernel block")
        for name, array in placed.items():
            assert_bits_equal(array, want[name], f"{name} placed from the shard files")

        # The export, by the real binary: the parameters whole under their own names...
        out = os.path.join(self.dir, "params.safetensors")
        r = subprocess.run([WORKER, "export-checkpoint", jobs, "--out", out],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(f"wrote {out}: step 100 of {step_dir}, 2 arrays, "
                                            f"{os.path.getsize(out)} bytes\n"), r.stdout)
        params = load_file(out)
        self.assertEqual(sorted(params), ["dense_0/bias", "dense_0/kernel"])
        for name, array in params.items():
            assert_bits_equal(array, want["params/" + name], f"exported {name}")
        with safe_open(out, framework="numpy") as f:
            self.assertEqual(f.metadata(), {"format": "substrax-export", "step": "100",
                                            "mesh_axes": "data,model", "mesh_shape": "2,2"})
        # ... and with the optimizer's state, under its checkpoint names.
        r = subprocess.run([WORKER, "export-checkpoint", step_dir, "--out", out,
                            "--include-optimizer"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        everything = load_file(out)
        self.assertEqual(sorted(everything), ["dense_0/bias", "dense_0/kernel",
                                              "optimizer/dense_0/bias/mu",
                                              "optimizer/dense_0/kernel/mu"])
        for name, array in everything.items():
            source = name if name.startswith("optimizer/") else "params/" + name
            assert_bits_equal(array, want[source], f"exported {name}")


if __name__ == "__main__":
    TOOL = sys.argv[1]
    WORKER = sys.argv[2]
    unittest.main(argv=[sys.argv[0]], verbosity=2)
