#!/usr/bin/env bash
# Build a small local OCI image for trying sluice out and for its tests:
# static busybox, plus (optionally) a sluice binary and the shared libraries
# it links against, so that `sluice probe ...` runs inside the container, and
# any other host binaries named with --add (with their libraries; the tests
# add nft to show that a container allowed to flush its ruleset still gets
# nowhere). No registry is involved: the root filesystem is assembled in a
# temp dir and handed to `podman import`.
#
#   containers/build-image.sh [--sluice PATH] [--add PATH]... [--tag NAME:TAG]
#
# Prints the image name on stdout. Default tag: localhost/sluice-busybox:latest.
# Needs podman and busybox-static (apt-get install --no-install-recommends
# podman busybox-static); run as root (the tests and `sluice oci` do).
set -euo pipefail

tag=localhost/sluice-busybox:latest
sluice=
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag=$2; shift 2 ;;
        --tag=*) tag=${1#--tag=}; shift ;;
        --sluice) sluice=$2; shift 2 ;;
        --sluice=*) sluice=${1#--sluice=}; shift ;;
        --add) extra+=("$2"); shift 2 ;;
        --add=*) extra+=("${1#--add=}"); shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "build-image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

# Debian's busybox-static installs a statically linked /bin/busybox; a
# dynamic one would need its libraries in the image too.
is_static() { [ -x "$1" ] && [[ "$(LC_ALL=C ldd "$1" 2>&1 || true)" == *'not a dynamic'* ]]; }
busybox=
for candidate in "$(command -v busybox || true)" /bin/busybox /usr/bin/busybox; do
    if [ -n "$candidate" ] && is_static "$candidate"; then busybox=$candidate; break; fi
done
if [ -z "$busybox" ]; then
    echo "build-image.sh: a static busybox is needed: apt-get install --no-install-recommends busybox-static" >&2
    exit 3
fi
command -v podman >/dev/null || { echo "build-image.sh: podman not found: apt-get install --no-install-recommends podman runc" >&2; exit 3; }

work=$(mktemp -d -t sluice-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{bin,sbin,usr/bin,usr/local/bin,etc,proc,sys,dev,tmp,root,var/tmp}
chmod 1777 "$root/tmp" "$root/var/tmp"
cp "$busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
    [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done

# Copy a dynamically linked program and the libraries it needs, at the
# paths the dynamic loader looks for them.
add_program() { # SOURCE DEST
    cp -L "$1" "$2"
    local lib
    for lib in $(ldd "$1" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [ -e "$root$lib" ] && continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
}

if [ -n "$sluice" ]; then
    [ -x "$sluice" ] || { echo "build-image.sh: $sluice is not an executable" >&2; exit 2; }
    add_program "$sluice" "$root/usr/local/bin/sluice"
    # A debug build carries over 100 MiB of debug info: strip the copy.
    strip "$root/usr/local/bin/sluice" 2>/dev/null || true
fi
for program in "${extra[@]}"; do
    path=$(command -v "$program" || true)
    [ -n "$path" ] || { echo "build-image.sh: --add $program: not found" >&2; exit 2; }
    add_program "$path" "$root/usr/local/bin/$(basename "$path")"
done

cat > "$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
: > "$root/etc/hosts"; : > "$root/etc/resolv.conf"; : > "$root/etc/hostname"

tar -C "$root" -c . | podman import -q \
    --change 'CMD ["/bin/sh"]' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/sbin' \
    - "$tag" >/dev/null
echo "$tag"
