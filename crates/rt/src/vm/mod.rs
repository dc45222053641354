//! The VM side of a shared-memory port (`spillway vm-endpoint`): owns the VM's memory and
//! drives its virtio queues as a guest driver would.

pub mod endpoint;
