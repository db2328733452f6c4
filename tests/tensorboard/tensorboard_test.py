"""TensorBoard event files of jobs that ran on a real local cluster (a coordinator and 2 worker
daemons, each with one CPU device), read with TensorBoard's own reader
(tensorboard.backend.event_processing.event_accumulator):
- `substraxctl metrics --tensorboard DIR`: every series of `substraxctl metrics -o json`, at
  every step, with the same values (float32);
- spec.tensorboard: the runner's file, written as the job trains, has the job's metrics at every
  report, equal to the coordinator's (declared reductions); a directory outside the checkpoint
  root is refused at submit.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from tensorboard.backend.event_processing import event_accumulator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import outlived  # noqa: E402  (tests/outlived.py)

ARGS = None

JOB = """apiVersion: substrax/v1
kind: TrainJob
metadata: {name: tensorboard}
spec:
  model: {type: mlp, hidden_sizes: [16], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 1024, num_test_examples: 256,
                num_features: 8, noise: 0.3}
  optimizer: {type: adam, learning_rate: 0.01}
  mesh: {data_parallel_size: 2}
  batch: {global_batch_size: 32}
  steps: 60
  seed: 3
  metrics: {loss: mean, accuracy: mean}
  report_every_steps: 10
  backend: cpu
"""


def job_with(name, extra):
    return JOB.replace("name: tensorboard", f"name: {name}") + extra + "\n"


def run(*argv, env=None, check=True, timeout=120):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"{argv} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


class TensorBoardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = os.path.realpath(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")))
        cls.state = os.path.join(cls.tmp, "cluster")
        cls.env = dict(os.environ)
        up = run(ARGS.ctl, "local", "up", "--workers", "2", "--cpu-devices", "1", "--state-dir",
                 cls.state, "--coordinator-binary", ARGS.coordinator, "--agent-binary",
                 ARGS.agent, timeout=120)
        # "export A=x B=y ...": the address and the admin's credentials.
        for word in shlex.split(up.stdout.strip())[1:]:
            key, _, value = word.partition("=")
            cls.env[key] = value
        cls.job = cls.submit("plain", JOB).stdout.strip()
        # local up's default checkpoint root.
        cls.live_dir = os.path.join(cls.state, "checkpoints", "runs", "live")
        cls.live_job = cls.submit(
            "live", job_with("tensorboard-live", f"  tensorboard: {{directory: {cls.live_dir}}}")
        ).stdout.strip()
        for job in (cls.job, cls.live_job):
            # `watch` returns when the job ends (exit 0 only if it SUCCEEDED), within its timeout.
            watched = cls.ctl("watch", job, check=False, timeout=240)
            if watched.returncode != 0:
                raise AssertionError(f"job {job} did not succeed:\n{watched.stdout}\n"
                                     f"{watched.stderr}\n{cls.ctl('get', job).stdout}")

    @classmethod
    def submit(cls, name, text, check=True):
        spec = os.path.join(cls.tmp, name + ".yaml")
        with open(spec, "w") as f:
            f.write(text)
        return cls.ctl("submit", spec, check=check)

    @classmethod
    def tearDownClass(cls):
        run(ARGS.ctl, "local", "down", "--state-dir", cls.state, check=False, timeout=60)
        outlived.assert_none_outlived(cls.tmp)

    @classmethod
    def ctl(cls, *argv, check=True, timeout=60):
        return run(ARGS.ctl, *argv, env=cls.env, check=check, timeout=timeout)

    def export(self, name, *query):
        """(the JSON response, TensorBoard's scalars by tag) of one query."""
        response = json.loads(self.ctl("metrics", self.job, "-o", "json", *query).stdout)
        out = os.path.join(self.tmp, "tb", name)
        wrote = self.ctl("metrics", self.job, "--tensorboard", out, *query).stdout
        self.assertIn(" to " + out + "/events.out.tfevents.", wrote)
        files = os.listdir(out)
        self.assertEqual(len(files), 1, files)
        self.assertRegex(files[0], r"^events\.out\.tfevents\.\d+\.")
        return response, self.load(out)

    def assert_same(self, response, scalars, tag_of):
        expected = {}
        for series in response["series"]:
            if series["points"]:
                expected[tag_of(series)] = series["points"]
        self.assertEqual(sorted(scalars), sorted(expected))
        for tag, points in expected.items():
            with self.subTest(tag=tag):
                self.assertEqual([e.step for e in scalars[tag]],
                                 [int(p["step"]) for p in points])
                self.assertEqual([np.float32(e.value) for e in scalars[tag]],
                                 [np.float32(p["value"]) for p in points])
        return expected

    def test_every_series_at_every_step(self):
        response, scalars = self.export("all")
        expected = self.assert_same(response, scalars, lambda s: s["name"])
        # The job's own metrics and the runtime's, 6 reports of 60 steps.
        self.assertTrue({"loss", "accuracy", "samples_per_second"} <= set(expected), expected)
        self.assertEqual([e.step for e in scalars["loss"]], [10, 20, 30, 40, 50, 60])

    def test_grouped_by_host(self):
        response, scalars = self.export("host", "--name", "loss", "--group-by", "host")
        expected = self.assert_same(response, scalars,
                                    lambda s: f"{s['name']}/host_{s['group']}")
        self.assertEqual(len(expected), 2, expected)  # two workers, two hosts

    def test_per_device_of_one_attempt(self):
        response, scalars = self.export("device", "--name", "loss,accuracy", "--reduce", "none",
                                        "--attempt", "1")
        expected = self.assert_same(response, scalars,
                                    lambda s: f"{s['name']}/device_{s['group']}")
        self.assertEqual(len(expected), 4, expected)  # 2 metrics x 2 devices

    def load(self, directory):
        acc = event_accumulator.EventAccumulator(directory, size_guidance={"scalars": 0})
        acc.Reload()
        return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}

    def test_spec_tensorboard_is_written_while_training(self):
        files = os.listdir(self.live_dir)
        self.assertEqual(len(files), 1, files)  # one attempt, one file
        self.assertRegex(files[0], r"^events\.out\.tfevents\.\d+\.")
        scalars = self.load(self.live_dir)
        self.assertEqual(sorted(scalars), ["accuracy", "collective_fraction", "compute_fraction",
                                           "data_wait_fraction", "loss", "samples_per_second"])
        response = json.loads(self.ctl("metrics", self.live_job, "--name", "loss,accuracy",
                                       "-o", "json").stdout)
        for series in response["series"]:
            with self.subTest(series=series["name"]):
                events = scalars[series["name"]]
                self.assertEqual([e.step for e in events], [10, 20, 30, 40, 50, 60])
                self.assertEqual([e.step for e in events],
                                 [int(p["step"]) for p in series["points"]])
                # The runner's reduction across devices and the coordinator's agree to float32.
                for event, point in zip(events, series["points"]):
                    self.assertAlmostEqual(event.value, point["value"],
                                           delta=1e-6 * max(1.0, abs(point["value"])))

    def test_spec_tensorboard_outside_the_checkpoint_root_is_refused(self):
        root = os.path.join(self.state, "checkpoints")
        for directory, message in [
                (root + "/../escape", "has a '..' component"),
                (os.path.join(self.tmp, "outside"), "is not under a checkpoint root")]:
            with self.subTest(directory=directory):
                r = self.submit("escape", job_with("escape", f"  tensorboard: {{directory: "
                                                             f"{directory}}}"), check=False)
                self.assertNotEqual(r.returncode, 0, r.stdout)
                self.assertIn(f"spec.tensorboard.directory: '{directory}' {message}", r.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.tmp, "escape")))
                self.assertFalse(os.path.exists(os.path.join(self.tmp, "outside")))

    def test_a_directory_that_cannot_be_made_is_refused(self):
        blocker = os.path.join(self.tmp, "a-file")
        with open(blocker, "w") as f:
            f.write("x")
        r = self.ctl("metrics", self.job, "--tensorboard", os.path.join(blocker, "tb"),
                     check=False)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--tensorboard: cannot create the directory " + blocker, r.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--agent", required=True)
    ARGS, rest = parser.parse_known_args()
    ARGS.ctl = os.path.abspath(ARGS.ctl)
    ARGS.coordinator = os.path.abspath(ARGS.coordinator)
    ARGS.agent = os.path.abspath(ARGS.agent)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
