"""Offline checks of the Kubernetes manifests (deploy/k8s) and the Dockerfiles (deploy/docker).

Renders every overlay with `kubectl kustomize`, validates each object against the Kubernetes
API schema of its kind (kubernetes-validate, strict: unknown fields are errors), and asserts
the properties the deployment promises: Pod Security "restricted" on every container, gRPC
probes on the --health-listen port (worker readiness on substrax.worker.ready, liveness on
nothing but the process), a headless worker Service publishing not-ready addresses, the
workers' --checkpoint-root on a ReadWriteMany claim, tagged images, no placeholders, options
ConfigMap keys that are flag names, and that every binary and flag the manifests and
Dockerfiles name exists in the binaries' --help. overlays/programs (users' programs) is the cpu
overlay plus the worker's --programs-dir on a read-only ReadOnlyMany claim and
--program-init-timeout (testProgramsOverlay); Dockerfile.worker-programs is the worker-cpu image
plus the SDK's library and programs in that directory (testProgramsImage). overlays/python
(command jobs in Python) is the cpu overlay with the Python worker image, the agent's
--python-env, --programs-dir and --job-user flags, and the one exception to "restricted": an
agent that runs as root with the five capabilities --job-user needs, in a namespace enforcing
"baseline" (testPythonOverlay); Dockerfile.worker-python installs tools/jax_requirements.txt's
pins with --no-index from a wheelhouse made in its build stage, without network
(testPythonImage) with the substrax package's wheel built there from python/, and
tools/install_deps.sh reads the same pins (testJaxPinsAreShared).

approver-policy's CertificateRequestPolicies (policy.cert-manager.io/v1alpha1) are evaluated as
approver-policy would (testApproverPolicy): every certificate the render requests is approved
for its requester, the requests an attacker would make through a pod's csi volume or a
Certificate are not, and cert-manager's Helm values turn its default approver off.

cert-manager's objects (cert-manager.io/v1 Issuer, Certificate) have no schema in
kubernetes-validate, nor anywhere else offline: they are validated against a schema if the
validator ever has one, and otherwise checked structurally here (testCertManagerObjects: kinds,
the spec fields cert-manager requires and the ones substrax relies on, issuers that exist,
usages, durations), as are the workers' csi.cert-manager.io volumes; and every Secret,
ConfigMap, claim and certificate file a pod mounts or names in a flag must be produced by the
render (testEveryMountedSourceIsRendered).

deploy/k8s/monitoring (applied beside an overlay where the Prometheus Operator runs) is rendered
too (MonitoringTest): its ConfigMap is validated against the API schema and must hold the Grafana
dashboard file as it is, labelled grafana_dashboard: "1", under a fixed name; its ServiceMonitor
(monitoring.coreos.com/v1, no schema offline either) is checked structurally: known fields, the
overlays' namespace, and an endpoint whose port is the named port, on exactly one selected
Service, that reaches the coordinator's --metrics-listen.

Run by //tests/k8s:render_test (render_test.sh picks the interpreter of tools/install_deps.sh's
virtual environment). Arguments: --coordinator, --worker, --ctl: the binaries; --root: the
directory holding deploy/ and tools/install_deps.sh.
"""

import argparse
import json
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
OVERLAYS = ("cpu", "gpu", "programs", "python")
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
    "substrax/worker-programs": "Dockerfile.worker-programs",
    "substrax/worker-python": "Dockerfile.worker-python",
}
# Dockerfiles whose runtime stage is the image of another (FROM ${ARG}, the ARG's default naming
# that image): they add files to it and keep its user, runtime packages and binaries.
DERIVED_FROM = {"Dockerfile.worker-programs": "Dockerfile.worker-cpu",
                "Dockerfile.worker-python": "Dockerfile.worker-cpu"}
# The runtime user of each image (USER): 10001, the substrax user, but for the Python worker,
# whose agent runs as root to switch its jobs to the job user (--job-user), in group 10001.
RUNTIME_USER = {"Dockerfile.worker-python": "0:10001"}
# Users' programs (docs/deploy.md#users-programs): the worker daemon's --programs-dir in
# overlays/programs and in Dockerfile.worker-programs, and the claim the overlay mounts there.
PROGRAMS_DIR = "/opt/substrax/programs"
PROGRAMS_CLAIM = "substrax-programs"
# Command jobs in Python (docs/deploy.md#python-jobs): the overlay whose worker runs its jobs as
# the job user, the flags it adds to the cpu overlay's worker, and the capabilities its agent
# needs for --job-user: agent/launch.h ResolveJobUser's four (switch users, give the job its
# attempt's directory, read what the job writes there) and CAP_KILL, without which the agent's
# supervisor cannot signal the job's processes once they are another user's.
PYTHON_OVERLAY = "python"
PYTHON_IMAGE = "Dockerfile.worker-python"
JOB_USER = "substrax-job"
PYTHON_FLAGS = ["--job-user=" + JOB_USER, "--python-env=jax=/opt/substrax/python",
                "--python-env=system=/usr", "--programs-dir=" + PROGRAMS_DIR]
JOB_USER_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "KILL", "SETGID", "SETUID"]
# Pod Security "baseline": the capabilities it admits beyond the default set's dropping.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                         "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                         "SYS_CHROOT"}
# The pins both JAX environments are installed from (tools/install_deps.sh, the Python image).
JAX_REQUIREMENTS = "tools/jax_requirements.txt"

CERT_MANAGER_API = "cert-manager.io/v1"
# cert-manager's approver-policy (CertificateRequestPolicy): which requests get signed.
APPROVER_POLICY_API = "policy.cert-manager.io/v1alpha1"
# The ServiceAccounts that make CertificateRequests: cert-manager's controller (for Certificate
# resources) and its csi-driver (for pods' csi.cert-manager.io volumes), as their charts name them.
CERT_MANAGER_SA = ("cert-manager", "cert-manager")
CSI_DRIVER_SA = ("cert-manager", "cert-manager-csi-driver")
# The Helm values cert-manager is installed with (docs/deploy.md#prerequisites).
CERT_MANAGER_VALUES = "deploy/k8s/cert-manager/cert-manager-values.yaml"
# The Prometheus Operator's API (ServiceMonitor) and the fields substrax may use of it
# (monitoring.coreos.com/v1 ServiceMonitorSpec and Endpoint), so that a misspelt one is an error.
MONITORING_API = "monitoring.coreos.com/v1"
SERVICE_MONITOR_FIELDS = {"selector", "endpoints", "namespaceSelector", "jobLabel",
                          "targetLabels", "podTargetLabels", "sampleLimit", "attachMetadata"}
ENDPOINT_FIELDS = {"port", "targetPort", "path", "scheme", "params", "interval",
                   "scrapeTimeout", "honorLabels", "honorTimestamps", "relabelings",
                   "metricRelabelings", "tlsConfig", "followRedirects"}
# deploy/k8s/monitoring: the Grafana dashboard and the label Grafana's sidecar looks for.
MONITORING = "monitoring"
DASHBOARD_FILE = "substrax-dashboard.json"
DASHBOARD_CONFIGMAP = "substrax-grafana-dashboard"
CSI_DRIVER = "csi.cert-manager.io"
# The csi-driver's volume attributes (github.com/cert-manager/csi-driver pkg/apis/v1alpha1);
# a misspelt one is silently ignored by the driver, so the test rejects any other.
CSI_ATTRIBUTES = {
    CSI_DRIVER + "/" + a for a in (
        "issuer-name", "issuer-kind", "issuer-group", "literal-subject", "common-name",
        "organizations", "organizationalunits", "countries", "provinces", "localities",
        "streetaddresses", "postalcodes", "serialnumber", "dns-names", "ip-sans", "uri-sans",
        "duration", "is-ca", "key-usages", "key-encoding", "ca-file", "certificate-file",
        "privatekey-file", "fs-group", "renew-before", "reuse-private-key", "pkcs12-enable",
        "pkcs12-filename", "pkcs12-password")
}
# cert-manager's KeyUsage values (cert-manager.io/v1).
KEY_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime",
    "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
}
# Certificate spec fields (cert-manager.io/v1), so that a misspelt one is an error.
CERTIFICATE_FIELDS = {
    "secretName", "secretTemplate", "issuerRef", "commonName", "dnsNames", "ipAddresses", "uris",
    "emailAddresses", "otherNames", "subject", "literalSubject", "duration", "renewBefore",
    "renewBeforePercentage", "usages", "isCA", "privateKey", "keystores",
    "revisionHistoryLimit", "encodeUsagesInRequest", "additionalOutputFormats",
    "nameConstraints",
}
ISSUER_TYPES = {"selfSigned", "ca", "acme", "vault", "venafi"}
# The roles a client certificate's O may carry (docs/deploy.md#users).
ROLES = {"substrax:admin", "substrax:submitter", "substrax:viewer", "substrax:worker"}
# The files a cert-manager Certificate's Secret holds.
CERTIFICATE_SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}
# Flags that name a file the pod must have.
FILE_FLAGS = ("--tls-cert", "--tls-key", "--tls-ca", "--auth-config")

ARGS = None


def Fail(errors):
    if errors:
        raise AssertionError("\n  " + "\n  ".join(errors))


def Flags(tokens):
    """The --flags among command-line tokens (--name=value or --name value)."""
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


class Binaries:
    """The binaries' --help, read once: binary name -> (subcommand or None) -> set of flags."""

    def __init__(self, coordinator, agent, job, ctl):
        self.paths = {
            "substrax-coordinator": coordinator,
            "substrax-agent": agent,
            "substrax-job": job,
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
        if binary == "substrax-job":
            if not rest or rest[0] not in ("run", "train", "export-checkpoint"):
                return ["%s: substrax-job needs a mode (run, train, export-checkpoint), got %s" %
                        (where, rest[:1])]
            subcommand, rest = rest[0], rest[1:]
        known = self.HelpFlags(binary, subcommand)
        name = binary + (" " + subcommand if subcommand else "")
        missing = [f for f in Flags(rest) if f not in known]
        return ["%s: %s has no flag %s (not in its --help)" % (where, name, f)
                for f in missing]


def Render(overlay):
    """The objects `kubectl kustomize` makes of an overlay (a copy of deploy/k8s, so that
    kustomize sees plain files rather than Bazel's runfiles links); MONITORING renders
    deploy/k8s/monitoring."""
    tmp = tempfile.mkdtemp(prefix="k8s-render-")
    try:
        shutil.copytree(os.path.join(ARGS.root, "deploy", "k8s"), os.path.join(tmp, "k8s"),
                        symlinks=False)
        where = [MONITORING] if overlay == MONITORING else ["overlays", overlay]
        out = subprocess.run([ARGS.kubectl, "kustomize", os.path.join(tmp, "k8s", *where)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             check=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if out.returncode != 0:
        raise AssertionError("kubectl kustomize overlays/%s failed:\n%s" % (overlay, out.stderr))
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def Wildcard(pattern, value):
    """approver-policy's wildcard match: '*' stands for any run of characters."""
    return re.fullmatch(".*".join(map(re.escape, str(pattern).split("*"))), str(value)) is not None


# The allowed.* fields this test evaluates; any other is an error (a policy it cannot judge).
POLICY_ALLOWED_FIELDS = {"commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses",
                         "isCA", "usages", "subject"}
POLICY_SUBJECT_FIELDS = {"organizations"}


def PolicyPermits(policy, request):
    """Whether approver-policy's `allowed` of `policy` permits `request` (a dict: commonName,
    organizations, dnsNames, ipAddresses, usages, isCA, duration in seconds): each value the
    request carries must match an allowed one, every required field must be present, and what
    the policy leaves out must be empty. Returns (permitted, why not)."""
    spec = policy.get("spec") or {}
    allowed = spec.get("allowed") or {}
    for field, values in (("dnsNames", request.get("dnsNames", [])),
                          ("ipAddresses", request.get("ipAddresses", [])),
                          ("organizations", request.get("organizations", []))):
        rule = ((allowed.get("subject") or {}) if field == "organizations" else allowed).get(field)
        if rule is None:
            if values:
                return False, "%s %s not allowed" % (field, values)
            continue
        if rule.get("required") and not values:
            return False, "%s required" % field
        for v in values:
            if not any(Wildcard(p, v) for p in rule.get("values") or []):
                return False, "%s %r not allowed" % (field, v)
    cn = request.get("commonName", "")
    rule = allowed.get("commonName")
    if rule is None:
        if cn:
            return False, "commonName %r not allowed" % cn
    elif (rule.get("required") and not cn) or (cn and not Wildcard(rule.get("value", ""), cn)):
        return False, "commonName %r not allowed" % cn
    if request.get("isCA") and allowed.get("isCA") is not True:
        return False, "isCA not allowed"
    for u in request.get("usages", []):
        if u not in (allowed.get("usages") or []):
            return False, "usage %r not allowed" % u
    most = ParseDuration(((spec.get("constraints") or {}).get("maxDuration")) or "")
    if most is not None and request.get("duration", 0) > most:
        return False, "duration over %s" % spec["constraints"]["maxDuration"]
    return True, ""


def Approves(objects, requester, issuer, request):
    """Whether approver-policy approves `request` against Issuer `issuer`, made by ServiceAccount
    `requester` ((namespace, name)) in the render's namespace: a policy counts when it selects
    the issuer and a RoleBinding lets the requester `use` it; approved when one of those permits
    it. Returns (approved, the reasons each counted policy gave)."""
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Role"}
    usable = set()
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        if not any(s.get("kind") == "ServiceAccount" and (s.get("namespace"), s.get("name")) ==
                   requester for s in binding.get("subjects", [])):
            continue
        role = roles.get(binding["roleRef"]["name"]) or {}
        for rule in role.get("rules", []):
            if ("policy.cert-manager.io" in rule.get("apiGroups", []) and
                    "certificaterequestpolicies" in rule.get("resources", []) and
                    "use" in rule.get("verbs", [])):
                usable.update(rule.get("resourceNames", []))
    reasons = []
    for policy in (o for o in objects if o["kind"] == "CertificateRequestPolicy"):
        ref = (policy.get("spec") or {}).get("selector", {}).get("issuerRef") or {}
        if policy["metadata"]["name"] not in usable or not Wildcard(ref.get("name", "*"), issuer):
            continue
        permitted, why = PolicyPermits(policy, request)
        if permitted:
            return True, []
        reasons.append("%s: %s" % (policy["metadata"]["name"], why))
    return False, reasons or ["no policy selects it for this requester"]


def CertificateRequestOf(cert):
    """What a Certificate's CertificateRequest asks for, as PolicyPermits reads it."""
    spec = cert["spec"]
    return {"commonName": spec.get("commonName", ""),
            "organizations": (spec.get("subject") or {}).get("organizations", []),
            "dnsNames": spec.get("dnsNames", []), "ipAddresses": spec.get("ipAddresses", []),
            "usages": spec.get("usages", []), "isCA": bool(spec.get("isCA")),
            "duration": ParseDuration(spec.get("duration", "2160h")) or 0}


def Requirements(path):
    """The requirements of a pip requirements file as pip reads them: a `#` at the start of a
    line or after whitespace begins a comment, blank lines are skipped."""
    with open(path, encoding="utf-8") as f:
        lines = [re.sub(r"(^|\s)#.*$", "", line).strip() for line in f]
    return [line for line in lines if line]


def JobUserOfImage():
    """(name, uid, gid) of the user Dockerfile.worker-python makes for the jobs (useradd)."""
    with open(os.path.join(ARGS.root, "deploy", "docker", PYTHON_IMAGE), encoding="utf-8") as f:
        text = re.sub(r"\\\n", " ", f.read())
    found = re.findall(r"useradd --uid (\d+) --gid (\d+) [^&]*?([\w-]+)\s*(?:&&|$)", text,
                       re.MULTILINE)
    if len(found) != 1:
        raise AssertionError("%s: want one `useradd --uid N --gid N ... NAME`, got %s" %
                             (PYTHON_IMAGE, found))
    uid, gid, name = found[0]
    return name, int(uid), int(gid)


def PodTemplates(objects):
    for obj in objects:
        if obj["kind"] in POD_KINDS:
            yield obj, obj["spec"]["template"]["spec"]


def Name(obj):
    return "%s/%s" % (obj["kind"], obj["metadata"]["name"])


def ParseDuration(text):
    """Seconds in a Go duration as cert-manager writes them ("2160h", "1h30m", "90s")."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", str(text))
    if not text or not m:
        return None
    h, mi, se = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + se


def FlagValues(container, flag):
    return [t.split("=", 1)[1] for t in container.get("args", []) if t.startswith(flag + "=")]


def ListenPort(container, flag):
    values = FlagValues(container, flag)
    return int(values[0].rsplit(":", 1)[1]) if len(values) == 1 else None


def Selects(match_labels, labels):
    return all(labels.get(k) == v for k, v in (match_labels or {}).items())


def HealthPort(container):
    """The port of --health-listen=HOST:PORT in a container's args, or None."""
    for token in container.get("args", []):
        if token.startswith("--health-listen="):
            return int(token.rsplit(":", 1)[1])
    return None


def ValidateSchemas(renders, structural_apis, structural_test):
    """Errors of each object of each (where, objects) render against the API schema of its kind
    (strict). Objects of the `structural_apis` may have no schema offline (CRDs): then
    `structural_test` checks them, and this says so on stderr."""
    errors = []
    structural = set()
    for where, obj in ((w, o) for w, objects in renders for o in objects):
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append("%s: %s: %s at %s" % (where, Name(obj), e.message,
                                                "/".join(map(str, e.path))))
        except kubernetes_validate.SchemaNotFoundError as e:
            if obj.get("apiVersion") in structural_apis:
                structural.add("%s %s" % (obj["apiVersion"], obj["kind"]))
            else:
                errors.append("%s: %s: no schema (%s)" % (where, Name(obj), e))
    if structural:
        print("\nrender_test: kubernetes-validate %s has no schema for %s: checked "
              "structurally instead (%s)" % (kubernetes_validate.version.__version__,
                                             ", ".join(sorted(structural)), structural_test),
              file=sys.stderr)
    return errors


class RenderedOverlayTest(unittest.TestCase):
    rendered = {}

    @classmethod
    def setUpClass(cls):
        cls.binaries = Binaries(ARGS.coordinator, ARGS.agent, ARGS.job, ARGS.ctl)
        for overlay in OVERLAYS:
            cls.rendered[overlay] = Render(overlay)

    def Each(self):
        for overlay in OVERLAYS:
            yield overlay, self.rendered[overlay][1]

    def testEveryObjectMatchesTheApiSchema(self):
        Fail(ValidateSchemas(self.Each(), (CERT_MANAGER_API, APPROVER_POLICY_API),
                             "testCertManagerObjects, testApproverPolicy"))

    def testExpectedObjects(self):
        for overlay, objects in self.Each():
            kinds = sorted(Name(o) for o in objects
                           if o["kind"] not in ("ConfigMap", "Secret", "Namespace"))
            self.assertEqual(kinds, sorted([
                "CertificateRequestPolicy/substrax-admin",
                "CertificateRequestPolicy/substrax-ca",
                "CertificateRequestPolicy/substrax-coordinator",
                "CertificateRequestPolicy/substrax-worker",
                "Role/substrax-certificate-policies",
                "Role/substrax-worker-certificate-policy",
                "RoleBinding/substrax-certificate-policies",
                "RoleBinding/substrax-worker-certificate-policy",
                "Certificate/substrax-admin",
                "Certificate/substrax-ca",
                "Certificate/substrax-coordinator",
                "DaemonSet/substrax-worker",
                "Issuer/substrax-ca",
                "Issuer/substrax-selfsigned",
                "NetworkPolicy/substrax-coordinator",
                "NetworkPolicy/substrax-worker",
                "PersistentVolumeClaim/substrax-checkpoints",
                "Service/substrax-coordinator",
                "Service/substrax-coordinator-metrics",
                "Service/substrax-coordinator-workers",
                "Service/substrax-worker",
                "StatefulSet/substrax-coordinator",
            ] + (["PersistentVolumeClaim/" + PROGRAMS_CLAIM] if overlay == "programs" else [])),
                overlay)
            secrets = sorted(re.sub(r"-[a-z0-9]{10}$", "", o["metadata"]["name"])
                             for o in objects if o["kind"] == "Secret")
            self.assertEqual(secrets, ["substrax-auth"], overlay)

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
                if overlay == PYTHON_OVERLAY and obj["kind"] == "DaemonSet":
                    continue  # root with five capabilities: testPythonOverlay
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
            # The worker id is the pod's name: the CN of the pod's csi certificate, which the
            # coordinator requires it to register as (testCertManagerObjects).
            for want in ("--worker-id=$(POD_NAME)", "--host=$(NODE_NAME)",
                         "--listen-host=$(POD_IP)"):
                self.assertIn(want, args, overlay)
            env = {e["name"]: e for e in c["env"]}
            self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
                             "metadata.name")
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

    def testProgramsOverlay(self):
        """overlays/programs is the cpu overlay plus what program jobs need: the worker daemon's
        --programs-dir=/opt/substrax/programs (after the cpu overlay's args, which it keeps),
        that directory the whole, read-only mount of a read-only ReadOnlyMany claim (workers on
        every node see the same programs and cannot change them), --program-init-timeout from
        the worker options; the cpu and gpu overlays run no programs."""
        objects = self.rendered["programs"][1]
        ds = [o for o in objects if o["kind"] == "DaemonSet"][0]
        pod = ds["spec"]["template"]["spec"]
        c = pod["containers"][0]
        cpu = [o for o in self.rendered["cpu"][1] if o["kind"] == "DaemonSet"][0]
        cpu_c = cpu["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["args"], cpu_c["args"] + [
            "--programs-dir=" + PROGRAMS_DIR, "--program-init-timeout=$(PROGRAM_INIT_TIMEOUT)"])
        self.assertEqual(c["image"], cpu_c["image"],
                         "the program image is the overlay's commented alternative")
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["PROGRAM_INIT_TIMEOUT"]["valueFrom"]["configMapKeyRef"]["key"],
                         "program-init-timeout")
        cm = [o for o in objects if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].startswith("substrax-worker-options")][0]
        self.assertIn("program-init-timeout", cm["data"])
        mounts = [m for m in c["volumeMounts"] if m["mountPath"].rstrip("/") == PROGRAMS_DIR]
        self.assertEqual(len(mounts), 1, "one volume mounted at --programs-dir=%s" % PROGRAMS_DIR)
        self.assertIs(mounts[0].get("readOnly"), True, "mount the programs read-only")
        self.assertNotIn("subPath", mounts[0])
        volume = [v for v in pod["volumes"] if v["name"] == mounts[0]["name"]][0]
        self.assertEqual(volume.get("persistentVolumeClaim"),
                         {"claimName": PROGRAMS_CLAIM, "readOnly": True})
        claim = [o for o in objects if Name(o) == "PersistentVolumeClaim/" + PROGRAMS_CLAIM][0]
        self.assertEqual(claim["spec"]["accessModes"], ["ReadOnlyMany"])
        # Nothing of the cpu overlay's worker is lost: its mounts and volumes are all there.
        self.assertEqual([m for m in c["volumeMounts"] if m is not mounts[0]],
                         cpu_c["volumeMounts"])
        self.assertEqual([v for v in pod["volumes"] if v is not volume],
                         cpu["spec"]["template"]["spec"]["volumes"])
        for overlay in ("cpu", "gpu"):
            other = [o for o in self.rendered[overlay][1] if o["kind"] == "DaemonSet"][0]
            self.assertFalse(
                [t for t in other["spec"]["template"]["spec"]["containers"][0]["args"]
                 if t.startswith("--program")],
                "%s: programs are overlays/programs' (opt-in)" % overlay)

    def testTheQueuesFileIsAConfigMapUpdatedInPlace(self):
        """The coordinator reads --queues from a whole-directory mount of the ConfigMap
        substrax-queues, whose name carries no hash (an update reaches the running coordinator,
        which rereads the file; a generated name would roll the pod instead), and the file names
        queues and priority classes as docs/scheduling.md describes."""
        for overlay, objects in self.Each():
            sts = [o for o in objects if o["kind"] == "StatefulSet"][0]
            pod = sts["spec"]["template"]["spec"]
            c = pod["containers"][0]
            self.assertIn("--queues=/etc/substrax/queues/queues.yaml", c["args"], overlay)
            mount = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/substrax/queues"]
            self.assertEqual(len(mount), 1, overlay)
            self.assertNotIn("subPath", mount[0])
            volume = [v for v in pod["volumes"] if v["name"] == mount[0]["name"]][0]
            self.assertEqual(volume["configMap"]["name"], "substrax-queues", overlay)
            cm = [o for o in objects if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "substrax-queues"]
            self.assertEqual(len(cm), 1, overlay)
            config = yaml.safe_load(cm[0]["data"]["queues.yaml"])
            self.assertTrue(config["queues"], overlay)
            classes = [k["name"] for k in config["priority_classes"]]
            self.assertIn(config["default_priority_class"], classes, overlay)

    def testNamespaceEnforcesPodSecurity(self):
        """Every overlay's namespace enforces Pod Security "restricted", which all its pods
        meet (testRestrictedSecurityContext), but overlays/python's, whose worker needs
        "baseline" (testPythonOverlay)."""
        for overlay, objects in self.Each():
            ns = [o for o in objects if o["kind"] == "Namespace"][0]
            want = "baseline" if overlay == PYTHON_OVERLAY else "restricted"
            self.assertEqual(ns["metadata"].get("labels", {}).get(
                "pod-security.kubernetes.io/enforce"), want, overlay)

    def testPythonOverlay(self):
        """overlays/python is the cpu overlay's worker with the Python worker image and its
        args plus PYTHON_FLAGS (the job user, the Python environments, the programs directory;
        never --allow-command-jobs, which would run jobs as the agent's user), all else the
        same; its agent runs as root in group 10001 (the csi key's fs-group) with exactly
        JOB_USER_CAPABILITIES, which "baseline" admits, no privilege escalation and a read-only
        root; fsGroup is the job user's group (the volumes jobs write), which is neither the
        key's group nor the agent's, and the job user is the image's."""
        objects = self.rendered[PYTHON_OVERLAY][1]
        ds = [o for o in objects if o["kind"] == "DaemonSet"][0]
        pod = ds["spec"]["template"]["spec"]
        c = pod["containers"][0]
        cpu = [o for o in self.rendered["cpu"][1] if o["kind"] == "DaemonSet"][0]
        cpu_pod = cpu["spec"]["template"]["spec"]
        cpu_c = cpu_pod["containers"][0]
        self.assertEqual(c["args"], cpu_c["args"] + PYTHON_FLAGS)
        self.assertNotIn("--allow-command-jobs", Flags(c["args"]))
        self.assertEqual(c["image"], cpu_c["image"].replace("/worker-cpu:", "/worker-python:"))
        for key in ("command", "env", "ports", "volumeMounts", "resources", "startupProbe",
                    "livenessProbe", "readinessProbe"):
            self.assertEqual(c.get(key), cpu_c.get(key), key)
        for key in ("volumes", "nodeSelector", "terminationGracePeriodSeconds",
                    "automountServiceAccountToken"):
            self.assertEqual(pod.get(key), cpu_pod.get(key), key)
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            self.assertNotIn(key, pod)
        name, uid, gid = JobUserOfImage()
        self.assertEqual(name, JOB_USER)
        self.assertNotIn(uid, (0, 10001), "the job user is neither root nor the substrax user")
        csi = [v for v in pod["volumes"] if "csi" in v][0]["csi"]["volumeAttributes"]
        key_group = int(csi[CSI_DRIVER + "/fs-group"])
        self.assertNotIn(gid, (0, key_group), "the job user's group must not read the key")
        seccomp = {"type": "RuntimeDefault"}
        self.assertEqual(pod["securityContext"], {
            "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": key_group, "fsGroup": gid,
            "seccompProfile": seccomp})
        self.assertEqual(c["securityContext"], {
            "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": key_group,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": JOB_USER_CAPABILITIES},
            "seccompProfile": seccomp})
        self.assertLessEqual(set(JOB_USER_CAPABILITIES), BASELINE_CAPABILITIES)
        # The same objects as the cpu overlay, the coordinator's pod unchanged.
        sts = [o for o in objects if o["kind"] == "StatefulSet"][0]
        cpu_sts = [o for o in self.rendered["cpu"][1] if o["kind"] == "StatefulSet"][0]
        self.assertEqual(sts["spec"]["template"]["spec"], cpu_sts["spec"]["template"]["spec"])

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

    def testCheckpointRootIsOnASharedClaim(self):
        """Every worker's --checkpoint-root is the mount, writable, of a rendered claim that
        every node can mount at once (ReadWriteMany): the processes of a job, on different
        nodes, write one checkpoint into the same directory."""
        errors = []
        for overlay, objects in self.Each():
            claims = {o["metadata"]["name"]: o for o in objects
                      if o["kind"] == "PersistentVolumeClaim"}
            ds = [o for o in objects if o["kind"] == "DaemonSet"][0]
            pod = ds["spec"]["template"]["spec"]
            c = pod["containers"][0]
            w = "%s: %s" % (overlay, Name(ds))
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            mounts = {m["mountPath"].rstrip("/"): m for m in c.get("volumeMounts", [])}
            roots = FlagValues(c, "--checkpoint-root")
            if not roots:
                errors.append("%s: no --checkpoint-root" % w)
            for root in roots:
                m = mounts.get(root.rstrip("/"))
                if m is None:
                    errors.append("%s: --checkpoint-root=%s is no volume's mountPath" % (w, root))
                    continue
                if m.get("readOnly") or m.get("subPath"):
                    errors.append("%s: --checkpoint-root=%s: mount %s writable, whole" %
                                  (w, root, m["name"]))
                claim = (volumes.get(m["name"]) or {}).get("persistentVolumeClaim")
                if claim is None:
                    errors.append("%s: --checkpoint-root=%s: volume %s is not a claim (every "
                                  "worker must see the same files)" % (w, root, m["name"]))
                    continue
                modes = (claims.get(claim.get("claimName")) or {}).get("spec", {}).get(
                    "accessModes", [])
                if "ReadWriteMany" not in modes:
                    errors.append("%s: --checkpoint-root=%s: claim %s has accessModes %s, want "
                                  "ReadWriteMany" % (w, root, claim.get("claimName"), modes))
        Fail(errors)

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

    def testNetworkPolicyAdmitsTheWorkerPortOnlyFromWorkers(self):
        """The coordinator's --worker-listen port: admitted by some rule, and every rule that
        admits it (naming it, by number or name, or no port at all) admits worker pods of the
        same namespace only: podSelector peers that select the worker pods, no
        namespaceSelector, no ipBlock, no empty `from`."""
        errors = []
        for overlay, objects in self.Each():
            sts = [o for o in objects if o["kind"] == "StatefulSet"][0]
            c = sts["spec"]["template"]["spec"]["containers"][0]
            port = ListenPort(c, "--worker-listen")
            if port is None:
                errors.append("%s: the coordinator has no single --worker-listen" % overlay)
                continue
            names = {p.get("name") for p in c.get("ports", []) if p["containerPort"] == port}
            worker_labels = [o for o in objects if o["kind"] == "DaemonSet"][0][
                "spec"]["template"]["metadata"]["labels"]
            coordinator_labels = sts["spec"]["template"]["metadata"]["labels"]
            policies = [o for o in objects if o["kind"] == "NetworkPolicy" and
                        Selects(o["spec"]["podSelector"].get("matchLabels"), coordinator_labels)]
            if not policies:
                errors.append("%s: no NetworkPolicy selects the coordinator pod" % overlay)
            admitting = 0
            for np in policies:
                for i, rule in enumerate(np["spec"].get("ingress", [])):
                    ports = rule.get("ports")
                    if ports and not any(p.get("port") == port or p.get("port") in names
                                         or "port" not in p for p in ports):
                        continue
                    admitting += 1
                    w = "%s: %s ingress rule %d admits port %d" % (overlay, Name(np), i, port)
                    peers = rule.get("from") or []
                    if not peers:
                        errors.append("%s from anywhere: only worker pods may reach it" % w)
                    for peer in peers:
                        if set(peer) != {"podSelector"}:
                            errors.append("%s from %s: only worker pods of this namespace "
                                          "(a podSelector alone)" % (w, sorted(peer)))
                        elif peer["podSelector"].get("matchExpressions") or not Selects(
                                peer["podSelector"].get("matchLabels"), worker_labels):
                            errors.append("%s from pods %s, which are not the worker pods %s" %
                                          (w, peer["podSelector"], worker_labels))
                        elif peer["podSelector"].get("matchLabels", {}).get(
                                "app.kubernetes.io/component") != "worker":
                            errors.append("%s from %s: select the worker component" %
                                          (w, peer["podSelector"]))
            if not admitting:
                errors.append("%s: no ingress rule admits the workers' port %d" % (overlay, port))
            # The clients' Service must not carry it, the workers' Service nothing else.
            for svc in (o for o in objects if o["kind"] == "Service"):
                ports = {p["port"] for p in svc["spec"]["ports"]}
                if svc["metadata"]["name"] == "substrax-coordinator-workers":
                    if ports != {port}:
                        errors.append("%s: %s has ports %s, want only %d" %
                                      (overlay, Name(svc), sorted(ports), port))
                elif port in ports:
                    errors.append("%s: %s exposes the workers' port %d" %
                                  (overlay, Name(svc), port))
        Fail(errors)

    def testCertManagerObjects(self):
        """cert-manager.io/v1 Issuers and Certificates, structurally (no schema offline), and
        the workers' csi.cert-manager.io volumes."""
        errors = []
        for overlay, objects in self.Each():
            ns = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"][0]
            issuers = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Issuer"}
            certs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Certificate"}
            for obj in list(issuers.values()) + list(certs.values()):
                if obj.get("apiVersion") != CERT_MANAGER_API:
                    errors.append("%s: %s: apiVersion %s, want %s" % (
                        overlay, Name(obj), obj.get("apiVersion"), CERT_MANAGER_API))
            for name, issuer in issuers.items():
                w = "%s: %s" % (overlay, Name(issuer))
                types = set(issuer.get("spec", {})) & ISSUER_TYPES
                if len(types) != 1 or set(issuer.get("spec", {})) - ISSUER_TYPES:
                    errors.append("%s: spec must be exactly one of %s, got %s" %
                                  (w, sorted(ISSUER_TYPES), sorted(issuer.get("spec", {}))))
                if "ca" in types:
                    secret = issuer["spec"]["ca"].get("secretName")
                    ca_certs = [c for c in certs.values() if c["spec"].get("secretName") == secret]
                    if not ca_certs or not all(c["spec"].get("isCA") is True for c in ca_certs):
                        errors.append("%s: ca.secretName %s is not the Secret of an isCA "
                                      "Certificate" % (w, secret))

            def Usages(w, usages, want):
                if not isinstance(usages, list) or not usages:
                    errors.append("%s: no usages" % w)
                    return
                for u in usages:
                    if u not in KEY_USAGES:
                        errors.append("%s: usage %r is not a cert-manager key usage" % (w, u))
                for u in want:
                    if u not in usages:
                        errors.append("%s: usages %s lack %r" % (w, usages, u))

            for name, cert in certs.items():
                w = "%s: %s" % (overlay, Name(cert))
                spec = cert.get("spec", {})
                for field in sorted(set(spec) - CERTIFICATE_FIELDS):
                    errors.append("%s: unknown spec field %s" % (w, field))
                if not isinstance(spec.get("secretName"), str) or not spec.get("secretName"):
                    errors.append("%s: no spec.secretName" % w)
                ref = spec.get("issuerRef") or {}
                if not ref.get("name") or ref.get("kind") not in ("Issuer", "ClusterIssuer"):
                    errors.append("%s: issuerRef needs name and kind (Issuer|ClusterIssuer): %s" %
                                  (w, ref))
                elif ref.get("group", "cert-manager.io") != "cert-manager.io" or (
                        ref["kind"] == "Issuer" and ref["name"] not in issuers):
                    errors.append("%s: issuerRef %s names no Issuer of this render" % (w, ref))
                if not spec.get("commonName") and not spec.get("dnsNames"):
                    errors.append("%s: needs commonName or dnsNames" % w)
                duration = ParseDuration(spec.get("duration", "2160h"))
                renew = ParseDuration(spec.get("renewBefore", "1h"))
                if duration is None or renew is None or renew >= duration:
                    errors.append("%s: duration %r / renewBefore %r: want Go durations, "
                                  "renewBefore shorter" % (w, spec.get("duration"),
                                                           spec.get("renewBefore")))
                for org in (spec.get("subject") or {}).get("organizations", []):
                    if org not in ROLES:
                        errors.append("%s: organization %r is not a substrax role %s" %
                                      (w, org, sorted(ROLES)))
            # What each certificate is for.
            ca = certs.get("substrax-ca", {}).get("spec", {})
            if ca.get("isCA") is not True or ca.get("secretName") != "substrax-ca":
                errors.append("%s: Certificate/substrax-ca must be isCA with secretName "
                              "substrax-ca" % overlay)
            Usages("%s: Certificate/substrax-ca" % overlay, ca.get("usages"), ["cert sign"])
            if ca.get("privateKey", {}).get("rotationPolicy") != "Never":
                errors.append("%s: Certificate/substrax-ca: privateKey.rotationPolicy must be "
                              "Never (renewals keep the key, so signed certificates stay "
                              "valid)" % overlay)
            if (issuers.get("substrax-ca") or {}).get("spec", {}).get("ca", {}).get(
                    "secretName") != "substrax-ca":
                errors.append("%s: Issuer/substrax-ca must sign with Secret substrax-ca" % overlay)
            server = certs.get("substrax-coordinator", {}).get("spec", {})
            w = "%s: Certificate/substrax-coordinator" % overlay
            if server.get("secretName") != "substrax-coordinator-tls" or server.get("isCA"):
                errors.append("%s: secretName must be substrax-coordinator-tls, not a CA" % w)
            if server.get("issuerRef", {}).get("name") != "substrax-ca":
                errors.append("%s: must be issued by substrax-ca" % w)
            Usages(w, server.get("usages"), ["server auth"])
            # Both Services, as a pod of any namespace may spell them. kustomize's namespace
            # does not reach into these strings: a wrong namespace here fails TLS at run time.
            dns = set(server.get("dnsNames") or [])
            for svc in ("substrax-coordinator", "substrax-coordinator-workers"):
                for want in (svc, "%s.%s" % (svc, ns), "%s.%s.svc" % (svc, ns),
                             "%s.%s.svc.cluster.local" % (svc, ns)):
                    if want not in dns:
                        errors.append("%s: dnsNames lack %s (namespace %s: see params.yaml)" %
                                      (w, want, ns))
            for extra in sorted(n for n in dns if n.startswith("substrax-") and "." in n
                                and n.split(".")[1] != ns):
                errors.append("%s: dnsName %s is not in namespace %s" % (w, extra, ns))
            admin = certs.get("substrax-admin", {}).get("spec", {})
            w = "%s: Certificate/substrax-admin" % overlay
            if (admin.get("secretName") != "substrax-admin-tls"
                    or admin.get("commonName") != "admin"
                    or (admin.get("subject") or {}).get("organizations") != ["substrax:admin"]):
                errors.append("%s: want secretName substrax-admin-tls, commonName admin, "
                              "subject.organizations [substrax:admin]" % w)
            Usages(w, admin.get("usages"), ["client auth"])
            if "server auth" in (admin.get("usages") or []):
                errors.append("%s: a client certificate, not a server's" % w)

            # The workers' csi volumes: each pod's own client certificate, CN = its worker id.
            ds = [o for o in objects if o["kind"] == "DaemonSet"][0]
            pod = ds["spec"]["template"]["spec"]
            c = pod["containers"][0]
            w = "%s: %s" % (overlay, Name(ds))
            csi = [v for v in pod.get("volumes", []) if "csi" in v]
            if len(csi) != 1:
                errors.append("%s: want one csi.cert-manager.io volume, got %d" % (w, len(csi)))
                continue
            vol = csi[0]["csi"]
            attrs = vol.get("volumeAttributes") or {}
            w = "%s volume %s" % (w, csi[0]["name"])
            if vol.get("driver") != CSI_DRIVER or vol.get("readOnly") is not True:
                errors.append("%s: driver must be %s, readOnly true (the driver requires it)" %
                              (w, CSI_DRIVER))
            for key in sorted(set(attrs) - CSI_ATTRIBUTES):
                errors.append("%s: %s is not a csi-driver attribute" % (w, key))
            for key, value in attrs.items():
                if not isinstance(value, str):
                    errors.append("%s: %s must be a string, is %r" % (w, key, value))
            a = {k[len(CSI_DRIVER) + 1:]: v for k, v in attrs.items()}
            if a.get("issuer-name") not in issuers or a.get("issuer-kind", "Issuer") != "Issuer":
                errors.append("%s: issuer-name %r / issuer-kind %r name no Issuer of this "
                              "render" % (w, a.get("issuer-name"), a.get("issuer-kind")))
            if a.get("common-name") != "${POD_NAME}" or "--worker-id=$(POD_NAME)" not in c["args"]:
                errors.append("%s: common-name must be ${POD_NAME}, the worker id "
                              "(--worker-id=$(POD_NAME))" % w)
            if a.get("organizations") != "substrax:worker":
                errors.append("%s: organizations must be substrax:worker" % w)
            usages = [u.strip() for u in a.get("key-usages", "").split(",") if u.strip()]
            Usages(w + " key-usages", usages, ["client auth"])
            if a.get("is-ca", "false") != "false":
                errors.append("%s: a worker's certificate is no CA" % w)
            duration, renew = ParseDuration(a.get("duration")), ParseDuration(a.get("renew-before"))
            if duration is None or renew is None or renew >= duration:
                errors.append("%s: duration %r / renew-before %r: want both, renew-before "
                              "shorter" % (w, a.get("duration"), a.get("renew-before")))
            group = (pod.get("securityContext") or {}).get("runAsGroup")
            if a.get("fs-group") != str(group):
                errors.append("%s: fs-group %r, want the pod's runAsGroup %s (the key is not "
                              "readable otherwise)" % (w, a.get("fs-group"), group))
            files = {a.get("ca-file"), a.get("certificate-file"), a.get("privatekey-file")}
            if None in files or len(files) != 3:
                errors.append("%s: name ca-file, certificate-file and privatekey-file" % w)
        Fail(errors)

    def testApproverPolicy(self):
        """approver-policy's CertificateRequestPolicies (structurally: no schema offline), and
        what they decide: every certificate the render asks for is approved, for its requester,
        and an administrator's or another identity's certificate asked for through a pod's csi
        volume, or any other subject through a Certificate, is not. cert-manager's own default
        approver must be off (CERT_MANAGER_VALUES), or it signs everything."""
        errors = []
        with open(os.path.join(ARGS.root, CERT_MANAGER_VALUES)) as f:
            values = yaml.safe_load(f) or {}
        if values.get("disableAutoApproval") is not True:
            errors.append("%s: disableAutoApproval must be true: cert-manager's default approver "
                          "signs any subject, an admin's included" % CERT_MANAGER_VALUES)
        for overlay, objects in self.Each():
            policies = [o for o in objects if o["kind"] == "CertificateRequestPolicy"]
            issuers = {o["metadata"]["name"] for o in objects if o["kind"] == "Issuer"}
            for policy in policies:
                w = "%s: %s" % (overlay, Name(policy))
                spec = policy.get("spec") or {}
                if policy.get("apiVersion") != APPROVER_POLICY_API:
                    errors.append("%s: apiVersion %s, want %s" % (w, policy.get("apiVersion"),
                                                                  APPROVER_POLICY_API))
                for field in sorted(set(spec) - {"allowed", "constraints", "selector"}):
                    errors.append("%s: unknown spec field %s" % (w, field))
                allowed = spec.get("allowed") or {}
                for field in sorted(set(allowed) - POLICY_ALLOWED_FIELDS):
                    errors.append("%s: allowed.%s is not evaluated by this test" % (w, field))
                for field in sorted(set(allowed.get("subject") or {}) - POLICY_SUBJECT_FIELDS):
                    errors.append("%s: allowed.subject.%s is not evaluated here" % (w, field))
                ref = spec.get("selector", {}).get("issuerRef") or {}
                if ref.get("name") not in issuers or ref.get("kind") != "Issuer":
                    errors.append("%s: selector.issuerRef %s names no Issuer of this render" %
                                  (w, ref))
                for org in (allowed.get("subject") or {}).get("organizations", {}).get(
                        "values", []):
                    if org not in ROLES:
                        errors.append("%s: organization %r is not exactly a substrax role" %
                                      (w, org))
            # Every certificate of the render is approved for cert-manager's controller.
            for cert in (o for o in objects if o["kind"] == "Certificate"):
                ok, why = Approves(objects, CERT_MANAGER_SA, cert["spec"]["issuerRef"]["name"],
                                   CertificateRequestOf(cert))
                if not ok:
                    errors.append("%s: %s would never be signed: %s" % (overlay, Name(cert),
                                                                        "; ".join(why)))
            # Each worker pod's csi volume, as the csi-driver asks for it.
            ds = [o for o in objects if o["kind"] == "DaemonSet"][0]
            csi = [v["csi"] for v in ds["spec"]["template"]["spec"].get("volumes", [])
                   if "csi" in v]
            attrs = {k[len(CSI_DRIVER) + 1:]: v for k, v in
                     ((csi[0].get("volumeAttributes") or {}) if csi else {}).items()}
            worker = {"commonName": "substrax-worker-x7k2p",
                      "organizations": [o for o in attrs.get("organizations", "").split(",") if o],
                      "usages": [u.strip() for u in attrs.get("key-usages", "").split(",")
                                 if u.strip()],
                      "duration": ParseDuration(attrs.get("duration", "")) or 0}
            ok, why = Approves(objects, CSI_DRIVER_SA, attrs.get("issuer-name"), worker)
            if not ok:
                errors.append("%s: a worker pod's certificate would never be signed: %s" %
                              (overlay, "; ".join(why)))
            # What an attacker who can create pods (csi volumes) or Certificates would ask for.
            admin = {"commonName": "admin", "organizations": ["substrax:admin"],
                     "usages": ["client auth", "digital signature", "key encipherment"]}
            refused = [
                ("a pod's csi volume asking for the admin's certificate", CSI_DRIVER_SA, admin),
                ("a pod's csi volume asking for a submitter's", CSI_DRIVER_SA,
                 dict(worker, organizations=["substrax:submitter"])),
                ("a pod's csi volume asking for two roles", CSI_DRIVER_SA,
                 dict(worker, organizations=["substrax:worker", "substrax:admin"])),
                ("a pod's csi volume asking for a worker certificate named after no worker pod",
                 CSI_DRIVER_SA, dict(worker, commonName="admin")),
                ("a pod's csi volume asking for a server certificate", CSI_DRIVER_SA,
                 dict(worker, usages=["server auth"])),
                ("a pod's csi volume asking for a CA", CSI_DRIVER_SA, dict(worker, isCA=True)),
                ("a worker certificate of a year", CSI_DRIVER_SA,
                 dict(worker, duration=365 * 24 * 3600)),
                ("a Certificate for another admin", CERT_MANAGER_SA,
                 dict(admin, commonName="mallory")),
                ("a Certificate for a worker identity", CERT_MANAGER_SA, worker),
                ("a Certificate for the coordinator's name with a role", CERT_MANAGER_SA,
                 {"commonName": "substrax-coordinator", "organizations": ["substrax:admin"],
                  "usages": ["client auth"]}),
                ("another service account", ("default", "default"), admin),
            ]
            for what, requester, request in refused:
                ok, _ = Approves(objects, requester, "substrax-ca", request)
                if ok:
                    errors.append("%s: %s is approved" % (overlay, what))
        Fail(errors)

    def testEveryMountedSourceIsRendered(self):
        """Every volume a pod mounts comes from something in the render (a Secret, a
        Certificate's Secret, a ConfigMap, a claim, an Issuer for csi volumes; emptyDir), and
        every file a flag names (--tls-*, --auth-config) is a file such a volume holds."""
        errors = []
        for overlay, objects in self.Each():
            secrets = {o["metadata"]["name"]: set((o.get("data") or {}))
                       for o in objects if o["kind"] == "Secret"}
            for cert in (o for o in objects if o["kind"] == "Certificate"):
                secrets.setdefault(cert["spec"].get("secretName"), set()).update(
                    CERTIFICATE_SECRET_KEYS)
            maps = {o["metadata"]["name"]: set((o.get("data") or {}))
                    for o in objects if o["kind"] == "ConfigMap"}
            claims = {o["metadata"]["name"] for o in objects
                      if o["kind"] == "PersistentVolumeClaim"}
            issuers = {o["metadata"]["name"] for o in objects if o["kind"] == "Issuer"}
            for obj, pod in PodTemplates(objects):
                where = "%s: %s" % (overlay, Name(obj))
                templates = {t["metadata"]["name"]
                             for t in obj["spec"].get("volumeClaimTemplates", [])}
                files = {}   # volume name -> the files it holds (None: any, e.g. a claim)
                for v in pod.get("volumes", []):
                    w = "%s volume %s" % (where, v["name"])
                    if "secret" in v:
                        name = v["secret"].get("secretName")
                        if name not in secrets:
                            errors.append("%s: Secret %s: neither rendered nor a Certificate's "
                                          "secretName" % (w, name))
                        files[v["name"]] = secrets.get(name, set())
                    elif "configMap" in v:
                        name = v["configMap"].get("name")
                        if name not in maps:
                            errors.append("%s: ConfigMap %s is not rendered" % (w, name))
                        files[v["name"]] = maps.get(name, set())
                    elif "persistentVolumeClaim" in v:
                        if v["persistentVolumeClaim"].get("claimName") not in claims:
                            errors.append("%s: claim %s is not rendered: add it to the overlay" %
                                          (w, v["persistentVolumeClaim"].get("claimName")))
                        files[v["name"]] = None
                    elif "csi" in v:
                        attrs = v["csi"].get("volumeAttributes") or {}
                        if (v["csi"].get("driver") != CSI_DRIVER or
                                attrs.get(CSI_DRIVER + "/issuer-name") not in issuers):
                            errors.append("%s: csi volume of driver %s, issuer %s: not a "
                                          "cert-manager volume of a rendered Issuer" % (
                                              w, v["csi"].get("driver"),
                                              attrs.get(CSI_DRIVER + "/issuer-name")))
                        files[v["name"]] = {attrs.get(CSI_DRIVER + "/" + k, d) for k, d in (
                            ("ca-file", "ca.crt"), ("certificate-file", "tls.crt"),
                            ("privatekey-file", "tls.key"))}
                    elif "emptyDir" in v:
                        files[v["name"]] = None
                    else:
                        errors.append("%s: source %s is produced by nothing in the render" %
                                      (w, sorted(set(v) - {"name"})))
                for c in pod.get("initContainers", []) + pod["containers"]:
                    w = "%s container %s" % (where, c["name"])
                    mounts = {}
                    for m in c.get("volumeMounts", []):
                        if m["name"] not in files and m["name"] not in templates:
                            errors.append("%s: mounts %s, which is no volume" % (w, m["name"]))
                        mounts[m["mountPath"].rstrip("/")] = m
                    for flag in FILE_FLAGS:
                        for path in FlagValues(c, flag):
                            directory, base = os.path.split(path)
                            m = mounts.get(directory)
                            if m is None:
                                errors.append("%s: %s=%s is not in a mounted volume's top "
                                              "directory" % (w, flag, path))
                                continue
                            held = files.get(m["name"])
                            if held is not None and base not in held:
                                errors.append("%s: %s=%s: volume %s holds %s" % (
                                    w, flag, path, m["name"], sorted(held)))
                            if m.get("subPath"):
                                errors.append("%s: %s: subPath mounts are not updated when "
                                              "certificates renew" % (w, flag))
                            if m.get("readOnly") is not True:
                                errors.append("%s: %s: mount %s read-only" % (
                                    w, flag, m["mountPath"]))
        Fail(errors)

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
            # A ConfigMap mounted as files (the coordinator's queues) is read, not passed.
            mounted = {v["configMap"]["name"] for _, pod in PodTemplates(objects)
                       for v in pod.get("volumes", []) if "configMap" in v}
            for name, data in maps.items():
                if name in mounted:
                    continue
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


class MonitoringTest(unittest.TestCase):
    """deploy/k8s/monitoring: the ServiceMonitor and the Grafana dashboard's ConfigMap."""

    @classmethod
    def setUpClass(cls):
        cls.objects = Render(MONITORING)[1]
        cls.overlays = {o: (RenderedOverlayTest.rendered.get(o) or Render(o))[1]
                        for o in OVERLAYS}

    def Only(self, kind):
        found = [o for o in self.objects if o["kind"] == kind]
        self.assertEqual(len(found), 1, "one %s in %s" % (kind, MONITORING))
        return found[0]

    def testObjectsAndSchemas(self):
        self.assertEqual(sorted(Name(o) for o in self.objects),
                         ["ConfigMap/" + DASHBOARD_CONFIGMAP,
                          "ServiceMonitor/substrax-coordinator"])
        Fail(ValidateSchemas([(MONITORING, self.objects)], (MONITORING_API,),
                             "MonitoringTest.testServiceMonitorScrapesTheCoordinator"))

    def testSameNamespaceAsTheOverlays(self):
        for overlay, objects in self.overlays.items():
            spaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
            for obj in self.objects:
                self.assertEqual({obj["metadata"].get("namespace")}, spaces,
                                 "%s: %s: the namespace of overlays/%s" % (MONITORING, Name(obj),
                                                                           overlay))

    def testDashboardConfigMapForGrafanasSidecar(self):
        cm = self.Only("ConfigMap")
        # A fixed name (no hash suffix; see the kustomization) and the sidecar's label.
        self.assertEqual(cm["metadata"]["name"], DASHBOARD_CONFIGMAP)
        self.assertEqual(cm["metadata"].get("labels", {}).get("grafana_dashboard"), "1")
        self.assertEqual(sorted(cm["data"]), [DASHBOARD_FILE])
        with open(os.path.join(ARGS.root, "deploy", "k8s", MONITORING, DASHBOARD_FILE),
                  encoding="utf-8") as f:
            self.assertEqual(cm["data"][DASHBOARD_FILE], f.read())
        dashboard = json.loads(cm["data"][DASHBOARD_FILE])
        self.assertTrue(dashboard.get("uid"))
        self.assertTrue(dashboard.get("panels"))

    def testServiceMonitorScrapesTheCoordinator(self):
        sm = self.Only("ServiceMonitor")
        errors = []
        if sm["apiVersion"] != MONITORING_API:
            errors.append("ServiceMonitor: apiVersion %s, want %s" % (sm["apiVersion"],
                                                                      MONITORING_API))
        spec = sm.get("spec", {})
        errors += ["ServiceMonitor: unknown spec field %s" % f
                   for f in sorted(set(spec) - SERVICE_MONITOR_FIELDS)]
        if spec.get("namespaceSelector"):
            errors.append("ServiceMonitor: scrape its own namespace (no namespaceSelector)")
        endpoints = spec.get("endpoints") or []
        if not endpoints:
            errors.append("ServiceMonitor: no endpoints")
        match = (spec.get("selector") or {}).get("matchLabels")
        if not match or (spec.get("selector") or {}).get("matchExpressions"):
            errors.append("ServiceMonitor: select the Services by matchLabels alone")
        for overlay, objects in self.overlays.items():
            services = [o for o in objects if o["kind"] == "Service" and
                        Selects(match, o["metadata"].get("labels", {}))]
            sts = [o for o in objects if o["kind"] == "StatefulSet"][0]
            c = sts["spec"]["template"]["spec"]["containers"][0]
            metrics_port = ListenPort(c, "--metrics-listen")
            for i, ep in enumerate(endpoints):
                w = "%s: ServiceMonitor endpoint %d" % (overlay, i)
                errors += ["%s: unknown field %s" % (w, f)
                           for f in sorted(set(ep) - ENDPOINT_FIELDS)]
                if ep.get("path", "/metrics") != "/metrics" or ep.get("scheme", "http") != "http":
                    errors.append("%s: the coordinator serves plaintext http /metrics" % w)
                ports = [(Name(svc), p) for svc in services for p in svc["spec"]["ports"]
                         if p.get("name") == ep.get("port")]
                if len(ports) != 1:
                    errors.append("%s: port %r is on %d selected Services (%s), want one" % (
                        w, ep.get("port"), len(ports), ", ".join(Name(s) for s in services)))
                    continue
                target = ports[0][1].get("targetPort")
                reached = [p["containerPort"] for p in c.get("ports", [])
                           if target in (p.get("name"), p["containerPort"])]
                if reached != [metrics_port]:
                    errors.append("%s: %s targets %r, container ports %s; --metrics-listen "
                                  "port %s" % (w, ports[0][0], target, reached, metrics_port))
        Fail(errors)


class DockerfileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.binaries = Binaries(ARGS.coordinator, ARGS.agent, ARGS.job, ARGS.ctl)
        cls.files = {}
        directory = os.path.join(ARGS.root, "deploy", "docker")
        for name in DOCKERFILE_OF_IMAGE.values():
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                # Join continuation lines: one instruction per entry.
                cls.files[name] = re.sub(r"\\\n", " ", f.read())

    def Instructions(self, name, keyword):
        return [line.strip()[len(keyword):].strip() for line in self.files[name].splitlines()
                if line.strip().upper().startswith(keyword + " ")]

    def Installed(self, name):
        """What a Dockerfile's image holds: its COPY instructions and, for an image FROM another
        of ours (DERIVED_FROM), that one's."""
        copied = " ".join(self.Instructions(name, "COPY"))
        if name in DERIVED_FROM:
            copied += " " + self.Installed(DERIVED_FROM[name])
        return copied

    def testEveryDockerfileIsCheckedAndHasItsDockerignore(self):
        directory = os.path.join(ARGS.root, "deploy", "docker")
        with open(os.path.join(directory, "Dockerfile.worker-cpu.dockerignore"),
                  encoding="utf-8") as f:
            want = f.read()
        for name in sorted(os.listdir(directory)):
            if name.startswith("Dockerfile.") and not name.endswith(".dockerignore"):
                self.assertIn(name, self.files, "%s: add it to DOCKERFILE_OF_IMAGE" % name)
                path = os.path.join(directory, name + ".dockerignore")
                self.assertTrue(os.path.exists(path), "%s has no .dockerignore" % name)
                with open(path, encoding="utf-8") as f:
                    self.assertEqual(f.read(), want, "%s.dockerignore" % name)

    def testMultiStageNonRootRuntime(self):
        for name, text in self.files.items():
            froms = self.Instructions(name, "FROM")
            self.assertGreaterEqual(len(froms), 2, name)
            self.assertIn("debian:12", " ".join(froms), name)
            self.assertEqual(self.Instructions(name, "USER")[-1],
                             RUNTIME_USER.get(name, "10001:10001"), name)
            if name in DERIVED_FROM:
                # FROM ${ARG}, whose default is the image of the Dockerfile it derives from:
                # that one makes the user.
                arg = re.fullmatch(r"\$\{(\w+)\}", froms[-1])
                self.assertTrue(arg, "%s: the runtime stage is FROM ${ARG}" % name)
                default = re.search(r"^ARG %s=(\S+)$" % arg.group(1), text, re.MULTILINE)
                self.assertTrue(default, "%s: ARG %s has no default" % (name, arg.group(1)))
                image = default.group(1).rsplit(":", 1)[0]
                self.assertEqual(DOCKERFILE_OF_IMAGE.get(image), DERIVED_FROM[name], name)
                text = self.files[DERIVED_FROM[name]]
            self.assertIn("--uid 10001", text, name)

    def testBazelTargetsAreTheBinaries(self):
        targets = {"//coordinator:substrax-coordinator", "//agent:substrax-agent",
                   "//worker:substrax-job", "//client:substraxctl"}
        for name, text in self.files.items():
            for label in re.findall(r"//[\w/]+:[\w.-]+", text):
                self.assertIn(label, targets, name)

    def testEntrypointsAndFlagsExist(self):
        errors = []
        for name in self.files:
            entry = yaml.safe_load(self.Instructions(name, "ENTRYPOINT")[-1])
            cmd = yaml.safe_load(self.Instructions(name, "CMD")[-1])
            copied = self.Installed(name)
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

    def testProgramsImage(self):
        """Dockerfile.worker-programs: worker-cpu's build stage (the same lines, so its cached
        layers are shared), `make sdk PREFIX=/opt/substrax`, the CMake project of build arg
        PROGRAMS (default examples/sdk) built into /opt/substrax/programs, and a runtime stage
        FROM the worker-cpu image with libsubstrax.so* and the programs copied in, and the
        worker-cpu command plus --programs-dir=/opt/substrax/programs."""
        name, base = "Dockerfile.worker-programs", "Dockerfile.worker-cpu"
        text = self.files[name]

        def BuildStage(f):
            lines = [l.strip() for l in self.files[f].splitlines()
                     if l.strip() and not l.strip().startswith("#")]
            start = [i for i, l in enumerate(lines) if l.startswith("FROM ") and
                     l.endswith(" AS build")][0]
            return lines[start:lines.index("COPY . .")]

        ours = BuildStage(name)
        theirs = BuildStage(base)
        self.assertEqual(ours[:len(theirs)], theirs,
                         "%s: start the build stage with %s's lines" % (name, base))
        self.assertRegex(text, r"(?m)^ARG PROGRAMS=examples/sdk$")
        runs = " ".join(self.Instructions(name, "RUN"))
        self.assertIn("make sdk PREFIX=/opt/substrax", runs)
        self.assertIn('cmake -S "$PROGRAMS"', runs)
        self.assertIn("-DCMAKE_PREFIX_PATH=/opt/substrax ", runs)
        self.assertIn("-DCMAKE_RUNTIME_OUTPUT_DIRECTORY=%s " % PROGRAMS_DIR, runs)
        self.assertIn("cp -a /opt/substrax/lib/libsubstrax.so* /out/lib/", runs)
        copies = self.Instructions(name, "COPY")
        self.assertIn("--from=build /out/lib/ /opt/substrax/lib/", copies)
        self.assertIn("--from=build %s/ %s/" % (PROGRAMS_DIR, PROGRAMS_DIR), copies)
        self.assertIn("ldconfig", runs)
        self.assertEqual(yaml.safe_load(self.Instructions(name, "ENTRYPOINT")[-1]),
                         yaml.safe_load(self.Instructions(base, "ENTRYPOINT")[-1]))
        self.assertEqual(yaml.safe_load(self.Instructions(name, "CMD")[-1]),
                         yaml.safe_load(self.Instructions(base, "CMD")[-1]) +
                         ["--programs-dir=" + PROGRAMS_DIR])

    def testPythonImage(self):
        """Dockerfile.worker-python: a wheels stage on debian:12 (Python 3.11, as the worker
        image's debian:12-slim) that downloads JAX_REQUIREMENTS's wheels, built ones only and
        without dependencies; a runtime stage FROM the worker-cpu image that installs Debian's
        python3, python3-venv, python3-torch and libopenblas0-pthread, makes the job user, strips
        setuid and setgid bits, and creates the venv /opt/substrax/python with the one pip
        install of the file, --no-index from the wheelhouse, mounted from the wheels stage, in a
        step without network; and worker-cpu's command plus PYTHON_FLAGS."""
        name, base = PYTHON_IMAGE, "Dockerfile.worker-cpu"
        self.assertIn("debian:12 AS wheels", self.Instructions(name, "FROM"))
        self.assertIn("debian:12-slim", self.Instructions(base, "FROM")[-1])
        self.assertIn("%s /wheelhouse/requirements.txt" % JAX_REQUIREMENTS,
                      self.Instructions(name, "COPY"))
        runs = self.Instructions(name, "RUN")
        downloads = [r for r in runs if "pip download" in r]
        self.assertEqual(len(downloads), 1, "one pip download")
        for want in ("--no-deps", "--only-binary=:all:", "--dest /wheelhouse",
                     "-r /wheelhouse/requirements.txt"):
            self.assertIn(want, downloads[0])
        installs = [r for r in runs if re.search(r"\bpip\S* install\b", r)]
        self.assertEqual(len(installs), 1, "one pip install: the wheelhouse's")
        install = installs[0]
        options = re.match(r"((?:--\S+\s+)*)", install).group(1).split()
        self.assertIn("--network=none", options)
        self.assertIn("--mount=type=bind,from=wheels,source=/wheelhouse,target=/wheelhouse",
                      options)
        for want in ("python3 -m venv /opt/substrax/python", "--no-index",
                     "--find-links /wheelhouse", "-r /wheelhouse/requirements.txt"):
            self.assertIn(want, install)
        self.assertNotRegex(install, r"--(extra-)?index-url|--trusted-host|-i\s")
        # The substrax package (docs/python.md): its wheel built in the wheels stage from
        # python/ as tools/build_python.sh builds it, offline, and installed with the pins.
        self.assertIn("python /tmp/substrax-python", self.Instructions(name, "COPY"))
        builds = [r for r in runs if "pip wheel" in r]
        self.assertEqual(len(builds), 1, "one pip wheel: the substrax package's")
        for want in ("--no-build-isolation", "--no-deps", "--no-index",
                     "--wheel-dir /wheelhouse /tmp/substrax-python"):
            self.assertIn(want, builds[0])
        self.assertRegex(install, r"-r /wheelhouse/requirements\.txt substrax\b")
        apt = " ".join(r for r in runs if "apt-get install" in r) + " "
        for package in ("python3", "python3-venv", "python3-torch", "libopenblas0-pthread"):
            self.assertRegex(apt, r"\s%s\s" % re.escape(package))
        self.assertRegex(" ".join(runs), r"find / -xdev -type f -perm /6000 -exec chmod ug-s ")
        self.assertEqual(JobUserOfImage()[0], JOB_USER)
        self.assertEqual(yaml.safe_load(self.Instructions(name, "ENTRYPOINT")[-1]),
                         yaml.safe_load(self.Instructions(base, "ENTRYPOINT")[-1]))
        self.assertEqual(yaml.safe_load(self.Instructions(name, "CMD")[-1]),
                         yaml.safe_load(self.Instructions(base, "CMD")[-1]) + PYTHON_FLAGS)

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
                    if binary not in self.Installed(dockerfile[0]):
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


    def testJaxPinsAreShared(self):
        """JAX_REQUIREMENTS is the one list of the JAX pins: pins only (name==version), the
        issue's four framework versions among them, and install_deps.sh's reader yields exactly
        what pip reads of it, and is what install_deps.sh installs /opt/substrax/jax from, with
        no JAX pin of its own (the Python image installs the same file: testPythonImage)."""
        path = os.path.join(ARGS.root, JAX_REQUIREMENTS)
        pins = Requirements(path)
        for pin in pins:
            self.assertRegex(pin, r"^[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+!-]*$")
        names = [re.sub(r"[-_.]+", "-", p.split("==")[0]).lower() for p in pins]
        self.assertEqual(len(names), len(set(names)), "each package pinned once")
        for want in ("jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8", "optax==0.2.8"):
            self.assertIn(want, pins)
        with open(os.path.join(ARGS.root, "tools", "install_deps.sh"), encoding="utf-8") as f:
            text = f.read()
        reader = re.search(r"^read_requirements\(\) \{\n.*?^\}\n", text, re.S | re.M)
        self.assertTrue(reader, "install_deps.sh: no read_requirements()")
        out = subprocess.run(["bash", "-c", reader.group(0) + 'read_requirements "$1"', "bash",
                              path], stdout=subprocess.PIPE, text=True, check=True).stdout
        self.assertEqual(out.splitlines(), pins)
        self.assertIn('jax_requirements="$(dirname "${BASH_SOURCE[0]}")/%s"' %
                      os.path.basename(JAX_REQUIREMENTS), text)
        self.assertIn('mapfile -t JAX_REQUIREMENTS < <(read_requirements "$jax_requirements")',
                      text)
        self.assertIn('install_venv /opt/substrax/jax "${JAX_REQUIREMENTS[@]}"', text)
        for framework in ("jax", "jaxlib", "flax", "optax"):
            self.assertNotRegex(text, r"(?m)^\s*%s==" % framework)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
