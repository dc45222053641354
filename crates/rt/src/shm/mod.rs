//! The shared-memory protocol between processes: memfd rings and their doorbells, virtio
//! queues in a VM's memory, the record codec, the vNIC set between the DPU and the spill plane,
//! and the passing of file descriptors over Unix sockets. Memory shared with another process
//! is untrusted: every length and record read from it is checked.

pub mod codec;
pub mod fdpass;
pub mod ring;
pub mod virtq;
pub mod vnic;
