//! vhost-user VM ports: the DPU process as the backend of a QEMU `virtio-net` device
//! (`backend = "vhost-user"`), so that a real guest's virtqueues, in its own memory, are a port
//! of the vSwitch as a TAP is.
//!
//! - [`msg`]: the protocol's framing, bounded before anything is allocated.
//! - [`device`]: the device's state machine ([`device::Session`], one per frontend connection)
//!   and the data path's operations on the guest's queues ([`device::recv`], [`device::send`]),
//!   built on rust-vmm's `virtio-queue` (descriptor chains) and `vm-memory` (the guest's memory
//!   table, mapped from the memfds the frontend sends).
//! - [`lend`]: the guest's receive queue 1 lent to the spill plane, which fills it through its
//!   vATC (the lease both processes map, and the plane's delivery).
//! - [`conn`]: the port's service thread, which holds the socket (listening or connecting) and
//!   runs the sessions.
//!
//! Why the protocol is handled here and not by the `vhost` crate's backend handler, how the
//! plane's queue is lent, and what is not done yet: see `docs/adr/0013-vhost-user.md`.

pub mod conn;
pub mod device;
pub mod lend;
pub mod msg;

use std::time::Duration;

/// How long a port whose guest broke a queue serves no new connection.
pub const QUARANTINE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests;
