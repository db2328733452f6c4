"""What a rendered overlay tells a container to run: command, args and env, as the kubelet would.

Used by multihost_test.sh, which runs the results in network namespaces. Given the output of
`kubectl kustomize` and a workload (kind/name) and container name, it

  * resolves the container's env: literal values, configMapKeyRef from the rendered ConfigMaps
    (their generated, hashed names), and the downward API (fieldRef) from --field values the
    caller gives for the pod (spec.nodeName, status.podIP, ...): a fieldRef it was not given is
    an error, never a guess;
  * expands $(VAR) in env values (earlier variables only), command and args exactly as Kubernetes
    does (third_party/forked/golang/expansion: $$ is a literal $, an undefined $(VAR) stays as
    written);
  * maps the paths the manifests use inside the container to the test's paths with the caller's
    table (--map CONTAINER_PATH=TEST_PATH): a path is replaced where an argument is that path, or
    a `--flag=` value is, or either begins with it followed by '/'. Every directory in the table
    must be a volumeMount of the container, every volumeMount must be in the table or named with
    --unmapped-mount, and no absolute path may be left unmapped in command or args, except a
    directory of the image that the test's hosts have at the same path (--image-path: the
    worker's --data-root). Nothing else of command, args or env is changed.
  * --override-configmap NAME/KEY=VALUE replaces one ConfigMap value (the test's only override:
    the worker's device count, when the manifest's is not what the test needs).

Writes OUT.argv and OUT.env (NUL-separated; env as NAME=VALUE in the manifest's order) and prints
them. `--facts` instead prints shell assignments of what the test needs to know of the rendered
objects (namespace, Service names and ports, the daemons' health ports, the devices per worker).
"""

import argparse
import os
import re
import shlex
import sys

import yaml


def Expand(text, mapping):
    """Kubernetes' $(VAR) expansion (k8s.io/kubernetes/third_party/forked/golang/expansion)."""
    out = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":  # $$: an escaped $
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                end = rest.find(")", 1)
                if end >= 0:
                    read, is_var, advance = rest[1:end], True, end + 1
                else:  # "$(" without ")": kept as written
                    read, is_var, advance = "$(", False, 1
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            out.append((mapping[read] if read in mapping else "$(" + read + ")") if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


def Load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def Find(docs, kind, name):
    hits = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    if len(hits) != 1:
        sys.exit("multihost_extract: %d %s named %s in the rendered overlay" % (len(hits), kind, name))
    return hits[0]


def Container(workload, name):
    hits = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    if len(hits) != 1:
        sys.exit("multihost_extract: no container %s in %s" % (name, workload["metadata"]["name"]))
    return hits[0]


def ConfigMaps(docs, overrides):
    maps = {d["metadata"]["name"]: dict(d.get("data") or {}) for d in docs if d.get("kind") == "ConfigMap"}
    for spec in overrides:
        ref, value = spec.split("=", 1)
        cm_prefix, key = ref.split("/", 1)
        # Generated names carry a hash suffix: the override names the generator's name.
        names = [n for n in maps if n == cm_prefix or re.fullmatch(re.escape(cm_prefix) + r"-[a-z0-9]+", n)]
        if len(names) != 1 or key not in maps[names[0]]:
            sys.exit("multihost_extract: override %s names no ConfigMap key" % spec)
        print("multihost_extract: OVERRIDE %s/%s: %r -> %r" % (names[0], key, maps[names[0]][key], value),
              file=sys.stderr)
        maps[names[0]][key] = value
    return maps


def Env(container, configmaps, fields):
    """The container's env in order, resolved and expanded."""
    env = {}
    for src in container.get("envFrom") or []:
        if "configMapRef" not in src:
            sys.exit("multihost_extract: envFrom other than configMapRef: %r" % src)
        for k, v in configmaps[src["configMapRef"]["name"]].items():
            env[src.get("prefix", "") + k] = v
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var:
            env[name] = Expand(str(var["value"]), env)
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            if ref["name"] not in configmaps or ref["key"] not in configmaps[ref["name"]]:
                if ref.get("optional"):
                    continue
                sys.exit("multihost_extract: %s: no ConfigMap key %s/%s" % (name, ref["name"], ref["key"]))
            env[name] = str(configmaps[ref["name"]][ref["key"]])
        elif "fieldRef" in var["valueFrom"]:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields:
                sys.exit("multihost_extract: %s: downward API field %s not given (--field)" % (name, path))
            env[name] = fields[path]
        else:
            sys.exit("multihost_extract: %s: unsupported valueFrom %r" % (name, var["valueFrom"]))
    return env


def MapPath(arg, table):
    """arg with a container path (at its start or after the first '=') replaced by the test's."""
    prefix, value = ("", arg)
    if arg.startswith("-") and "=" in arg:
        prefix, value = arg.split("=", 1)
        prefix += "="
    for container_path, test_path in sorted(table.items(), key=lambda kv: -len(kv[0])):
        if value == container_path or value.startswith(container_path.rstrip("/") + "/"):
            return prefix + test_path + value[len(container_path):]
    if value.startswith("/"):
        sys.exit("multihost_extract: %r names container path %s, which the table does not map" % (arg, value))
    return arg


def Facts(docs):
    ns = Find(docs, "StatefulSet", "substrax-coordinator")["metadata"].get("namespace", "default")
    coordinator = Container(Find(docs, "StatefulSet", "substrax-coordinator"), "coordinator")
    worker_set = Find(docs, "DaemonSet", "substrax-worker")
    worker = Container(worker_set, "worker")
    service = Find(docs, "Service", "substrax-coordinator")
    headless = Find(docs, "Service", "substrax-worker")

    def Flag(container, flag):
        for a in container.get("args") or []:
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        sys.exit("multihost_extract: no %s= in %s's args" % (flag, container["name"]))

    def Port(container, flag):
        return Flag(container, flag).rsplit(":", 1)[1]

    facts = {
        "K8S_NAMESPACE": ns,
        "COORDINATOR_SERVICE": service["metadata"]["name"],
        "COORDINATOR_SERVICE_PORT": str(service["spec"]["ports"][0]["port"]),
        "COORDINATOR_GRPC_PORT": Port(coordinator, "--listen"),
        "COORDINATOR_HEALTH_PORT": Port(coordinator, "--health-listen"),
        "WORKER_HEALTH_PORT": Port(worker, "--health-listen"),
        "WORKER_COORDINATOR_FLAG": Flag(worker, "--coordinator"),
        "WORKER_SUBDOMAIN": worker_set["spec"]["template"]["spec"].get("subdomain", ""),
        "WORKER_HEADLESS_SERVICE": headless["metadata"]["name"],
        "WORKER_LISTEN_HOST_ARG": Flag(worker, "--listen-host"),
    }
    for k, v in facts.items():
        print("%s=%s" % (k, shlex.quote(v)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rendered", required=True, help="output of kubectl kustomize")
    p.add_argument("--facts", action="store_true")
    p.add_argument("--workload", help="KIND/NAME, e.g. DaemonSet/substrax-worker")
    p.add_argument("--container")
    p.add_argument("--field", action="append", default=[], help="FIELDPATH=VALUE (downward API)")
    p.add_argument("--map", action="append", default=[], help="CONTAINER_PATH=TEST_PATH")
    p.add_argument("--unmapped-mount", action="append", default=[],
                   help="a volumeMount no flag names (left unmapped on purpose)")
    p.add_argument("--image-path", action="append", default=[],
                   help="a directory of the image the test's hosts have too (kept as it is)")
    p.add_argument("--override-configmap", action="append", default=[], help="NAME/KEY=VALUE")
    p.add_argument("--out", help="writes OUT.argv and OUT.env")
    a = p.parse_args()
    docs = Load(a.rendered)
    if a.facts:
        Facts(docs)
        return
    kind, name = a.workload.split("/", 1)
    workload = Find(docs, kind, name)
    container = Container(workload, a.container)
    fields = dict(f.split("=", 1) for f in a.field)
    table = dict(m.split("=", 1) for m in a.map)
    image_paths = {path: path for path in a.image_path}

    # The table must cover the container's mounts, and map nothing that is not a mount or a
    # command (binaries in the image).
    mounts = {m["mountPath"] for m in container.get("volumeMounts") or []}
    command = container.get("command") or []
    for path in table:
        if path not in mounts and path not in command:
            sys.exit("multihost_extract: table maps %s, neither a volumeMount nor the command of %s"
                     % (path, a.container))
    for m in mounts - set(table) - set(a.unmapped_mount):
        sys.exit("multihost_extract: volumeMount %s of %s is not in the table" % (m, a.container))

    env = Env(container, ConfigMaps(docs, a.override_configmap), fields)
    argv = [Expand(s, env) for s in command + (container.get("args") or [])]
    if not command:
        sys.exit("multihost_extract: %s has no command (the image's entrypoint is not known here)" % a.container)
    argv = [MapPath(s, dict(table, **image_paths)) for s in argv]
    with open(a.out + ".argv", "wb") as f:
        f.write(b"".join(s.encode() + b"\0" for s in argv))
    with open(a.out + ".env", "wb") as f:
        f.write(b"".join(("%s=%s" % kv).encode() + b"\0" for kv in env.items()))
    print("  env:  " + " ".join(shlex.quote("%s=%s" % kv) for kv in env.items()))
    print("  argv: " + " ".join(shlex.quote(s) for s in argv))


if __name__ == "__main__":
    main()
