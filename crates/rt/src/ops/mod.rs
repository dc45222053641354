//! Operator interfaces: the `spillway ctl` control socket, the Prometheus metrics endpoint,
//! structured logging, and the service thread the two servers share.

pub mod cluster;
pub mod ctl;
mod exposition;
pub mod log;
pub mod metrics;
pub(crate) mod service;
