# Shared settings for tests/cluster/{up,down,status,smoke}. Sourced, not run.
# shellcheck shell=bash
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="${MCP_K8S_TEST_CLUSTER_DIR:-/var/lib/mcp-k8s-test-cluster}"
CACHE="${MCP_K8S_TEST_CLUSTER_CACHE:-/var/cache/mcp-k8s-test-cluster}"
BIN="$CACHE/bin"
KUBE="$BIN/kube"
PKI="$STATE/pki"
RUN="$STATE/run"
LOGS="$STATE/logs"
CONTAINERD_SOCK="$RUN/containerd.sock"
# containerd's content store and snapshots live in the cache dir, so imported
# images survive down/up (down removes every container and sandbox first).
CONTAINERD_ROOT="$CACHE/containerd-root"

# Network layout (all on this machine; nothing is routed off it).
NODE_NAME="mcp-k8s-test-node"
BRIDGE="mcp-k8s0"
POD_CIDR="10.244.0.0/24"
BRIDGE_IP="10.244.0.1"           # gateway of the pod bridge = node IP = API advertise address
# The bridge's own MAC, set once: a Linux bridge left to choose takes the
# lowest MAC of its ports and changes it as pods come and go. A pod that
# learned the gateway's MAC while it was another pod's veth then reaches
# nothing on the node once that pod is gone, until its ARP entry expires
# (up to ~50 s: the clone tests' "could not connect to 10.244.0.1").
BRIDGE_MAC="02:6d:63:70:6b:01"
# Pods get .2-.239; .240-.254 are for tests' own network namespaces on the
# bridge (tests/on_cluster/network.rs), so they never meet a pod's address.
POD_RANGE_END="10.244.0.239"
SERVICE_CIDR="10.96.0.0/24"
KUBERNETES_SVC_IP="10.96.0.1"
API_PORT="${MCP_K8S_TEST_API_PORT:-6443}"
ETCD_PORT=2379
ETCD_PEER_PORT=2380
KUBELET_PORT=10250
FW_CHAIN="MCP-K8S-TEST"         # our iptables chains, table mangle (INPUT guard + FORWARD guard)
# kube-router's NetworkPolicy firewall (tests/cluster/build-kube-router), the
# binary keyed by version in the cache.
KUBE_ROUTER_VERSION="v2.1.0"
KUBE_ROUTER="$BIN/kube-router-$KUBE_ROUTER_VERSION"

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy kube-router)

export PATH="$BIN:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"

kubectl_admin() { "$KUBE" kubectl --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

pid_of() { # component -> pid if running
  local f="$RUN/$1.pid" p
  [[ -s "$f" ]] || return 1
  p="$(cat "$f")"
  [[ -d /proc/$p ]] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null || return 1
  echo "$p"
}

healthy() { # component -> 0 when its health endpoint answers
  case "$1" in
    etcd) [[ "$(curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null)" == *'"health":"true"'* ]] ;;
    kube-apiserver) curl -fsS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
                      "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1 ;;
    kube-controller-manager) curl -fsSk --max-time 2 https://127.0.0.1:10257/healthz >/dev/null 2>&1 ;;
    kube-scheduler) curl -fsSk --max-time 2 https://127.0.0.1:10259/healthz >/dev/null 2>&1 ;;
    containerd) ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1 ;;
    kubelet) curl -fsS --max-time 2 http://127.0.0.1:10248/healthz >/dev/null 2>&1 ;;
    kube-proxy) curl -fsS --max-time 2 http://127.0.0.1:10256/healthz >/dev/null 2>&1 ;;
    # No health port (--health-port=0): healthy once its chains are in place
    # (up also checks that a policy change is enforced).
    kube-router) iptables -w -S KUBE-ROUTER-FORWARD >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}
