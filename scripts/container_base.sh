#!/usr/bin/env bash
# Make sure podman can build and run mtserve images on this machine, and build a local Debian
# bookworm base image with debootstrap (base images cannot be pulled here), tagged
# localhost/mtserve-base:bookworm (python3 + venv + ca-certificates). Idempotent; needs root.
#
#   scripts/container_base.sh            # prints the base image's name when done
set -euo pipefail

BASE_IMAGE=${BASE_IMAGE:-localhost/mtserve-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

need=()
command -v podman >/dev/null || need+=(podman runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
  echo "installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" uidmap >&2
fi

# No systemd here: cgroupfs, runc, and no default ulimits (the machine's hard limits are lower
# than podman's defaults).
conf=/etc/containers/containers.conf
if ! grep -q '^cgroup_manager = "cgroupfs"' "$conf" 2>/dev/null; then
  mkdir -p /etc/containers
  cat >> "$conf" <<'CONF'
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
CONF
fi

if podman image exists "$BASE_IMAGE"; then
  echo "$BASE_IMAGE"
  exit 0
fi
root=$(mktemp -d /var/tmp/mtserve-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm into $root" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$MIRROR" >&2
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >&2
echo "$BASE_IMAGE"
