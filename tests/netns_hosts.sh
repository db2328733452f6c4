# Network-namespace "hosts" on a bridge, for tests that run real processes on real networks
# (sourced by tests/k8s/multihost_test.sh and tests/chaos/partition_test.sh).
#
# The caller defines log() and die(), sets NETNS_TEST (its name, for messages), and then:
#   netns_require [CMD...]  root, a working `ip netns` and every CMD on PATH, or skip: exit 0
#                           saying so, except under CI=true (CI has them), where it fails
#   netns_bridge RUN        namespace RUN-br holding bridge br0
#   netns_host NS IP HOSTS  namespace NS whose eth0 (IP/24) is a port of br0; HOSTS (text of an
#                           /etc/hosts) and a resolv.conf with no reachable DNS in /etc/netns/NS
#   netns_partition NS      every packet in or out of NS's eth0 dropped (nftables): peers see
#                           silence, not refused connections. netns_heal NS removes the rule.
#   netns_cleanup           SIGKILL what still runs in the namespaces, delete them and their
#                           /etc/netns entries; returns 1 when a namespace could not be deleted
# Every link and address lives in those namespaces; nothing is added to the root namespace (the
# veth pairs are created inside RUN-br and their peers moved straight into the hosts). Names are
# per run, so parallel runs do not collide.

NETNS_CREATED=()
NETNS_SKIPPED=""
NETNS_ETC_EXISTED=""; [ -d /etc/netns ] && NETNS_ETC_EXISTED=1
NETNS_N=0

netns_skip() {
  if [ "${CI:-}" = true ]; then
    log "FAIL: CI=true, but $NETNS_TEST cannot run: $*" >&2
    exit 1
  fi
  NETNS_SKIPPED=1
  log "$*"
  log "SKIPPED: $NETNS_TEST did not run (it needs root and ip netns; CI has both)"
  exit 0
}

netns_require() {
  [ "$(id -u)" = 0 ] || netns_skip "not root (uid $(id -u)): network namespaces need root"
  command -v ip >/dev/null 2>&1 || netns_skip "no ip (iproute2) on PATH"
  ip netns list >/dev/null 2>&1 || netns_skip "ip netns is unavailable: $(ip netns list 2>&1 | head -1)"
  local cmd
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null 2>&1 || die "no $cmd on PATH: run tools/install_deps.sh"
  done
}

netns_add() {
  ip netns add "$1" || netns_skip "ip netns add $1 failed (no permission to create network namespaces?)"
  NETNS_CREATED+=("$1")
  ip -n "$1" link set lo up
}

netns_bridge() {
  NETNS_BR="$1-br"
  netns_add "$NETNS_BR"
  ip -n "$NETNS_BR" link add br0 type bridge
  ip -n "$NETNS_BR" link set br0 up
}

netns_host() {  # netns_host NS IP HOSTS [SEARCH]
  local ns="$1" addr="$2" hosts="$3" search="${4:-}"
  NETNS_N=$((NETNS_N + 1))
  netns_add "$ns"
  ip -n "$NETNS_BR" link add "veth$NETNS_N" type veth peer name eth0 netns "$ns"
  ip -n "$NETNS_BR" link set "veth$NETNS_N" master br0 up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  # (retried: a parallel run may remove an empty /etc/netns between mkdir -p's two steps)
  for _ in 1 2 3; do mkdir -p "/etc/netns/$ns" 2>/dev/null && break; done
  printf '%s\n' "$hosts" >"/etc/netns/$ns/hosts"
  # The only nameserver is this host's loopback, where nothing listens: no query leaves the
  # namespace and every name comes from hosts.
  { [ -z "$search" ] || echo "search $search"
    printf 'nameserver 127.0.0.1\noptions ndots:5\n'; } >"/etc/netns/$ns/resolv.conf"
}

netns_partition() {
  ip netns exec "$1" nft -f - <<'EOF'
table inet substrax_partition {
  chain in { type filter hook input priority 0; iifname "eth0" drop; }
  chain out { type filter hook output priority 0; oifname "eth0" drop; }
}
EOF
}

netns_heal() {
  ip netns exec "$1" nft delete table inet substrax_partition
}

netns_cleanup() {
  local ns pid rc=0
  for ns in "${NETNS_CREATED[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  for ns in "${NETNS_CREATED[@]}"; do
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  # /etc/netns itself only if this run made it and no other run uses it now.
  [ -n "$NETNS_ETC_EXISTED" ] || rmdir /etc/netns 2>/dev/null
  for ns in "${NETNS_CREATED[@]}"; do
    if ip netns list 2>/dev/null | grep -q "^$ns\b"; then
      log "cleanup left namespace $ns"
      rc=1
    fi
  done
  return "$rc"
}
