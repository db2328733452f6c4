"""Offline checks of the Kubernetes manifests (deploy/k8s) and the Dockerfiles (deploy/docker).

Renders every overlay with `kubectl kustomize`, validates each object against the Kubernetes
API schema of its kind (kubernetes-validate, strict: unknown fields are errors), and asserts
the properties the deployment promises: Pod Security "restricted" on every container, gRPC
probes on the --health-listen port (worker readiness on substrax.worker.ready, liveness on
nothing but the process), a headless worker Service publishing not-ready addresses, tagged
images, no placeholders, options ConfigMap keys that are flag names, and that every binary
and flag the manifests and Dockerfiles name exists in the binaries' --help.

Run by //tests/k8s:render_test (render_test.sh picks the interpreter of tools/install_deps.sh's
virtual environment). Arguments: --coordinator, --worker, --ctl: the binaries; --root: the
directory holding deploy/ and tools/install_deps.sh.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import kubernetes_validate
import kubernetes_validate.version
import yaml

# Native grpc probes are GA from 1.27; the validator's newest schemas of this pin.
K8S_VERSION = "1.31.0"
OVERLAYS = ("cpu", "gpu")
# Strings that mean "a user must edit this" (the rendered output and every deploy/ file).
PLACEHOLDERS = re.compile(r"CHANGEME|CHANGE_ME|TODO|FIXME|XXX|REPLACE_?ME|<your|your-registry|"
                          r"example\.com|\bTBD\b", re.IGNORECASE)
# The daemons stop a runner with SIGTERM and SIGKILL it 10 s later (WorkerDaemonOptions).
STOP_GRACE_S = 10
POD_KINDS = ("StatefulSet", "DaemonSet", "Deployment", "Job")
# Which Dockerfile builds which image (the name in base/, before `images:` renames it).
DOCKERFILE_OF_IMAGE = {
    "substrax/coordinator": "Dockerfile.coordinator",
    "substrax/worker-cpu": "Dockerfile.worker-cpu",
    "substrax/worker-cuda": "Dockerfile.worker-cuda",
}

ARGS = None


def Fail(errors):
    if errors:
        raise AssertionError("\n  " + "\n  ".join(errors))


def Flags(tokens):
    """The --flags among command-line tokens (--name=value or --name value)."""
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


class Binaries:
    """The binaries' --help, read once: binary name -> (subcommand or None) -> set of flags."""

    def __init__(self, coordinator, worker, ctl):
        self.paths = {
            "substrax-coordinator": coordinator,
            "substrax-worker": worker,
            "substraxctl": ctl,
        }
        self.cache = {}

    def HelpFlags(self, binary, subcommand=None):
        key = (binary, subcommand)
        if key not in self.cache:
            cmd = [self.paths[binary]] + ([subcommand] if subcommand else []) + ["--help"]
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, check=False)
            if out.returncode != 0:
                raise AssertionError("%s exited %d:\n%s" % (" ".join(cmd), out.returncode,
                                                            out.stdout))
            self.cache[key] = set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout))
        return self.cache[key]

    def Check(self, where, command, args):
        """Errors for a command line: the binary must be one of ours, each flag in its --help."""
        if not command:
            return ["%s: no command" % where]
        binary = os.path.basename(command[0])
        if binary not in self.paths:
            return ["%s: %s is not a substrax binary (%s)" % (where, command[0],
                                                              ", ".join(self.paths))]
        rest = list(command[1:]) + list(args)
        subcommand = None
        if binary == "substrax-worker":
            if not rest or rest[0] not in ("daemon", "run", "train"):
                return ["%s: substrax-worker needs a mode (daemon, run, train), got %s" %
                        (where, rest[:1])]
            subcommand, rest = rest[0], rest[1:]
        known = self.HelpFlags(binary, subcommand)
        name = binary + (" " + subcommand if subcommand else "")
        return ["%s: %s has no flag %s (not in its --help)" % (where, name, f)
                for f in Flags(rest) if f not in known]


def Render(overlay):
    """The objects `kubectl kustomize` makes of an overlay (a copy of deploy/k8s, so that
    kustomize sees plain files rather than Bazel's runfiles links)."""
    tmp = tempfile.mkdtemp(prefix="k8s-render-")
    try:
        shutil.copytree(os.path.join(ARGS.root, "deploy", "k8s"), os.path.join(tmp, "k8s"),
                        symlinks=False)
        out = subprocess.run([ARGS.kubectl, "kustomize", os.path.join(tmp, "k8s", "overlays",
                                                                      overlay)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             check=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if out.returncode != 0:
        raise AssertionError("kubectl kustomize overlays/%s failed:\n%s" % (overlay, out.stderr))
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def PodTemplates(objects):
    for obj in objects:
        if obj["kind"] in POD_KINDS:
            yield obj, obj["spec"]["template"]["spec"]


def Name(obj):
    return "%s/%s" % (obj["kind"], obj["metadata"]["name"])


def HealthPort(container):
    """The port of --health-listen=HOST:PORT in a container's args, or None."""
    for token in container.get("args", []):
        if token.startswith("--health-listen="):
            return int(token.rsplit(":", 1)[1])
    return None


class RenderedOverlayTest(unittest.TestCase):
    rendered = {}

    @classmethod
    def setUpClass(cls):
        cls.binaries = Binaries(ARGS.coordinator, ARGS.worker, ARGS.ctl)
        for overlay in OVERLAYS:
            cls.rendered[overlay] = Render(overlay)

    def Each(self):
        for overlay in OVERLAYS:
            yield overlay, self.rendered[overlay][1]

    def testEveryObjectMatchesTheApiSchema(self):
        errors = []
        for overlay, objects in self.Each():
            for obj in objects:
                try:
                    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
                except kubernetes_validate.ValidationError as e:
                    errors.append("%s: %s: %s at %s" % (overlay, Name(obj), e.message,
                                                        "/".join(map(str, e.path))))
                except kubernetes_validate.SchemaNotFoundError as e:
                    errors.append("%s: %s: no schema (%s)" % (overlay, Name(obj), e))
        Fail(errors)

    def testExpectedObjects(self):
        for overlay, objects in self.Each():
            kinds = sorted(Name(o) for o in objects
                           if not (o["kind"] == "ConfigMap" or o["kind"] == "Namespace"))
            self.assertEqual(kinds, [
                "DaemonSet/substrax-worker",
                "NetworkPolicy/substrax-coordinator",
                "NetworkPolicy/substrax-worker",
                "Service/substrax-coordinator",
                "Service/substrax-coordinator-metrics",
                "Service/substrax-worker",
                "StatefulSet/substrax-coordinator",
            ], overlay)

    def testOneNamespace(self):
        for overlay, objects in self.Each():
            spaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
            self.assertEqual(len(spaces), 1, "%s: objects in namespaces %s" % (overlay, spaces))
            declared = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]
            self.assertEqual(declared, list(spaces),
                             "%s: overlays/%s/namespace.yaml must name the namespace of "
                             "kustomization.yaml" % (overlay, overlay))

    def testRestrictedSecurityContext(self):
        errors = []
        for overlay, objects in self.Each():
            for obj, pod in PodTemplates(objects):
                where = "%s: %s" % (overlay, Name(obj))
                psc = pod.get("securityContext", {})
                if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
                    errors.append("%s: host namespaces" % where)
                for c in pod.get("initContainers", []) + pod["containers"]:
                    sc = c.get("securityContext", {})
                    w = "%s container %s" % (where, c["name"])
                    if sc.get("allowPrivilegeEscalation") is not False:
                        errors.append("%s: allowPrivilegeEscalation must be false" % w)
                    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                        errors.append("%s: capabilities must drop ALL" % w)
                    if sc.get("capabilities", {}).get("add"):
                        errors.append("%s: adds capabilities" % w)
                    if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
                        errors.append("%s: runAsNonRoot must be true" % w)
                    if sc.get("runAsUser", psc.get("runAsUser")) in (None, 0):
                        errors.append("%s: runAsUser must be a non-zero uid" % w)
                    seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
                    if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
                        errors.append("%s: seccompProfile must be RuntimeDefault" % w)
                    if sc.get("privileged"):
                        errors.append("%s: privileged" % w)
                    if sc.get("readOnlyRootFilesystem") is not True:
                        errors.append("%s: readOnlyRootFilesystem must be true" % w)
        Fail(errors)

    def testResourcesAndGrace(self):
        errors = []
        for overlay, objects in self.Each():
            for obj, pod in PodTemplates(objects):
                where = "%s: %s" % (overlay, Name(obj))
                if pod.get("terminationGracePeriodSeconds", 30) < STOP_GRACE_S + 5:
                    errors.append("%s: terminationGracePeriodSeconds must cover the %d s stop "
                                  "grace" % (where, STOP_GRACE_S))
                if pod.get("automountServiceAccountToken") is not False:
                    errors.append("%s: automountServiceAccountToken must be false" % where)
                for c in pod["containers"]:
                    r = c.get("resources", {})
                    for part in ("requests", "limits"):
                        for res in ("cpu", "memory"):
                            if res not in r.get(part, {}):
                                errors.append("%s container %s: no %s.%s" % (where, c["name"],
                                                                             part, res))
        Fail(errors)

    def testGrpcProbesOnTheHealthPort(self):
        errors = []
        for overlay, objects in self.Each():
            for obj, pod in PodTemplates(objects):
                for c in pod["containers"]:
                    w = "%s: %s container %s" % (overlay, Name(obj), c["name"])
                    port = HealthPort(c)
                    if port is None:
                        errors.append("%s: no --health-listen=HOST:PORT" % w)
                        continue
                    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                        probe = c.get(kind)
                        if not probe or "grpc" not in probe:
                            errors.append("%s: %s must be a grpc probe" % (w, kind))
                            continue
                        if probe["grpc"].get("port") != port:
                            errors.append("%s: %s on port %s, --health-listen on %d" %
                                          (w, kind, probe["grpc"].get("port"), port))
                        service = probe["grpc"].get("service", "")
                        want = ("substrax.worker.ready"
                                if kind == "readinessProbe" and obj["kind"] == "DaemonSet"
                                else "")
                        if service != want:
                            errors.append("%s: %s asks service %r, should ask %r%s" % (
                                w, kind, service, want,
                                " (liveness must not depend on the coordinator or peers)"
                                if kind != "readinessProbe" else ""))
        Fail(errors)

    def testWorkerHeadlessServicePublishesNotReady(self):
        for overlay, objects in self.Each():
            svc = [o for o in objects if Name(o) == "Service/substrax-worker"][0]
            self.assertEqual(svc["spec"].get("clusterIP"), "None", overlay)
            self.assertIs(svc["spec"].get("publishNotReadyAddresses"), True, overlay)

    def testWorkerUsesTheDownwardApi(self):
        for overlay, objects in self.Each():
            ds = [o for o in objects if o["kind"] == "DaemonSet"][0]
            c = ds["spec"]["template"]["spec"]["containers"][0]
            args = c["args"]
            for want in ("--worker-id=$(NODE_NAME)", "--host=$(NODE_NAME)",
                         "--listen-host=$(POD_IP)"):
                self.assertIn(want, args, overlay)
            env = {e["name"]: e for e in c["env"]}
            self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
                             "spec.nodeName")
            self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
            self.assertTrue(ds["spec"]["template"]["spec"].get("nodeSelector"),
                            "%s: the worker pool needs a nodeSelector" % overlay)

    def testGpuOverlay(self):
        objects = self.rendered["gpu"][1]
        pod = [o for o in objects if o["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
        c = pod["containers"][0]
        self.assertIn("nvidia.com/gpu", c["resources"]["limits"])
        self.assertIn("cuda", c["image"])
        self.assertTrue(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])))
        self.assertNotIn("--cpu-devices", " ".join(c["args"]))
        cm = [o for o in objects if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("substrax-worker-options")][0]
        self.assertEqual(cm["data"]["devices"], "cuda")
        self.assertIn("--devices=$(DEVICES)", c["args"])
        cpu = [o for o in self.rendered["cpu"][1] if o["kind"] == "DaemonSet"][0]
        self.assertNotIn("nvidia.com/gpu",
                         cpu["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"])

    def testCoordinatorStateAndScraping(self):
        for overlay, objects in self.Each():
            sts = [o for o in objects if o["kind"] == "StatefulSet"][0]
            self.assertEqual(sts["spec"]["replicas"], 1)
            c = sts["spec"]["template"]["spec"]["containers"][0]
            claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
            state = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--state-dir=")]
            self.assertEqual(len(state), 1)
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            self.assertIn(mounts.get(state[0]), claims,
                          "%s: --state-dir must be on the PersistentVolumeClaim" % overlay)
            ann = sts["spec"]["template"]["metadata"]["annotations"]
            metrics = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--metrics-listen=")]
            self.assertEqual(ann["prometheus.io/scrape"], "true")
            self.assertEqual(ann["prometheus.io/port"], metrics[0].rsplit(":", 1)[1])

    def testNetworkPolicyAdmitsWorkersToEachOther(self):
        for overlay, objects in self.Each():
            np = [o for o in objects if Name(o) == "NetworkPolicy/substrax-worker"][0]
            peer_rules = [r for r in np["spec"]["ingress"] if r.get("from")]
            self.assertTrue(peer_rules, overlay)
            for rule in peer_rules:
                for port in rule.get("ports", []):
                    self.assertNotIn("port", port,
                                     "%s: Gloo ports are ephemeral: admit every TCP port between "
                                     "workers" % overlay)

    def testImagesAreTaggedAndBuiltByADockerfile(self):
        errors = []
        for overlay, objects in self.Each():
            for obj, pod in PodTemplates(objects):
                for c in pod["containers"]:
                    image = c["image"]
                    last = image.rsplit("/", 1)[-1]
                    if ":" not in last and "@" not in image:
                        errors.append("%s: %s: image %s has no tag" % (overlay, Name(obj), image))
                    elif last.endswith(":latest"):
                        errors.append("%s: %s: image %s: pin a tag, not latest" %
                                      (overlay, Name(obj), image))
        Fail(errors)

    def testNoPlaceholders(self):
        errors = []
        for overlay in OVERLAYS:
            for n, line in enumerate(self.rendered[overlay][0].splitlines(), 1):
                if PLACEHOLDERS.search(line):
                    errors.append("rendered %s line %d: %s" % (overlay, n, line.strip()))
        for top, _, files in os.walk(os.path.join(ARGS.root, "deploy")):
            for f in files:
                path = os.path.join(top, f)
                with open(path, encoding="utf-8") as fh:
                    for n, line in enumerate(fh, 1):
                        if PLACEHOLDERS.search(line):
                            errors.append("%s:%d: %s" % (os.path.relpath(path, ARGS.root), n,
                                                         line.strip()))
        Fail(errors)

    def testOptionsAreFlagsPassedThroughEnv(self):
        """Each options ConfigMap key is a flag name, reaches `--key=$(ENV)` through an env
        var of that key, and every $(VAR) in args is defined."""
        errors = []
        for overlay, objects in self.Each():
            maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
            used = set()
            for obj, pod in PodTemplates(objects):
                for c in pod["containers"]:
                    w = "%s: %s container %s" % (overlay, Name(obj), c["name"])
                    env = {e["name"]: e for e in c.get("env", [])}
                    for token in c.get("args", []):
                        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", token):
                            if var not in env:
                                errors.append("%s: %s uses $(%s), which is not in env" %
                                              (w, token, var))
                    for e in env.values():
                        ref = e.get("valueFrom", {}).get("configMapKeyRef")
                        if not ref:
                            continue
                        used.add((ref["name"], ref["key"]))
                        if ref["name"] not in maps or ref["key"] not in maps[ref["name"]]:
                            errors.append("%s: env %s: no key %s in ConfigMap %s" %
                                          (w, e["name"], ref["key"], ref["name"]))
                        want = "--%s=$(%s)" % (ref["key"], e["name"])
                        if want not in c.get("args", []):
                            errors.append("%s: option key %s should reach the command line as "
                                          "%s" % (w, ref["key"], want))
            for name, data in maps.items():
                for key in data:
                    if (name, key) not in used and not (overlay == "gpu" and key == "cpu-devices"):
                        errors.append("%s: ConfigMap %s key %s reaches no command line" %
                                      (overlay, name, key))
        Fail(errors)

    def testManifestFlagsExistInTheBinaries(self):
        errors = []
        for overlay, objects in self.Each():
            for obj, pod in PodTemplates(objects):
                for c in pod["containers"]:
                    errors += self.binaries.Check(
                        "%s: %s container %s" % (overlay, Name(obj), c["name"]),
                        c.get("command", []), c.get("args", []))
        Fail(errors)


class DockerfileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.binaries = Binaries(ARGS.coordinator, ARGS.worker, ARGS.ctl)
        cls.files = {}
        directory = os.path.join(ARGS.root, "deploy", "docker")
        for name in DOCKERFILE_OF_IMAGE.values():
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                # Join continuation lines: one instruction per entry.
                cls.files[name] = re.sub(r"\\\n", " ", f.read())

    def Instructions(self, name, keyword):
        return [line.strip()[len(keyword):].strip() for line in self.files[name].splitlines()
                if line.strip().upper().startswith(keyword + " ")]

    def testMultiStageNonRootRuntime(self):
        for name, text in self.files.items():
            froms = self.Instructions(name, "FROM")
            self.assertGreaterEqual(len(froms), 2, name)
            self.assertIn("debian:12", " ".join(froms), name)
            self.assertEqual(self.Instructions(name, "USER")[-1], "10001:10001", name)
            self.assertIn("--uid 10001", text, name)

    def testBazelTargetsAreTheBinaries(self):
        targets = {"//coordinator:substrax-coordinator", "//worker:substrax-worker",
                   "//client:substraxctl"}
        for name, text in self.files.items():
            for label in re.findall(r"//[\w/]+:[\w.-]+", text):
                self.assertIn(label, targets, name)

    def testEntrypointsAndFlagsExist(self):
        errors = []
        for name in self.files:
            entry = yaml.safe_load(self.Instructions(name, "ENTRYPOINT")[-1])
            cmd = yaml.safe_load(self.Instructions(name, "CMD")[-1])
            copied = " ".join(self.Instructions(name, "COPY"))
            if "/usr/local/bin/" not in copied or os.path.dirname(entry[0]) != "/usr/local/bin":
                errors.append("%s: ENTRYPOINT %s is not where the binaries are copied" %
                              (name, entry[0]))
            errors += self.binaries.Check(name, entry, cmd)
        Fail(errors)

    def testCoordinatorImageHasSubstraxctl(self):
        copied = " ".join(self.Instructions("Dockerfile.coordinator", "COPY"))
        self.assertIn("substraxctl", copied)

    def testCudaWorker(self):
        text = self.files["Dockerfile.worker-cuda"]
        self.assertIn("--config=cuda", text)
        self.assertRegex(text, r"ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:\S+-runtime-")
        self.assertRegex(self.Instructions("Dockerfile.worker-cuda", "FROM")[-1],
                         r"^\$\{CUDA_RUNTIME_IMAGE\}$")

    def testManifestsRunWhatTheImagesHold(self):
        """The command of each container is a binary its image's Dockerfile installs."""
        errors = []
        for overlay in OVERLAYS:
            _, objects = RenderedOverlayTest.rendered.get(overlay) or Render(overlay)
            for obj, pod in PodTemplates(objects):
                for c in pod["containers"]:
                    repo = c["image"].rsplit(":", 1)[0]
                    dockerfile = [f for image, f in DOCKERFILE_OF_IMAGE.items()
                                  if repo.endswith(image)]
                    if not dockerfile:
                        errors.append("%s: %s: no Dockerfile builds %s" % (overlay, Name(obj),
                                                                          c["image"]))
                        continue
                    binary = os.path.basename(c["command"][0])
                    if binary not in " ".join(self.Instructions(dockerfile[0], "COPY")):
                        errors.append("%s: %s runs %s, which %s does not install" %
                                      (overlay, Name(obj), c["command"][0], dockerfile[0]))
        Fail(errors)


class InstallDepsTest(unittest.TestCase):

    def testInstallsTheTestTools(self):
        with open(os.path.join(ARGS.root, "tools", "install_deps.sh"), encoding="utf-8") as f:
            text = f.read()
        pin = "kubernetes-validate==" + kubernetes_validate.version.__version__
        for want in ("kubernetes-client", "python3-venv", pin):
            self.assertIn(want, text)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
