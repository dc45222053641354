//! The spill-plane process (`spillway spill-plane`), started by the DPU process in its own
//! cgroup and connected to it by the vNIC set ([`crate::shm::vnic`]).

pub mod process;
mod threads;
