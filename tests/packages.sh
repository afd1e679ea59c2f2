# Sourced by the test scripts: ensure_packages installs the Debian packages
# named that are not installed, checked by package name (dpkg-query), so a
# script never relies on what another script or CI happened to install.
# Recommends are not installed, so each script names all it needs.
ensure_packages() {
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f '${Status}' "$package" 2>/dev/null | grep -q ' installed$' || missing+=("$package")
  done
  ((${#missing[@]})) || return 0
  echo "installing ${missing[*]}" >&2
  apt_install "${missing[@]}"
}

# Installs the packages named (update first), one script at a time: two
# scripts run side by side (./demo and a test script, or the cluster and
# the Docker engine coming up) would otherwise fail on apt's lock.
apt_install() {
  (
    flock -w 900 9 || { echo "packages: apt stayed busy for 15 min" >&2; exit 1; }
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  ) 9>/var/lock/mcp-k8s-ephemeral-job-apt.lock
}
