#!/usr/bin/env bash
# Builds the small guest `spillway` boots under QEMU (issue 18), from Debian packages only:
# the kernel of `linux-image-amd64` and its virtio modules, and an initramfs of
# `busybox-static` with an init that brings up the virtio-net interface from the kernel command
# line and serves HTTP (busybox httpd) on port 80, and the benches' tools: iperf3 and wrk with
# the libraries they load (bench/vm-vs.sh). Nothing is downloaded from outside the
# package registry: the packages come through apt (`apt-get download`, no install, no
# maintainer scripts run), and are unpacked with `dpkg-deb -x`.
#
#   bash guest/build.sh [OUT_DIR]       (default: target/guest)
#
# Writes OUT_DIR/vmlinuz, OUT_DIR/initramfs.cpio.gz and OUT_DIR/VERSION (the packages' versions);
# does nothing if VERSION already names the packages apt offers now. The guest's init reads
# from the kernel command line:
#
#   spillway.ip=ADDR/PREFIX   the address of eth0 (none: eth0 stays down)
#   spillway.gw=ADDR          a default route
#   spillway.ping=ADDR        ping ADDR in the background from the start, printing
#                             `spillway-guest pong ...` for every reply (tests)
#   spillway.fetch=ADDR       GET / from ADDR:80 every second for 5 minutes (busybox nc: the
#                             static busybox's wget segfaults in glibc's resolver), printing
#                             `spillway-guest fetched BODY` for every success (tests)
#   spillway.fetchbig=ADDR    GET /big (256 KiB) from ADDR:80 every 2 s, printing
#                             `spillway-guest fetched-big BYTES` (the response's size)
#   spillway.echo=PORT        an echo server on PORT (busybox nc, one process per connection)
#   spillway.hold=ADDR:PORT   every 10 s a new TCP connection to ADDR:PORT that sends a line
#                             every half second for 90 s, printing `spillway-guest held N K`
#                             for the K-th echo on connection N: a connection that breaks
#                             stops printing (tests)
#   spillway.rxstat=S         every S seconds, `spillway-guest rx PACKETS UPTIME`: eth0's
#                             received packets and the guest's uptime in seconds (benches)
#   spillway.iperf3s=1        an iperf3 server (benches)
#   spillway.bench=ADDR:S     once ADDR answers a ping: iperf3 TCP for S seconds, iperf3 UDP
#                             with 64-byte datagrams flat out, wrk with `Connection: close`
#                             against ADDR's httpd, each printed between
#                             `spillway-guest bench-begin NAME` and `... bench-end NAME`
#                             (iperf3 as JSON), then `spillway-guest bench-done` (benches)
#
# and prints `spillway-guest ready` on the console once eth0 is up and httpd runs, then
# `spillway-guest eth0 MAC` with the interface's address. A guest powers off when its init's
# shell reads `poweroff` on the console (the tests stop QEMU instead).
#
# Needs: apt-get with the Debian lists (run `apt-get update` first on a fresh machine),
# dpkg-deb, cpio, gzip. Exit status: 0 done; 1 a step failed (it says which).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/target/guest}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

for tool in apt-get apt-cache dpkg-deb cpio gzip; do
    command -v "$tool" >/dev/null || { echo "guest/build.sh: $tool is missing" >&2; exit 1; }
done

# The kernel package linux-image-amd64 points to today, and busybox-static.
kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[[ -n $kpkg ]] || { echo "guest/build.sh: apt knows no linux-image-amd64 (apt-get update?)" >&2; exit 1; }
kver=$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
bver=$(apt-cache policy busybox-static | awk '/Candidate:/ {print $2}')
# The benches' tools and what they load (the loader below checks that nothing is missing).
tools="iperf3 libiperf0 libsctp1 libssl3 wrk libluajit-5.1-2 libgcc-s1 libc6"
tver=$(for p in $tools; do apt-cache policy "$p" | awk -v p="$p" '/Candidate:/ {print p "=" $2}'; done | tr '\n' ' ')
# The script's own hash too: a changed init rebuilds the guest.
want="$kpkg $kver busybox-static $bver ${tver}$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
if [[ -f $OUT/VERSION && $(cat "$OUT/VERSION") == "$want" && -f $OUT/vmlinuz && -f $OUT/initramfs.cpio.gz ]]; then
    echo "guest/build.sh: $OUT is up to date ($want)"
    exit 0
fi

WORK=$(mktemp -d /tmp/spillway-guest.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# apt's sandbox user must be able to write where it downloads.
chmod 0755 "$WORK"
(cd "$WORK" && apt-get download -qq -o APT::Sandbox::User=root "$kpkg" busybox-static) ||
    { echo "guest/build.sh: apt-get download $kpkg busybox-static failed" >&2; exit 1; }
mkdir "$WORK/k" "$WORK/b"
dpkg-deb -x "$WORK"/linux-image-*.deb "$WORK/k"
dpkg-deb -x "$WORK"/busybox-static_*.deb "$WORK/b"
# shellcheck disable=SC2086 # a list of package names
(cd "$WORK" && mkdir t && cd t && apt-get download -qq -o APT::Sandbox::User=root $tools) ||
    { echo "guest/build.sh: apt-get download $tools failed" >&2; exit 1; }
mkdir "$WORK/tools"
for d in "$WORK"/t/*.deb; do dpkg-deb -x "$d" "$WORK/tools"; done

krel=$(ls "$WORK/k/lib/modules")
mods=$WORK/k/lib/modules/$krel/kernel
R=$WORK/root
mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,run,www,lib/modules}
cp "$WORK/b/bin/busybox" "$R/bin/busybox"
for app in sh mount insmod ip ifconfig route httpd sleep cat echo poweroff mkdir ls ping \
           grep sed awk seq dd nc wget uname tail printf wc; do
    ln -s busybox "$R/bin/$app"
done
# virtio-net over virtio-pci, in dependency order (modinfo's `depends`).
order="drivers/virtio/virtio.ko drivers/virtio/virtio_ring.ko
       drivers/virtio/virtio_pci_modern_dev.ko drivers/virtio/virtio_pci_legacy_dev.ko
       drivers/virtio/virtio_pci.ko net/core/failover.ko drivers/net/net_failover.ko
       drivers/net/virtio_net.ko"
for m in $order; do
    src=$mods/$m
    [[ -f $src ]] || src=$(ls "$src".* 2>/dev/null | head -1)
    [[ -f $src ]] || { echo "guest/build.sh: $m is not in $kpkg" >&2; exit 1; }
    case $src in
        *.ko) cp "$src" "$R/lib/modules/" ;;
        *.ko.xz) xz -dc "$src" >"$R/lib/modules/$(basename "$m")" ;;
        *.ko.zst) zstd -qdc "$src" >"$R/lib/modules/$(basename "$m")" ;;
        *) echo "guest/build.sh: cannot unpack $src" >&2; exit 1 ;;
    esac
    echo "$(basename "$m")" >>"$R/lib/modules/order"
done
# iperf3 and wrk, the loader, and every library the loader says the two need, into /lib (on
# the loader's default path). The loader is the package's, run here only to list them.
T=$WORK/tools
ldso=$T/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
mkdir -p "$R/lib64"
cp "$T/usr/bin/iperf3" "$T/usr/bin/wrk" "$R/bin/"
cp "$ldso" "$R/lib64/ld-linux-x86-64.so.2"
for tool in iperf3 wrk; do
    "$ldso" --library-path "$T/lib/x86_64-linux-gnu:$T/usr/lib/x86_64-linux-gnu" \
        --list "$T/usr/bin/$tool" >"$WORK/$tool.libs" ||
        { echo "guest/build.sh: the loader cannot list $tool's libraries" >&2; exit 1; }
    if grep -q "not found" "$WORK/$tool.libs"; then
        echo "guest/build.sh: $tool needs what no package here has: $(grep "not found" "$WORK/$tool.libs")" >&2
        exit 1
    fi
    # (The loader's own line names it by path: it is in place already.)
    awk '$2 == "=>" && $3 ~ /^\// && $1 !~ /\// {print $1, $3}' "$WORK/$tool.libs" |
        while read -r name path; do
            case $path in
                "$T"/*) cp -L "$path" "$R/lib/$name" ;;
                *) echo "guest/build.sh: $tool's $name is not in the packages: $path" >&2; exit 1 ;;
            esac
        done
done
echo "hello from a spillway guest" >"$R/www/index.html"
dd if=/dev/zero of="$R/www/big" bs=1024 count=256 2>/dev/null

cat >"$R/init" <<'INIT'
#!/bin/sh
# The guest's init (guest/build.sh): modules, eth0 from the command line, httpd, then a shell
# on the console.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m; done
ip link set lo up
arg() { for w in $(cat /proc/cmdline); do case $w in "$1"=*) echo "${w#*=}";; esac; done; }
addr=$(arg spillway.ip)
gw=$(arg spillway.gw)
ping=$(arg spillway.ping)
fetch=$(arg spillway.fetch)
fetchbig=$(arg spillway.fetchbig)
rxstat=$(arg spillway.rxstat)
iperf3s=$(arg spillway.iperf3s)
bench=$(arg spillway.bench)
echo_port=$(arg spillway.echo)
hold=$(arg spillway.hold)
if [ -n "$addr" ]; then
    for _ in $(seq 50); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
    ip addr add "$addr" dev eth0
    ip link set eth0 up
    [ -n "$gw" ] && ip route add default via "$gw"
    httpd -p 80 -h /www
    if [ -n "$ping" ]; then
        ( ping "$ping" 2>&1 | while read -r l; do
            case "$l" in *"bytes from"*) echo "spillway-guest pong $l";; esac
        done ) &
    fi
    if [ -n "$fetchbig" ]; then
        ( for _ in $(seq 150); do
            n=$(printf 'GET /big HTTP/1.0\r\n\r\n' | nc -w 5 "$fetchbig" 80 | wc -c)
            echo "spillway-guest fetched-big $n"
            sleep 2
        done ) &
    fi
    if [ -n "$fetch" ]; then
        ( for _ in $(seq 300); do
            body=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$fetch" 80 | tail -n 1)
            [ -n "$body" ] && echo "spillway-guest fetched $body"
            sleep 1
        done ) &
    fi
    if [ -n "$echo_port" ]; then
        nc -ll -p "$echo_port" -e cat &
    fi
    if [ -n "$hold" ]; then
        ( n=0; while [ $n -lt 60 ]; do
            n=$((n + 1))
            ( k=0; while [ $k -lt 180 ]; do echo "$n $k"; k=$((k + 1)); sleep 0.5; done ) |
                nc "${hold%:*}" "${hold##*:}" | while read -r c k; do
                    echo "spillway-guest held $c $k"
                done &
            sleep 10
        done ) &
    fi
    if [ -n "$rxstat" ]; then
        ( while :; do
            read -r up _ </proc/uptime
            echo "spillway-guest rx $(cat /sys/class/net/eth0/statistics/rx_packets) $up"
            sleep "$rxstat"
        done ) &
    fi
    [ -n "$iperf3s" ] && iperf3 -s -D
    if [ -n "$bench" ]; then
        ( peer=${bench%%:*}; secs=${bench#*:}
          for _ in $(seq 300); do ping -c 1 -W 1 "$peer" >/dev/null 2>&1 && break; sleep 0.2; done
          sleep 1
          for t in tcp udp64 http; do
              echo "spillway-guest bench-begin $t"
              case $t in
                  tcp) iperf3 -c "$peer" -t "$secs" -J ;;
                  udp64) iperf3 -c "$peer" -u -b 0 -l 64 -t "$secs" -J ;;
                  http) wrk -t1 -c16 -d"${secs}s" -H 'Connection: close' "http://$peer:80/" ;;
              esac 2>&1
              echo "spillway-guest bench-end $t"
              sleep 1
          done
          echo "spillway-guest bench-done" ) &
    fi
    echo "spillway-guest eth0 $(cat /sys/class/net/eth0/address)"
fi
echo "spillway-guest ready"
exec sh
INIT
chmod 0755 "$R/init"

cp "$WORK/k/boot/vmlinuz-$krel" "$OUT/vmlinuz"
(cd "$R" && find . | sort | cpio -o -H newc --quiet | gzip -9) >"$OUT/initramfs.cpio.gz"
echo "$want" >"$OUT/VERSION"
echo "guest/build.sh: wrote $OUT/vmlinuz and $OUT/initramfs.cpio.gz ($want)"
