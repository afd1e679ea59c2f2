# Shared settings for tests/podman/{up,down}. Sourced, not run.
# shellcheck shell=bash
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# Everything this Podman owns lives under $STATE (storage, volumes, libpod's
# database, events) and $RUN (runroot, tmpdir, the socket), apart from the
# system's own Podman (/var/lib/containers, /run/containers, /run/podman),
# which we never touch.
STATE="${MCP_K8S_TEST_PODMAN_DIR:-/var/lib/mcp-k8s-test-podman}"
RUN="${MCP_K8S_TEST_PODMAN_RUN:-/run/mcp-podman}"
SOCK="$RUN/podman.sock"
PIDFILE="$STATE/service.pid"
LOG="$STATE/service.log"
CLUSTER_CACHE="${MCP_K8S_TEST_CLUSTER_CACHE:-/var/cache/mcp-k8s-test-cluster}"
IMAGES_DIR="$CLUSTER_CACHE/images"
export DOCKER_HOST="unix://$SOCK"

# The same global flags for the service and for every `podman` run here, so
# the CLI (image load, cleanup) sees the service's storage and database.
# cgroupfs: no systemd in this VM. The events log is a file under $RUN; the
# network config dir is ours, so nothing lands in /etc/cni or
# /etc/containers/networks (the backend only uses network `none`).
# runc, not crun: Debian's podman brings crun when runc is not installed
# yet, and Podman prefers it, but crun 1.8 refuses this VM's cgroups
# ("cgroups in hybrid mode not supported"); `up` installs runc.
# Our own containers.conf (written by `up`): with CONTAINERS_CONF set, Podman
# reads that file and no system one.
export CONTAINERS_CONF="$STATE/containers.conf"
PODMAN_FLAGS=(
  --root "$STATE/storage"
  --runroot "$RUN/runroot"
  --tmpdir "$RUN/tmp"
  --volumepath "$STATE/volumes"
  --network-config-dir "$STATE/networks"
  --cgroup-manager cgroupfs
  --events-backend file
  --storage-driver overlay
  --runtime runc
)

pm() { # podman on our storage
  podman "${PODMAN_FLAGS[@]}" "$@"
}

service_pid() { # -> pid of our `podman system service` if it runs
  local p
  [[ -s "$PIDFILE" ]] || return 1
  p="$(cat "$PIDFILE")"
  [[ -d /proc/$p ]] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null || return 1
  [[ "$(tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline")" == *podman*service*"$SOCK"* ]] || return 1
  echo "$p"
}

pinged() { # -> 0 when our service answers /_ping
  [[ -S "$SOCK" ]] && [[ "$(curl -fsS --max-time 2 --unix-socket "$SOCK" http://d/_ping 2>/dev/null)" == OK ]]
}
