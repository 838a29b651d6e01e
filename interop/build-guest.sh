#!/usr/bin/env bash
# Builds the interop guest: Debian 12's kernel with rdma_rxe, and an
# initramfs with busybox, rdma-core, ibverbs-utils and perftest, all from
# Debian packages (ROCEV2.md section 8). The result is cached by package
# versions; the script prints the directory holding vmlinuz and initrd.gz.
set -euo pipefail

cache=${ROCE_EMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/roce-emu/interop}
mkdir -p "$cache"

if ! command -v apt-get >/dev/null; then
  echo "build-guest: needs a Debian machine (apt-get)" >&2
  exit 1
fi
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$kpkg" ]; then
  echo "build-guest: cannot find the kernel behind linux-image-amd64 (run apt-get update)" >&2
  exit 1
fi
kver=${kpkg#linux-image-}
pkgs="$kpkg rdma-core ibverbs-providers libibverbs1 ibverbs-utils librdmacm1 rdmacm-utils perftest libnl-3-200
 libnl-route-3-200 iproute2 libbpf1 libelf1 libmnl0 libcap2 libbsd0 libmd0 libpci3 libibumad3"
versions=$(for p in $pkgs; do apt-cache policy "$p" | awk -v p="$p" '/Candidate:/ {print p"="$2}'; done)
key=$( (echo "$versions"; cat "$0" "$(dirname "$0")/guest-init.sh") | sha256sum | cut -c1-16)
out="$cache/guest-$key"
if [ -f "$out/initrd.gz" ] && [ -f "$out/vmlinuz" ]; then
  echo "$out"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build-guest: downloading $(echo $pkgs | wc -w) packages for kernel $kver" >&2
(cd "$work" && apt-get download $pkgs >/dev/null 2>&1) || {
  echo "build-guest: apt-get download failed; run apt-get update first" >&2
  exit 1
}
root="$work/root"
mkdir -p "$root"
for d in "$work"/*.deb; do dpkg -x "$d" "$root"; done

rm -rf "$out.tmp"
mkdir -p "$out.tmp"
cp "$root/boot/vmlinuz-$kver" "$out.tmp/vmlinuz"
rm -rf "$root/boot" "$root/usr/share"

# Keep only the modules the guest loads (the package has no modules.dep).
mods="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net
 crc32_generic ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe configfs ib_cm iw_cm rdma_cm rdma_ucm"
moddir="$root/lib/modules/$kver"
mkdir -p "$work/keep"
for m in $mods; do
  f=$(find "$moddir" -name "$m.ko" | head -1)
  if [ -z "$f" ]; then
    echo "build-guest: module $m not found in $kpkg (built in?)" >&2
    continue
  fi
  cp "$f" "$work/keep/"
done
rm -rf "$moddir"
mkdir -p "$root/modules"
cp "$work/keep/"*.ko "$root/modules/"
echo "$mods" > "$root/modules/order"

# busybox, the dynamic loader and the host's copies of the libraries the
# guest's programs need that the packages above do not bring.
mkdir -p "$root/bin" "$root/sbin" "$root/lib64" "$root/lib/x86_64-linux-gnu" "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/etc"
cp /usr/bin/busybox "$root/bin/busybox"
cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
libpath="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu"
for elf in "$root"/usr/bin/* "$root"/usr/sbin/* "$root"/sbin/* "$root"/bin/ip "$root"/usr/lib/x86_64-linux-gnu/libibverbs/*.so; do
  [ -f "$elf" ] || continue
  { LD_LIBRARY_PATH=$libpath ldd "$elf" 2>/dev/null || true; } | awk '/=> \// {print $3}' | while read -r lib; do
    case "$lib" in "$root"/*) continue ;; esac
    base=$(basename "$lib")
    [ -e "$root/lib/x86_64-linux-gnu/$base" ] || [ -e "$root/usr/lib/x86_64-linux-gnu/$base" ] || cp -L "$lib" "$root/lib/x86_64-linux-gnu/"
  done
done
# glibc loads libgcc_s at run time for pthread_exit and pthread_cancel
# (rping's threads end so); ldd does not list it.
gcc_s=$(ldconfig -p | awk '$1 == "libgcc_s.so.1" && /x86-64/ {print $NF; exit}')
[ -e "$root/lib/x86_64-linux-gnu/libgcc_s.so.1" ] || [ -e "$root/usr/lib/x86_64-linux-gnu/libgcc_s.so.1" ] || cp -L "$gcc_s" "$root/lib/x86_64-linux-gnu/"
install -m 0755 "$(dirname "$0")/guest-init.sh" "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp/initrd.gz"
echo "$versions" > "$out.tmp/packages"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "build-guest: $(du -h "$out/initrd.gz" | cut -f1) initramfs in $out" >&2
echo "$out"
