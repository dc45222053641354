//! # spillway-fabric
//!
//! The elastic fabric, sans-IO: the emulated DPU ([`dpu::DpuNode`], its hardware behind the
//! [`hw::DpuHardware`] trait a real backend would implement), the host spill plane
//! ([`spill::SpillPlane`]), the scheduler that decides when the plane runs
//! ([`ursched::URSched`]), the placement policies that hand flows back to the DPU's hardware
//! fast path ([`placement`]), the vATC translation cache the plane uses to write into VM
//! memory ([`atc`]), and the messages between them ([`types`]). Two drivers run it: the
//! deterministic simulator (`spillway-sim`) and the real-time runtime (`spillway-rt`). For real
//! frames, [`frame`] joins each node to a vSwitch pipeline ([`frame::DpuSwitch`],
//! [`frame::PlaneSwitch`]): one call per frame, one [`frame::Outcome`].
//!
//! ## Shape
//!
//! Each node takes `handle_*(now, input)` calls and hands back outputs through `poll_*`
//! (messages with their departure time and channel, commands, lifecycle events,
//! `poll_timeout`). Nodes never read a clock, never sleep and never talk to each other
//! directly: the driver carries every [`types::Transmit`] over its channel with the link's
//! latency, and may lose messages on unreliable channels when it injects faults.
//!
//! ## The model
//!
//! Resources are FIFO servers with bounded queues ([`server::Server`]); their capacities and
//! costs are [`params::FabricParams`], each default documented with its source. Traffic comes in
//! trains (packets of one connection arriving together); the hardware table is the real bounded
//! [`spillway_vswitch::flow_table::FlowTable`] with `Reject` at capacity.
//!
//! ## Invariants
//!
//! - Every packet offered is delivered, dropped with a counted [`stats::FabricDrop`], or in a
//!   message in flight (the driver checks the sum).
//! - A connection has at most one `Owner` across the DPU and the planes in its two plane
//!   slots (the warm standby plane holds copies only, ADR 0012); while a handover message is in
//!   flight it has none, and the sender keeps a copy.
//! - No table or queue exceeds its capacity; inserts never exceed the insertion rate (they are
//!   served by a server at that rate).
//!
//! ## Example
//!
//! ```
//! use spillway_fabric::dpu::DpuNode;
//! use spillway_fabric::params::FabricParams;
//! use spillway_fabric::types::{ConnId, Dest, Kind, Side, Train};
//! use spillway_vswitch::{Instant, TenantId};
//!
//! let f = FabricParams::default();
//! let mut dpu = DpuNode::new(&f);
//! let syn = Train {
//!     conn: ConnId(1), tenant: TenantId(1), side: Side::Orig, dest: Dest::Vm, kind: Kind::Open,
//!     packets: 1, packet_bytes: 64, born: Instant(0), denied: false,
//! };
//! dpu.handle_train(Instant(0), &syn);
//! assert_eq!(dpu.counters().soc_new_conn, 1);
//! // The entries go live after the insert latency; later packets take the fast path.
//! dpu.handle_timeout(Instant(1_000_000));
//! let data = Train { kind: Kind::Data, packets: 10, born: Instant(1_000_000), ..syn };
//! dpu.handle_train(Instant(1_000_000), &data);
//! assert_eq!(dpu.counters().hw_delivered, 10);
//! ```

#![deny(unsafe_code)]

pub mod atc;
pub mod dpu;
pub mod frame;
pub mod hw;
mod links;
pub mod params;
pub mod placement;
mod records;
pub mod server;
pub mod spill;
pub mod stable_placement;
pub mod stats;
pub mod types;
pub mod ursched;
