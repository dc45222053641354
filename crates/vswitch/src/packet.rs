//! [`PacketBuf`]: one frame in a buffer with headroom, so encapsulation prepends in place and
//! decapsulation only moves the start offset. Buffers are allocated once (by the driver's pool)
//! and reused; nothing here allocates after construction.

/// Bytes kept free in front of a frame received into a fresh buffer: room for an IPv6 VXLAN
/// outer header (70 bytes) and a VLAN tag, rounded up to two cache lines.
pub const HEADROOM: usize = 128;

/// Default buffer size: headroom plus a 9216-byte jumbo frame would cost 9 KiB per buffer; we use
/// the 1500-byte MTU frame plus tags, overlay and slack, and reject longer frames at `load`.
pub const DEFAULT_CAPACITY: usize = HEADROOM + 2048;

/// A frame inside a fixed buffer: `buf[start..end]` is the frame.
#[derive(Clone, Debug)]
pub struct PacketBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// See [`PacketBuf::gso_size`].
    gso_size: u16,
    /// See [`PacketBuf::is_generated`].
    generated: bool,
}

/// The frame does not fit the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("frame of {actual} bytes does not fit a buffer with room for {expected}")]
pub struct FrameTooLong {
    /// Room for a frame after the headroom.
    pub expected: usize,
    /// The frame's length.
    pub actual: usize,
}

/// Not enough headroom to prepend (or not enough bytes to strip).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("buffer adjust by {wanted} bytes exceeds the {available} available")]
pub struct NoRoom {
    /// Bytes asked for.
    pub wanted: usize,
    /// Bytes available.
    pub available: usize,
}

impl Default for PacketBuf {
    fn default() -> Self {
        PacketBuf::with_capacity(DEFAULT_CAPACITY)
    }
}

impl PacketBuf {
    /// An empty buffer of `capacity` bytes (at least `HEADROOM`).
    pub fn with_capacity(capacity: usize) -> PacketBuf {
        let capacity = capacity.max(HEADROOM);
        PacketBuf {
            buf: vec![0u8; capacity].into_boxed_slice(),
            start: HEADROOM,
            end: HEADROOM,
            gso_size: 0,
            generated: false,
        }
    }

    /// A buffer holding a copy of `frame` after the default headroom.
    pub fn from_frame(frame: &[u8]) -> PacketBuf {
        let mut p =
            PacketBuf::with_capacity(HEADROOM + frame.len().max(DEFAULT_CAPACITY - HEADROOM));
        p.load(frame).expect("capacity was sized for this frame");
        p
    }

    /// Replace the contents with a copy of `frame`, restoring the headroom.
    pub fn load(&mut self, frame: &[u8]) -> Result<(), FrameTooLong> {
        let room = self.buf.len() - HEADROOM;
        if frame.len() > room {
            return Err(FrameTooLong {
                expected: room,
                actual: frame.len(),
            });
        }
        self.start = HEADROOM;
        self.end = HEADROOM + frame.len();
        self.buf[self.start..self.end].copy_from_slice(frame);
        self.gso_size = 0;
        self.generated = false;
        Ok(())
    }

    /// Where a driver reads a frame into this buffer itself, with no copy after: the bytes
    /// from `prefix` bytes before the headroom's end to the end of the buffer, so that
    /// `prefix` bytes of per-frame metadata read with the frame (a virtio-net header) land in
    /// the headroom and the frame right after it. [`PacketBuf::set_received`] says how much
    /// was read. `prefix` is at most [`HEADROOM`] (clamped).
    pub fn receive_area(&mut self, prefix: usize) -> &mut [u8] {
        &mut self.buf[HEADROOM - prefix.min(HEADROOM)..]
    }

    /// `n` bytes were read into [`PacketBuf::receive_area`]`(prefix)`: the frame is what
    /// follows the `prefix` metadata bytes, with no GSO size and not generated. An error if
    /// `n` is shorter than the metadata or longer than the area.
    pub fn set_received(&mut self, prefix: usize, n: usize) -> Result<(), NoRoom> {
        let area = self.buf.len() - (HEADROOM - prefix.min(HEADROOM));
        if prefix > HEADROOM || n < prefix || n > area {
            return Err(NoRoom {
                wanted: n,
                available: area,
            });
        }
        self.start = HEADROOM;
        self.end = HEADROOM - prefix + n;
        self.gso_size = 0;
        self.generated = false;
        Ok(())
    }

    /// The `n` bytes right in front of the frame: after [`PacketBuf::set_received`], the
    /// metadata read with it (until the frame is moved or the headroom written). `None` if
    /// the headroom is shorter.
    pub fn prefix(&self, n: usize) -> Option<&[u8]> {
        self.buf.get(self.start.checked_sub(n)?..self.start)
    }

    /// Writes `prefix` into the headroom right in front of the frame and returns the two as
    /// one slice, for a driver that sends metadata and frame with one write (a virtio-net
    /// header before a frame to a TAP). The frame itself does not change.
    pub fn framed(&mut self, prefix: &[u8]) -> Result<&[u8], NoRoom> {
        let Some(at) = self.start.checked_sub(prefix.len()) else {
            return Err(NoRoom {
                wanted: prefix.len(),
                available: self.start,
            });
        };
        self.buf[at..self.start].copy_from_slice(prefix);
        Ok(&self.buf[at..self.end])
    }

    /// The segment size of a GSO / TSO super-frame (the transport payload bytes of each packet
    /// the receiving stack or NIC will cut it into), or 0 for an ordinary frame. A driver that
    /// takes super-frames from a TAP or virtio queue sets it after [`PacketBuf::load`] (which
    /// clears it), so that the router checks the MTU against the packets that will be on the
    /// wire, not the super-frame.
    #[inline]
    pub fn gso_size(&self) -> u16 {
        self.gso_size
    }

    /// Marks the frame a GSO super-frame of `gso_size`-byte segments (0: not one).
    #[inline]
    pub fn set_gso_size(&mut self, gso_size: u16) {
        self.gso_size = gso_size;
    }

    /// Whether the vSwitch replaced the frame with one of its own (an ICMP error, an ARP or
    /// neighbour-discovery answer): its checksums are complete and it carries no offload, so a
    /// driver must send it with a plain virtio-net header, not the one the original came with.
    #[inline]
    pub fn is_generated(&self) -> bool {
        self.generated
    }

    /// Records that the frame now is one the vSwitch wrote (see [`PacketBuf::is_generated`]);
    /// clears the GSO size.
    #[inline]
    pub fn mark_generated(&mut self) {
        self.generated = true;
        self.gso_size = 0;
    }

    /// The frame.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// The frame, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.end]
    }

    /// Frame length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// True when the buffer holds no frame.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// Free bytes in front of the frame.
    #[inline]
    pub fn headroom(&self) -> usize {
        self.start
    }

    /// Strip `n` bytes from the front (decapsulation).
    #[inline]
    pub fn pull_front(&mut self, n: usize) -> Result<(), NoRoom> {
        if n > self.len() {
            return Err(NoRoom {
                wanted: n,
                available: self.len(),
            });
        }
        self.start += n;
        Ok(())
    }

    /// Grow the frame by `n` bytes at the front (encapsulation) and return them for writing.
    #[inline]
    pub fn push_front(&mut self, n: usize) -> Result<&mut [u8], NoRoom> {
        if n > self.start {
            return Err(NoRoom {
                wanted: n,
                available: self.start,
            });
        }
        self.start -= n;
        Ok(&mut self.buf[self.start..self.start + n])
    }

    /// Drop trailing bytes beyond `len` (e.g. Ethernet padding after decapsulation).
    #[inline]
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            self.end = self.start + len;
        }
    }

    /// Set the frame's length to `len`: shorter drops trailing bytes, longer grows into the
    /// room after the frame with zero bytes (a reply written in place may be longer than the
    /// request it answers).
    #[inline]
    pub fn set_len(&mut self, len: usize) -> Result<(), NoRoom> {
        let room = self.buf.len() - self.start;
        if len > room {
            return Err(NoRoom {
                wanted: len,
                available: room,
            });
        }
        let end = self.start + len;
        if end > self.end {
            self.buf[self.end..end].fill(0);
        }
        self.end = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_and_pull_round_trip_without_copying_the_payload() {
        let mut p = PacketBuf::from_frame(&[1, 2, 3, 4]);
        p.push_front(2).unwrap().copy_from_slice(&[9, 9]);
        assert_eq!(p.data(), &[9, 9, 1, 2, 3, 4]);
        p.pull_front(2).unwrap();
        assert_eq!(p.data(), &[1, 2, 3, 4]);
        assert_eq!(p.push_front(HEADROOM + 1).unwrap_err().available, HEADROOM);
        assert_eq!(
            p.pull_front(5).unwrap_err(),
            NoRoom {
                wanted: 5,
                available: 4
            }
        );
    }

    #[test]
    fn set_len_grows_with_zeros_and_stops_at_the_buffer() {
        let mut p = PacketBuf::with_capacity(HEADROOM + 8);
        p.load(&[7; 4]).unwrap();
        p.set_len(2).unwrap();
        p.set_len(6).unwrap();
        assert_eq!(p.data(), &[7, 7, 0, 0, 0, 0]);
        assert_eq!(p.set_len(9).unwrap_err().available, 8);
    }

    #[test]
    fn a_frame_read_in_place_keeps_its_metadata_in_the_headroom() {
        let mut p = PacketBuf::with_capacity(HEADROOM + 8);
        let area = p.receive_area(4);
        assert_eq!(
            area.len(),
            12,
            "the metadata and a frame of at most the capacity"
        );
        area[..7].copy_from_slice(&[1, 2, 3, 4, 9, 8, 7]);
        p.set_gso_size(5);
        p.set_received(4, 7).unwrap();
        assert_eq!(p.data(), &[9, 8, 7]);
        assert_eq!(p.prefix(4), Some(&[1, 2, 3, 4][..]));
        assert_eq!(p.gso_size(), 0, "a fresh frame");
        assert_eq!(p.framed(&[5, 5]).unwrap(), &[5, 5, 9, 8, 7]);
        assert_eq!(p.data(), &[9, 8, 7], "framing leaves the frame alone");
        assert!(p.set_received(4, 3).is_err(), "shorter than its metadata");
        assert!(p.set_received(4, 13).is_err(), "longer than the area");
        assert!(p.framed(&[0; HEADROOM + 1]).is_err());
        assert_eq!(p.prefix(HEADROOM + 1), None);
    }

    #[test]
    fn load_rejects_a_frame_longer_than_the_buffer() {
        let mut p = PacketBuf::with_capacity(HEADROOM + 8);
        assert_eq!(
            p.load(&[0; 9]),
            Err(FrameTooLong {
                expected: 8,
                actual: 9
            })
        );
        assert!(p.load(&[0; 8]).is_ok());
    }
}
