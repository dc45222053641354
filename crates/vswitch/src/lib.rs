//! # spillway-vswitch
//!
//! The Spillway virtual switch: the one pipeline that both the DPU's SoC slow path and the host
//! spill plane run, and the flow entries the DPU's hardware fast path executes. Sans-IO: every
//! call takes `now`, nothing reads a clock, spawns a thread or does I/O.
//!
//! ## Main types
//!
//! - [`policy::Policy`]: tenants (VPC + VNI), subnets, VM ports with anti-spoofing, stateful
//!   security groups, per-VPC routes (longest prefix match), SNAT ranges; loaded from TOML with
//!   errors that name the file, the field and what was expected.
//! - [`conntrack::Conntrack`]: per-tenant-zone connection tracking with a TCP state machine,
//!   UDP/ICMP pseudo-connections, state-dependent timeouts and a bounded table.
//! - [`flow_table::FlowTable`]: the bounded exact-match table with per-entry counters, idle
//!   expiry and evict-or-reject when full; the same type models the DPU hardware table.
//! - [`flow::FlowMatch`] + [`flow::FlowEntry`] with an [`action::ActionList`]: the unified flow
//!   entry (exact match plus header transformation), stamped with the policy [`Epoch`].
//! - [`frag::FragTable`]: bounded IP fragment tracking; later fragments follow the verdict and
//!   rewrites of their first fragment (tracking, not reassembly; see the module doc).
//! - [`pipeline::Pipeline`]: batched fast path over the flow table, slow path over policy and
//!   conntrack, producing forward and reverse entries.
//! - [`neigh`]: the ARP / IPv6 neighbour-discovery responder for VM ports (answers with the
//!   tenant router's MAC, in place, out of the ingress port).
//!
//! ## Invariants
//!
//! - Every frame offered is forwarded or dropped with a counted [`DropReason`]
//!   ([`pipeline::Pipeline::check_invariants`] checks conservation).
//! - The fast path and the slow path give the same verdict and bytes for the same packet under
//!   the same epoch (`tests/path_equivalence.rs`).
//! - No table exceeds its configured capacity; nothing allocates per packet on the fast path.
//!
//! ## Example
//!
//! ```
//! use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
//! use spillway_vswitch::policy::Policy;
//! use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};
//! use spillway_wire::MacAddr;
//! use spillway_wire::build::FrameBuilder;
//!
//! let policy = Policy::from_toml_str(r#"
//!     [host]
//!     uplink_port = 0
//!     uplink_mac = "02:00:00:00:00:01"
//!     vtep_ip = "192.0.2.1"
//!     gateway_mac = "02:00:00:00:00:fe"
//!     [[tenant]]
//!     id = 1
//!     vni = 100
//!     router_mac = "02:00:00:00:01:01"
//!     subnets = ["10.0.0.0/24"]
//!     [[port]]
//!     id = 1
//!     tenant = 1
//!     mac = "02:00:00:00:00:0a"
//!     ips = ["10.0.0.1"]
//!     [[port]]
//!     id = 2
//!     tenant = 1
//!     mac = "02:00:00:00:00:0b"
//!     ips = ["10.0.0.2"]
//!     security_groups = [1]
//!     [[security_group]]
//!     id = 1
//!     tenant = 1
//!     [[security_group.rule]]
//!     direction = "ingress"
//!     priority = 1
//!     action = "allow"
//!     protocol = "udp"
//!     remote = "10.0.0.0/24"
//! "#, "example.toml").unwrap();
//! let mut pipeline = Pipeline::new(policy, PipelineConfig::default()).unwrap();
//! let frame = FrameBuilder::new()
//!     .eth(MacAddr([2, 0, 0, 0, 0, 0xa]), MacAddr([2, 0, 0, 0, 1, 1]))
//!     .ipv4([10, 0, 0, 1], [10, 0, 0, 2])
//!     .udp(5000, 53)
//!     .build();
//! let mut pkt = PacketBuf::from_frame(&frame);
//! // The first packet walks the slow path and installs the connection's two flow entries...
//! assert_eq!(pipeline.process(Instant(1), PortId(1), &mut pkt), Verdict::Forward(PortId(2)));
//! assert_eq!(&pkt.data()[0..6], &[2, 0, 0, 0, 0, 0xb]); // destination MAC rewritten
//! // ...and the next one hits the fast path.
//! let mut pkt = PacketBuf::from_frame(&frame);
//! pipeline.process(Instant(2), PortId(1), &mut pkt);
//! assert_eq!(pipeline.counters().fast_path_hits, 1);
//! ```

#![deny(unsafe_code)]

pub mod action;
pub mod conntrack;
pub mod counters;
pub mod flow;
pub mod flow_table;
pub mod frag;
pub mod ids;
pub mod neigh;
pub mod packet;
pub mod pipeline;
pub mod policy;
pub mod router;
pub mod time;
pub mod verdict;
pub mod workload;

pub use ids::{Direction, Epoch, PortId, SecurityGroupId, TenantId};
pub use packet::PacketBuf;
pub use time::Instant;
pub use verdict::{DropCounters, DropKind, DropReason, Verdict};
