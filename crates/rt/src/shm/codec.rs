//! The byte encoding of what crosses between the DPU process and the spill-plane process: the
//! fabric's [`Msg`]s (on the rings and the control socket), the conntrack snapshot that rides on
//! a state-sync message, and the frame metadata of the phy vNIC.
//!
//! Both processes are the same binary, so the format only has to be stable within one build;
//! still, every field is written explicitly (little-endian, fixed width) rather than by
//! transmuting structs, and every read is bounds- and value-checked: a record that does not
//! decode is a [`CodecError`] naming the field, never a panic. Encoding appends to a caller's
//! `Vec` that is cleared and reused, so the data path allocates nothing after warm-up.
//!
//! ```text
//! record   = msg [snapshot] [frame-meta frame]
//! msg      = tag:u8 fields...                       (see `encode_msg`)
//! vatc     = 0:u8 vm:u32 iova:u64 len:u64                            (translate)
//!          | 1:u8 vm:u32 epoch:u64 iova:u64 len:u64 n:u32 n*region  (regions)
//!          | 2:u8 vm:u32 port:u32 epoch:u64                         (attach, 2 fds)
//!          | 3:u8 vm:u32 epoch:u64                                  (detach)
//! region   = iova:u64 len:u64 host:u64 read:u8 write:u8
//! snapshot = 0:u8 | 1:u8 zone:u32 orig:key reply:key state:u8 closer:u8 created:u64
//!            last_seen:u64 packets:2*u64 bytes:2*u64 tag:u64
//! key      = src:16B dst:16B sport:u16 dport:u16 proto:u8
//! ```
//!
//! Over 1,000 lines only with its tests (about 300): every record type's encoder and decoder
//! sit together so a field's width and order can be checked against both at once.

use crate::vm::vhost_user::lend::{GuestRegion, LendSpec, RingSpec};
use spillway_fabric::atc::{AtcEpoch, HostAddr, Iova, Mapping, Perm, VmId};
use spillway_fabric::types::{
    Colour, ConnId, ConnPhase, ConnState, Dest, Kind, Msg, Side, SyncKind, Train,
};
use spillway_vswitch::conntrack::{CtDir, CtSnapshot, CtState, TcpState};
use spillway_vswitch::{Instant, TenantId};
use spillway_wire::{FlowKey, IpAddr16};

/// A record that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The record ended inside a field.
    #[error("record truncated in field {field}: need {need} bytes, {have} left")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Bytes the field needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// A field holds a value outside its range.
    #[error("field {field} holds {value}, which is not a valid value")]
    BadValue {
        /// The field.
        field: &'static str,
        /// What it held.
        value: u64,
    },
}

/// Appends fixed-width little-endian fields.
#[derive(Debug)]
pub struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.u64(v.to_bits());
    }
}

/// Reads fixed-width little-endian fields, checking every length.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, at: 0 }
    }
    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.at
    }
    /// The unread rest.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.at..]
    }
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], CodecError> {
        let have = self.buf.len() - self.at;
        if have < n {
            return Err(CodecError::Truncated {
                field,
                need: n,
                have,
            });
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, CodecError> {
        Ok(self.take(field, 1)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, CodecError> {
        Ok(u16::from_le_bytes(
            self.take(field, 2)?.try_into().expect("2 bytes"),
        ))
    }
    /// A little-endian u32.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(
            self.take(field, 4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(
            self.take(field, 8)?.try_into().expect("8 bytes"),
        ))
    }
    fn f64(&mut self, field: &'static str) -> Result<f64, CodecError> {
        Ok(f64::from_bits(self.u64(field)?))
    }
    fn bool(&mut self, field: &'static str) -> Result<bool, CodecError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(CodecError::BadValue {
                field,
                value: u64::from(v),
            }),
        }
    }
}

fn bad(field: &'static str, value: u8) -> CodecError {
    CodecError::BadValue {
        field,
        value: u64::from(value),
    }
}

fn put_train(w: &mut Writer<'_>, t: &Train) {
    w.u64(t.conn.0);
    w.u32(t.tenant.0);
    w.u8(match t.side {
        Side::Orig => 0,
        Side::Reply => 1,
    });
    w.u8(match t.dest {
        Dest::Vm => 0,
        Dest::Wire => 1,
    });
    w.u8(match t.kind {
        Kind::Open => 0,
        Kind::Control => 1,
        Kind::Data => 2,
        Kind::Close => 3,
    });
    w.u32(t.packets);
    w.u32(t.packet_bytes);
    w.u64(t.born.0);
    w.u8(u8::from(t.denied));
}

fn get_train(r: &mut Reader<'_>) -> Result<Train, CodecError> {
    Ok(Train {
        conn: ConnId(r.u64("train.conn")?),
        tenant: TenantId(r.u32("train.tenant")?),
        side: match r.u8("train.side")? {
            0 => Side::Orig,
            1 => Side::Reply,
            v => return Err(bad("train.side", v)),
        },
        dest: match r.u8("train.dest")? {
            0 => Dest::Vm,
            1 => Dest::Wire,
            v => return Err(bad("train.dest", v)),
        },
        kind: match r.u8("train.kind")? {
            0 => Kind::Open,
            1 => Kind::Control,
            2 => Kind::Data,
            3 => Kind::Close,
            v => return Err(bad("train.kind", v)),
        },
        packets: r.u32("train.packets")?,
        packet_bytes: r.u32("train.packet_bytes")?,
        born: Instant(r.u64("train.born")?),
        denied: r.bool("train.denied")?,
    })
}

fn put_state(w: &mut Writer<'_>, s: &ConnState) {
    w.u64(s.conn.0);
    w.u32(s.tenant.0);
    w.u8(match s.phase {
        ConnPhase::Opening => 0,
        ConnPhase::Established => 1,
        ConnPhase::Closing => 2,
    });
    w.u64(s.packets);
    w.u32(s.version);
    w.u64(s.opened.0);
}

fn get_state(r: &mut Reader<'_>) -> Result<ConnState, CodecError> {
    Ok(ConnState {
        conn: ConnId(r.u64("state.conn")?),
        tenant: TenantId(r.u32("state.tenant")?),
        phase: match r.u8("state.phase")? {
            0 => ConnPhase::Opening,
            1 => ConnPhase::Established,
            2 => ConnPhase::Closing,
            v => return Err(bad("state.phase", v)),
        },
        packets: r.u64("state.packets")?,
        version: r.u32("state.version")?,
        opened: Instant(r.u64("state.opened")?),
    })
}

/// Appends `msg`.
pub fn encode_msg(out: &mut Vec<u8>, msg: &Msg) {
    let mut w = Writer(out);
    match msg {
        Msg::Packets(t) => {
            w.u8(0);
            put_train(&mut w, t);
        }
        Msg::Punt(t) => {
            w.u8(1);
            put_train(&mut w, t);
        }
        Msg::Sync {
            colour,
            kind,
            state,
        } => {
            w.u8(2);
            w.u32(colour.0);
            w.u8(match kind {
                SyncKind::Mirror => 0,
                SyncKind::Handover => 1,
                SyncKind::Update => 2,
                SyncKind::Closed => 3,
            });
            put_state(&mut w, state);
        }
        Msg::SyncDone {
            colour,
            count,
            shard,
        } => {
            w.u8(3);
            w.u32(colour.0);
            w.u64(*count);
            w.u16(*shard);
        }
        Msg::Recall {
            state,
            pps,
            replaces_pps,
        } => {
            w.u8(4);
            put_state(&mut w, state);
            w.f64(*pps);
            w.f64(*replaces_pps);
        }
        Msg::RecallDone { conn, ok } => {
            w.u8(5);
            w.u64(conn.0);
            w.u8(u8::from(*ok));
        }
        Msg::Delete { seq, conn } => {
            w.u8(6);
            w.u64(*seq);
            w.u64(conn.0);
        }
        Msg::DeleteAck { seq, state } => {
            w.u8(7);
            w.u64(*seq);
            match state {
                None => w.u8(0),
                Some(s) => {
                    w.u8(1);
                    put_state(&mut w, s);
                }
            }
        }
        Msg::Adopted { conn } => {
            w.u8(8);
            w.u64(conn.0);
        }
        Msg::Activated { colour } => {
            w.u8(9);
            w.u32(colour.0);
        }
        Msg::Release { colour } => {
            w.u8(10);
            w.u32(colour.0);
        }
        Msg::Released {
            colour,
            count,
            shard,
        } => {
            w.u8(11);
            w.u32(colour.0);
            w.u64(*count);
            w.u16(*shard);
        }
        Msg::Drain {
            colour,
            shard,
            packets,
        } => {
            w.u8(12);
            w.u32(colour.0);
            w.u16(*shard);
            w.u64(*packets);
        }
        Msg::Drained { colour, shard } => {
            w.u8(13);
            w.u32(colour.0);
            w.u16(*shard);
        }
        Msg::Absorbing => w.u8(14),
        Msg::OffloadStats { conn, pps } => {
            w.u8(15);
            w.u64(conn.0);
            w.f64(*pps);
        }
        Msg::Budget {
            free_entries,
            headroom_pps,
        } => {
            w.u8(16);
            w.u64(*free_entries);
            w.f64(*headroom_pps);
        }
        Msg::Heartbeat { workers, util } => {
            w.u8(17);
            w.u32(*workers);
            w.f64(*util);
        }
        Msg::SetWorkers { workers } => {
            w.u8(18);
            w.u32(*workers);
        }
        Msg::DigestAsk {
            colour,
            shard,
            round,
        } => {
            w.u8(19);
            w.u32(colour.0);
            w.u16(*shard);
            w.u16(*round);
        }
        Msg::Digest {
            colour,
            round,
            bucket,
            count,
            digest,
        } => {
            w.u8(20);
            w.u32(colour.0);
            w.u16(*round);
            w.u16(*bucket);
            w.u32(*count);
            w.u64(*digest);
        }
        Msg::DigestDone {
            colour,
            round,
            shard,
        } => {
            w.u8(21);
            w.u32(colour.0);
            w.u16(*round);
            w.u16(*shard);
        }
        Msg::Resync { colour, bucket } => {
            w.u8(22);
            w.u32(colour.0);
            w.u16(*bucket);
        }
        Msg::Remirror { colour, bucket } => {
            w.u8(25);
            w.u32(colour.0);
            w.u16(*bucket);
        }
        Msg::SendBack { colour, bucket } => {
            w.u8(23);
            w.u32(colour.0);
            w.u16(*bucket);
        }
        Msg::SentBack {
            colour,
            bucket,
            count,
        } => {
            w.u8(24);
            w.u32(colour.0);
            w.u16(*bucket);
            w.u32(*count);
        }
    }
}

/// Reads one message from the front of `r`.
pub fn decode_msg(r: &mut Reader<'_>) -> Result<Msg, CodecError> {
    let colour = |r: &mut Reader<'_>| r.u32("colour").map(Colour);
    Ok(match r.u8("msg.tag")? {
        0 => Msg::Packets(get_train(r)?),
        1 => Msg::Punt(get_train(r)?),
        2 => {
            let colour = colour(r)?;
            let kind = match r.u8("sync.kind")? {
                0 => SyncKind::Mirror,
                1 => SyncKind::Handover,
                2 => SyncKind::Update,
                3 => SyncKind::Closed,
                v => return Err(bad("sync.kind", v)),
            };
            Msg::Sync {
                colour,
                kind,
                state: get_state(r)?,
            }
        }
        3 => Msg::SyncDone {
            colour: colour(r)?,
            count: r.u64("count")?,
            shard: r.u16("shard")?,
        },
        4 => Msg::Recall {
            state: get_state(r)?,
            pps: r.f64("recall.pps")?,
            replaces_pps: r.f64("recall.replaces_pps")?,
        },
        5 => Msg::RecallDone {
            conn: ConnId(r.u64("conn")?),
            ok: r.bool("recall_done.ok")?,
        },
        6 => Msg::Delete {
            seq: r.u64("seq")?,
            conn: ConnId(r.u64("conn")?),
        },
        7 => Msg::DeleteAck {
            seq: r.u64("seq")?,
            state: if r.bool("delete_ack.has_state")? {
                Some(get_state(r)?)
            } else {
                None
            },
        },
        8 => Msg::Adopted {
            conn: ConnId(r.u64("conn")?),
        },
        9 => Msg::Activated { colour: colour(r)? },
        10 => Msg::Release { colour: colour(r)? },
        11 => Msg::Released {
            colour: colour(r)?,
            count: r.u64("count")?,
            shard: r.u16("shard")?,
        },
        12 => Msg::Drain {
            colour: colour(r)?,
            shard: r.u16("shard")?,
            packets: r.u64("drain.packets")?,
        },
        13 => Msg::Drained {
            colour: colour(r)?,
            shard: r.u16("shard")?,
        },
        14 => Msg::Absorbing,
        15 => Msg::OffloadStats {
            conn: ConnId(r.u64("conn")?),
            pps: r.f64("pps")?,
        },
        16 => Msg::Budget {
            free_entries: r.u64("budget.free_entries")?,
            headroom_pps: r.f64("budget.headroom_pps")?,
        },
        17 => Msg::Heartbeat {
            workers: r.u32("heartbeat.workers")?,
            util: r.f64("heartbeat.util")?,
        },
        18 => Msg::SetWorkers {
            workers: r.u32("workers")?,
        },
        19 => Msg::DigestAsk {
            colour: colour(r)?,
            shard: r.u16("shard")?,
            round: r.u16("digest.round")?,
        },
        20 => Msg::Digest {
            colour: colour(r)?,
            round: r.u16("digest.round")?,
            bucket: r.u16("digest.bucket")?,
            count: r.u32("digest.count")?,
            digest: r.u64("digest.digest")?,
        },
        21 => Msg::DigestDone {
            colour: colour(r)?,
            round: r.u16("digest.round")?,
            shard: r.u16("shard")?,
        },
        22 => Msg::Resync {
            colour: colour(r)?,
            bucket: r.u16("resync.bucket")?,
        },
        23 => Msg::SendBack {
            colour: colour(r)?,
            bucket: r.u16("send_back.bucket")?,
        },
        25 => Msg::Remirror {
            colour: colour(r)?,
            bucket: r.u16("remirror.bucket")?,
        },
        24 => Msg::SentBack {
            colour: colour(r)?,
            bucket: r.u16("sent_back.bucket")?,
            count: r.u32("sent_back.count")?,
        },
        v => return Err(bad("msg.tag", v)),
    })
}

fn put_key(w: &mut Writer<'_>, k: &FlowKey) {
    w.0.extend_from_slice(&k.src_ip.0);
    w.0.extend_from_slice(&k.dst_ip.0);
    w.u16(k.src_port);
    w.u16(k.dst_port);
    w.u8(k.proto);
}

fn get_key(r: &mut Reader<'_>) -> Result<FlowKey, CodecError> {
    Ok(FlowKey {
        src_ip: IpAddr16(r.take("key.src_ip", 16)?.try_into().expect("16 bytes")),
        dst_ip: IpAddr16(r.take("key.dst_ip", 16)?.try_into().expect("16 bytes")),
        src_port: r.u16("key.src_port")?,
        dst_port: r.u16("key.dst_port")?,
        proto: r.u8("key.proto")?,
    })
}

fn dir_code(d: CtDir) -> u8 {
    match d {
        CtDir::Original => 0,
        CtDir::Reply => 1,
    }
}

/// Appends an optional conntrack snapshot.
pub fn encode_snapshot(out: &mut Vec<u8>, s: Option<&CtSnapshot>) {
    let mut w = Writer(out);
    let Some(s) = s else {
        w.u8(0);
        return;
    };
    w.u8(1);
    w.u32(s.zone.0);
    put_key(&mut w, &s.orig);
    put_key(&mut w, &s.reply);
    let (state, closer) = match s.state {
        CtState::Unreplied => (0, 0),
        CtState::Replied => (1, 0),
        CtState::Tcp(t) => match t {
            TcpState::SynSent => (2, 0),
            TcpState::SynReceived => (3, 0),
            TcpState::Established => (4, 0),
            TcpState::FinWait { closer } => (5, dir_code(closer)),
            TcpState::CloseWait { closer } => (6, dir_code(closer)),
            TcpState::LastAck { closer } => (7, dir_code(closer)),
            TcpState::TimeWait => (8, 0),
            TcpState::Close => (9, 0),
            TcpState::Aborted => (10, 0),
        },
    };
    w.u8(state);
    w.u8(closer);
    w.u64(s.created.0);
    w.u64(s.last_seen.0);
    w.u64(s.packets[0]);
    w.u64(s.packets[1]);
    w.u64(s.bytes[0]);
    w.u64(s.bytes[1]);
    w.u64(s.tag);
}

/// Reads an optional conntrack snapshot.
pub fn decode_snapshot(r: &mut Reader<'_>) -> Result<Option<CtSnapshot>, CodecError> {
    if !r.bool("snapshot.present")? {
        return Ok(None);
    }
    let zone = TenantId(r.u32("snapshot.zone")?);
    let orig = get_key(r)?;
    let reply = get_key(r)?;
    let code = r.u8("snapshot.state")?;
    let closer = match r.u8("snapshot.closer")? {
        0 => CtDir::Original,
        1 => CtDir::Reply,
        v => return Err(bad("snapshot.closer", v)),
    };
    let state = match code {
        0 => CtState::Unreplied,
        1 => CtState::Replied,
        2 => CtState::Tcp(TcpState::SynSent),
        3 => CtState::Tcp(TcpState::SynReceived),
        4 => CtState::Tcp(TcpState::Established),
        5 => CtState::Tcp(TcpState::FinWait { closer }),
        6 => CtState::Tcp(TcpState::CloseWait { closer }),
        7 => CtState::Tcp(TcpState::LastAck { closer }),
        8 => CtState::Tcp(TcpState::TimeWait),
        9 => CtState::Tcp(TcpState::Close),
        10 => CtState::Tcp(TcpState::Aborted),
        v => return Err(bad("snapshot.state", v)),
    };
    Ok(Some(CtSnapshot {
        zone,
        orig,
        reply,
        state,
        created: Instant(r.u64("snapshot.created")?),
        last_seen: Instant(r.u64("snapshot.last_seen")?),
        packets: [r.u64("snapshot.packets")?, r.u64("snapshot.packets")?],
        bytes: [r.u64("snapshot.bytes")?, r.u64("snapshot.bytes")?],
        tag: r.u64("snapshot.tag")?,
    }))
}

/// Appends the phy-vNIC frame metadata: the port the frame entered on (DPU to host) or leaves
/// by (host to DPU; `u32::MAX` for none).
pub fn encode_port(out: &mut Vec<u8>, port: u32) {
    Writer(out).u32(port);
}

/// A vATC control message: a shared-memory VM port's life and its translation traffic between
/// the DPU process (the authority over VM memory) and the spill plane (which caches
/// translations). These ride on the control socket as [`crate::shm::vnic::CONTROL_VM`] records.
///
/// Why a typed enum in this binary codec rather than JSON with an `"op"` string: the control
/// socket is already a stream of length-framed binary records, and the fabric's messages on it
/// use this codec, so these need no second format; both processes are the same binary, so there
/// is no compatibility to keep with anything else; every field is read with its bounds and
/// values checked, and a record that does not decode is a [`CodecError`] naming the field,
/// where a JSON document could hold anything and each reader had to check each field by hand.
/// Above all, how many fds ride on a record follows from its variant ([`VatcMsg::fds`]) rather
/// than from a number in the document, so a peer cannot make the receiver take fds that belong
/// to a later record.
///
/// A record that does not decode fails the control channel as any undecodable record on it
/// does ([`crate::shm::vnic::VnicError::Codec`]): the DPU process counts the plane as failed
/// (`rt.plane.failures`), logs why and fails open; the plane logs it and exits. Both ends are
/// the same build, so such a record means a broken or hostile peer, not a version skew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VatcMsg {
    /// Plane to DPU: translate `[iova, iova + len)` of `vm` (the plane missed in its cache).
    Translate {
        /// The VM.
        vm: VmId,
        /// First address asked about.
        iova: Iova,
        /// Length asked about, bytes.
        len: u64,
    },
    /// DPU to plane: the answer to a [`VatcMsg::Translate`]: all of the VM's regions at
    /// `epoch`, and the range that was asked about (what the regions leave out of it is known
    /// unmapped at that epoch).
    Regions {
        /// The VM.
        vm: VmId,
        /// The VM's epoch in the authority when it answered.
        epoch: AtcEpoch,
        /// First address asked about.
        iova: Iova,
        /// Length asked about, bytes.
        len: u64,
        /// Every region of the VM.
        regions: Vec<Mapping>,
    },
    /// DPU to plane: a VM port attached; its memory fd and interrupt eventfd ride on the
    /// record, in that order.
    Attach {
        /// The VM.
        vm: VmId,
        /// The port the VM attached on.
        port: u32,
        /// The VM's epoch in the authority.
        epoch: AtcEpoch,
    },
    /// DPU to plane: a vhost-user guest's receive queue 1 is lent to the plane
    /// (`vm::vhost_user::lend`): the lease's memfd, the queue's interrupt eventfd and one memfd
    /// per memory region ride on the record, in that order.
    AttachGuest {
        /// The VM.
        vm: VmId,
        /// The port the guest is.
        port: u32,
        /// The VM's epoch in the authority (its memory table).
        epoch: AtcEpoch,
        /// The queue, the guest's features and its memory table.
        lend: LendSpec,
    },
    /// DPU to plane: a VM port detached; every translation of the VM is dead (an
    /// invalidation at the VM's new epoch).
    Detach {
        /// The VM.
        vm: VmId,
        /// The VM's new epoch.
        epoch: AtcEpoch,
    },
}

impl VatcMsg {
    /// How many fds ride on the record: the VM's memory and interrupt eventfd with an attach,
    /// the lease, the interrupt eventfd and the regions with a guest's, none with the others.
    pub fn fds(&self) -> usize {
        match self {
            VatcMsg::Attach { .. } => 2,
            VatcMsg::AttachGuest { lend, .. } => 2 + lend.regions.len(),
            _ => 0,
        }
    }

    /// The VM the message is about.
    pub fn vm(&self) -> VmId {
        match *self {
            VatcMsg::Translate { vm, .. }
            | VatcMsg::Regions { vm, .. }
            | VatcMsg::Attach { vm, .. }
            | VatcMsg::AttachGuest { vm, .. }
            | VatcMsg::Detach { vm, .. } => vm,
        }
    }
}

/// Memory regions a [`VatcMsg::AttachGuest`] may carry (vhost-user's table holds at most 8).
pub const GUEST_REGIONS_MAX: usize = 8;
/// The most fds a vATC record carries.
pub const VATC_FDS_MAX: usize = 2 + GUEST_REGIONS_MAX;

/// Bytes of one region in a [`VatcMsg::Regions`] record.
const REGION_BYTES: usize = 8 + 8 + 8 + 1 + 1;

/// Appends a vATC message (`vatc` in the module doc).
pub fn encode_vatc(out: &mut Vec<u8>, msg: &VatcMsg) {
    let mut w = Writer(out);
    match msg {
        VatcMsg::Translate { vm, iova, len } => {
            w.u8(0);
            w.u32(vm.0);
            w.u64(iova.0);
            w.u64(*len);
        }
        VatcMsg::Regions {
            vm,
            epoch,
            iova,
            len,
            regions,
        } => {
            w.u8(1);
            w.u32(vm.0);
            w.u64(epoch.0);
            w.u64(iova.0);
            w.u64(*len);
            w.u32(u32::try_from(regions.len()).expect("a VM has fewer than 2^32 regions"));
            for m in regions {
                w.u64(m.iova.0);
                w.u64(m.len);
                w.u64(m.host.0);
                w.u8(u8::from(m.perm.read));
                w.u8(u8::from(m.perm.write));
            }
        }
        VatcMsg::Attach { vm, port, epoch } => {
            w.u8(2);
            w.u32(vm.0);
            w.u32(*port);
            w.u64(epoch.0);
        }
        VatcMsg::AttachGuest {
            vm,
            port,
            epoch,
            lend,
        } => {
            let LendSpec {
                number,
                features,
                ring,
                regions,
            } = lend;
            w.u8(4);
            w.u32(vm.0);
            w.u32(*port);
            w.u64(epoch.0);
            w.u32(*number);
            w.u64(*features);
            w.u16(ring.size);
            w.u64(ring.desc);
            w.u64(ring.avail);
            w.u64(ring.used);
            w.u8(u8::try_from(regions.len()).expect("at most GUEST_REGIONS_MAX regions"));
            for r in regions {
                w.u64(r.gpa);
                w.u64(r.size);
                w.u64(r.offset);
            }
        }
        VatcMsg::Detach { vm, epoch } => {
            w.u8(3);
            w.u32(vm.0);
            w.u64(epoch.0);
        }
    }
}

/// Reads a vATC message that fills the whole of `body`; trailing bytes are an error, as they
/// mean the peer wrote something this build does not know.
pub fn decode_vatc(body: &[u8]) -> Result<VatcMsg, CodecError> {
    let mut r = Reader::new(body);
    let msg = match r.u8("vatc.tag")? {
        0 => VatcMsg::Translate {
            vm: VmId(r.u32("vatc.vm")?),
            iova: Iova(r.u64("vatc.iova")?),
            len: r.u64("vatc.len")?,
        },
        1 => {
            let vm = VmId(r.u32("vatc.vm")?);
            let epoch = AtcEpoch(r.u64("vatc.epoch")?);
            let iova = Iova(r.u64("vatc.iova")?);
            let len = r.u64("vatc.len")?;
            let n = r.u32("vatc.regions")? as usize;
            // The count is checked against the bytes there before anything is allocated, so a
            // lying count costs nothing.
            let need = n.saturating_mul(REGION_BYTES);
            if need > r.rest().len() {
                return Err(CodecError::Truncated {
                    field: "vatc.regions",
                    need,
                    have: r.rest().len(),
                });
            }
            let mut regions = Vec::with_capacity(n);
            for _ in 0..n {
                regions.push(Mapping {
                    iova: Iova(r.u64("vatc.region.iova")?),
                    len: r.u64("vatc.region.len")?,
                    host: HostAddr(r.u64("vatc.region.host")?),
                    perm: Perm {
                        read: r.bool("vatc.region.read")?,
                        write: r.bool("vatc.region.write")?,
                    },
                });
            }
            VatcMsg::Regions {
                vm,
                epoch,
                iova,
                len,
                regions,
            }
        }
        2 => VatcMsg::Attach {
            vm: VmId(r.u32("vatc.vm")?),
            port: r.u32("vatc.port")?,
            epoch: AtcEpoch(r.u64("vatc.epoch")?),
        },
        3 => VatcMsg::Detach {
            vm: VmId(r.u32("vatc.vm")?),
            epoch: AtcEpoch(r.u64("vatc.epoch")?),
        },
        4 => {
            let vm = VmId(r.u32("vatc.vm")?);
            let port = r.u32("vatc.port")?;
            let epoch = AtcEpoch(r.u64("vatc.epoch")?);
            let number = r.u32("vatc.number")?;
            let features = r.u64("vatc.features")?;
            let ring = RingSpec {
                size: r.u16("vatc.ring.size")?,
                desc: r.u64("vatc.ring.desc")?,
                avail: r.u64("vatc.ring.avail")?,
                used: r.u64("vatc.ring.used")?,
            };
            let n = r.u8("vatc.guest_regions")?;
            if n == 0 || usize::from(n) > GUEST_REGIONS_MAX {
                return Err(bad("vatc.guest_regions", n));
            }
            let mut regions = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                regions.push(GuestRegion {
                    gpa: r.u64("vatc.guest_region.gpa")?,
                    size: r.u64("vatc.guest_region.size")?,
                    offset: r.u64("vatc.guest_region.offset")?,
                });
            }
            VatcMsg::AttachGuest {
                vm,
                port,
                epoch,
                lend: LendSpec {
                    number,
                    features,
                    ring,
                    regions,
                },
            }
        }
        v => return Err(bad("vatc.tag", v)),
    };
    if !r.rest().is_empty() {
        return Err(CodecError::BadValue {
            field: "vatc.trailing",
            value: r.rest().len() as u64,
        });
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn train(seed: u64) -> Train {
        Train {
            conn: ConnId(seed),
            tenant: TenantId(seed as u32 ^ 7),
            side: if seed & 1 == 0 {
                Side::Orig
            } else {
                Side::Reply
            },
            dest: if seed & 2 == 0 { Dest::Vm } else { Dest::Wire },
            kind: [Kind::Open, Kind::Control, Kind::Data, Kind::Close][(seed % 4) as usize],
            packets: (seed % 9) as u32 + 1,
            packet_bytes: 64 + (seed % 1400) as u32,
            born: Instant(seed.wrapping_mul(31)),
            denied: seed & 8 != 0,
        }
    }

    fn state(seed: u64) -> ConnState {
        ConnState {
            conn: ConnId(seed),
            tenant: TenantId(3),
            phase: [
                ConnPhase::Opening,
                ConnPhase::Established,
                ConnPhase::Closing,
            ][(seed % 3) as usize],
            packets: seed.wrapping_mul(3),
            version: seed as u32,
            opened: Instant(seed),
        }
    }

    fn every_msg(seed: u64) -> Vec<Msg> {
        let c = Colour(seed as u32);
        vec![
            Msg::Packets(train(seed)),
            Msg::Punt(train(seed.wrapping_add(1))),
            Msg::Sync {
                colour: c,
                kind: SyncKind::Handover,
                state: state(seed),
            },
            Msg::SyncDone {
                colour: c,
                count: seed,
                shard: seed as u16,
            },
            Msg::Recall {
                state: state(seed),
                pps: 1.5,
                replaces_pps: 0.25,
            },
            Msg::RecallDone {
                conn: ConnId(seed),
                ok: true,
            },
            Msg::Delete {
                seq: seed,
                conn: ConnId(seed),
            },
            Msg::DeleteAck {
                seq: seed,
                state: Some(state(seed)),
            },
            Msg::DeleteAck {
                seq: seed,
                state: None,
            },
            Msg::Adopted { conn: ConnId(seed) },
            Msg::Activated { colour: c },
            Msg::Release { colour: c },
            Msg::Released {
                colour: c,
                count: 4,
                shard: 3,
            },
            Msg::Drain {
                colour: c,
                shard: 1,
                packets: seed,
            },
            Msg::Drained {
                colour: c,
                shard: 1,
            },
            Msg::Absorbing,
            Msg::OffloadStats {
                conn: ConnId(seed),
                pps: 9.0,
            },
            Msg::Budget {
                free_entries: 5,
                headroom_pps: 1e6,
            },
            Msg::Heartbeat {
                workers: 2,
                util: 0.5,
            },
            Msg::SetWorkers { workers: 3 },
            Msg::DigestAsk {
                colour: c,
                shard: 2,
                round: 9,
            },
            Msg::Digest {
                colour: c,
                round: seed as u16,
                bucket: seed as u16,
                count: 7,
                digest: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            },
            Msg::DigestDone {
                colour: c,
                round: 7,
                shard: 1,
            },
            Msg::Resync {
                colour: c,
                bucket: 255,
            },
            Msg::SendBack {
                colour: c,
                bucket: 254,
            },
            Msg::Remirror {
                colour: c,
                bucket: 253,
            },
            Msg::SentBack {
                colour: c,
                bucket: seed as u16,
                count: 3,
            },
        ]
    }

    fn every_vatc(seed: u64) -> Vec<VatcMsg> {
        let vm = VmId(seed as u32);
        let region = |i: u64| Mapping {
            iova: Iova(seed.wrapping_add(i << 12)),
            len: 4096 + i,
            host: HostAddr(seed ^ i),
            perm: Perm {
                read: i.is_multiple_of(2),
                write: i.is_multiple_of(3),
            },
        };
        vec![
            VatcMsg::Translate {
                vm,
                iova: Iova(seed),
                len: seed >> 3,
            },
            VatcMsg::Regions {
                vm,
                epoch: AtcEpoch(seed.rotate_left(7)),
                iova: Iova(seed),
                len: 1 << 20,
                regions: Vec::new(),
            },
            VatcMsg::Regions {
                vm,
                epoch: AtcEpoch(seed),
                iova: Iova(!seed),
                len: 64,
                regions: (0..5).map(region).collect(),
            },
            VatcMsg::Attach {
                vm,
                port: (seed >> 32) as u32,
                epoch: AtcEpoch(seed),
            },
            VatcMsg::Detach {
                vm,
                epoch: AtcEpoch(!seed),
            },
            VatcMsg::AttachGuest {
                vm,
                port: seed as u32 ^ 5,
                epoch: AtcEpoch(seed),
                lend: LendSpec {
                    number: (seed >> 7) as u32,
                    features: !seed,
                    ring: RingSpec {
                        size: 256,
                        desc: seed,
                        avail: seed ^ 0x1000,
                        used: seed.rotate_left(3),
                    },
                    regions: (0..3)
                        .map(|i| GuestRegion {
                            gpa: seed.wrapping_add(i << 30),
                            size: 1 << 28,
                            offset: i * 4096,
                        })
                        .collect(),
                },
            },
        ]
    }

    #[test]
    fn a_guest_attach_with_no_region_or_too_many_is_refused() {
        for n in [0usize, GUEST_REGIONS_MAX + 1] {
            let mut m = every_vatc(3).pop().unwrap();
            let VatcMsg::AttachGuest { lend, .. } = &mut m else {
                panic!("the last is a guest attach");
            };
            let r = lend.regions[0];
            lend.regions = vec![r; n];
            let mut buf = Vec::new();
            encode_vatc(&mut buf, &m);
            assert!(decode_vatc(&buf).is_err(), "{n} regions");
        }
    }

    #[test]
    fn vatc_messages_round_trip_and_every_prefix_is_an_error() {
        for seed in [0, 1, 0x1234_5678_9abc_def0, u64::MAX] {
            for m in every_vatc(seed) {
                let mut buf = Vec::new();
                encode_vatc(&mut buf, &m);
                assert_eq!(decode_vatc(&buf).unwrap(), m);
                for cut in 0..buf.len() {
                    assert!(decode_vatc(&buf[..cut]).is_err(), "{m:?} cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn only_an_attach_carries_fds() {
        for m in every_vatc(9) {
            let want = match &m {
                VatcMsg::Attach { .. } => 2,
                // The lease, the interrupt eventfd, one memfd per region.
                VatcMsg::AttachGuest { lend, .. } => 2 + lend.regions.len(),
                _ => 0,
            };
            assert_eq!(m.fds(), want, "{m:?}");
            assert_eq!(m.vm(), VmId(9));
        }
    }

    #[test]
    fn malformed_vatc_records_are_typed_errors_naming_the_field() {
        assert_eq!(
            decode_vatc(&[]),
            Err(CodecError::Truncated {
                field: "vatc.tag",
                need: 1,
                have: 0
            })
        );
        assert_eq!(
            decode_vatc(&[7]),
            Err(CodecError::BadValue {
                field: "vatc.tag",
                value: 7
            })
        );
        // A trailing byte after a whole message.
        let mut buf = Vec::new();
        encode_vatc(
            &mut buf,
            &VatcMsg::Detach {
                vm: VmId(1),
                epoch: AtcEpoch(2),
            },
        );
        buf.push(0);
        assert_eq!(
            decode_vatc(&buf),
            Err(CodecError::BadValue {
                field: "vatc.trailing",
                value: 1
            })
        );
        // A region count far beyond the bytes that follow is refused before allocating.
        let mut buf = vec![1];
        buf.extend_from_slice(&1u32.to_le_bytes());
        buf.extend_from_slice(&[0; 24]);
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_vatc(&buf),
            Err(CodecError::Truncated {
                field: "vatc.regions",
                ..
            })
        ));
        // A permission byte that is not a bool.
        let mut buf = Vec::new();
        encode_vatc(
            &mut buf,
            &VatcMsg::Regions {
                vm: VmId(1),
                epoch: AtcEpoch(1),
                iova: Iova(0),
                len: 1,
                regions: vec![Mapping {
                    iova: Iova(0),
                    len: 1,
                    host: HostAddr(0),
                    perm: Perm {
                        read: true,
                        write: true,
                    },
                }],
            },
        );
        *buf.last_mut().unwrap() = 2;
        assert_eq!(
            decode_vatc(&buf),
            Err(CodecError::BadValue {
                field: "vatc.region.write",
                value: 2
            })
        );
    }

    proptest! {
        #[test]
        fn every_message_round_trips(seed in any::<u64>()) {
            let mut buf = Vec::new();
            for m in every_msg(seed) {
                buf.clear();
                encode_msg(&mut buf, &m);
                let mut r = Reader::new(&buf);
                prop_assert_eq!(decode_msg(&mut r).unwrap(), m);
                prop_assert_eq!(r.position(), buf.len());
                // Every strict prefix is a typed error, never a panic.
                for cut in 0..buf.len() {
                    prop_assert!(decode_msg(&mut Reader::new(&buf[..cut])).is_err());
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut r = Reader::new(&bytes);
            let _ = decode_msg(&mut r);
            let _ = decode_snapshot(&mut Reader::new(&bytes));
            let _ = decode_vatc(&bytes);
        }
    }

    #[test]
    fn snapshot_round_trips() {
        let key = FlowKey {
            src_ip: IpAddr16::from_v4([10, 0, 0, 1]),
            dst_ip: IpAddr16::from_v4([10, 0, 0, 2]),
            src_port: 4000,
            dst_port: 80,
            proto: 6,
        };
        for state in [
            CtState::Unreplied,
            CtState::Replied,
            CtState::Tcp(TcpState::Established),
            CtState::Tcp(TcpState::LastAck {
                closer: CtDir::Reply,
            }),
        ] {
            let s = CtSnapshot {
                zone: TenantId(9),
                orig: key,
                reply: key.reversed(),
                state,
                created: Instant(1),
                last_seen: Instant(2),
                packets: [3, 4],
                bytes: [5, 6],
                tag: 7,
            };
            let mut buf = Vec::new();
            encode_snapshot(&mut buf, Some(&s));
            encode_snapshot(&mut buf, None);
            let mut r = Reader::new(&buf);
            assert_eq!(decode_snapshot(&mut r).unwrap(), Some(s));
            assert_eq!(decode_snapshot(&mut r).unwrap(), None);
            assert!(r.rest().is_empty());
        }
    }
}
