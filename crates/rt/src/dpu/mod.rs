//! The DPU process of `spillway run`: the daemon loop around the core's DPU frame node
//! ([`daemon`]; its ports, the plane's process, its reports and its start are in private
//! sibling modules), the bring-up of a testbed's VMs as namespaces on TAP devices ([`bringup`]),
//! and shared-memory VM ports ([`vmport`]: the attach handshake and the DPU's end, plus the
//! vATC delivery the spill plane and the VM endpoint also use). [`shards`] carries the DPU
//! model's control part's requests to shards on other threads (ADR 0011; not used by the
//! daemon yet).

pub mod bringup;
pub mod daemon;
mod forward;
mod plane_ctl;
mod plane_proc;
mod ports;
pub(crate) use ports::worth_logging;
mod report;
mod setup;
pub mod shards;
pub mod vmport;
