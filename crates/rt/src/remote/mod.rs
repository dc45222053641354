//! The remote plane: a host whose own cores are all taken runs its spill plane on a pool
//! host's cores, across the underlay.
//!
//! ```text
//!  host A: DPU process ==vNIC set== relay (its "plane": spillway spill-plane --remote)
//!                                     |  TCP, A's host namespace -> P's, over the underlay
//!  host P: pool service (a thread of P's DPU process) ==vNIC set== spill plane (P's pool cgroup)
//! ```
//!
//! Neither the DPU process nor the plane knows the plane is remote: the relay and the pool
//! service each hold one end of a vNIC set and move its records over one TCP connection
//! ([`link`]), so every rule (steering, sync, fail-open when the plane goes) is the one the
//! local plane follows. What differs is where the cores are and what it costs: the reservation
//! in the cluster (`spillway_cluster`), the token the relay presents, and the underlay's
//! round trip on every steered frame. A VM's memory cannot be lent across hosts, so a remote
//! plane delivers the DPU way (no vATC).

pub mod link;
pub mod pool;
pub mod relay;
