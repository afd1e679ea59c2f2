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
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
