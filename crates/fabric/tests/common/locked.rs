//! A handle through which several shards (or nodes) on several threads charge one DPU's
//! `Resources`, behind a `Mutex`: what a driver with a thread per shard would give its shards.
//! The core takes no lock; tests and benches that share resources across threads use this.

use std::sync::{Arc, Mutex, MutexGuard};

use spillway_fabric::dpu::{EmulatedHardware, Resources, ResourcesHandle};
use spillway_fabric::params::FabricParams;

/// A shard's handle to the DPU's one `Resources`. Not exclusive: other holders of the same
/// `Arc` may hold records the node does not.
#[derive(Debug)]
pub struct Locked(pub Arc<Mutex<Resources>>);

impl ResourcesHandle for Locked {
    type Read<'a> = MutexGuard<'a, Resources>;
    type Write<'a> = MutexGuard<'a, Resources>;
    const EXCLUSIVE: bool = false;
    fn read(&self) -> MutexGuard<'_, Resources> {
        self.0
            .lock()
            .expect("a shard panicked holding the resources")
    }
    fn write(&mut self) -> MutexGuard<'_, Resources> {
        self.0
            .lock()
            .expect("a shard panicked holding the resources")
    }
}

/// The resources of a DPU with the limits in `f`, over the emulated hardware, to share.
pub fn resources(f: &FabricParams) -> Arc<Mutex<Resources>> {
    Arc::new(Mutex::new(Resources::new(
        f,
        Box::new(EmulatedHardware::new(f)),
    )))
}
