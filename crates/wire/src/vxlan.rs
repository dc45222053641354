//! VXLAN header (RFC 7348 section 5): flags (8 bits, I = 0x08 must be set), 24 reserved bits,
//! the 24-bit VNI, 8 reserved bits. Carried in UDP, destination port 4789 by default.

use crate::error::{Layer, WireError};
use crate::key::Vni;

/// VXLAN header length.
pub const HEADER_LEN: usize = 8;
/// The IANA-assigned UDP port.
pub const UDP_PORT: u16 = 4789;
/// The "valid VNI" flag.
pub const FLAG_I: u8 = 0x08;

/// A view of a VXLAN header and the frame after it.
#[derive(Debug, Clone, Copy)]
pub struct VxlanPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VxlanPacket<T> {
    /// Wraps without checks; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        VxlanPacket { buffer }
    }

    /// Wraps and checks: 8 bytes, I flag set (`BadField` otherwise).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        let h: &[u8; HEADER_LEN] =
            b.first_chunk()
                .ok_or(WireError::truncated(Layer::Vxlan, HEADER_LEN, b.len()))?;
        if h[0] & FLAG_I == 0 {
            return Err(WireError::bad_field(
                Layer::Vxlan,
                "I flag",
                FLAG_I as u32,
                h[0] as u32,
            ));
        }
        Ok(VxlanPacket { buffer })
    }

    /// Flags byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// The VNI.
    pub fn vni(&self) -> Vni {
        let b = self.buffer.as_ref();
        Vni::new(u32::from_be_bytes([0, b[4], b[5], b[6]])).expect("24 bits always fit")
    }
    /// The inner Ethernet frame.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VxlanPacket<T> {
    /// Writes flags = I and the VNI, zeroing the reserved bits.
    pub fn set_header(&mut self, vni: Vni) {
        let b = self.buffer.as_mut();
        let v = vni.get().to_be_bytes();
        b[..8].copy_from_slice(&[FLAG_I, 0, 0, 0, v[1], v[2], v[3], 0]);
    }
}
