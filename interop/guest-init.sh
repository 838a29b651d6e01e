#!/bin/busybox sh
# PID 1 of the interop guest: load rxe, bring up eth0 and rxe0, then serve
# commands on TCP port 2323, one command line per connection (the output
# ends with a line "__rc=N"). Kernel parameters: roceemu.ip=ADDR/LEN,
# roceemu.ip6=ADDR/LEN (an IPv6 address beside it; rxe adds its GID) and
# roceemu.mtu=N.
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null || mdev -s
mkdir -p /dev/infiniband /tmp /run
ip=192.0.2.2/24
ip6=
mtu=1500
for a in $(cat /proc/cmdline); do
  case "$a" in
    roceemu.ip=*) ip=${a#roceemu.ip=} ;;
    roceemu.ip6=*) ip6=${a#roceemu.ip6=} ;;
    roceemu.mtu=*) mtu=${a#roceemu.mtu=} ;;
  esac
done
for m in $(cat /modules/order); do
  [ -f "/modules/$m.ko" ] && insmod "/modules/$m.ko"
done
mdev -s
ip link set lo up
ip link set eth0 mtu "$mtu"
ip addr add "$ip" dev eth0
# busybox's ip has no "nodad": turn duplicate address detection off instead,
# so that the address (and rxe's GID for it) is usable at once.
if [ -n "$ip6" ]; then
  echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
  ip -6 addr add "$ip6" dev eth0
fi
ip link set eth0 up
rdma link add rxe0 type rxe netdev eth0
echo "roceemu-guest: ready ip=$ip ip6=$ip6 mtu=$mtu"
cat > /bin/guest-exec <<'X'
#!/bin/sh
read -r line
/bin/sh -c "$line" </dev/null 2>&1
echo "__rc=$?"
X
chmod +x /bin/guest-exec
while true; do nc -ll -p 2323 -e /bin/guest-exec; sleep 1; done
