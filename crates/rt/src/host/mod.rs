//! The host operating system: TAP devices (and their io_uring), network namespaces and links, cgroups, the
//! crash-safe cleanup ledger, signals, the clock, privilege dropping, Unix sockets and the
//! virtio-net header. Everything here is a thin, typed wrapper over a kernel interface or a
//! system tool; nothing here knows about the fabric core.

pub mod allocs;
pub mod cgroup;
pub mod clock;
pub mod ledger;
pub mod netns;
pub mod privilege;
pub mod signals;
pub mod tap;
pub mod tap_uring;
pub mod unixsock;
pub mod vnet;
