# Shared settings for tests/docker/{up,down}. Sourced, not run.
# shellcheck shell=bash
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# Everything the test engine owns lives under one directory, apart from the
# system's own Docker (/var/lib/docker, /run/docker.sock), which we never touch.
STATE="${MCP_K8S_TEST_DOCKER_DIR:-/var/lib/mcp-k8s-test-docker}"
SOCK="$STATE/docker.sock"
DATA_ROOT="$STATE/data"
EXEC_ROOT="$STATE/exec"
PIDFILE="$STATE/dockerd.pid"
LOG="$STATE/dockerd.log"
# The test cluster's containerd uses namespace k8s.io on its own socket
# (/var/lib/mcp-k8s-test-cluster/run/containerd.sock); dockerd starts its own
# managed containerd under $EXEC_ROOT/containerd with a namespace of ours, so
# the two share neither socket, state nor namespace.
# A second, private daemon (the on_docker_alone tier) sets its own state
# directory and namespace, so the two never share anything.
CONTAINERD_NAMESPACE="${MCP_K8S_TEST_DOCKER_NAMESPACE:-mcp-k8s-docker}"
# The network namespace dockerd runs in (`ip netns`, /run/netns/$NETNS): its
# bridges, iptables rules and NAT live there, never in the host's firewall
# (the test cluster's kube-router and kube-proxy rules).
# Named after $STATE, so an engine with another state directory gets its own.
NETNS="${STATE##*/}"
CLUSTER_CACHE="${MCP_K8S_TEST_CLUSTER_CACHE:-/var/cache/mcp-k8s-test-cluster}"
IMAGES_DIR="$CLUSTER_CACHE/images"
export DOCKER_HOST="unix://$SOCK"

dockerd_pid() { # -> pid of our dockerd if it runs
  local p
  [[ -s "$PIDFILE" ]] || return 1
  p="$(cat "$PIDFILE")"
  [[ -d /proc/$p ]] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null || return 1
  [[ "$(tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline")" == *dockerd*"$SOCK"* ]] || return 1
  echo "$p"
}

pinged() { # -> 0 when our daemon answers /_ping
  [[ -S "$SOCK" ]] && [[ "$(curl -fsS --max-time 2 --unix-socket "$SOCK" http://docker/_ping 2>/dev/null)" == OK ]]
}

in_netns() { # $1: pid -> 0 when it runs in $NETNS
  [[ -e /run/netns/$NETNS ]] || return 1
  [[ "$(stat -L -c %i "/proc/$1/ns/net" 2>/dev/null)" == "$(stat -L -c %i "/run/netns/$NETNS")" ]]
}
