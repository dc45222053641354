//! The VM side: a shared-memory port's endpoint (`spillway vm-endpoint`), which owns the VM's
//! memory and drives its virtio queues as a guest driver would ([`endpoint`]), and a real guest
//! under QEMU ([`qemu`]).

pub mod endpoint;
pub mod qemu;
pub mod vhost_user;
