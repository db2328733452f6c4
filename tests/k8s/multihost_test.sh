#!/usr/bin/env bash
# The Kubernetes manifests, run for real on three "hosts" made of network namespaces.
#
# Renders deploy/k8s/overlays/cpu with `kubectl kustomize`, takes from it the coordinator's and
# the worker's command, args and env exactly as the kubelet would give them (multihost_extract.py:
# ConfigMap values from the rendered ConfigMaps, the downward API's POD_IP and NODE_NAME from the
# namespace host, $(VAR) expanded as Kubernetes does), and starts them with `ip netns exec` in:
#
#   <run>-c  (coordinator, 10.213.0.2) ─┐
#   <run>-w1 (worker,      10.213.0.3) ─┼─ veth ─ bridge br0 in namespace <run>-br
#   <run>-w2 (worker,      10.213.0.4) ─┘
#
# <run> is "sxmh<pid>" (parallel runs do not collide). Every link and address lives in those
# namespaces (tests/netns_hosts.sh makes them); nothing is added to the root namespace. Names
# resolve per namespace through
# /etc/netns/<ns>/hosts (and resolv.conf with the pod's search path and no reachable DNS):
# the coordinator Service (substrax-coordinator, .<namespace>, .svc, .svc.cluster.local) and
# the headless worker Service's pod names. Ports are the manifests' own (7070, 7071, 9090): each
# host has its own network stack, as each pod does.
#
# TLS as on a cluster: the test makes, with openssl, what cert-manager would (a CA; the
# coordinator's server certificate with the rendered Certificate's CN, dnsNames and ipAddresses;
# each worker's client certificate with CN = its pod name, which is its --worker-id, and
# O=substrax:worker, as the csi-driver volume asks; an admin client certificate, CN admin,
# O=substrax:admin, for substraxctl), and puts them where the Secret and csi volumes would be
# mounted. The coordinator's --auth-config is the rendered Secret substrax-auth's file. The
# workers dial the worker Service's name (--coordinator, --tls-server-name) on its own port.
#
# It waits for each daemon through grpc.health.v1 (`substraxctl health` on its --health-listen
# port, workers on substrax.worker.ready), then submits from the coordinator's namespace, through
# the Service name, a data-parallel Fashion-MNIST job (examples/fashion_mnist_mlp.yaml with
# `steps: 60` instead of `epochs`, checkpointing every 20 steps under the workers'
# --checkpoint-root) over 2 workers x 2 CPU devices, and checks that it SUCCEEDED
# with test metrics, that its mesh spans both worker hosts, that the workers registered as their
# pod names (--worker-id=$(POD_NAME)) with their namespace IPs (--listen-host=$(POD_IP)): Gloo binds the runners there, and each host's only
# route to the other is the bridge, so a succeeded job means the all-reduces crossed it. The
# checkpoint root is one directory for both workers, as the ReadWriteMany claim
# substrax-checkpoints is on a cluster: the last checkpoint must be committed there with both
# processes' shard files.
# The job's one group (its 1-D mesh's data axis is the world) has two ranks on each host, so each
# runner's log (the daemon writes it under its --work-dir) must say that the world took the
# hierarchical path: shared memory inside each host, then Gloo between the hosts' leaders.
#
# Cleans up on every exit (trap): the daemons and their runners, the namespaces, /etc/netns/<ns>,
# the temp dir. Bounded: an overall deadline, every blocking command under `timeout`.
# Skips (exit 0, saying so) unless root with working `ip netns`; under CI=true that is a
# failure instead. Daemon logs are copied to
# $TEST_UNDECLARED_OUTPUTS_DIR when Bazel gives one.
#
# MULTIHOST_TEST_FORCE_FAILURE=1 fails on purpose once the daemons are ready (to check the cleanup).
#
# Arguments: --coordinator=, --agent=, --ctl= (the binaries), --manifests= (deploy/k8s),
# --spec= (examples/fashion_mnist_mlp.yaml).
set -euo pipefail
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

readonly OVERALL_S=420   # the whole test; Bazel's timeout ("long", 900 s) is the backstop
readonly READY_S=60      # each daemon to become ready
readonly JOB_S=150       # submit --watch of the 60-step job
START=$SECONDS

log() { echo "multihost_test: $*"; }
die() { log "FAIL: $*" >&2; exit 1; }
left() { echo $((OVERALL_S - (SECONDS - START))); }

NETNS_TEST="the multi-host test"
NETNS_LIB="$(dirname "$0")/../netns_hosts.sh"   # Bazel's runfiles, or the source tree
[ -f "$NETNS_LIB" ] || NETNS_LIB="$(dirname "$(realpath "$0")")/../netns_hosts.sh"
# shellcheck source=tests/netns_hosts.sh
. "$NETNS_LIB"
# CI has root and ip netns: there, not being able to make namespaces is a failure, never a
# silent pass (tools/test.sh passes CI through with --test_env=CI).
netns_require

for arg in "$@"; do
  case "$arg" in
    --coordinator=*) COORDINATOR_BIN="$(realpath "${arg#*=}")" ;;
    --agent=*) AGENT_BIN="$(realpath "${arg#*=}")" ;;
    --ctl=*) CTL="$(realpath "${arg#*=}")" ;;
    --manifests=*) MANIFESTS="$(realpath "${arg#*=}")" ;;
    --spec=*) SPEC="$(realpath "${arg#*=}")" ;;
    *) die "unknown argument $arg" ;;
  esac
done
for v in COORDINATOR_BIN AGENT_BIN CTL MANIFESTS SPEC; do
  [ -n "${!v:-}" ] || die "missing --${v,,} argument"
done

# Not skips: a machine set up by tools/install_deps.sh has these.
command -v kubectl >/dev/null 2>&1 || die "no kubectl on PATH: run tools/install_deps.sh"
PY=""
for candidate in /opt/substrax/venv/bin/python python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import yaml" 2>/dev/null; then
    PY="$candidate"; break
  fi
done
[ -n "$PY" ] || die "no Python with PyYAML (/opt/substrax/venv): run tools/install_deps.sh"
EXTRACT="$(dirname "$0")/multihost_extract.py"   # beside this script (Bazel's runfiles)
[ -f "$EXTRACT" ] || EXTRACT="$(dirname "$(realpath "$0")")/multihost_extract.py"

RUN="sxmh$$"
C_NS="$RUN-c"
W_NS=("$RUN-w1" "$RUN-w2")
readonly SUBNET_PREFIX=10.213.0   # private; exists only inside this run's namespaces
C_IP="$SUBNET_PREFIX.2"
W_IP=("$SUBNET_PREFIX.3" "$SUBNET_PREFIX.4")
PIDS=()
TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/multihost.XXXXXX")"

cleanup() {
  local rc=$?
  set +e
  trap - EXIT TERM INT HUP
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  # The worker stops its runners on SIGTERM (10 s each before SIGKILL); give them 15 s.
  for _ in $(seq 150); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  # Whatever is still in our namespaces (a stuck daemon, an orphaned runner) is ours: SIGKILL it,
  # then the namespaces go.
  netns_cleanup || rc=1
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && [ -d "$TMP" ]; then
    find "$TMP" -maxdepth 4 -name '*.log' -exec cp --parents {} "$TEST_UNDECLARED_OUTPUTS_DIR" \; 2>/dev/null
  fi
  if [ "$rc" != 0 ]; then
    for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "--- $f (last 40 lines)"; tail -n 40 "$f"; }; done
    for f in "$TMP"/*/work/*/*.log "$TMP"/*/work/*.log; do
      [ -f "$f" ] && { echo "--- $f (last 20 lines)"; tail -n 20 "$f"; }
    done
  fi
  rm -rf "$TMP"
  if [ -n "$NETNS_SKIPPED" ] && [ "$rc" = 0 ]; then :  # netns_skip said so
  elif [ "$rc" = 0 ]; then log "PASSED"; else log "FAILED (exit $rc); cleaned up"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP

# --- 1. Render the cpu overlay and extract the containers' command, args and env. -----------
# kustomize wants plain files, not Bazel's runfiles symlinks.
cp -rL "$MANIFESTS" "$TMP/k8s"
HOME="$TMP" timeout 60 kubectl kustomize "$TMP/k8s/overlays/cpu" >"$TMP/rendered.yaml" \
  || die "kubectl kustomize deploy/k8s/overlays/cpu failed"
eval "$("$PY" "$EXTRACT" --rendered "$TMP/rendered.yaml" --facts)"
[ "$WORKER_LISTEN_HOST_ARG" = '$(POD_IP)' ] \
  || die "the worker's --listen-host is $WORKER_LISTEN_HOST_ARG, not \$(POD_IP): this test assumes the pod IP"
CLUSTER_DOMAIN=cluster.local   # Kubernetes' default; the manifests assume none

# The substitution table: container path -> test path. The only changes made to what the
# manifests say; each is a path inside the image or on a volume, and multihost_extract.py checks
# that the directories are the container's volumeMounts and that no other path is left.
#   /usr/local/bin/substrax-coordinator  -> the built coordinator            (image)
#   /var/lib/substrax                    -> $TMP/<coordinator ns>/state      (PVC "state")
#   /usr/local/bin/substrax-agent        -> the built agent                  (image)
#   /var/lib/substrax-worker             -> $TMP/<worker ns>/work            (emptyDir "work")
#   /etc/substrax/tls (coordinator)      -> $TMP/<coordinator ns>/tls        (cert-manager Secret)
#   /etc/substrax/auth                   -> $TMP/<coordinator ns>/auth       (Secret substrax-auth)
#   /etc/substrax/tls (worker)           -> $TMP/<worker ns>/tls             (csi.cert-manager.io)
#   /var/lib/substrax-data               -> $TMP/<worker ns>/data, empty     (volume "data")
#   /var/lib/substrax/checkpoints        -> $TMP/checkpoints, one for both   (PVC, ReadWriteMany)
#   /usr/share/datasets/fashion-mnist    -> itself: the CPU image's example data, which this
#                                           host has at the same path (--image-path)
#   /tmp                                 -> not mapped: no flag names it (emptyDir "tmp")
#   /usr/share/datasets                  -> itself: the worker's --data-root, a directory of the
#                                           image (Fashion-MNIST); the test's jobs use no files
# Devices per worker: the test needs 2 (2 workers x 2 = the job's 4 devices). The cpu overlay's
# cpu-devices is 2 today; if it ever is not, ONLY that ConfigMap value is overridden to 2 here.
WORKER_DEVICE_OVERRIDE=()
manifest_devices="$("$PY" -c '
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("substrax-worker-options"):
        print((d.get("data") or {}).get("cpu-devices", ""))' "$TMP/rendered.yaml")"
if [ "$manifest_devices" != 2 ]; then
  log "the cpu overlay's cpu-devices is '$manifest_devices': overriding ONLY it to 2"
  WORKER_DEVICE_OVERRIDE=(--override-configmap "substrax-worker-options/cpu-devices=2")
fi

# The certificates cert-manager would issue (see the header), with openssl: EC P-256 keys in
# SEC1 PEM, as cert-manager writes them.
PKI="$TMP/pki"
mkdir -p "$PKI"
pki_key() { timeout 20 openssl ecparam -genkey -name prime256v1 -noout -out "$1" 2>/dev/null; }
pki_issue() {  # pki_issue OUT_DIR SUBJECT EXTENSIONS [DAYS]: OUT_DIR/{tls.key,tls.crt,ca.crt}
  local dir="$1" subject="$2" ext="$3" days="${4:-30}"
  mkdir -p "$dir"
  pki_key "$dir/tls.key" || die "openssl: no key for $subject"
  printf '%b\n' "$ext" >"$dir/ext.cnf"
  timeout 20 openssl req -new -key "$dir/tls.key" -subj "$subject" -out "$dir/tls.csr" \
    && timeout 20 openssl x509 -req -in "$dir/tls.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
         -CAcreateserial -days "$days" -extfile "$dir/ext.cnf" -out "$dir/tls.crt" 2>/dev/null \
    || die "openssl: cannot issue $subject"
  cp "$PKI/ca.crt" "$dir/ca.crt"
  rm -f "$dir/tls.csr" "$dir/ext.cnf"
}
command -v openssl >/dev/null 2>&1 || die "no openssl on PATH (Debian's openssl package)"
pki_key "$PKI/ca.key" || die "openssl: no CA key"
timeout 20 openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=substrax-ca" -days 365 \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
  -out "$PKI/ca.crt" || die "openssl: no CA certificate"
[ -n "$COORDINATOR_CERT_DNS" ] || die "the rendered Certificate substrax-coordinator has no dnsNames"
san=""
for n in $COORDINATOR_CERT_DNS; do san+="${san:+,}DNS:$n"; done
for n in $COORDINATOR_CERT_IPS; do san+="${san:+,}IP:$n"; done
# The workers expect --tls-server-name in it; the names this test dials must be there too.
for n in "$WORKER_TLS_SERVER_NAME" "$COORDINATOR_WORKER_SERVICE" "$COORDINATOR_SERVICE.$K8S_NAMESPACE"; do
  [[ " $COORDINATOR_CERT_DNS " == *" $n "* ]] || die "the coordinator's certificate does not name $n"
done
pki_issue "$TMP/$C_NS/tls" "/CN=$COORDINATOR_CERT_CN" \
  "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=$san"
pki_issue "$PKI/admin" "/O=substrax:admin/CN=admin" \
  "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
# Worker 2's certificate expires within a day: `substraxctl doctor` must say so (step 6).
for i in 0 1; do
  pki_issue "$TMP/${W_NS[$i]}/tls" "/O=substrax:worker/CN=substrax-worker-${W_NS[$i]}" \
    "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth" \
    "$([ "$i" = 1 ] && echo 1 || echo 30)"
done
# The coordinator's --auth-config: the files of the rendered Secret substrax-auth.
mkdir -p "$TMP/$C_NS/auth"
"$PY" - "$TMP/rendered.yaml" "$TMP/$C_NS/auth" <<'EOF'
import base64, os, re, sys, yaml
hits = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Secret"
        and re.fullmatch(r"substrax-auth(-[a-z0-9]+)?", d["metadata"]["name"])]
assert len(hits) == 1, "want one rendered Secret substrax-auth, got %d" % len(hits)
for key, value in (hits[0].get("data") or {}).items():
    with open(os.path.join(sys.argv[2], key), "wb") as f:
        f.write(base64.b64decode(value))
EOF
# The coordinator's --queues: the file of the rendered ConfigMap substrax-queues.
mkdir -p "$TMP/$C_NS/queues"
"$PY" - "$TMP/rendered.yaml" "$TMP/$C_NS/queues" <<'EOF'
import os, sys, yaml
hits = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"
        and d["metadata"]["name"] == "substrax-queues"]
assert len(hits) == 1, "want one rendered ConfigMap substrax-queues, got %d" % len(hits)
for key, value in hits[0]["data"].items():
    with open(os.path.join(sys.argv[2], key), "w") as f:
        f.write(value)
EOF

mkdir -p "$TMP/$C_NS/state" "$TMP/$C_NS/home" "$TMP/checkpoints"
log "coordinator ($C_NS, $C_IP):"
"$PY" "$EXTRACT" --rendered "$TMP/rendered.yaml" \
  --workload StatefulSet/substrax-coordinator --container coordinator \
  --field "spec.nodeName=$C_NS" --field "status.podIP=$C_IP" --field "status.hostIP=$C_IP" \
  --field "metadata.name=substrax-coordinator-0" --field "metadata.namespace=$K8S_NAMESPACE" \
  --map "/usr/local/bin/substrax-coordinator=$COORDINATOR_BIN" \
  --map "/var/lib/substrax=$TMP/$C_NS/state" \
  --map "/etc/substrax/tls=$TMP/$C_NS/tls" \
  --map "/etc/substrax/auth=$TMP/$C_NS/auth" \
  --map "/etc/substrax/queues=$TMP/$C_NS/queues" \
  --unmapped-mount /tmp \
  --out "$TMP/$C_NS/cmd"
for i in 0 1; do
  ns="${W_NS[$i]}"
  mkdir -p "$TMP/$ns/work" "$TMP/$ns/home" "$TMP/$ns/data"
  log "worker $((i + 1)) ($ns, ${W_IP[$i]}):"
  "$PY" "$EXTRACT" --rendered "$TMP/rendered.yaml" \
    --workload DaemonSet/substrax-worker --container worker \
    --field "spec.nodeName=$ns" --field "status.podIP=${W_IP[$i]}" --field "status.hostIP=${W_IP[$i]}" \
    --field "metadata.name=substrax-worker-$ns" --field "metadata.namespace=$K8S_NAMESPACE" \
    --map "/usr/local/bin/substrax-agent=$AGENT_BIN" \
    --map "/var/lib/substrax-worker=$TMP/$ns/work" \
    --map "/etc/substrax/tls=$TMP/$ns/tls" \
    --map "/var/lib/substrax-data=$TMP/$ns/data" \
    --map "/var/lib/substrax/checkpoints=$TMP/checkpoints" \
    --image-path /usr/share/datasets/fashion-mnist \
    --unmapped-mount /tmp \
    --image-path /usr/share/datasets \
    "${WORKER_DEVICE_OVERRIDE[@]}" \
    --out "$TMP/$ns/cmd"
done

# --- 2. The hosts: namespaces on a bridge that lives in a namespace of its own. --------------
netns_bridge "$RUN"
# /etc/hosts of every host: the coordinator Service and StatefulSet pod, the worker pods of the
# headless Service, as cluster DNS would answer them.
svc="$COORDINATOR_SERVICE.$K8S_NAMESPACE"
wsvc="$COORDINATOR_WORKER_SERVICE.$K8S_NAMESPACE"
HOSTS="127.0.0.1 localhost
::1 localhost ip6-localhost ip6-loopback
$C_IP $COORDINATOR_SERVICE $svc $svc.svc $svc.svc.$CLUSTER_DOMAIN substrax-coordinator-0.$svc.svc.$CLUSTER_DOMAIN
$C_IP $COORDINATOR_WORKER_SERVICE $wsvc $wsvc.svc $wsvc.svc.$CLUSTER_DOMAIN"
for i in 0 1; do
  HOSTS+="
${W_IP[$i]} substrax-worker-${W_NS[$i]}.$WORKER_SUBDOMAIN.$K8S_NAMESPACE.svc.$CLUSTER_DOMAIN"
done
[ "$WORKER_SUBDOMAIN" = "$WORKER_HEADLESS_SERVICE" ] \
  || die "the worker pods' subdomain ($WORKER_SUBDOMAIN) is not the headless Service ($WORKER_HEADLESS_SERVICE)"
for entry in "$C_NS=$C_IP" "${W_NS[0]}=${W_IP[0]}" "${W_NS[1]}=${W_IP[1]}"; do
  # With the pod's DNS search path.
  netns_host "${entry%=*}" "${entry#*=}" "$HOSTS" \
    "$K8S_NAMESPACE.svc.$CLUSTER_DOMAIN svc.$CLUSTER_DOMAIN $CLUSTER_DOMAIN"
done

# --- 3. Start the daemons: exactly the extracted argv and env. ---------------------------------
# A container's environment is the image's (PATH) plus the manifest's env; HOME is the temp dir.
start() {  # start NS NAME
  local ns="$1" name="$2" argv env
  mapfile -d '' -t argv <"$TMP/$ns/cmd.argv"
  mapfile -d '' -t env <"$TMP/$ns/cmd.env"
  ip netns exec "$ns" env -i PATH="$PATH" HOME="$TMP/$ns/home" "${env[@]}" "${argv[@]}" \
    >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_$name=$!"
}
ctl() {  # ctl NS SECONDS ARGS... : substraxctl inside a host's namespace (health: plaintext)
  local ns="$1" secs="$2"; shift 2
  ip netns exec "$ns" env -i PATH="$PATH" HOME="$TMP/$C_NS/home" timeout "$secs" "$CTL" "$@"
}
admin_ctl() {  # admin_ctl NS SECONDS ARGS... : substraxctl with the admin's certificate
  local ns="$1" secs="$2"; shift 2
  ip netns exec "$ns" env -i PATH="$PATH" HOME="$TMP/$C_NS/home" \
    SUBSTRAX_TLS_CA="$PKI/admin/ca.crt" SUBSTRAX_TLS_CERT="$PKI/admin/tls.crt" \
    SUBSTRAX_TLS_KEY="$PKI/admin/tls.key" timeout "$secs" "$CTL" "$@"
}
wait_serving() {  # wait_serving NAME PID ADDRESS SERVICE
  local name="$1" pid="$2" address="$3" service="$4" deadline=$((SECONDS + READY_S)) out
  while :; do
    kill -0 "$pid" 2>/dev/null || die "$name exited before it was ready (see its log below)"
    if out="$(ctl "$C_NS" 5 health --address "$address" --service "$service" 2>&1)" \
        && [ "$(echo "$out" | tr -d '[:space:]')" = SERVING ]; then
      log "$name serving at $address (service '${service}')"
      return 0
    fi
    [ "$SECONDS" -lt "$deadline" ] && [ "$(left)" -gt 0 ] \
      || die "$name not SERVING at $address (service '$service') within ${READY_S}s: $out"
    sleep 0.5
  done
}

start "$C_NS" coordinator
# Probed from the coordinator's namespace, across the bridge for the workers.
wait_serving coordinator "$PID_coordinator" "$C_IP:$COORDINATOR_HEALTH_PORT" ""
start "${W_NS[0]}" worker1
start "${W_NS[1]}" worker2
wait_serving worker1 "$PID_worker1" "${W_IP[0]}:$WORKER_HEALTH_PORT" substrax.worker.ready
wait_serving worker2 "$PID_worker2" "${W_IP[1]}:$WORKER_HEALTH_PORT" substrax.worker.ready

if [ -n "${MULTIHOST_TEST_FORCE_FAILURE:-}" ]; then
  die "MULTIHOST_TEST_FORCE_FAILURE is set: failing on purpose with every daemon running"
fi

# --- 4. The job, submitted from the coordinator's namespace through the Service name. --------
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] \
  || die "no Fashion-MNIST in /usr/share/datasets/fashion-mnist: run tools/install_deps.sh"
# Its checkpoints go under the workers' --checkpoint-root (the test's path for it).
CHECKPOINTS="$TMP/checkpoints/multihost"
"$PY" - "$SPEC" "$TMP/job.yaml" "$CHECKPOINTS" <<'EOF'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
s = spec["spec"]
assert s["mesh"] == {"data_parallel_size": 4}, s["mesh"]
assert "test" in s["data"], "the example spec has no test data"
s.pop("epochs", None)
s["steps"] = 60
s["checkpoint"] = {"directory": sys.argv[3], "every_steps": 20}
yaml.safe_dump(spec, open(sys.argv[2], "w"), sort_keys=False)
EOF
COORDINATOR_ADDRESS="$COORDINATOR_SERVICE.$K8S_NAMESPACE:$COORDINATOR_SERVICE_PORT"
log "submitting $TMP/job.yaml (steps: 60, checkpoints in $CHECKPOINTS) to $COORDINATOR_ADDRESS from $C_NS"
secs=$(( $(left) < JOB_S ? $(left) : JOB_S ))
[ "$secs" -ge 10 ] || die "the overall deadline (${OVERALL_S}s) is reached before the job"
set +e
# In the background and waited for, so that a SIGTERM (the overall timeout) runs the cleanup at
# once; the cleanup kills whatever is left in the namespaces, this client included.
admin_ctl "$C_NS" "$secs" --coordinator "$COORDINATOR_ADDRESS" submit "$TMP/job.yaml" --watch \
  >"$TMP/submit.log" 2>&1 &
wait $!
rc=$?
set -e
cat "$TMP/submit.log"
[ "$rc" = 0 ] || die "substraxctl submit --watch exited $rc (124: over ${secs}s)"
JOB_ID="$(head -n 1 "$TMP/submit.log" | tr -d '[:space:]')"
admin_ctl "$C_NS" 20 --coordinator "$COORDINATOR_ADDRESS" get "$JOB_ID" -o json >"$TMP/job.json" \
  || die "substraxctl get $JOB_ID failed"
admin_ctl "$C_NS" 20 --coordinator "$COORDINATOR_ADDRESS" workers -o json >"$TMP/workers.json" \
  || die "substraxctl workers failed"
# Worker ids are pod names (--worker-id=$(POD_NAME)): substrax-worker-<node>, as this test
# names the pods (metadata.name) and their certificates' CNs.
"$PY" - "$TMP/job.json" "$TMP/workers.json" "${W_NS[0]}=${W_IP[0]}" "${W_NS[1]}=${W_IP[1]}" <<'EOF'
import json, sys
job = json.load(open(sys.argv[1]))
workers = json.load(open(sys.argv[2]))
expected = dict(a.split("=", 1) for a in sys.argv[3:])   # node name -> namespace IP
errors = []
if job.get("state") != "JOB_STATE_SUCCEEDED":
    errors.append("job state %s, error %r" % (job.get("state"), job.get("error")))
devices = job.get("mesh", {}).get("devices", [])
hosts = sorted({d.get("host") for d in devices})
if len(devices) != 4 or hosts != sorted(expected):
    errors.append("mesh has %d devices on hosts %s, want 4 on %s" % (len(devices), hosts, sorted(expected)))
final = job.get("progress", {}).get("finalMetrics", job.get("progress", {}).get("final_metrics", {}))
if "test_accuracy" not in final:
    errors.append("no test_accuracy in final metrics %s" % final)
elif float(final["test_accuracy"]) < 0.5:
    # 40 steps on one host reach about 0.76 (0.1 is chance): far less after 60 means the
    # gradients were not averaged right across the hosts.
    errors.append("test_accuracy %s after 60 steps, want at least 0.5" % final["test_accuracy"])
# The workers registered their namespace IPs (--listen-host=$(POD_IP)), where Gloo binds.
listed = workers.get("workers", workers) if isinstance(workers, dict) else workers
seen = {}
ids = {}
for w in listed:
    seen[w.get("host") or w.get("workerId")] = w.get("address")
    ids[w.get("host")] = w.get("workerId", w.get("worker_id"))
for node, ip in expected.items():
    if seen.get(node) != ip:
        errors.append("worker %s registered address %r, want its namespace IP %s" % (node, seen.get(node), ip))
    if ids.get(node) != "substrax-worker-" + node:
        errors.append("worker on %s registered as %r, want its pod name substrax-worker-%s" % (node, ids.get(node), node))
if errors:
    print("multihost_test: job or workers wrong:\n  " + "\n  ".join(errors))
    print(json.dumps(job, indent=1)[:4000])
    print(json.dumps(workers, indent=1)[:2000])
    sys.exit(1)
print("multihost_test: job %s SUCCEEDED, test_accuracy=%s, mesh on %s, workers at %s"
      % (job.get("id"), final["test_accuracy"], hosts, sorted(seen.items())))
EOF
# The checkpoints, in the one directory both workers' --checkpoint-root stands for: the last one
# committed with its manifest and the shard file of each process (one per worker host).
last="$CHECKPOINTS/step-000000000060"
held() { find "$CHECKPOINTS" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>&1 | sort | tr '\n' ' '; }
for f in manifest.json process-00000.safetensors process-00001.safetensors; do
  [ -s "$last/$f" ] || die "no $f in $last; $CHECKPOINTS holds: $(held)"
done
log "checkpoints committed in $CHECKPOINTS: $(held)"

# The collectives' path, from each worker's runner log (<job>-attempt-<n>-process-<p>.log in its
# work dir; CpuGroupConnector's line per group and process).
for i in 0 1; do
  work="$TMP/${W_NS[$i]}/work"
  mapfile -t runner_logs < <(find "$work" -name '*-attempt-*-process-*.log' 2>/dev/null)
  [ "${#runner_logs[@]}" -gt 0 ] || die "no runner log in $work: $(ls -R "$work" 2>&1 | head -20)"
  line="$(grep -h '^collectives: world ' "${runner_logs[@]}" | head -n 1)"
  [[ "$line" == "collectives: world (4 ranks): hierarchical: 2 hosts (shared memory inside a host, Gloo between hosts)" ]] \
    || die "worker $((i + 1))'s runner did not connect the world hierarchically: '${line:-no collectives line}' in ${runner_logs[*]}"
  log "worker $((i + 1)): $line"
done

# --- 6. substraxctl doctor across the hosts, with worker 2's link slowed. ----------------------
# tc netem delays worker 2's packets where the kernel has netem; else tbf holds its egress to
# 80 Mbit/s (10 MB/s). Either way the one link between the hosts is named with what to do, as is
# worker 2's certificate (it expires within a day, step 2); the rest is OK.
if ip netns exec "${W_NS[1]}" tc qdisc add dev eth0 root netem delay 50ms 2>/dev/null; then
  SLOWED="netem delay 50ms"; SLOW_MARK="more than 20.00 ms"
else
  ip netns exec "${W_NS[1]}" tc qdisc add dev eth0 root tbf rate 80mbit burst 256kbit latency 500ms \
    || die "tc: neither netem nor tbf can slow worker 2's link"
  SLOWED="tbf rate 80mbit (no netem in this kernel)"; SLOW_MARK="below 50 MB/s"
fi
log "worker 2's eth0 slowed: $SLOWED; running substraxctl doctor"
rc=0
secs=$(left); [ "$secs" -ge 20 ] || die "the overall deadline (${OVERALL_S}s) is reached before doctor"
admin_ctl "$C_NS" "$secs" --coordinator "$COORDINATOR_ADDRESS" doctor --wait 120s >"$TMP/doctor.txt" \
  2>"$TMP/doctor.err" || rc=$?
cat "$TMP/doctor.txt" "$TMP/doctor.err"
[ "$rc" = 1 ] || die "substraxctl doctor exited $rc, want 1 (worker 2's certificate is a problem)"
secs=$(left); [ "$secs" -ge 20 ] || die "the overall deadline (${OVERALL_S}s) is reached before doctor"
admin_ctl "$C_NS" "$secs" --coordinator "$COORDINATOR_ADDRESS" doctor --wait 120s -o json \
  >"$TMP/doctor.json" 2>"$TMP/doctor-json.err" || true
"$PY" - "$TMP/doctor.json" "${W_NS[0]}" "${W_NS[1]}" "$SLOW_MARK" <<'EOF2'
import json, sys
s = json.load(open(sys.argv[1]))
w1, w2, slow_mark = "substrax-worker-" + sys.argv[2], "substrax-worker-" + sys.argv[3], sys.argv[4]
def g(d, key):  # substraxctl's JSON has the proto's field names
    return d.get(key)
errors = []
if g(s, "job_state") != "JOB_STATE_SUCCEEDED":
    errors.append("doctor job %s: %s" % (g(s, "job_state"), g(s, "job_error")))
by_worker = {g(w, "worker_id"): w for w in s.get("workers", [])}
tested = sorted(w for w, r in by_worker.items() if r.get("process_index", 0) >= 0)
if tested != sorted([w1, w2]):
    errors.append("tested %s, want both workers" % tested)
def findings(worker, check):
    return [f for f in by_worker.get(worker, {}).get("findings", []) if f.get("check", "").startswith(check)]
for w in (w1, w2):
    for check in ("cpu", "data root /usr/share/datasets", "clock", "work dir"):
        got = findings(w, check)
        if len(got) != 1 or got[0].get("verdict") != "DOCTOR_VERDICT_OK":
            errors.append("%s %s: %s, want one OK" % (w, check, got))
cert1, cert2 = findings(w1, "certificate"), findings(w2, "certificate")
if len(cert1) != 1 or cert1[0].get("verdict") != "DOCTOR_VERDICT_OK":
    errors.append("%s certificate: %s, want OK (30 days)" % (w1, cert1))
if (len(cert2) != 1 or cert2[0].get("verdict") != "DOCTOR_VERDICT_PROBLEM"
        or "expires in 23h" not in cert2[0].get("seen", "") or "certs issue" not in cert2[0].get("fix", "")):
    errors.append("%s certificate: %s, want a PROBLEM: expires in 23h, with what to do" % (w2, cert2))
links = [f for w in by_worker for f in findings(w, "link to ")]
if (len(links) != 1 or links[0].get("verdict") != "DOCTOR_VERDICT_WARNING"
        or slow_mark not in links[0].get("seen", "") or "network path" not in links[0].get("fix", "")):
    errors.append("links: %s, want one WARNING saying '%s', with what to do" % (links, slow_mark))
if errors:
    print("multihost_test: doctor wrong:\n  " + "\n  ".join(errors))
    print(json.dumps(s, indent=1)[:6000])
    sys.exit(1)
print("multihost_test: doctor named the slowed link (%s) and worker 2's certificate (%s)"
      % (links[0]["seen"], cert2[0]["seen"]))
EOF2
