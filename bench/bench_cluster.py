"""A local substrax cluster for the Python benchmarks (bench/command_relaunch.py,
bench/python_overhead.py): a coordinator and 2 agents x 2 CPU devices from a -c opt build,
plaintext, started and stopped by the benchmark itself, and substraxctl against it."""
import json
import os
import signal
import subprocess
import time


def wait_for(condition, timeout, what):
    """condition()'s first true value, polled every 50 ms; exits naming `what` at the deadline."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"bench: timed out after {timeout}s waiting for {what}")


def stop(processes):
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def binaries(bin_dir):
    return {"coordinator": f"{bin_dir}/coordinator/substrax-coordinator",
            "agent": f"{bin_dir}/agent/substrax-agent",
            "job": f"{bin_dir}/worker/substrax-job",
            "ctl": f"{bin_dir}/client/substraxctl"}


class Cluster:
    """`with Cluster(bins, work, coordinator_flags, agent_flags) as c:` c.ctl(...), c.run_job(spec)."""

    def __init__(self, bins, work, coordinator_flags=(), agent_flags=()):
        self.bins, self.work = bins, work
        self.coordinator_flags, self.agent_flags = list(coordinator_flags), list(agent_flags)
        self.processes = []

    def __enter__(self):
        address_file = os.path.join(self.work, "address")
        self.log = open(os.path.join(self.work, "cluster.log"), "w")
        self.processes.append(subprocess.Popen(
            [self.bins["coordinator"], "--insecure", "--listen", "127.0.0.1:0",
             "--metrics-listen", "", "--state-dir", os.path.join(self.work, "state"),
             "--address-file", address_file] + self.coordinator_flags,
            stdout=self.log, stderr=subprocess.STDOUT))
        try:
            self.address = wait_for(
                lambda: os.path.exists(address_file) and open(address_file).read().strip(),
                30, "the coordinator's address")
            for w in (1, 2):
                self.processes.append(subprocess.Popen(
                    [self.bins["agent"], "--insecure", "--coordinator", self.address,
                     "--cpu-devices", "2", "--worker-id", f"w-{w}", "--host", f"host-{w}",
                     "--work-dir", os.path.join(self.work, f"worker-{w}"), "--job-binary",
                     self.bins["job"], "--stop-grace", "5s"] + self.agent_flags,
                    stdout=self.log, stderr=subprocess.STDOUT))
            wait_for(self._alive, 30, "2 agents to register")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        stop(self.processes[::-1])
        self.log.close()

    def ctl(self, *args):
        return subprocess.run([self.bins["ctl"], "--coordinator", self.address, "--insecure",
                               *args], capture_output=True, text=True)

    def _alive(self):
        r = self.ctl("workers", "-o", "json")
        if r.returncode != 0:
            return False
        workers = json.loads(r.stdout).get("workers", [])
        return sum(w.get("state") == "WORKER_STATE_ALIVE" for w in workers) == 2

    def submit(self, spec_text, name="job.yaml"):
        """Submits the spec; returns (job id, the time.time() just before the submit)."""
        spec = os.path.join(self.work, name)
        with open(spec, "w") as f:
            f.write(spec_text)
        submitted = time.time()
        r = self.ctl("submit", spec)
        if r.returncode != 0:
            raise SystemExit(f"bench: submit failed: {r.stderr}")
        return r.stdout.strip().split()[-1], submitted

    def wait_end(self, job, timeout=600):
        """The job as `get -o json` prints it, once it has ended. Waits with one `substraxctl
        watch` (a stream) rather than polling `get`: a new substraxctl every 50 ms costs about a
        quarter of a core on 2 cores, taken from the job being measured."""
        try:
            subprocess.run([self.bins["ctl"], "--coordinator", self.address, "--insecure",
                            "watch", job, "-o", "json"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"bench: timed out after {timeout}s waiting for job {job} to end")
        r = self.ctl("get", job, "-o", "json")
        got = json.loads(r.stdout) if r.stdout else {}
        if got.get("state") not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                    "JOB_STATE_CANCELLED"):
            raise SystemExit(f"bench: `watch {job}` ended with the job {got.get('state')}: "
                             f"{r.stderr.strip()}")
        return got
