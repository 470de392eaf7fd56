#!/usr/bin/env bash
# Build the guest kit for sluice's microVM tests: a kernel and an initramfs
# that boot under `qemu-system-x86_64 -M microvm -accel tcg`.
#
#   containers/vm/build-guest.sh [--kit DIR] [--no-sluice] [--quiet]
#
# - kernel: Debian's cloud kernel (linux-image-cloud-amd64 names the current
#   package), fetched with `apt-get download` and cached as a .deb (as root,
#   the package lists are updated first when apt does not know it yet);
# - initramfs: static busybox, the virtio modules (virtio_mmio, virtio_net,
#   virtio_console) in the order their own `depends=` fields give, the
#   guest's /init and udhcpc hook from this directory, and sluice itself
#   built static (`sluice probe http|tls|tcp|udp|icmp|dns` inside the guest,
#   no libc there) into target/guest.
#
# Idempotent: the .deb, the extracted kernel and the initramfs are kept in
# the kit directory (default: target/vm-kit in the repository, or
# $SLUICE_VM_KIT) and rebuilt only when an input changed. Progress goes to
# stderr; stdout gets three lines a script can read:
#   kit=DIR  kernel=PATH  initrd=PATH
# Exit status: 0 built or up to date, 2 bad arguments, 3 a missing tool or
# package (the message says what to install), 4 a failed download or build.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
kit=${SLUICE_VM_KIT:-$repo/target/vm-kit}
with_sluice=1
quiet=
while [ $# -gt 0 ]; do
    case "$1" in
        --kit) kit=$2; shift 2 ;;
        --kit=*) kit=${1#--kit=}; shift ;;
        --no-sluice) with_sluice=; shift ;;
        --quiet) quiet=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "build-guest.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
say() { [ -n "$quiet" ] || echo "build-guest.sh: $*" >&2; }
die() { echo "build-guest.sh: $2" >&2; exit "$1"; }

# ---- what must be installed -------------------------------------------------
# ldd says "not a dynamic executable" of a static binary, "statically
# linked" of a static-pie one (Rust's crt-static).
is_static() {
    [ -x "$1" ] || return 1
    case "$(LC_ALL=C ldd "$1" 2>&1 || true)" in *'not a dynamic'*|*'statically linked'*) return 0 ;; esac
    return 1
}
busybox=
for candidate in "$(command -v busybox || true)" /bin/busybox /usr/bin/busybox; do
    if [ -n "$candidate" ] && is_static "$candidate"; then busybox=$candidate; break; fi
done
[ -n "$busybox" ] || die 3 "a static busybox is needed: apt-get install --no-install-recommends busybox-static"
for tool in apt-get apt-cache dpkg-deb tar gzip sha256sum; do
    command -v "$tool" >/dev/null || die 3 "$tool not found: this script needs Debian's apt and dpkg (and coreutils, tar, gzip)"
done
if [ -n "$with_sluice" ]; then
    command -v cargo >/dev/null || die 3 "cargo not found: install Rust (rustup) or pass --no-sluice"
    [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || die 3 "static glibc not found: apt-get install --no-install-recommends libc6-dev"
fi

mkdir -p "$kit/debs"
kit=$(cd "$kit" && pwd)
say "kit directory: $kit"

# ---- 1. kernel ------------------------------------------------------------------
# The meta package names the versioned one; without apt lists (a fresh
# machine), a .deb already in the cache is used.
kernel_package() {
    apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/{print $2; exit}' || true
}
kpkg=$(kernel_package)
cached=$(cd "$kit/debs" && ls linux-image-*-cloud-amd64_*.deb 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$kpkg" ] && [ -z "$cached" ] && [ "$(id -u)" = 0 ]; then
    say "apt knows no linux-image-cloud-amd64 yet: apt-get update"
    apt-get update -qq >&2 || true
    kpkg=$(kernel_package)
fi
if [ -z "$kpkg" ]; then
    [ -n "$cached" ] || die 3 "apt knows no linux-image-cloud-amd64: run apt-get update (Debian's package lists) and try again"
    kpkg=${cached%%_*}
fi
deb=$(cd "$kit/debs" && ls "${kpkg}"_*.deb 2>/dev/null | head -1 || true)
if [ -z "$deb" ]; then
    say "downloading $kpkg (about 26 MiB)"
    # apt-get download writes into the current directory; the sandbox user
    # `_apt` may not write there, so fetch into a temp dir apt may use.
    tmp=$(mktemp -d)
    chmod 0777 "$tmp"
    ( cd "$tmp" && apt-get download -qq "$kpkg" ) >&2 || { rm -rf "$tmp"; die 4 "apt-get download $kpkg failed"; }
    mv "$tmp"/"${kpkg}"_*.deb "$kit/debs/"
    rm -rf "$tmp"
    deb=$(cd "$kit/debs" && ls "${kpkg}"_*.deb | head -1)
fi
kdir=$kit/$kpkg
if [ ! -e "$kdir/.extracted" ]; then
    say "extracting the kernel and its virtio modules from $deb"
    rm -rf "$kdir"
    mkdir -p "$kdir"
    dpkg-deb --fsys-tarfile "$kit/debs/$deb" | tar -x -C "$kdir" --wildcards \
        './boot/vmlinuz-*' \
        './lib/modules/*/kernel/drivers/virtio/*' \
        './lib/modules/*/kernel/drivers/net/virtio_net.ko*' \
        './lib/modules/*/kernel/drivers/net/net_failover.ko*' \
        './lib/modules/*/kernel/net/core/failover.ko*' \
        './lib/modules/*/kernel/drivers/char/virtio_console.ko*' ||
        die 4 "cannot extract $deb (a damaged download? delete it and run again)"
    touch "$kdir/.extracted"
fi
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* | head -1)

# ---- 2. modules in dependency order -----------------------------------------------
# Each .ko names what it needs in its modinfo "depends=" string; visiting
# those first gives an insmod order without kmod or depmod in the guest.
modfile() { find "$kdir/lib/modules" \( -name "$1.ko" -o -name "$1.ko.xz" \) | head -1; }
modinfo_depends() {
    local f=$1
    if [[ $f == *.xz ]]; then
        command -v xz >/dev/null || die 3 "xz not found (the modules are compressed): apt-get install --no-install-recommends xz-utils"
        xz -dc "$f"
    else
        cat "$f"
    fi | grep -a -o -m1 'depends=[a-z0-9_,-]*' | sed 's/^depends=//' || true
}
order=() seen=" "
visit() {
    local m=$1 f d
    case "$seen" in *" $m "*) return ;; esac
    seen+="$m "
    f=$(modfile "$m")
    [ -n "$f" ] || die 4 "module $m is not in $kpkg (is it built in? then drop it from the list)"
    for d in $(modinfo_depends "$f" | tr ',' ' '); do visit "$d"; done
    order+=("$m")
}
for m in virtio_mmio virtio_net virtio_console; do visit "$m"; done

# ---- 3. sluice, static --------------------------------------------------------------
sluice_bin=
if [ -n "$with_sluice" ]; then
    say "building sluice static for the guest (target/guest; minutes the first time)"
    # Run from a test, this inherits cargo's CARGO_* variables; ring's build
    # script tracks CARGO_MANIFEST_DIR, so they would make each nested build
    # and each top-level one rebuild everything after the other.
    for var in $(compgen -e | grep '^CARGO_' | grep -vx 'CARGO_HOME'); do unset "$var"; done
    ( cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static" cargo build ${quiet:+-q} --release --locked \
        --target x86_64-unknown-linux-gnu --target-dir target/guest --bin sluice ) >&2 ||
        die 4 "the static sluice build failed (see above)"
    sluice_bin=$repo/target/guest/x86_64-unknown-linux-gnu/release/sluice
    is_static "$sluice_bin" || die 4 "$sluice_bin is not static (crt-static was not applied?)"
fi

# ---- 4. initramfs, rebuilt only when an input changed ----------------------------------
inputs=("$busybox" "$0" "$repo/containers/vm/init" "$repo/containers/vm/udhcpc.script")
for m in "${order[@]}"; do inputs+=("$(modfile "$m")"); done
[ -z "$sluice_bin" ] || inputs+=("$sluice_bin")
stamp=$( { printf '%s\n' "${order[@]}"; sha256sum "${inputs[@]}" | cut -d' ' -f1; } | sha256sum | cut -d' ' -f1)
initrd=$kit/initrd.gz
if [ -e "$initrd" ] && [ "$(cat "$kit/initrd.stamp" 2>/dev/null)" = "$stamp" ]; then
    say "initramfs up to date"
else
    say "packing the initramfs (modules: ${order[*]})"
    root=$(mktemp -d -t sluice-guest.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,run,etc,root,lib/modules,usr/local/bin}
    # /init links the applets at boot (in-process, faster than a fork each here).
    cp "$busybox" "$root/bin/busybox"
    for m in "${order[@]}"; do
        f=$(modfile "$m")
        if [[ $f == *.xz ]]; then xz -dc "$f" > "$root/lib/modules/$m.ko"; else cp "$f" "$root/lib/modules/$m.ko"; fi
    done
    printf '%s\n' "${order[@]}" > "$root/lib/modules/order"
    install -m 0755 "$repo/containers/vm/init" "$root/init"
    install -m 0755 "$repo/containers/vm/udhcpc.script" "$root/etc/udhcpc.script"
    if [ -n "$sluice_bin" ]; then
        cp "$sluice_bin" "$root/usr/local/bin/sluice"
        strip "$root/usr/local/bin/sluice" 2>/dev/null || true
    fi
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
    echo "127.0.0.1 localhost" > "$root/etc/hosts"
    : > "$root/etc/resolv.conf"
    ( cd "$root" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc 2>/dev/null ) | gzip -1 > "$initrd.tmp"
    mv "$initrd.tmp" "$initrd"
    echo "$stamp" > "$kit/initrd.stamp"
fi
ln -sfn "$kpkg/boot/$(basename "$vmlinuz")" "$kit/vmlinuz"
echo "kit=$kit"
echo "kernel=$kit/vmlinuz"
echo "initrd=$initrd"
