//! Spillway's cluster control plane: what the hosts of a cluster tell each other, and how a host
//! that has run out of idle cores borrows some on a pool host.
//!
//! # What is kept
//!
//! Everything lives in a key-value store with leases, transactions and watches (etcd in a
//! cluster, [`local::LocalKv`] in one process), under `/spillway/`:
//!
//! | key | value | lease |
//! |---|---|---|
//! | `hosts/<host>` | [`HostRecord`]: per-tenant load and variance, spare isolatable cores, plane state | the host's: a host that dies disappears with it |
//! | `pool/<host>/capacity` | cores the pool host offers | the pool host's |
//! | `pool/<host>/seq` | bumped by every reservation | none |
//! | `pool/<host>/held/<reserver>` | cores reserved | the reserver's: a reserver that dies releases them |
//! | `pool/<host>/endpoint` | `address:port` of the pool host's remote-plane service on the underlay | the pool host's |
//! | `pool/<host>/token/<reserver>` | the secret the reserver's plane link presents to that service | the reserver's |
//!
//! The cluster baseline URSched's variance trigger compares a tenant with is computed from the
//! host records ([`baseline`]); [`Cluster::watch_baseline`] follows it as hosts publish.
//!
//! # No double booking
//!
//! [`Cluster::reserve`] reads the pool's keys at one revision, checks that what the other
//! reservers hold plus the request fits the capacity, and writes its reservation in a
//! transaction that succeeds only if neither the pool's `seq` nor its `capacity` changed since
//! that read (compare on their mod revisions), bumping `seq` in the same transaction. Two
//! reservers that read the same state cannot both commit; the loser reads again. A release or
//! an expired lease only deletes a reservation, which frees capacity, so it needs no bump: a
//! reservation computed against the older, fuller state is merely conservative.
//!
//! # Backends
//!
//! The rules above are written once, in [`Cluster`], over the [`Kv`] trait: the small set of
//! primitives both backends provide (a prefix read at one revision, a transaction guarded by
//! mod revisions, leases, a prefix watch). [`local::LocalKv`] is the embedded default (the
//! simulator and single-host `spillway run` need no etcd); `etcd::EtcdKv` (feature `etcd`,
//! on by default in this crate) talks to a real etcd with the `etcd-client` crate.
//!
//! Names of hosts and reservers are `[A-Za-z0-9._-]{1,64}`, so that no name can reach outside
//! its own key.

use std::sync::mpsc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod local;

/// The root of every key.
pub const ROOT: &str = "/spillway/";
/// Transactions a reservation tries before it reports contention.
pub const RESERVE_TRIES_MAX: u32 = 64;

/// A lease: keys put under it go when it is revoked or expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub i64);

/// One key as read: its value, the revision of its last change and its lease (0: none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// Revision of its last change.
    pub mod_revision: i64,
}

/// A write in a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Put `value` at `key`, under `lease` if any.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
        /// The lease it goes with.
        lease: Option<LeaseId>,
    },
    /// Delete `key` (nothing if absent).
    Delete {
        /// The key.
        key: String,
    },
}

/// A change under a watched prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// `key` now holds `value`.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// `key` was deleted, or its lease went.
    Delete {
        /// The key.
        key: String,
    },
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The store failed or could not be reached.
    #[error("cluster store: {0}")]
    Backend(String),
    /// A host or reserver name outside `[A-Za-z0-9._-]{1,64}`.
    #[error("{what} {name:?}: expected 1 to 64 of A-Z a-z 0-9 . _ -")]
    BadName {
        /// Which name.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A value in the store that is not what its key holds.
    #[error("cluster store: key {key}: {reason}")]
    BadValue {
        /// The key.
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// The pool host offers nothing (never offered, or its lease went).
    #[error("pool host {0} offers no capacity")]
    NoSuchPool(String),
    /// Every try of a reservation lost its transaction to another reserver.
    #[error("pool host {pool}: {tries} reservation transactions lost to others")]
    Contention {
        /// The pool host.
        pool: String,
        /// Tries made.
        tries: u32,
    },
}

/// A result of this crate.
pub type Result<T> = core::result::Result<T, ClusterError>;

/// The primitives a store provides. Every method is blocking.
pub trait Kv: Send + Sync {
    /// Every key under `prefix`, in key order, and the store's revision they were read at.
    fn get_prefix(&self, prefix: &str) -> Result<(i64, Vec<KeyValue>)>;
    /// Applies `writes` if, for every `(key, revision)` in `unchanged`, the key's mod revision
    /// is `revision` (0: the key is absent). Returns whether it applied them.
    fn txn(&self, unchanged: &[(String, i64)], writes: Vec<Write>) -> Result<bool>;
    /// A lease of `ttl` (whole seconds, at least 1).
    fn grant(&self, ttl: Duration) -> Result<LeaseId>;
    /// Renews `lease` for its full ttl.
    fn keep_alive(&self, lease: LeaseId) -> Result<()>;
    /// Ends `lease` now; its keys go.
    fn revoke(&self, lease: LeaseId) -> Result<()>;
    /// Changes under `prefix` from now on, in order, on a channel (closed when the store is).
    fn watch_prefix(&self, prefix: &str) -> Result<mpsc::Receiver<Change>>;
}

/// A store chosen at run time: the embedded one, or etcd where this crate was built with its
/// `etcd` feature ([`Store::etcd`] says clearly when it was not).
#[derive(Clone, Debug)]
pub enum Store {
    /// [`local::LocalKv`].
    Local(local::LocalKv),
    /// `etcd::EtcdKv` (boxed: the client is a few KiB).
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd::EtcdKv>),
}

impl Store {
    /// Connects to the etcd members at `endpoints` (`http://host:port`).
    pub fn etcd(endpoints: &[String]) -> Result<Store> {
        #[cfg(feature = "etcd")]
        {
            etcd::EtcdKv::connect(endpoints).map(|k| Store::Etcd(Box::new(k)))
        }
        #[cfg(not(feature = "etcd"))]
        {
            Err(ClusterError::Backend(format!(
                "etcd at {endpoints:?}: this build has no etcd client (build with `--features etcd`)"
            )))
        }
    }

    fn kv(&self) -> &dyn Kv {
        match self {
            Store::Local(k) => k,
            #[cfg(feature = "etcd")]
            Store::Etcd(k) => k.as_ref(),
        }
    }
}

impl Kv for Store {
    fn get_prefix(&self, prefix: &str) -> Result<(i64, Vec<KeyValue>)> {
        self.kv().get_prefix(prefix)
    }
    fn txn(&self, unchanged: &[(String, i64)], writes: Vec<Write>) -> Result<bool> {
        self.kv().txn(unchanged, writes)
    }
    fn grant(&self, ttl: Duration) -> Result<LeaseId> {
        self.kv().grant(ttl)
    }
    fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        self.kv().keep_alive(lease)
    }
    fn revoke(&self, lease: LeaseId) -> Result<()> {
        self.kv().revoke(lease)
    }
    fn watch_prefix(&self, prefix: &str) -> Result<mpsc::Receiver<Change>> {
        self.kv().watch_prefix(prefix)
    }
}

/// Where a host's spill plane stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlaneState {
    /// No plane.
    Idle,
    /// Up in shadow mode (prepared, not serving).
    Shadow,
    /// Serving.
    Active,
}

/// One tenant's load on a host over URSched's last window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantLoad {
    /// The tenant.
    pub tenant: u32,
    /// Mean packet rate, packets/s.
    pub mean_pps: f64,
    /// Variance of the packet rate over the window normalised by the squared mean (the squared
    /// coefficient of variation): what URSched compares with the cluster's.
    pub norm_variance: f64,
}

/// What a host publishes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Its tenants' load.
    pub tenants: Vec<TenantLoad>,
    /// Idle cores it could isolate for a spill plane.
    pub spare_cores: u32,
    /// Its plane.
    pub plane: PlaneState,
}

/// The cluster's baseline: the average normalised variance of the tenants of every host, each
/// tenant-host pair weighted by its mean rate (a busy tenant's variance says more than an idle
/// one's). URSched's variance trigger fires for a tenant about 25 % above it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Baseline {
    /// Hosts that published.
    pub hosts: usize,
    /// Tenant-host pairs with traffic.
    pub tenants: usize,
    /// The rate-weighted mean normalised variance (0 with no traffic).
    pub norm_variance: f64,
    /// Spare isolatable cores over every host.
    pub spare_cores: u64,
}

/// The baseline of these host records.
pub fn baseline<'a>(records: impl IntoIterator<Item = &'a HostRecord>) -> Baseline {
    let mut b = Baseline::default();
    let (mut weighted, mut weight) = (0.0, 0.0);
    for r in records {
        b.hosts += 1;
        b.spare_cores += u64::from(r.spare_cores);
        for t in &r.tenants {
            if t.mean_pps.is_finite()
                && t.mean_pps > 0.0
                && t.norm_variance.is_finite()
                && t.norm_variance >= 0.0
            {
                b.tenants += 1;
                weighted += t.mean_pps * t.norm_variance;
                weight += t.mean_pps;
            }
        }
    }
    if weight > 0.0 {
        b.norm_variance = weighted / weight;
    }
    b
}

/// The answer to a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// The cores are held for the reserver until it releases them or its lease goes.
    Granted,
    /// Not enough free: what the others hold leaves `free_cores`.
    Refused {
        /// Cores free for this reserver (its own current reservation counted as free).
        free_cores: u32,
    },
}

/// A pool host as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// Cores it offers (`None`: nothing, or its lease went).
    pub capacity: Option<u32>,
    /// Who holds how many, by reserver name.
    pub held: Vec<(String, u32)>,
    /// Where its remote-plane service listens (`address:port`), if it runs one.
    pub endpoint: Option<String>,
}

/// A reservation as the pool host's service checks it: the cores held and the token the
/// reserver's plane link must present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Cores held.
    pub cores: u32,
    /// The reserver's token (see [`Cluster::set_token`]).
    pub token: String,
}

/// Bytes of a token's text at most (a 32-byte secret in hex is 64).
pub const TOKEN_LEN_MAX: usize = 128;

/// The control plane over a store: every rule of this crate, written once.
#[derive(Debug)]
pub struct Cluster<K> {
    kv: K,
}

/// Whether `name` may name a host or a reserver: `[A-Za-z0-9._-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_name(what: &'static str, name: &str) -> Result<()> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ClusterError::BadName {
            what,
            name: name.to_string(),
        })
    }
}

fn host_key(host: &str) -> String {
    format!("{ROOT}hosts/{host}")
}

fn pool_prefix(pool: &str) -> String {
    format!("{ROOT}pool/{pool}/")
}

fn parse_cores(kv: &KeyValue) -> Result<u32> {
    std::str::from_utf8(&kv.value)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ClusterError::BadValue {
            key: kv.key.clone(),
            reason: "expected a whole number of cores".into(),
        })
}

fn parse_text(kv: &KeyValue, what: &str) -> Result<String> {
    std::str::from_utf8(&kv.value)
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= TOKEN_LEN_MAX)
        .map(str::to_string)
        .ok_or_else(|| ClusterError::BadValue {
            key: kv.key.clone(),
            reason: format!("expected {what}: 1 to {TOKEN_LEN_MAX} bytes of UTF-8"),
        })
}

/// Checks a value this crate writes: 1 to `max` printable ASCII characters.
fn check_text(what: &'static str, text: &str, max: usize) -> Result<()> {
    if text.is_empty() || text.len() > max || !text.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ClusterError::BadValue {
            key: what.to_string(),
            reason: format!("expected 1 to {max} printable ASCII characters"),
        });
    }
    Ok(())
}

/// Cores of a pool of `capacity` free for `reserver`: what the others hold is taken, its own
/// reservation (which a new one replaces) is not.
fn free_for(capacity: u32, held: &[(String, u32)], reserver: &str) -> u64 {
    let others: u64 = held
        .iter()
        .filter(|(who, _)| who != reserver)
        .map(|(_, c)| u64::from(*c))
        .sum();
    u64::from(capacity).saturating_sub(others)
}

/// A pool host's keys as read at one revision.
struct PoolView {
    capacity: Option<(u32, i64)>,
    seq_revision: i64,
    held: Vec<(String, u32)>,
    endpoint: Option<String>,
    tokens: Vec<(String, String)>,
}

impl<K: Kv> Cluster<K> {
    /// The control plane over `kv`.
    pub fn new(kv: K) -> Cluster<K> {
        Cluster { kv }
    }

    /// The store.
    pub fn kv(&self) -> &K {
        &self.kv
    }

    /// A lease of `ttl` for this host's or reserver's keys; keep it alive with
    /// [`Kv::keep_alive`] more often than `ttl`.
    pub fn lease(&self, ttl: Duration) -> Result<LeaseId> {
        self.kv.grant(ttl)
    }

    /// Publishes `host`'s record under `lease`.
    pub fn publish(&self, host: &str, record: &HostRecord, lease: LeaseId) -> Result<()> {
        check_name("host", host)?;
        let value = serde_json::to_vec(record).map_err(|e| ClusterError::Backend(e.to_string()))?;
        self.kv.txn(
            &[],
            vec![Write::Put {
                key: host_key(host),
                value,
                lease: Some(lease),
            }],
        )?;
        Ok(())
    }

    /// Every host's record, by host name. A record that does not parse is an error naming
    /// its key.
    pub fn hosts(&self) -> Result<Vec<(String, HostRecord)>> {
        let prefix = format!("{ROOT}hosts/");
        let (_, kvs) = self.kv.get_prefix(&prefix)?;
        kvs.into_iter()
            .map(|kv| {
                let record =
                    serde_json::from_slice(&kv.value).map_err(|e| ClusterError::BadValue {
                        key: kv.key.clone(),
                        reason: format!("expected a host record: {e}"),
                    })?;
                Ok((kv.key[prefix.len()..].to_string(), record))
            })
            .collect()
    }

    /// The cluster baseline now.
    pub fn baseline(&self) -> Result<Baseline> {
        let hosts = self.hosts()?;
        Ok(baseline(hosts.iter().map(|(_, r)| r)))
    }

    /// Follows the baseline: the current one first, then a new one after every change of a
    /// host record, on a channel fed by a thread of its own (ends when the store's watch
    /// ends or the receiver is dropped).
    pub fn watch_baseline(&self) -> Result<mpsc::Receiver<Baseline>>
    where
        K: Clone + 'static,
    {
        let prefix = format!("{ROOT}hosts/");
        let changes = self.kv.watch_prefix(&prefix)?;
        let (tx, rx) = mpsc::channel();
        // The records as of the watch's start, then kept current from its changes (each
        // change carries the whole record, so no read per change).
        let mut records: std::collections::BTreeMap<String, HostRecord> =
            self.hosts()?.into_iter().collect();
        let _ = tx.send(baseline(records.values()));
        std::thread::Builder::new()
            .name("cluster-watch".into())
            .spawn(move || {
                for change in changes {
                    match change {
                        Change::Put { key, value } => {
                            // A record that does not parse is left out, not fatal to the watch.
                            if let Ok(r) = serde_json::from_slice(&value) {
                                records.insert(key, r);
                            } else {
                                records.remove(&key);
                            }
                        }
                        Change::Delete { key } => {
                            records.remove(&key);
                        }
                    }
                    if tx.send(baseline(records.values())).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| ClusterError::Backend(format!("starting the watch thread: {e}")))?;
        Ok(rx)
    }

    /// `pool` offers `cores` under its `lease`; reservations made against more than that
    /// fail from now on (those already held stay until released).
    pub fn offer(&self, pool: &str, cores: u32, lease: LeaseId) -> Result<()> {
        check_name("pool host", pool)?;
        let p = pool_prefix(pool);
        self.kv.txn(
            &[],
            vec![Write::Put {
                key: format!("{p}capacity"),
                value: cores.to_string().into_bytes(),
                lease: Some(lease),
            }],
        )?;
        Ok(())
    }

    fn pool_view(&self, pool: &str) -> Result<PoolView> {
        let p = pool_prefix(pool);
        let (_, kvs) = self.kv.get_prefix(&p)?;
        let mut v = PoolView {
            capacity: None,
            seq_revision: 0,
            held: Vec::new(),
            endpoint: None,
            tokens: Vec::new(),
        };
        for kv in &kvs {
            let rest = &kv.key[p.len()..];
            if rest == "capacity" {
                v.capacity = Some((parse_cores(kv)?, kv.mod_revision));
            } else if rest == "seq" {
                v.seq_revision = kv.mod_revision;
            } else if let Some(who) = rest.strip_prefix("held/") {
                v.held.push((who.to_string(), parse_cores(kv)?));
            } else if rest == "endpoint" {
                v.endpoint = Some(parse_text(kv, "an address:port")?);
            } else if let Some(who) = rest.strip_prefix("token/") {
                v.tokens.push((who.to_string(), parse_text(kv, "a token")?));
            }
        }
        Ok(v)
    }

    /// Reserves `cores` of `pool` for `reserver` under its `lease` (replacing what it held
    /// there), if they fit beside what the others hold; see the module doc for why two
    /// reservers never book the same cores.
    pub fn reserve(
        &self,
        pool: &str,
        reserver: &str,
        cores: u32,
        lease: LeaseId,
    ) -> Result<Reserve> {
        check_name("pool host", pool)?;
        check_name("reserver", reserver)?;
        let p = pool_prefix(pool);
        for _ in 0..RESERVE_TRIES_MAX {
            let view = self.pool_view(pool)?;
            let Some((capacity, capacity_rev)) = view.capacity else {
                return Err(ClusterError::NoSuchPool(pool.to_string()));
            };
            let free = free_for(capacity, &view.held, reserver);
            if u64::from(cores) > free {
                return Ok(Reserve::Refused {
                    free_cores: free as u32,
                });
            }
            let seq = format!("{p}seq");
            let applied = self.kv.txn(
                &[
                    (seq.clone(), view.seq_revision),
                    (format!("{p}capacity"), capacity_rev),
                ],
                vec![
                    Write::Put {
                        key: seq,
                        value: Vec::new(),
                        lease: None,
                    },
                    Write::Put {
                        key: format!("{p}held/{reserver}"),
                        value: cores.to_string().into_bytes(),
                        lease: Some(lease),
                    },
                ],
            )?;
            if applied {
                return Ok(Reserve::Granted);
            }
        }
        Err(ClusterError::Contention {
            pool: pool.to_string(),
            tries: RESERVE_TRIES_MAX,
        })
    }

    /// Releases what `reserver` holds on `pool` (nothing if it holds nothing), and its token.
    pub fn release(&self, pool: &str, reserver: &str) -> Result<()> {
        check_name("pool host", pool)?;
        check_name("reserver", reserver)?;
        let p = pool_prefix(pool);
        self.kv.txn(
            &[],
            vec![
                Write::Delete {
                    key: format!("{p}held/{reserver}"),
                },
                Write::Delete {
                    key: format!("{p}token/{reserver}"),
                },
            ],
        )?;
        Ok(())
    }

    /// `pool` runs its remote-plane service at `endpoint` (`address:port` on the underlay),
    /// under its `lease`.
    pub fn advertise(&self, pool: &str, endpoint: &str, lease: LeaseId) -> Result<()> {
        check_name("pool host", pool)?;
        check_text("endpoint", endpoint, 64)?;
        self.kv.txn(
            &[],
            vec![Write::Put {
                key: format!("{}endpoint", pool_prefix(pool)),
                value: endpoint.as_bytes().to_vec(),
                lease: Some(lease),
            }],
        )?;
        Ok(())
    }

    /// The secret `reserver`'s plane link presents to `pool`'s service, under the reserver's
    /// `lease` (it goes with the reservation's lease, and with [`Cluster::release`]). Whoever
    /// can write the store can reserve anyway: the token proves a connection comes from the
    /// reserver, with the store as the root of trust.
    pub fn set_token(&self, pool: &str, reserver: &str, token: &str, lease: LeaseId) -> Result<()> {
        check_name("pool host", pool)?;
        check_name("reserver", reserver)?;
        check_text("token", token, TOKEN_LEN_MAX)?;
        self.kv.txn(
            &[],
            vec![Write::Put {
                key: format!("{}token/{reserver}", pool_prefix(pool)),
                value: token.as_bytes().to_vec(),
                lease: Some(lease),
            }],
        )?;
        Ok(())
    }

    /// What `reserver` holds on `pool` with its token; `None` unless it holds cores there and
    /// has a token.
    pub fn grant(&self, pool: &str, reserver: &str) -> Result<Option<Grant>> {
        check_name("pool host", pool)?;
        check_name("reserver", reserver)?;
        let v = self.pool_view(pool)?;
        let cores = v.held.iter().find(|(w, _)| w == reserver).map(|h| h.1);
        let token = v
            .tokens
            .into_iter()
            .find(|(w, _)| w == reserver)
            .map(|t| t.1);
        Ok(cores
            .zip(token)
            .filter(|(c, _)| *c > 0)
            .map(|(cores, token)| Grant { cores, token }))
    }

    /// Every pool host that offers cores, by name, with what it offers and who holds what.
    pub fn pools(&self) -> Result<Vec<(String, Pool)>> {
        let prefix = format!("{ROOT}pool/");
        let (_, kvs) = self.kv.get_prefix(&prefix)?;
        let mut names: Vec<String> = kvs
            .iter()
            .filter_map(|kv| kv.key[prefix.len()..].strip_suffix("/capacity"))
            .map(str::to_string)
            .collect();
        names.dedup();
        names
            .into_iter()
            .filter(|n| valid_name(n))
            .map(|n| Ok((n.clone(), self.pool(&n)?)))
            .collect()
    }

    /// Reserves `cores` for `reserver` on whichever pool host has most free (ties by name),
    /// trying the others in that order when one refuses, and never one named in `avoid`.
    /// Returns the pool host, or `None` when no pool has room.
    pub fn reserve_anywhere(
        &self,
        reserver: &str,
        cores: u32,
        lease: LeaseId,
        avoid: &[String],
    ) -> Result<Option<String>> {
        let mut pools: Vec<(u64, String)> = self
            .pools()?
            .into_iter()
            .filter_map(|(name, p)| {
                let free = free_for(p.capacity?, &p.held, reserver);
                let usable = name != reserver && !avoid.contains(&name);
                (free >= u64::from(cores) && usable).then_some((free, name))
            })
            .collect();
        pools.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, name) in pools {
            match self.reserve(&name, reserver, cores, lease) {
                Ok(Reserve::Granted) => return Ok(Some(name)),
                // Taken meanwhile, or gone: the next one.
                Ok(Reserve::Refused { .. }) | Err(ClusterError::NoSuchPool(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// What `pool` offers and who holds how many of its cores.
    pub fn pool(&self, pool: &str) -> Result<Pool> {
        check_name("pool host", pool)?;
        let v = self.pool_view(pool)?;
        Ok(Pool {
            capacity: v.capacity.map(|c| c.0),
            held: v.held,
            endpoint: v.endpoint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_weights_each_tenant_by_its_rate_and_skips_bad_figures() {
        let r = |tenants: Vec<(u32, f64, f64)>, spare| HostRecord {
            tenants: tenants
                .into_iter()
                .map(|(tenant, mean_pps, norm_variance)| TenantLoad {
                    tenant,
                    mean_pps,
                    norm_variance,
                })
                .collect(),
            spare_cores: spare,
            plane: PlaneState::Idle,
        };
        let a = r(vec![(1, 1_000.0, 0.1), (2, 3_000.0, 0.5)], 4);
        let b = r(
            vec![(1, 0.0, 9.0), (3, f64::NAN, 1.0), (4, 1_000.0, -1.0)],
            2,
        );
        let base = baseline([&a, &b]);
        assert_eq!((base.hosts, base.tenants, base.spare_cores), (2, 2, 6));
        assert!((base.norm_variance - (100.0 + 1_500.0) / 4_000.0).abs() < 1e-12);
        assert_eq!(baseline([]), Baseline::default());
    }

    #[test]
    fn names_stay_inside_their_key() {
        for bad in ["", "a/b", "..\u{0}", &"x".repeat(65), "host name"] {
            assert!(check_name("host", bad).is_err(), "{bad:?}");
        }
        for good in ["h1", "pool-7.rack_2", &"x".repeat(64)] {
            assert!(check_name("host", good).is_ok(), "{good:?}");
        }
    }
}
