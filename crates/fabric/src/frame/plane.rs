//! The spill plane's side of a frame: [`PlaneSwitch`].

use spillway_vswitch::pipeline::{Pipeline, PipelineConfig, PipelineError};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PortId};

use super::{FrameDrop, Outcome, SwitchCore};
use crate::params::FabricParams;
use crate::spill::SpillPlane;
use crate::types::{Kind, Msg, Train};

/// The spill plane with real frames: the [`SpillPlane`] model, the plane's own vSwitch
/// [`Pipeline`] (the same code as the DPU's, its own state) and its [`ConnTable`](super::ConnTable).
///
/// Inputs: [`PlaneSwitch::process`] (a frame the DPU steered here),
/// [`PlaneSwitch::direct_refused`] (a frame sent the vATC way could not be delivered so),
/// [`PlaneSwitch::handle_msg`] and [`PlaneSwitch::handle_conntrack`] (the DPU's flow and
/// control records), and the model's own inputs through [`PlaneSwitch::plane_mut`] (timers,
/// workers, placement). Outputs: each frame's [`Outcome`], then
/// [`PlaneSwitch::poll_transmit`] (see the [module](super) for the polling order).
#[derive(Debug)]
pub struct PlaneSwitch {
    plane: SpillPlane,
    sw: SwitchCore,
    /// The last frame sent the vATC way: its train and the port it leaves by, until the next
    /// frame (for [`PlaneSwitch::direct_refused`]).
    direct: Option<(Train, PortId)>,
}

impl PlaneSwitch {
    /// A plane with fabric parameters `f`, vSwitch `policy` and `config`, remembering at most
    /// `conns_max` connections in its classifier. It is down until
    /// [`SpillPlane::start`] (through [`PlaneSwitch::plane_mut`]).
    pub fn new(
        f: &FabricParams,
        policy: Policy,
        config: PipelineConfig,
        conns_max: usize,
    ) -> Result<PlaneSwitch, PipelineError> {
        Ok(PlaneSwitch {
            plane: SpillPlane::new(f),
            sw: SwitchCore::new(Pipeline::new(policy, config)?, conns_max),
            direct: None,
        })
    }

    /// The model.
    pub fn plane(&self) -> &SpillPlane {
        &self.plane
    }

    /// The model, for its own inputs (start, timers, workers, placement, vATC on or off). The
    /// messages they cause come out of [`PlaneSwitch::poll_transmit`].
    pub fn plane_mut(&mut self) -> &mut SpillPlane {
        &mut self.plane
    }

    switch_api!(plane, "DPU");

    /// A frame the DPU steered here on the phy vNIC with `msg`, from port `port`; `gso_size`
    /// as in [`super::DpuSwitch::process`]. The model serves it or not; if it does, the
    /// frame runs through the pipeline and goes straight into its VM (vATC) or back to the
    /// DPU, and a TCP state change of a connection the plane owns is mirrored to the DPU's
    /// copy. A frame of a connection the plane has no state for yet is punted back as it came.
    pub fn process<'a>(
        &'a mut self,
        now: Instant,
        port: PortId,
        msg: Msg,
        gso_size: u16,
        frame: &'a [u8],
    ) -> Outcome<'a> {
        self.direct = None;
        let Msg::Packets(t) = msg else {
            return self.sw.drop(FrameDrop::Protocol);
        };
        // Classified on the headers the pipeline decides on (the inner frame of VXLAN), as the
        // DPU classified it, once copied out of the DPU's ring: the bytes the pipeline
        // processes are the bytes classified.
        let parsed = match self.sw.load_and_parse(port, frame) {
            Ok(p) => p,
            Err(d) => return Outcome::Drop(d),
        };
        let key = parsed.innermost().key;
        if t.kind == Kind::Open
            && let Some(key) = key
        {
            self.sw.conns.learn(now, t.tenant, key);
        }
        self.plane.handle_msg(now, msg);
        let role = self.plane.conn(t.conn).map(|c| c.role);
        let direct = self.plane.direct_last();
        let mut result = None;
        if direct > 0 {
            // Sent the vATC way: processed here, then copied into the VM's memory.
            let watch = self.sw.watch(now, role, true, t.tenant, key);
            let (r, changed) = self.sw.run(now, port, (gso_size, &parsed), watch);
            if let Ok(out) = r {
                let mut back = t;
                back.packets = direct;
                self.direct = Some((back, out));
            }
            result = Some((r, changed));
        }
        let phy = self.sw.drain(&mut self.plane, Some(t.conn));
        let outcome = match (result, phy) {
            (Some((r, changed)), _) => {
                self.sw.seal(now, changed);
                match r {
                    Ok(out) => Outcome::Direct {
                        port: out,
                        bytes: self.sw.pkt.data(),
                        generated: self.sw.pkt.is_generated(),
                    },
                    Err(d) => Outcome::Drop(d),
                }
            }
            (None, Some(back @ Msg::Punt(_))) => {
                self.sw.seal(now, None);
                Outcome::Punt { msg: back }
            }
            (None, Some(done)) => {
                let watch = self.sw.watch(now, role, true, t.tenant, key);
                let (r, changed) = self.sw.run(now, port, (gso_size, &parsed), watch);
                self.sw.seal(now, changed);
                match r {
                    Ok(out) => Outcome::Return {
                        msg: done,
                        port: out,
                        bytes: self.sw.pkt.data(),
                        generated: self.sw.pkt.is_generated(),
                    },
                    Err(d) => Outcome::Drop(d),
                }
            }
            (None, None) => {
                self.sw.seal(now, None);
                self.sw.drop(FrameDrop::Fabric)
            }
        };
        if t.kind == Kind::Close {
            self.sw.conns.forget(t.conn);
        }
        outcome
    }

    /// The frame of the last [`Outcome::Direct`] could not be copied into its VM (no fresh
    /// translation, no receive buffer, no shared memory): it goes back through the DPU
    /// instead, as without vATC, if the link back has room.
    pub fn direct_refused(&mut self, now: Instant) -> Outcome<'_> {
        let Some((train, out)) = self.direct.take() else {
            return self.sw.drop(FrameDrop::Protocol);
        };
        self.plane.handle_direct_refused(now, &train);
        let back = self.sw.drain(&mut self.plane, Some(train.conn));
        self.sw.seal(now, None);
        match back {
            Some(msg) => Outcome::Return {
                msg,
                port: out,
                bytes: self.sw.pkt.data(),
                generated: self.sw.pkt.is_generated(),
            },
            None => self.sw.drop(FrameDrop::Fabric),
        }
    }
}
