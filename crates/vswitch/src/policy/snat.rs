//! SNAT port allocation: one [`SnatPool`] per tenant and protocol (TCP, UDP, ICMP id).
//!
//! Allocation is deterministic: a cursor walks the configured range and hands out the next free
//! port after the last one allocated, wrapping around, so a run replays exactly from its seed and
//! a just-released port is not reused until the cursor comes round again (which keeps late
//! packets of an old connection away from a new one for as long as possible). The in-use set is a
//! bitmap over the range: at most 8 KB per pool, and `allocate` scans it a word at a time.

use super::SnatRange;
use spillway_wire::ip_proto;

/// Why a SNAT port could not be allocated or released. `Copy`: raised on the slow path.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum SnatError {
    /// Every port of the range is in use; the slow path drops with `DropReason::SnatExhausted`.
    #[error("SNAT ports exhausted: all {capacity} ports of {port_min}-{port_max} in use")]
    Exhausted {
        /// First port of the range.
        port_min: u16,
        /// Last port of the range.
        port_max: u16,
        /// Size of the range.
        capacity: u32,
    },
    /// `release` of a port outside the range.
    #[error("SNAT port {port} is outside the range {port_min}-{port_max}")]
    OutOfRange {
        /// The port released.
        port: u16,
        /// First port of the range.
        port_min: u16,
        /// Last port of the range.
        port_max: u16,
    },
    /// `release` of a port that is not allocated (a double release is a caller bug made visible).
    #[error("SNAT port {port} is not allocated")]
    NotAllocated {
        /// The port released.
        port: u16,
    },
}

impl SnatError {
    /// The drop a failed allocation turns into: `Some(SnatExhausted)` for exhaustion; release
    /// errors are caller bugs, not packet drops, and give `None`.
    pub fn drop_reason(self) -> Option<crate::verdict::DropReason> {
        match self {
            SnatError::Exhausted { .. } => Some(crate::verdict::DropReason::SnatExhausted),
            SnatError::OutOfRange { .. } | SnatError::NotAllocated { .. } => None,
        }
    }
}

/// The ports of one range, allocated by a cursor. Bounded by the range.
#[derive(Clone, Debug)]
pub struct SnatPool {
    port_min: u16,
    port_max: u16,
    /// Bit `i` set: port `port_min + i` is in use.
    used: Vec<u64>,
    in_use: u32,
    /// Offset (from `port_min`) where the next search starts.
    cursor: u32,
}

impl SnatPool {
    /// A pool over `port_min..=port_max`. Panics if `port_min > port_max` (the config validator
    /// rejects that range first).
    pub fn new(port_min: u16, port_max: u16) -> SnatPool {
        assert!(port_min <= port_max, "SNAT range validated non-empty");
        let capacity = u32::from(port_max) - u32::from(port_min) + 1;
        SnatPool {
            port_min,
            port_max,
            used: vec![0; (capacity as usize).div_ceil(64)],
            in_use: 0,
            cursor: 0,
        }
    }

    /// A pool over a tenant's configured range.
    pub fn for_range(range: &SnatRange) -> SnatPool {
        SnatPool::new(range.port_min, range.port_max)
    }

    /// Number of ports in the range.
    pub fn capacity(&self) -> u32 {
        u32::from(self.port_max) - u32::from(self.port_min) + 1
    }

    /// Ports currently allocated.
    pub fn in_use(&self) -> u32 {
        self.in_use
    }

    /// Whether `port` is allocated.
    pub fn is_allocated(&self, port: u16) -> bool {
        self.offset(port)
            .is_some_and(|o| self.used[o as usize / 64] & (1 << (o % 64)) != 0)
    }

    fn offset(&self, port: u16) -> Option<u32> {
        (self.port_min..=self.port_max)
            .contains(&port)
            .then(|| u32::from(port - self.port_min))
    }

    /// The next free port at or after the cursor, wrapping; the cursor moves past it.
    pub fn allocate(&mut self) -> Result<u16, SnatError> {
        let capacity = self.capacity();
        if self.in_use == capacity {
            return Err(SnatError::Exhausted {
                port_min: self.port_min,
                port_max: self.port_max,
                capacity,
            });
        }
        let words = self.used.len();
        let start_word = self.cursor as usize / 64;
        // Scan words from the cursor's, masking bits before the cursor in the first word; the
        // last visit (index `words`) revisits the first word for the bits before the cursor.
        for step in 0..=words {
            let w = (start_word + step) % words;
            let mut free = !self.used[w];
            if step == 0 {
                free &= u64::MAX << (self.cursor % 64);
            }
            // Bits past the end of the range are never free.
            let base = (w * 64) as u32;
            if base + 64 > capacity {
                free &= (1u64 << (capacity - base)) - 1;
            }
            if free != 0 {
                let o = base + free.trailing_zeros();
                self.used[w] |= 1 << (o % 64);
                self.in_use += 1;
                self.cursor = (o + 1) % capacity;
                let port = u32::from(self.port_min) + o;
                return Ok(u16::try_from(port).expect("offset within the u16 range"));
            }
        }
        unreachable!("in_use < capacity, so some bit in the range is free")
    }

    /// Return a port to the pool.
    pub fn release(&mut self, port: u16) -> Result<(), SnatError> {
        let o = self.offset(port).ok_or(SnatError::OutOfRange {
            port,
            port_min: self.port_min,
            port_max: self.port_max,
        })?;
        let bit = 1u64 << (o % 64);
        let word = &mut self.used[o as usize / 64];
        if *word & bit == 0 {
            return Err(SnatError::NotAllocated { port });
        }
        *word &= !bit;
        self.in_use -= 1;
        Ok(())
    }

    /// The count matches the bitmap, and no bit past the range is set.
    pub fn check_invariants(&self) {
        let ones: u32 = self.used.iter().map(|w| w.count_ones()).sum();
        assert_eq!(ones, self.in_use);
        assert!(self.in_use <= self.capacity());
        assert!(self.cursor < self.capacity());
        for port in 0..=u16::MAX {
            if !(self.port_min..=self.port_max).contains(&port) {
                assert!(!self.is_allocated(port));
            }
        }
    }
}

/// The three pools of one tenant: TCP ports, UDP ports, ICMP echo identifiers.
#[derive(Clone, Debug)]
pub struct SnatPools {
    /// TCP source ports.
    pub tcp: SnatPool,
    /// UDP source ports.
    pub udp: SnatPool,
    /// ICMP / ICMPv6 echo identifiers.
    pub icmp: SnatPool,
}

impl SnatPools {
    /// Fresh pools over a tenant's configured range.
    pub fn new(range: &SnatRange) -> SnatPools {
        SnatPools {
            tcp: SnatPool::for_range(range),
            udp: SnatPool::for_range(range),
            icmp: SnatPool::for_range(range),
        }
    }

    /// The pool for an IP protocol; `None` for protocols SNAT does not translate.
    pub fn for_protocol(&mut self, proto: u8) -> Option<&mut SnatPool> {
        match proto {
            ip_proto::TCP => Some(&mut self.tcp),
            ip_proto::UDP => Some(&mut self.udp),
            ip_proto::ICMP | ip_proto::ICMPV6 => Some(&mut self.icmp),
            _ => None,
        }
    }

    /// The pool for an IP protocol, read-only; `None` for protocols SNAT does not translate.
    pub fn get(&self, proto: u8) -> Option<&SnatPool> {
        match proto {
            ip_proto::TCP => Some(&self.tcp),
            ip_proto::UDP => Some(&self.udp),
            ip_proto::ICMP | ip_proto::ICMPV6 => Some(&self.icmp),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn allocates_in_cursor_order_and_exhausts() {
        let mut p = SnatPool::new(1000, 1003);
        assert_eq!(p.allocate(), Ok(1000));
        assert_eq!(p.allocate(), Ok(1001));
        assert_eq!(p.allocate(), Ok(1002));
        assert_eq!(p.allocate(), Ok(1003));
        assert_eq!(
            p.allocate(),
            Err(SnatError::Exhausted {
                port_min: 1000,
                port_max: 1003,
                capacity: 4
            })
        );
        assert_eq!(p.in_use(), 4);
        assert_eq!(
            p.allocate().map_err(SnatError::drop_reason),
            Err(Some(crate::verdict::DropReason::SnatExhausted))
        );
        p.check_invariants();
    }

    #[test]
    fn released_port_is_reused_after_the_cursor_wraps() {
        let mut p = SnatPool::new(1000, 1003);
        for _ in 0..3 {
            p.allocate().expect("room");
        }
        p.release(1001).expect("allocated");
        assert_eq!(p.in_use(), 2);
        // The cursor is at 1003: it is handed out before the released 1001.
        assert_eq!(p.allocate(), Ok(1003));
        assert_eq!(p.allocate(), Ok(1001));
        assert!(p.allocate().is_err());
        p.check_invariants();
    }

    #[test]
    fn release_errors_are_typed() {
        let mut p = SnatPool::new(1000, 1003);
        assert_eq!(
            p.release(999),
            Err(SnatError::OutOfRange {
                port: 999,
                port_min: 1000,
                port_max: 1003
            })
        );
        assert_eq!(p.release(1000), Err(SnatError::NotAllocated { port: 1000 }));
    }

    #[test]
    fn full_u16_range_and_single_port_ranges_work() {
        let mut p = SnatPool::new(0, u16::MAX);
        assert_eq!(p.capacity(), 65536);
        for expect in 0..=u16::MAX {
            assert_eq!(p.allocate(), Ok(expect));
        }
        assert!(p.allocate().is_err());
        p.release(65535).expect("allocated");
        assert_eq!(p.allocate(), Ok(65535));
        let mut one = SnatPool::new(7, 7);
        assert_eq!(one.allocate(), Ok(7));
        assert!(one.allocate().is_err());
        one.release(7).expect("allocated");
        assert_eq!(one.allocate(), Ok(7));
    }

    proptest! {
        #[test]
        fn pool_matches_a_set_model(
            (min, len) in (0u16..200, 1u16..130),
            ops in proptest::collection::vec((any::<bool>(), 0u16..140), 0..400),
        ) {
            let max = min + len - 1;
            let mut p = SnatPool::new(min, max);
            let mut model: BTreeSet<u16> = BTreeSet::new();
            for (alloc, k) in ops {
                if alloc {
                    match p.allocate() {
                        Ok(port) => {
                            prop_assert!((min..=max).contains(&port));
                            prop_assert!(model.insert(port), "double allocation of {}", port);
                        }
                        Err(SnatError::Exhausted { .. }) => {
                            prop_assert_eq!(model.len(), usize::from(len));
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                } else {
                    let port = min.saturating_add(k);
                    let r = p.release(port);
                    prop_assert_eq!(r.is_ok(), model.remove(&port));
                }
                prop_assert_eq!(p.in_use() as usize, model.len());
            }
            p.check_invariants();
        }
    }
}
