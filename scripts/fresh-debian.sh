#!/usr/bin/env bash
# Runs a command on a clone of this repository's HEAD inside a brand-new Debian 12 root
# (debootstrap --variant=minbase bookworm): a new user's machine, with nothing installed by hand.
#   scripts/fresh-debian.sh COMMAND...      e.g. scripts/fresh-debian.sh scripts/dev.sh test
# Only committed work travels (the clone is of HEAD). Needs root (or sudo) for debootstrap,
# mounts and chroot. Environment:
#   FRESH_WITH_CUDA=1   mount this machine's CUDA toolkit (/usr/local/cuda) read-only into the root
#                       and put its bin/ on PATH: a user's machine with CUDA installed
#   FRESH_DIR=DIR       where roots and caches live (default /var/tmp/mixprec-fresh)
#   MIXPREC_CUDA_ARCHS  passed on to the command (scripts/dev.sh builds those CUDA architectures)
# Cached between runs on one machine: the pristine base root (a tarball) and downloaded .deb files.
# Everything the project installs is installed anew in every run. Mounts are released and the root
# removed when the run ends, fails or is interrupted; a root that a killed run left behind is
# cleared by the next run.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/fresh-debian.sh COMMAND..." >&2; exit 2; }
if [ "$(id -u)" -ne 0 ]; then exec sudo --preserve-env=FRESH_WITH_CUDA,FRESH_DIR,MIXPREC_CUDA_ARCHS "$0" "$@"; fi

repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse HEAD)
dir=${FRESH_DIR:-/var/tmp/mixprec-fresh}
base_tar=$dir/base-bookworm.tar
debs=$dir/debs
mkdir -p "$dir" "$debs"
log() { echo "fresh-debian: $*" >&2; }

# Mount points at or below $1, deepest first (mountinfo field 5; octal escapes left as they are).
mounts_under() { awk -v r="$1" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo | sort -r; }

# Releases every mount under a root, then removes it. Refuses to delete while anything is mounted
# there: rm must never walk into the host's /dev or /sys.
clear_root() {
  local root=$1 m p
  # Processes still running inside it (a killed run's command lives on in its own session).
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -KILL "${p#/proc/}" 2>/dev/null
  done
  for m in $(mounts_under "$root"); do umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  if [ -n "$(mounts_under "$root")" ]; then
    log "cannot release the mounts under $root; left in place"
    return 1
  fi
  rm -rf --one-file-system "$root"
}

# Roots of earlier runs whose process is gone (killed before its trap ran).
for old in "$dir"/root.*; do
  [ -d "$old" ] || continue
  pid=${old##*.}
  if ! kill -0 "$pid" 2>/dev/null; then
    log "clearing $old, left by an interrupted run"
    clear_root "$old"
  fi
done

command -v debootstrap >/dev/null || {
  log "installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}

# This machine's Debian mirror, as its apt sources name it.
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

# The pristine base, made once (under a lock, so two runs do not both make it).
exec 9>"$dir/base.lock"
flock 9
if [ ! -s "$base_tar" ]; then
  log "making the base root with debootstrap from $mirror (once per machine)"
  tmp=$(mktemp -d "$dir/base.XXXX")
  if ! debootstrap --variant=minbase bookworm "$tmp" "$mirror" >"$dir/debootstrap.log" 2>&1; then
    log "debootstrap failed; see $dir/debootstrap.log"
    rm -rf --one-file-system "$tmp"
    exit 1
  fi
  chmod 755 "$tmp"  # mktemp's 0700 would become the root's /, which apt's _apt user cannot enter
  tar -C "$tmp" -cf "$base_tar.tmp" . && mv "$base_tar.tmp" "$base_tar"
  rm -rf --one-file-system "$tmp"
fi
flock -u 9

root=$dir/root.$$
child=
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  clear_root "$root" || rc=1
  exit "$rc"
}
# On a signal, end the whole command inside the root first: nothing may hold the mounts.
on_signal() {
  if [ -n "$child" ]; then
    kill -TERM -- "-$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

mkdir "$root"
tar -C "$root" -xf "$base_tar"
chmod 755 "$root"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
  rm -f "$root/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
mount --bind "$debs" "$root/var/cache/apt/archives"
mkdir -p "$root/var/cache/apt/archives/partial"
chroot "$root" chown _apt:root /var/cache/apt/archives/partial

path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "${FRESH_WITH_CUDA:-0}" = 1 ]; then
  cuda=$(readlink -f /usr/local/cuda)
  [ -d "$cuda" ] || { log "FRESH_WITH_CUDA=1 but there is no /usr/local/cuda here"; exit 1; }
  mkdir -p "$root$cuda" && mount --bind -o ro "$cuda" "$root$cuda"
  [ -e "$root/usr/local/cuda" ] || ln -s "$cuda" "$root/usr/local/cuda"
  path=/usr/local/cuda/bin:$path
fi

mkdir -p "$root/w"
git clone -q --no-hardlinks "$repo" "$root/w/repo"
git -C "$root/w/repo" checkout -q --detach "$commit"
log "running '$*' on $(git -C "$repo" log -1 --format='%h %s' "$commit" | cut -c1-70) in $root"
# In its own session, in the background: a signal to this script interrupts `wait` at once, and
# on_signal can end every process of the command.
setsid chroot "$root" /usr/bin/env -i HOME=/root PATH="$path" LANG=C.UTF-8 CI="${CI:-}" \
  ${MIXPREC_CUDA_ARCHS:+MIXPREC_CUDA_ARCHS="$MIXPREC_CUDA_ARCHS"} \
  /bin/bash -c 'cd /w/repo && "$@"' bash "$@" &
child=$!
wait "$child"
