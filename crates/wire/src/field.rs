//! Byte-order helpers shared by the header views. The views check their length once in
//! `new_checked`; after that these indexings are in bounds (a view built with `new_unchecked`
//! over a short buffer panics on access, exactly like smoltcp's).

#[inline(always)]
pub(crate) fn be16(b: &[u8], i: usize) -> u16 {
    u16::from_be_bytes([b[i], b[i + 1]])
}

#[inline(always)]
pub(crate) fn be32(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

#[inline(always)]
pub(crate) fn set16(b: &mut [u8], i: usize, v: u16) {
    b[i..i + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
pub(crate) fn set32(b: &mut [u8], i: usize, v: u32) {
    b[i..i + 4].copy_from_slice(&v.to_be_bytes());
}
