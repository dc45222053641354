//! TAP devices against the real kernel: frames cross between a `Tap` fd and sockets in a
//! network namespace, in both directions, with and without the virtio-net header's offloads.
//! Each test creates a TAP with a unique name, moves it into a fresh namespace (recorded in a
//! ledger, so it is removed even when an assertion fails), gives it an address and a permanent
//! neighbour entry for a peer that exists only as this test's reads and writes on the fd, then
//! checks byte by byte what the kernel sent or received. The TCP test answers the handshake by
//! hand and shows that TSO super-frames (gso_type TCPV4, longer than the MTU) pass through.
//! The io_uring tests do the same through the DPU process's ring (`host::tap_uring`), each in
//! both read modes (one multishot read per TAP, and reads armed one buffer each): frames in
//! order through few buffers, a refused write counted, a TAP bounded to its own buffers, and,
//! under a counting allocator, no allocation per frame once warm.
//! Needs root; without it the tests skip (or fail under CI=true).

mod oslab;

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::mpsc;
use std::time::Duration;

use oslab::{Lab, in_netns, parse_ipv4, read_until, spawn_in_netns, tcp_frame, udp_frame, unique};
use spillway_rt::host::tap::{FrameBatch, Tap, TapOptions};
use spillway_rt::host::tap_uring::{ReadMode, TapUring};
use spillway_rt::host::vnet::{VnetHdr, complete_checksum};
use spillway_rt::host::{ledger, netns};
use spillway_wire::MacAddr;

// Counts the allocations of each thread, for the test that the io_uring path allocates
// nothing per frame once warm (the other tests do not look at it).
#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

const LOCAL_MAC: MacAddr = MacAddr([0x02, 0x00, 0x00, 0x00, 0x00, 0x01]);
const PEER_MAC: MacAddr = MacAddr([0x02, 0x00, 0x00, 0x00, 0x00, 0x02]);
const LOCAL_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const TIMEOUT: Duration = Duration::from_secs(5);

/// A TAP inside its own namespace, addressed LOCAL_IP/24 with PEER_IP -> PEER_MAC pinned.
struct TapNs {
    // Field order: the TAP closes (and its interface disappears) before the lab deletes the
    // namespace.
    tap: Tap,
    ns: String,
    _lab: Lab,
}

fn tap_in_netns(opts: TapOptions) -> TapNs {
    let mut lab = Lab::new();
    let ns = unique("swt");
    lab.ledger.netns_add(&ns).unwrap();
    let tap = Tap::create(&unique("swt"), opts).unwrap();
    let dev = tap.name().to_owned();
    netns::link_set_netns(&dev, &ns).unwrap();
    let ns_ = Some(ns.as_str());
    // No IPv6 on the TAP: router solicitations and MLD reports would be noise on the fd.
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        netns::sysctl(ns_, &format!("net/ipv6/conf/{dev}/disable_ipv6"), "1").unwrap();
    }
    netns::link_set_mac(ns_, &dev, LOCAL_MAC).unwrap();
    netns::addr_add(ns_, &dev, &format!("{LOCAL_IP}/24")).unwrap();
    netns::link_set_up(ns_, "lo").unwrap();
    netns::link_set_up(ns_, &dev).unwrap();
    netns::neigh_add_permanent(ns_, PEER_IP.into(), PEER_MAC, &dev).unwrap();
    TapNs { tap, ns, _lab: lab }
}

fn is_udp_to(port: u16) -> impl Fn(&VnetHdr, &[u8]) -> bool {
    move |_, f| parse_ipv4(f).is_some_and(|p| p.proto == 17 && p.dport() == port)
}

#[test]
fn tap_delivers_udp_sent_in_the_namespace_with_a_full_checksum() {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let t = tap_in_netns(TapOptions::default());
    assert!(t.tap.vnet_hdr());
    in_netns(&t.ns, || {
        let s = UdpSocket::bind((LOCAL_IP, 4000)).unwrap();
        s.send_to(b"hello from the namespace", (PEER_IP, 9999))
            .unwrap();
    });

    let frame = read_until(&t.tap.queues()[0], TIMEOUT, is_udp_to(9999));
    let hdr = VnetHdr::parse(&frame).unwrap();
    // Without offloads the kernel must finish the checksum itself and say nothing special.
    assert_eq!(hdr.gso_type, VnetHdr::GSO_NONE);
    assert!(!hdr.needs_csum(), "{hdr:?}");
    let p = parse_ipv4(&frame[VnetHdr::LEN..]).unwrap();
    assert_eq!((p.dst_mac, p.src_mac), (PEER_MAC, LOCAL_MAC));
    assert_eq!((p.src, p.dst), (LOCAL_IP, PEER_IP));
    assert_eq!((p.sport(), p.dport()), (4000, 9999));
    assert_eq!(&p.l4[8..], b"hello from the namespace");
    assert!(p.ip_checksum_ok());
    assert!(
        p.l4_checksum_ok(),
        "UDP checksum must be complete without offloads"
    );
}

#[test]
fn tap_with_offloads_hands_over_partial_checksums_that_complete_checksum_finishes() {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let opts = TapOptions {
        offload: true,
        ..TapOptions::default()
    };
    let t = tap_in_netns(opts);
    assert!(t.tap.offloads().csum && t.tap.offloads().tso);
    in_netns(&t.ns, || {
        let s = UdpSocket::bind((LOCAL_IP, 4001)).unwrap();
        s.send_to(b"partial", (PEER_IP, 9999)).unwrap();
    });

    let mut frame = read_until(&t.tap.queues()[0], TIMEOUT, is_udp_to(9999));
    let hdr = VnetHdr::parse(&frame).unwrap();
    assert!(hdr.needs_csum(), "device offers checksum offload: {hdr:?}");
    assert!(!hdr.is_gso());
    // Checksumming starts at the UDP header; the result goes in its checksum field.
    assert_eq!((hdr.csum_start, hdr.csum_offset), (34, 6));
    assert!(!parse_ipv4(&frame[VnetHdr::LEN..]).unwrap().l4_checksum_ok());

    complete_checksum(&mut frame[VnetHdr::LEN..], &hdr).unwrap();
    let p = parse_ipv4(&frame[VnetHdr::LEN..]).unwrap();
    assert_eq!(&p.l4[8..], b"partial");
    assert!(
        p.l4_checksum_ok(),
        "complete_checksum must produce a valid UDP checksum"
    );
}

#[test]
fn tap_write_reaches_a_udp_socket_in_the_namespace() {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let t = tap_in_netns(TapOptions::default());
    let (ready_tx, ready_rx) = mpsc::channel();
    let receiver = spawn_in_netns(&t.ns, move || {
        let s = UdpSocket::bind((LOCAL_IP, 9998)).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        for _ in 0..2 {
            let (n, from) = s.recv_from(&mut buf).expect("datagram from the TAP");
            got.push((buf[..n].to_vec(), from));
        }
        got
    });
    ready_rx.recv_timeout(TIMEOUT).unwrap();

    let one = udp_frame(PEER_MAC, LOCAL_MAC, PEER_IP, LOCAL_IP, 5555, 9998, b"one");
    let n = t.tap.write_vectored(&VnetHdr::NONE, &one).unwrap();
    assert_eq!(n, VnetHdr::LEN + one.len());
    // The same through plain write(), header and frame in one buffer.
    let two = udp_frame(PEER_MAC, LOCAL_MAC, PEER_IP, LOCAL_IP, 5555, 9998, b"two");
    let mut buf = VnetHdr::NONE.to_bytes().to_vec();
    buf.extend_from_slice(&two);
    assert_eq!(t.tap.write(&buf).unwrap(), buf.len());

    let got = receiver.join().unwrap();
    let from: SocketAddr = (PEER_IP, 5555).into();
    assert_eq!(got, vec![(b"one".to_vec(), from), (b"two".to_vec(), from)]);
}

#[test]
fn read_batch_drains_queued_frames_up_to_the_batch_size() {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let t = tap_in_netns(TapOptions::default());
    in_netns(&t.ns, || {
        let s = UdpSocket::bind((LOCAL_IP, 4002)).unwrap();
        for i in 0..5u8 {
            s.send_to(&[i; 10], (PEER_IP, 9997)).unwrap();
        }
    });
    let q = &t.tap.queues()[0];
    let mut batch = FrameBatch::new(3, 2048);
    let mut payloads = Vec::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while payloads.len() < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "got only {payloads:?}"
        );
        q.wait_readable(Some(Duration::from_millis(100))).unwrap();
        batch.clear();
        let n = q.read_batch(&mut batch).unwrap();
        assert!(n <= 3 && n == batch.len());
        for f in batch.iter() {
            if let Some(p) = parse_ipv4(&f[VnetHdr::LEN..]).filter(|p| p.dport() == 9997) {
                payloads.push(p.l4[8]);
            }
        }
    }
    assert_eq!(payloads, vec![0, 1, 2, 3, 4]);
    // Drained: an empty queue is 0 frames, and a plain read says WouldBlock.
    batch.clear();
    assert_eq!(q.read_batch(&mut batch).unwrap(), 0);
    let mut buf = [0u8; 2048];
    assert_eq!(q.read(&mut buf).unwrap_err().kind(), ErrorKind::WouldBlock);
}

/// The kernel's TCP in the namespace talks to a "peer" that is this test: we answer its SYN
/// with a SYN-ACK (MSS 1460, window 65535) written into the TAP, then let it send a burst. With
/// TSO offered by the TAP, the burst leaves as GSO super-frames longer than the MTU.
#[test]
fn tap_with_offloads_passes_tso_super_frames_through() {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let opts = TapOptions {
        offload: true,
        ..TapOptions::default()
    };
    let t = tap_in_netns(opts);
    let q = &t.tap.queues()[0];
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let client = spawn_in_netns(&t.ns, move || {
        let s = TcpStream::connect_timeout(&(PEER_IP, 7777).into(), TIMEOUT).expect("connect");
        // Close with RST, not FIN-and-linger: the peer will never ACK, and an orphaned socket
        // would keep retransmitting (and keep the namespace alive) for minutes.
        rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO)).unwrap();
        s.set_nonblocking(true).unwrap();
        let data = vec![0x5a; 256 * 1024];
        let sent = match std::io::Write::write(&mut &s, &data) {
            Ok(n) => n,
            Err(e) => panic!("send: {e}"),
        };
        let _ = done_rx.recv_timeout(TIMEOUT);
        sent
    });

    let syn = read_until(q, TIMEOUT, |_, f| {
        parse_ipv4(f).is_some_and(|p| p.proto == 6 && p.dport() == 7777 && p.l4[13] == 0x02)
    });
    let p = parse_ipv4(&syn[VnetHdr::LEN..]).unwrap();
    let client_port = p.sport();
    let isn = u32::from_be_bytes(p.l4[4..8].try_into().unwrap());
    let syn_ack = tcp_frame(
        PEER_MAC,
        LOCAL_MAC,
        PEER_IP,
        LOCAL_IP,
        7777,
        client_port,
        1000,
        isn.wrapping_add(1),
        0x12, // SYN | ACK
        1460,
    );
    t.tap.write_vectored(&VnetHdr::NONE, &syn_ack).unwrap();

    let gso = read_until(q, TIMEOUT, |hdr, f| {
        hdr.is_gso() && parse_ipv4(f).is_some_and(|p| p.proto == 6 && p.sport() == client_port)
    });
    done_tx.send(()).unwrap();
    let sent = client.join().unwrap();
    assert!(sent > 1460, "the client queued only {sent} bytes");

    let hdr = VnetHdr::parse(&gso).unwrap();
    let frame = &gso[VnetHdr::LEN..];
    assert_eq!(
        hdr.gso_type & !VnetHdr::GSO_ECN,
        VnetHdr::GSO_TCPV4,
        "{hdr:?}"
    );
    assert_eq!(hdr.gso_size, 1460, "segments at the MSS we announced");
    assert!(
        hdr.needs_csum(),
        "a TSO frame carries a partial checksum: {hdr:?}"
    );
    assert!(
        frame.len() > 1514,
        "a super-frame longer than MTU + Ethernet header, got {} bytes",
        frame.len()
    );
    let p = parse_ipv4(frame).unwrap();
    assert_eq!(p.dst, PEER_IP);
    // hdr_len is the linear part of the skb: at least the headers, a hint only.
    assert!(usize::from(hdr.hdr_len) >= 14 + 20 + 20, "{hdr:?}");
}

#[test]
fn multiqueue_tap_has_one_fd_per_queue_and_disappears_with_them() {
    if !oslab::require_root("TAP devices") {
        return;
    }
    let opts = TapOptions {
        queues: 2,
        ..TapOptions::default()
    };
    let tap = Tap::create(&unique("swq"), opts).unwrap();
    let name = tap.name().to_owned();
    assert_eq!(tap.queues().len(), 2);
    assert!(tap.as_fd(1).is_some() && tap.as_fd(2).is_none());
    let sys = std::path::PathBuf::from(format!("/sys/class/net/{name}"));
    let flags = std::fs::read_to_string(sys.join("tun_flags")).unwrap();
    let flags = i64::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 0x0100, 0x0100, "IFF_MULTI_QUEUE in {flags:#x}");
    assert_eq!(flags & 0x4000, 0x4000, "IFF_VNET_HDR in {flags:#x}");
    drop(tap);
    // The kernel unregisters the device when its last queue closes, but waits for the
    // device's last reference (an in-flight packet, a sysfs reader) before its directory
    // goes: seen lingering once in CI, under the other tests' load.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while sys.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        !sys.exists(),
        "non-persistent TAP must vanish within 5 s of its fds closing"
    );
}

#[test]
fn persistent_tap_outlives_its_fd_until_the_ledger_removes_it() {
    if !oslab::require_root("TAP devices") {
        return;
    }
    let mut lab = Lab::new();
    let name = unique("swp");
    lab.ledger
        .record(ledger::LedgerEntry::Link {
            name: name.clone(),
            ns: None,
        })
        .unwrap();
    let tap = Tap::create(&name, TapOptions::default()).unwrap();
    tap.set_persist(true).unwrap();
    drop(tap);
    assert!(
        netns::link_exists(&name, None).unwrap(),
        "persistent TAP gone"
    );
    let report = lab.ledger.cleanup();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.removed.len(), 1);
    assert!(!netns::link_exists(&name, None).unwrap());
}

#[test]
fn tap_names_longer_than_15_bytes_are_refused() {
    let err = Tap::create("a-name-too-long!", TapOptions::default()).unwrap_err();
    assert!(err.to_string().contains("15 bytes"), "{err}");
}

/// A UDP socket on `LOCAL_IP:port` in `ns`, bound before this returns, collecting the payloads
/// of up to `n` datagrams (fewer if none comes for [`TIMEOUT`]).
fn udp_receiver(ns: &str, port: u16, n: usize) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let receiver = spawn_in_netns(ns, move || {
        let s = UdpSocket::bind((LOCAL_IP, port)).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        ready_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while got.len() < n {
            match s.recv_from(&mut buf) {
                Ok((len, _)) => got.push(buf[..len].to_vec()),
                Err(_) => break,
            }
        }
        got
    });
    ready_rx.recv_timeout(TIMEOUT).unwrap();
    receiver
}

fn io_uring_reads_what_the_namespace_sends_and_its_writes_reach_a_socket_there(mode: ReadMode) {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let t = tap_in_netns(TapOptions::default());
    const N: usize = 200;
    let receiver = udp_receiver(&t.ns, 9997, N);
    // Four reads armed: the N datagrams need every buffer re-armed many times over.
    let fd = t.tap.as_fd(0).unwrap();
    let mut ring = TapUring::with_mode(&[fd], 4, 64, VnetHdr::LEN, 2048, mode).unwrap();
    check_mode(&ring, mode);
    in_netns(&t.ns, || {
        let s = UdpSocket::bind((LOCAL_IP, 4002)).unwrap();
        for i in 0..N as u32 {
            s.send_to(&i.to_be_bytes(), (PEER_IP, 9999)).unwrap();
            if i % 16 == 15 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    // Echo each datagram back, as the peer, to the socket on port 9997.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut echoed = 0;
    while echoed < N && std::time::Instant::now() < deadline {
        ring.enter().unwrap();
        ring.drain_frames(|file, pkt, tx| {
            assert_eq!(file, 0);
            let Some(p) = parse_ipv4(pkt.data()) else {
                return;
            };
            if p.proto != 17 || p.dport() != 9999 {
                return;
            }
            let back = udp_frame(
                PEER_MAC,
                LOCAL_MAC,
                PEER_IP,
                LOCAL_IP,
                5555,
                9997,
                &p.l4[8..],
            );
            assert!(tx.write(0, [&VnetHdr::NONE.to_bytes(), &back]));
            echoed += 1;
        })
        .unwrap();
    }
    ring.enter().unwrap();
    let got = receiver.join().unwrap();
    assert_eq!(echoed, N, "{:?}", ring.counters());
    let want: Vec<Vec<u8>> = (0..N as u32).map(|i| i.to_be_bytes().to_vec()).collect();
    assert_eq!(got, want, "every datagram, in order");
    let c = *ring.counters();
    assert!(
        c.reads >= N as u64 && c.write_errors == 0 && c.tx_full == 0,
        "{c:?}"
    );
    assert!(
        c.enters < 2 * N as u64,
        "far fewer system calls than frames: {c:?}"
    );
}

/// A TAP keeps one read waiting (its multishot read, or with armed reads one of
/// `reads_per_tap`): an idle ring costs no system call per loop turn (the waiting read's
/// completion is flagged in shared memory), and a burst is read in batches (by the one
/// multishot read, or by armed reads that do not wait, in growing numbers).
fn io_uring_makes_no_system_call_on_an_idle_tap_and_reads_a_burst_in_batches(mode: ReadMode) {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let t = tap_in_netns(TapOptions::default());
    let fd = t.tap.as_fd(0).unwrap();
    let mut ring = TapUring::with_mode(&[fd], 32, 8, VnetHdr::LEN, 2048, mode).unwrap();
    check_mode(&ring, mode);
    let idle = |ring: &mut TapUring| {
        let before = ring.counters().enters;
        for _ in 0..1000 {
            ring.enter().unwrap();
            ring.drain_frames(|_, _, _| {}).unwrap();
        }
        ring.counters().enters - before
    };
    assert!(idle(&mut ring) <= 2, "{:?}", ring.counters());
    const N: usize = 64;
    in_netns(&t.ns, || {
        let s = UdpSocket::bind((LOCAL_IP, 4003)).unwrap();
        for i in 0..N as u32 {
            s.send_to(&i.to_be_bytes(), (PEER_IP, 9999)).unwrap();
        }
    });
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut got = 0;
    let before = *ring.counters();
    while got < N && std::time::Instant::now() < deadline {
        ring.enter().unwrap();
        ring.drain_frames(|_, pkt, _| {
            if parse_ipv4(pkt.data()).is_some_and(|p| p.proto == 17 && p.dport() == 9999) {
                got += 1;
            }
        })
        .unwrap();
    }
    let c = *ring.counters();
    assert_eq!(got, N, "{c:?}");
    assert!(
        c.enters - before.enters < 32,
        "the batch grew: {} enters for {N} frames ({c:?})",
        c.enters - before.enters
    );
    if ring.read_mode() == ReadMode::Multishot {
        assert!(
            c.reads_armed - before.reads_armed <= 2,
            "one multishot read took the burst: {c:?}"
        );
    }
    // Quiet again: back to one waiting read and no system call per turn.
    idle(&mut ring);
    assert!(idle(&mut ring) <= 2, "{:?}", ring.counters());
}

fn io_uring_sends_a_frame_from_the_buffer_it_was_read_into(mode: ReadMode) {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    use spillway_vswitch::PacketBuf;
    let t = tap_in_netns(TapOptions::default());
    const N: usize = 300;
    let receiver = udp_receiver(&t.ns, 9996, N);
    // One read armed on the TAP: every frame sent in place holds a buffer until its write
    // completes, and the TAP's next read must still find one.
    let fd = t.tap.as_fd(0).unwrap();
    let mut ring = TapUring::with_mode(&[fd], 1, 4, VnetHdr::LEN, 2048, mode).unwrap();
    check_mode(&ring, mode);
    let sender = spawn_in_netns(&t.ns, || {
        let s = UdpSocket::bind((LOCAL_IP, 4004)).unwrap();
        for i in 0..N as u32 {
            s.send_to(&i.to_be_bytes(), (PEER_IP, 9999)).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let hdr = VnetHdr::NONE.to_bytes();
    let mut other = PacketBuf::with_capacity(4096);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut echoed = 0;
    while echoed < N && std::time::Instant::now() < deadline {
        ring.enter().unwrap();
        ring.drain_frames(|_, pkt, tx| {
            let Some(p) = parse_ipv4(pkt.data()) else {
                return;
            };
            if p.proto != 17 || p.dport() != 9999 {
                return;
            }
            let back = udp_frame(
                PEER_MAC,
                LOCAL_MAC,
                PEER_IP,
                LOCAL_IP,
                5555,
                9996,
                &p.l4[8..],
            );
            other.load(&back).unwrap();
            assert!(
                !tx.send_in_place(0, &hdr, &mut other),
                "a buffer that is not the frame's own is refused"
            );
            // The answer written over the request, in the same buffer, and grown at the front
            // into the headroom (as an encapsulation or an ICMP error grows a frame): the
            // write starts before the area the read filled.
            pkt.load(&back[40..]).unwrap();
            pkt.push_front(40).unwrap().copy_from_slice(&back[..40]);
            assert_eq!(pkt.data(), &back[..]);
            assert!(tx.send_in_place(0, &hdr, pkt));
            assert!(!tx.send_in_place(0, &hdr, pkt), "sent once");
            echoed += 1;
        })
        .unwrap();
    }
    ring.enter().unwrap();
    sender.join().unwrap();
    let got = receiver.join().unwrap();
    assert_eq!(echoed, N, "{:?}", ring.counters());
    let want: Vec<Vec<u8>> = (0..N as u32).map(|i| i.to_be_bytes().to_vec()).collect();
    assert_eq!(got, want, "every datagram, in order");
    let c = *ring.counters();
    assert_eq!(c.writes_in_place, N as u64, "{c:?}");
    assert_eq!(c.write_errors + c.tx_full + c.read_errors, 0, "{c:?}");
}

fn io_uring_refuses_a_write_without_a_free_buffer_and_counts_it(mode: ReadMode) {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let t = tap_in_netns(TapOptions::default());
    let fd = t.tap.as_fd(0).unwrap();
    let mut ring = TapUring::with_mode(&[fd], 1, 1, VnetHdr::LEN, 2048, mode).unwrap();
    check_mode(&ring, mode);
    let f = udp_frame(PEER_MAC, LOCAL_MAC, PEER_IP, LOCAL_IP, 5555, 9, b"x");
    let hdr = VnetHdr::NONE.to_bytes();
    assert!(ring.tx().write(0, [&hdr, &f]));
    assert!(
        !ring.tx().write(0, [&hdr, &f]),
        "the one buffer is in flight"
    );
    assert_eq!(ring.counters().tx_full, 1);
    // Once the first write completes its buffer is free again.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while ring.counters().writes == 0 && std::time::Instant::now() < deadline {
        ring.enter().unwrap();
    }
    assert!(ring.tx().write(0, [&hdr, &f]));
    let too_big = vec![0u8; 3000];
    assert!(
        !ring.tx().write(0, [&hdr, &too_big]),
        "larger than a buffer"
    );
}

fn io_uring_moves_frames_without_allocating_once_warm(mode: ReadMode) {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let t = tap_in_netns(TapOptions::default());
    let fd = t.tap.as_fd(0).unwrap();
    let mut ring = TapUring::with_mode(&[fd], 8, 64, VnetHdr::LEN, 2048, mode).unwrap();
    check_mode(&ring, mode);
    let hdr = VnetHdr::NONE.to_bytes();
    let back = udp_frame(PEER_MAC, LOCAL_MAC, PEER_IP, LOCAL_IP, 5555, 9, b"sink");
    let sender = spawn_in_netns(&t.ns, || {
        let s = UdpSocket::bind((LOCAL_IP, 4003)).unwrap();
        for i in 0..4_000u32 {
            s.send_to(&i.to_be_bytes(), (PEER_IP, 9999)).unwrap();
            if i % 32 == 31 {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    });
    // Each frame read is answered by a write: reads, re-arms, writes and their completions.
    let step = |ring: &mut TapUring| {
        ring.enter().unwrap();
        ring.drain_frames(|_, _, tx| {
            tx.write(0, [&hdr, &back]);
        })
        .unwrap()
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut seen = 0;
    while seen < 500 && std::time::Instant::now() < deadline {
        seen += step(&mut ring);
    }
    let before = spillway_testkit::allocations();
    let mut counted = 0;
    while counted < 2_000 && std::time::Instant::now() < deadline {
        counted += step(&mut ring);
    }
    let allocated = spillway_testkit::allocations() - before;
    sender.join().unwrap();
    assert!(
        counted >= 2_000,
        "{counted} frames in time: {:?}",
        ring.counters()
    );
    assert_eq!(allocated, 0, "allocations over {counted} frames");
    assert_eq!(ring.counters().tx_full + ring.counters().write_errors, 0);
}

/// With multishot reads each TAP reads into buffers of its own: a TAP whose buffers are all
/// held stops reading (its frames wait in its queue, its read ends, counted) while another
/// TAP's frames are still read, and it resumes, in order and losing nothing, once its buffers
/// come back.
#[test]
fn io_uring_multishot_bounds_each_tap_to_its_own_buffers() {
    if !oslab::require_root("TAP devices and network namespaces") {
        return;
    }
    let a = tap_in_netns(TapOptions::default());
    let b = tap_in_netns(TapOptions::default());
    let fds = [a.tap.as_fd(0).unwrap(), b.tap.as_fd(0).unwrap()];
    // Two reads per TAP: four buffers each.
    let mut ring =
        TapUring::with_mode(&fds, 2, 4, VnetHdr::LEN, 2048, ReadMode::Multishot).unwrap();
    check_mode(&ring, ReadMode::Multishot);
    if ring.read_mode() != ReadMode::Multishot {
        return;
    }
    const N: u32 = 20;
    let send = |ns: &str, n: u32| {
        in_netns(ns, || {
            let s = UdpSocket::bind((LOCAL_IP, 4005)).unwrap();
            for i in 0..n {
                s.send_to(&i.to_be_bytes(), (PEER_IP, 9999)).unwrap();
            }
        })
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    let wait = |ring: &mut TapUring, done: &dyn Fn(&TapUring) -> bool| {
        while !done(ring) && std::time::Instant::now() < deadline {
            ring.enter().unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(done(ring), "{:?}", ring.counters());
    };
    // Nothing handed out: A's four buffers stay taken, and its read ends for want of one.
    send(&a.ns, N);
    wait(&mut ring, &|r| {
        r.counters().reads_no_buffer >= 1 && r.counters().reads >= 4
    });
    assert_eq!(
        ring.counters().reads,
        4,
        "A read into its own four buffers only"
    );
    send(&b.ns, 1);
    wait(&mut ring, &|r| r.counters().reads >= 5);
    // Now hand the frames out, which gives A's buffers back; A's read is re-armed and the
    // rest of its frames come, in order.
    let mut got: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    while got[0].len() < N as usize && std::time::Instant::now() < deadline {
        ring.enter().unwrap();
        ring.drain_frames(|file, pkt, _| {
            if let Some(p) = parse_ipv4(pkt.data()).filter(|p| p.proto == 17 && p.dport() == 9999) {
                got[file].push(u32::from_be_bytes(p.l4[8..12].try_into().unwrap()));
            }
        })
        .unwrap();
    }
    assert_eq!(got[0], (0..N).collect::<Vec<_>>(), "{:?}", ring.counters());
    assert_eq!(got[1], vec![0]);
    let c = *ring.counters();
    assert!(c.reads_armed >= 3, "A's read was re-armed: {c:?}");
    assert_eq!(c.read_errors, 0, "{c:?}");
}

/// The ring reads the way the test asked: multishot reads wherever the kernel has them
/// (Linux 6.7 on), so that a kernel which has them and a ring that falls back is a failure.
fn check_mode(ring: &TapUring, asked: ReadMode) {
    let has_multishot = {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release
            .trim()
            .split(|c: char| !c.is_ascii_digit())
            .map(|x| x.parse::<u32>().unwrap_or(0));
        (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 7)
    };
    let want = if has_multishot {
        asked
    } else {
        ReadMode::Armed
    };
    assert_eq!(ring.read_mode(), want, "asked for {asked:?}");
}

/// Each io_uring test, once per read mode: `<test>::multishot` and `<test>::armed`.
macro_rules! in_both_read_modes {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[test]
            fn multishot() {
                super::$test(super::ReadMode::Multishot);
            }
            #[test]
            fn armed() {
                super::$test(super::ReadMode::Armed);
            }
        }
    )*};
}

in_both_read_modes!(
    io_uring_reads_what_the_namespace_sends_and_its_writes_reach_a_socket_there,
    io_uring_makes_no_system_call_on_an_idle_tap_and_reads_a_burst_in_batches,
    io_uring_sends_a_frame_from_the_buffer_it_was_read_into,
    io_uring_refuses_a_write_without_a_free_buffer_and_counts_it,
    io_uring_moves_frames_without_allocating_once_warm,
);
