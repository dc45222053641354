//! The embedded store: [`Kv`] in one process, for the simulator and single-host runs, and the
//! reference the etcd backend is tested against (the same tests run on both).
//!
//! One mutex over a key map with etcd's bookkeeping: a store revision bumped by every
//! applied transaction, each key's mod revision, leases with deadlines. A lease's deadline is
//! checked at every call (a lapsed lease's keys go then, with their watch events), so with no
//! calls nothing expires; a process that uses the store calls it every keep-alive anyway.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use crate::{Change, ClusterError, KeyValue, Kv, LeaseId, Result, Write};

#[derive(Debug)]
struct Entry {
    value: Vec<u8>,
    mod_revision: i64,
    lease: Option<LeaseId>,
}

#[derive(Debug)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    revision: i64,
    keys: BTreeMap<String, Entry>,
    leases: HashMap<LeaseId, Lease>,
    next_lease: i64,
    watchers: Vec<(String, mpsc::Sender<Change>)>,
}

impl Inner {
    fn notify(&mut self, change: &Change) {
        let key = match change {
            Change::Put { key, .. } | Change::Delete { key } => key,
        };
        // A watcher whose receiver is gone is dropped here.
        self.watchers.retain(|(prefix, tx)| {
            !key.starts_with(prefix.as_str()) || tx.send(change.clone()).is_ok()
        });
    }

    /// Ends the leases whose deadline passed, and `revoke` if given: their keys go, each with
    /// a delete event, in one revision.
    fn expire(&mut self, now: Instant, revoke: Option<LeaseId>) {
        let ended: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(id, l)| l.deadline <= now || Some(**id) == revoke)
            .map(|(id, _)| *id)
            .collect();
        if ended.is_empty() {
            return;
        }
        for id in &ended {
            self.leases.remove(id);
        }
        let gone: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, e)| e.lease.is_some_and(|l| ended.contains(&l)))
            .map(|(k, _)| k.clone())
            .collect();
        if gone.is_empty() {
            return;
        }
        self.revision += 1;
        for key in gone {
            self.keys.remove(&key);
            self.notify(&Change::Delete { key });
        }
    }
}

/// The embedded store. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct LocalKv {
    inner: Arc<Mutex<Inner>>,
}

impl LocalKv {
    /// An empty store.
    pub fn new() -> LocalKv {
        LocalKv::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the map consistent (every change
        // below is applied whole before anything can panic), so a poisoned lock is usable.
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.expire(Instant::now(), None);
        g
    }
}

impl Kv for LocalKv {
    fn get_prefix(&self, prefix: &str) -> Result<(i64, Vec<KeyValue>)> {
        let g = self.lock();
        let kvs = g
            .keys
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| KeyValue {
                key: k.clone(),
                value: e.value.clone(),
                mod_revision: e.mod_revision,
            })
            .collect();
        Ok((g.revision, kvs))
    }

    fn txn(&self, unchanged: &[(String, i64)], writes: Vec<Write>) -> Result<bool> {
        let mut g = self.lock();
        let holds = unchanged
            .iter()
            .all(|(k, rev)| g.keys.get(k).map_or(0, |e| e.mod_revision) == *rev);
        if !holds {
            return Ok(false);
        }
        // Check every lease before writing anything: a transaction applies whole or not.
        for w in &writes {
            if let Write::Put { lease: Some(l), .. } = w
                && !g.leases.contains_key(l)
            {
                return Err(ClusterError::Backend(format!("lease {} not found", l.0)));
            }
        }
        g.revision += 1;
        let revision = g.revision;
        for w in writes {
            match w {
                Write::Put { key, value, lease } => {
                    g.keys.insert(
                        key.clone(),
                        Entry {
                            value: value.clone(),
                            mod_revision: revision,
                            lease,
                        },
                    );
                    g.notify(&Change::Put { key, value });
                }
                Write::Delete { key } => {
                    if g.keys.remove(&key).is_some() {
                        g.notify(&Change::Delete { key });
                    }
                }
            }
        }
        Ok(true)
    }

    fn grant(&self, ttl: Duration) -> Result<LeaseId> {
        let ttl = ttl.max(Duration::from_secs(1));
        let mut g = self.lock();
        g.next_lease += 1;
        let id = LeaseId(g.next_lease);
        g.leases.insert(
            id,
            Lease {
                ttl,
                deadline: Instant::now() + ttl,
            },
        );
        Ok(id)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        let mut g = self.lock();
        let l = g
            .leases
            .get_mut(&lease)
            .ok_or_else(|| ClusterError::Backend(format!("lease {} not found", lease.0)))?;
        l.deadline = Instant::now() + l.ttl;
        Ok(())
    }

    fn revoke(&self, lease: LeaseId) -> Result<()> {
        let mut g = self.lock();
        g.expire(Instant::now(), Some(lease));
        Ok(())
    }

    fn watch_prefix(&self, prefix: &str) -> Result<mpsc::Receiver<Change>> {
        let (tx, rx) = mpsc::channel();
        self.lock().watchers.push((prefix.to_string(), tx));
        Ok(rx)
    }
}
