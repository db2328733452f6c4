"""A Python gRPC client (grpcio, stubs generated here by grpcio-tools from proto/) cannot call
any substrax service without credentials, and can with them: a client certificate or a bearer
token. The coordinator is the real binary over mutual TLS; `substraxctl certs` makes the CA,
the certificates and the token.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
from grpc_tools import protoc

ARGS = None


def run(*argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"{argv} exited {r.returncode}: {r.stderr}")
    return r


def generate_stubs(root, protos, out):
    """protoc with grpcio-tools' own protobuf includes; the stubs land in `out`."""
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    os.makedirs(out, exist_ok=True)
    status = protoc.main(["protoc", f"-I{root}/proto", f"-I{include}", f"--python_out={out}",
                          f"--grpc_python_out={out}", *protos])
    if status != 0:
        raise AssertionError(f"protoc failed ({status}) on {protos}")
    sys.path.insert(0, out)


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        protos = [os.path.relpath(p, os.path.join(ARGS.root, "proto")) for p in ARGS.protos]
        generate_stubs(ARGS.root, protos, os.path.join(cls.tmp, "stubs"))
        global job_service_pb2, job_service_pb2_grpc, metrics_service_pb2
        global metrics_service_pb2_grpc, coordinator_service_pb2, coordinator_service_pb2_grpc
        from substrax.v1 import job_service_pb2, job_service_pb2_grpc  # noqa: E402
        from substrax.v1 import metrics_service_pb2, metrics_service_pb2_grpc  # noqa: E402
        from substrax.v1 import coordinator_service_pb2, coordinator_service_pb2_grpc  # noqa: E402

        ca, certs = os.path.join(cls.tmp, "ca"), os.path.join(cls.tmp, "certs")
        run(ARGS.ctl, "certs", "init", "--dir", ca)
        run(ARGS.ctl, "certs", "issue", "--ca-dir", ca, "--out-dir", certs, "--name",
            "coordinator", "--role", "server", "--dns", "localhost", "--ip", "127.0.0.1")
        run(ARGS.ctl, "certs", "issue", "--ca-dir", ca, "--out-dir", certs, "--name", "pyuser",
            "--role", "viewer")
        run(ARGS.ctl, "certs", "issue", "--ca-dir", ca, "--out-dir", certs, "--name", "w-1",
            "--role", "worker")
        token = run(ARGS.ctl, "certs", "token", "--name", "pybot", "--role", "submitter")
        cls.token = token.stdout.strip()
        auth = os.path.join(cls.tmp, "auth.yaml")
        with open(auth, "w") as f:
            f.write(token.stderr[token.stderr.index("\ntokens:") + 1:])
        cls.certs = certs

        address_file = os.path.join(cls.tmp, "address")
        cls.log = open(os.path.join(cls.tmp, "coordinator.log"), "w")
        cls.coordinator = subprocess.Popen(
            [ARGS.coordinator, "--listen", "127.0.0.1:0", "--metrics-listen", "",
             "--state-dir", os.path.join(cls.tmp, "state"), "--address-file", address_file,
             "--auth-config", auth, "--tls-ca", os.path.join(certs, "ca.crt"),
             "--tls-cert", os.path.join(certs, "coordinator.crt"),
             "--tls-key", os.path.join(certs, "coordinator.key")],
            stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (os.path.exists(address_file) and open(address_file).read().strip()):
            if time.monotonic() > deadline or cls.coordinator.poll() is not None:
                raise AssertionError("the coordinator did not start: " +
                                     open(cls.log.name).read())
            time.sleep(0.05)  # polling the address file, bounded by the deadline
        cls.address = open(address_file).read().strip()

    @classmethod
    def tearDownClass(cls):
        cls.coordinator.send_signal(signal.SIGTERM)
        assert cls.coordinator.wait(timeout=30) == 0, open(cls.log.name).read()

    def read(self, name):
        with open(os.path.join(self.certs, name), "rb") as f:
            return f.read()

    def channel(self, cert=None, token=None, tls=True):
        if not tls:
            return grpc.insecure_channel(self.address)
        chain = key = None
        if cert:
            chain, key = self.read(cert + ".crt"), self.read(cert + ".key")
        creds = grpc.ssl_channel_credentials(self.read("ca.crt"), key, chain)
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(self.address, creds)

    def calls(self, channel):
        """One call of each service, as (name, thunk)."""
        jobs = job_service_pb2_grpc.JobServiceStub(channel)
        metrics = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        coordinator = coordinator_service_pb2_grpc.CoordinatorServiceStub(channel)
        return [
            ("JobService.ListJobs", lambda: jobs.ListJobs(job_service_pb2.ListJobsRequest(),
                                                          timeout=10)),
            ("JobService.ListWorkers",
             lambda: jobs.ListWorkers(job_service_pb2.ListWorkersRequest(), timeout=10)),
            ("MetricsService.QueryMetrics",
             lambda: metrics.QueryMetrics(metrics_service_pb2.QueryMetricsRequest(job_id="x"),
                                          timeout=10)),
            ("CoordinatorService.Heartbeat",
             lambda: coordinator.Heartbeat(
                 coordinator_service_pb2.HeartbeatRequest(worker_id="w-1"), timeout=10)),
        ]

    def assert_refused(self, channel, code):
        for name, call in self.calls(channel):
            with self.subTest(call=name):
                with self.assertRaises(grpc.RpcError) as refused:
                    call()
                self.assertEqual(refused.exception.code(), code, refused.exception.details())

    def test_plaintext_is_refused(self):
        self.assert_refused(self.channel(tls=False), grpc.StatusCode.UNAVAILABLE)

    def test_tls_without_credentials_is_refused(self):
        self.assert_refused(self.channel(), grpc.StatusCode.UNAUTHENTICATED)

    def test_an_unknown_token_is_refused(self):
        self.assert_refused(self.channel(token="not-a-token"), grpc.StatusCode.UNAUTHENTICATED)

    def test_a_client_certificate_is_served(self):
        ch = self.channel(cert="pyuser")
        jobs = job_service_pb2_grpc.JobServiceStub(ch)
        self.assertEqual(list(jobs.ListJobs(job_service_pb2.ListJobsRequest(), timeout=10).jobs),
                         [])
        self.assertEqual(
            len(jobs.ListWorkers(job_service_pb2.ListWorkersRequest(), timeout=10).workers), 0)
        # A viewer, not a worker.
        with self.assertRaises(grpc.RpcError) as refused:
            coordinator_service_pb2_grpc.CoordinatorServiceStub(ch).Heartbeat(
                coordinator_service_pb2.HeartbeatRequest(worker_id="w-1"), timeout=10)
        self.assertEqual(refused.exception.code(), grpc.StatusCode.PERMISSION_DENIED)

    def test_a_token_is_served(self):
        jobs = job_service_pb2_grpc.JobServiceStub(self.channel(token=self.token))
        self.assertIsNotNone(jobs.ListJobs(job_service_pb2.ListJobsRequest(), timeout=10))

    def test_a_worker_certificate_is_served_as_that_worker(self):
        coordinator = coordinator_service_pb2_grpc.CoordinatorServiceStub(
            self.channel(cert="w-1"))
        # Known identity and role; the worker has not registered, so the lease says so.
        with self.assertRaises(grpc.RpcError) as unknown:
            coordinator.Heartbeat(coordinator_service_pb2.HeartbeatRequest(worker_id="w-1"),
                                  timeout=10)
        self.assertNotIn(unknown.exception.code(),
                         (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED),
                         unknown.exception.details())
        with self.assertRaises(grpc.RpcError) as posing:
            coordinator.Heartbeat(coordinator_service_pb2.HeartbeatRequest(worker_id="w-2"),
                                  timeout=10)
        self.assertEqual(posing.exception.code(), grpc.StatusCode.PERMISSION_DENIED)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("protos", nargs="+")
    ARGS, rest = parser.parse_known_args()
    ARGS.coordinator = os.path.abspath(ARGS.coordinator)
    ARGS.ctl = os.path.abspath(ARGS.ctl)
    ARGS.protos = [os.path.abspath(p) for p in ARGS.protos]
    ARGS.root = os.path.abspath(ARGS.root)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
