//! # spillway-wire
//!
//! Zero-copy packet views for the Spillway data plane (placeholder; being written).

#![deny(unsafe_code)]

pub mod key;

pub use key::{FlowKey, IpAddr16, MacAddr, Vni, ip_proto};
pub mod error;
pub use error::{ErrorKind, Layer, WireError};
