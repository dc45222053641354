//! The spill plane's side of a frame: [`PlaneSwitch`], over the whole plane ([`SpillPlane`])
//! or one shard of it ([`PlaneShardModel`]).

use spillway_vswitch::pipeline::{Pipeline, PipelineConfig, PipelineError};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PortId};

use super::{FrameDrop, Model, Outcome, SwitchCore};
use crate::params::FabricParams;
use crate::records::Role;
use crate::spill::{
    PlaneReply, PlaneRequest, PlaneResourcesHandle, PlaneShard, PlaneView, SpillPlane,
};
use crate::types::{ConnId, Kind, Msg, Train, Transmit};

/// The model under a [`PlaneSwitch`]: the joining rules' [`Model`], and the vATC's way out.
pub trait PlaneModel: Model {
    /// Packets the last [`Model::handle_msg`] sent the vATC way.
    fn direct_last(&self) -> u32;
    /// Packets sent the vATC way could not be delivered so: they go back through the DPU.
    fn handle_direct_refused(&mut self, now: Instant, t: &Train);
    /// When the model's next timer is due (a shard has none: the control part keeps them).
    fn poll_timeout(&self) -> Option<Instant>;
}

impl<R: PlaneResourcesHandle> Model for SpillPlane<R> {
    fn role(&self, conn: ConnId) -> Option<Role> {
        self.conn(conn).map(|c| c.role)
    }
    fn handle_msg(&mut self, now: Instant, msg: Msg) {
        SpillPlane::handle_msg(self, now, msg);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        SpillPlane::poll_transmit(self)
    }
}

impl<R: PlaneResourcesHandle> PlaneModel for SpillPlane<R> {
    fn direct_last(&self) -> u32 {
        SpillPlane::direct_last(self)
    }
    fn handle_direct_refused(&mut self, now: Instant, t: &Train) {
        SpillPlane::handle_direct_refused(self, now, t);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        SpillPlane::poll_timeout(self)
    }
}

/// One shard of the plane, as a thread of a driver that runs the plane's shards on threads
/// holds it: the [`PlaneShard`], the control part's latest [`PlaneView`] (the driver passes
/// each new one with [`PlaneShardModel::set_view`]) and a handle to the plane's one
/// [`PlaneResources`](crate::spill::PlaneResources).
#[derive(Debug)]
pub struct PlaneShardModel<R: PlaneResourcesHandle> {
    shard: PlaneShard,
    view: PlaneView,
    res: R,
}

impl<R: PlaneResourcesHandle> PlaneShardModel<R> {
    /// `shard`, seeing the lifecycle as `view`, charging `res`.
    pub fn new(shard: PlaneShard, view: PlaneView, res: R) -> PlaneShardModel<R> {
        PlaneShardModel { shard, view, res }
    }
    /// The control part's new view, after a lifecycle step.
    pub fn set_view(&mut self, view: PlaneView) {
        self.view = view;
    }
    /// The shard.
    pub fn shard(&self) -> &PlaneShard {
        &self.shard
    }
    /// Answers a request of the control part.
    pub fn serve(&mut self, req: PlaneRequest) -> PlaneReply {
        self.shard.serve(req)
    }
}

impl<R: PlaneResourcesHandle> Model for PlaneShardModel<R> {
    fn role(&self, conn: ConnId) -> Option<Role> {
        self.shard.conn(conn).map(|c| c.role)
    }
    fn handle_msg(&mut self, now: Instant, msg: Msg) {
        let mut res = self.res.write();
        self.shard.handle_msg(now, msg, &self.view, &mut res);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.shard.poll_transmit()
    }
}

impl<R: PlaneResourcesHandle> PlaneModel for PlaneShardModel<R> {
    fn direct_last(&self) -> u32 {
        self.shard.direct_last()
    }
    fn handle_direct_refused(&mut self, now: Instant, t: &Train) {
        let mut res = self.res.write();
        self.shard.handle_direct_refused(now, t, &mut res);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}

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
pub struct PlaneSwitch<M: PlaneModel = SpillPlane> {
    plane: M,
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
        PlaneSwitch::with_model(SpillPlane::new(f), policy, config, conns_max)
    }
}

impl<M: PlaneModel> PlaneSwitch<M> {
    /// A frame node over `model` (the whole plane, or one shard of it for a thread of a
    /// driver that shards), with its own pipeline of `policy` and `config`.
    pub fn with_model(
        model: M,
        policy: Policy,
        config: PipelineConfig,
        conns_max: usize,
    ) -> Result<PlaneSwitch<M>, PipelineError> {
        Ok(PlaneSwitch {
            plane: model,
            sw: SwitchCore::new(Pipeline::new(policy, config)?, conns_max),
            direct: None,
        })
    }

    /// The model.
    pub fn plane(&self) -> &M {
        &self.plane
    }

    /// The model, for its own inputs (start, timers, workers, placement, vATC on or off; a
    /// shard's view and the control part's requests). The messages they cause come out of
    /// [`PlaneSwitch::poll_transmit`].
    pub fn plane_mut(&mut self) -> &mut M {
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
        let role = self.plane.role(t.conn);
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
