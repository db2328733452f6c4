"""safetensors files written by substrax's C++ (worker/checkpoint) load in Python's safetensors
package with numpy, value for value; and files Python writes load in C++."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

TOOL = None


def tool(*args):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"safetensors_tool {args} exited {r.returncode}: {r.stderr}")
    return r.stdout


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


if __name__ == "__main__":
    TOOL = sys.argv[1]
    unittest.main(argv=[sys.argv[0]], verbosity=2)
