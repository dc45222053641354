//! Newtypes for every id space in the vSwitch. Mixing a port id with a tenant id is a type error.

use core::fmt;

macro_rules! id_newtype {
    ($(#[$m:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
        #[derive(serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_newtype!(
    /// A vSwitch port: a VM's vNIC or the uplink. Assigned by the policy config.
    PortId(u32),
    "port:"
);
id_newtype!(
    /// A tenant (one VPC). Also the conntrack zone: connections of different tenants never meet.
    TenantId(u32),
    "tenant:"
);
id_newtype!(
    /// A security group.
    SecurityGroupId(u32),
    "sg:"
);

/// The policy epoch. Every policy change increments it; a flow entry made under an older epoch is
/// stale and is recomputed by the slow path on its next hit (never patched in place).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch after this one.
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch:{}", self.0)
    }
}

/// Direction of traffic relative to the VM, the only meaning the word has in Spillway:
/// `Egress` leaves the VM (its vNIC transmits), `Ingress` arrives at the VM.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Toward the VM.
    Ingress,
    /// From the VM.
    Egress,
}
