//! # spillway-vswitch
//!
//! The vSwitch (placeholder; being written).

#![deny(unsafe_code)]

pub mod action;
pub mod conntrack;
pub mod flow;
pub mod flow_table;
pub mod ids;
pub mod packet;
pub mod pipeline;
pub mod policy;
pub mod time;
pub mod verdict;
pub mod workload;

pub use ids::{Direction, Epoch, PortId, SecurityGroupId, TenantId};
pub use packet::PacketBuf;
pub use time::Instant;
pub use verdict::{DropCounters, DropKind, DropReason, Verdict};
