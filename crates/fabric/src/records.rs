//! What both nodes keep per connection, and how they send: a connection map that counts the
//! connections it owns (the one-owner checks read the count), and the outbox of a node with its
//! flow-vNIC sender. The DPU and the plane each hold one of each; only their record types differ.

use std::collections::VecDeque;

use spillway_vswitch::Instant;

use crate::links::FlowVnic;
use crate::params::FabricParams;
use crate::types::{Channel, Colour, ConnId, ConnState, Msg, SyncKind, Transmit};

/// A plane's relation to a connection's state. Exactly one plane is `Owner`, or the state is in
/// a handover message on its way (then no plane is, and the sender holds a `Copy`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Role {
    /// This plane owns the state.
    Owner,
    /// A mirror kept to fail open (DPU) or to serve misses (plane); the owner is the other side.
    Copy,
}

/// A per-connection record: whatever else a node keeps, it has a [`Role`], which only
/// [`Records::set_role`] changes.
pub(crate) trait Record: Copy {
    fn role(&self) -> Role;
    fn set_role(&mut self, role: Role);
    /// The connection's state, as the sync protocol carries it.
    fn state(&self) -> &ConnState;
}

type Map<V> = hashbrown::HashMap<ConnId, V, foldhash::fast::FixedState>;

/// Connection records and the number of them held as owner. Read through `Deref` (the map);
/// change roles only through [`Records::set_role`], so the count stays exact.
#[derive(Clone, Debug)]
pub(crate) struct Records<V> {
    map: Map<V>,
    owned: u64,
}

impl<V: Record> Records<V> {
    /// Per-bucket digests of every record (see [`crate::types::bucket_digests`]).
    pub(crate) fn digests(&self, buckets: u16) -> Vec<(u32, u64)> {
        crate::types::bucket_digests(self.map.values().map(Record::state), buckets)
    }

    /// Per-bucket digests of the records of `conns` held here, each counted once (`conns` is
    /// sorted and deduplicated in place): what a sync-back's two sides compare.
    pub(crate) fn digests_of(&self, conns: &mut Vec<ConnId>, buckets: u16) -> Vec<(u32, u64)> {
        conns.sort_unstable();
        conns.dedup();
        let states = conns
            .iter()
            .filter_map(|c| self.map.get(c).map(Record::state));
        crate::types::bucket_digests(states, buckets)
    }

    /// An empty map hashing with `seed` (fixed, so runs are reproducible).
    pub(crate) fn new(seed: u64) -> Records<V> {
        Records {
            map: Map::with_hasher(foldhash::fast::FixedState::with_seed(seed)),
            owned: 0,
        }
    }

    /// Inserts or replaces the record of `conn`; returns the replaced one.
    pub(crate) fn insert(&mut self, conn: ConnId, rec: V) -> Option<V> {
        if rec.role() == Role::Owner {
            self.owned += 1;
        }
        let old = self.map.insert(conn, rec);
        if old.is_some_and(|o| o.role() == Role::Owner) {
            self.owned -= 1;
        }
        old
    }

    /// Removes the record of `conn`.
    pub(crate) fn remove(&mut self, conn: ConnId) -> Option<V> {
        let rec = self.map.remove(&conn)?;
        if rec.role() == Role::Owner {
            self.owned -= 1;
        }
        Some(rec)
    }

    /// Sets the role of `conn`'s record, if there is one.
    pub(crate) fn set_role(&mut self, conn: ConnId, role: Role) {
        if let Some(c) = self.map.get_mut(&conn) {
            match (c.role(), role) {
                (Role::Copy, Role::Owner) => self.owned += 1,
                (Role::Owner, Role::Copy) => self.owned -= 1,
                _ => {}
            }
            c.set_role(role);
        }
    }

    /// The record of `conn`, to change anything but its role.
    pub(crate) fn get_mut(&mut self, conn: &ConnId) -> Option<&mut V> {
        self.map.get_mut(conn)
    }

    /// Every record, to change anything but its role.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&ConnId, &mut V)> {
        self.map.iter_mut()
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.owned = 0;
    }

    /// Records held as owner.
    pub(crate) fn owned(&self) -> u64 {
        self.owned
    }

    /// The keys of the records `keep` selects, sorted (hash-map order never reaches an output).
    pub(crate) fn keys_where(&self, mut keep: impl FnMut(&ConnId, &V) -> bool) -> Vec<ConnId> {
        let mut v: Vec<ConnId> = self
            .map
            .iter()
            .filter(|(k, c)| keep(k, c))
            .map(|(k, _)| *k)
            .collect();
        v.sort_unstable();
        v
    }

    /// Every record, sorted by connection.
    pub(crate) fn sorted(&self) -> Vec<(ConnId, V)> {
        Records::sorted_over([self])
    }

    /// Every record of `parts` (a node's shards), sorted by connection.
    pub(crate) fn sorted_over<'a>(
        parts: impl IntoIterator<Item = &'a Records<V>>,
    ) -> Vec<(ConnId, V)>
    where
        V: 'a,
    {
        let mut v: Vec<_> = parts
            .into_iter()
            .flat_map(|r| r.map.iter().map(|(k, c)| (*k, *c)))
            .collect();
        v.sort_unstable_by_key(|(k, _)| *k);
        v
    }

    /// Checks the owned count against the records.
    pub(crate) fn check(&self, who: &str) -> Result<(), String> {
        let owned = self
            .map
            .values()
            .filter(|c| c.role() == Role::Owner)
            .count() as u64;
        if owned != self.owned {
            return Err(format!("{who}: owned count {} != {owned}", self.owned));
        }
        Ok(())
    }
}

impl<V> core::ops::Deref for Records<V> {
    type Target = Map<V>;
    fn deref(&self) -> &Map<V> {
        &self.map
    }
}

/// A node's outgoing messages, and its flow-vNIC sender (state messages leave at its rate).
#[derive(Clone, Debug)]
pub(crate) struct Outbox {
    out: VecDeque<Transmit>,
    flow: FlowVnic,
}

impl Outbox {
    pub(crate) fn new(f: &FabricParams) -> Outbox {
        Outbox {
            out: VecDeque::new(),
            flow: FlowVnic::new(f),
        }
    }

    /// Queues `msg`, leaving at `at` on `channel`.
    pub(crate) fn send(&mut self, at: Instant, channel: Channel, msg: Msg) {
        self.out.push_back(Transmit { at, channel, msg });
    }

    /// Queues a message on the flow vNIC behind what is queued there; returns when it leaves.
    pub(crate) fn send_flow(&mut self, now: Instant, msg: Msg) -> Instant {
        let at = self.flow.depart(now);
        self.send(at, Channel::FlowVnic, msg);
        at
    }

    /// Queues a state message of `colour` on the flow vNIC.
    pub(crate) fn sync(&mut self, now: Instant, colour: Colour, kind: SyncKind, state: ConnState) {
        self.send_flow(
            now,
            Msg::Sync {
                colour,
                kind,
                state,
            },
        );
    }

    /// When everything queued on the flow vNIC so far has left.
    pub(crate) fn flow_idle_at(&self, now: Instant) -> Instant {
        self.flow.idle_at(now)
    }

    /// The next message to carry.
    pub(crate) fn pop(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    /// Drops everything queued (the node died).
    pub(crate) fn clear(&mut self) {
        self.out.clear();
    }
}
