//! The DPU process of `spillway run`: the daemon loop around the core's DPU frame node
//! ([`daemon`]), the bring-up of a testbed's VMs as namespaces on TAP devices ([`bringup`]),
//! and shared-memory VM ports ([`vmport`]: the attach handshake and the DPU's end, plus the
//! vATC delivery the spill plane and the VM endpoint also use).

pub mod bringup;
pub mod daemon;
pub mod vmport;
