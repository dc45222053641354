//! [`Kv`] on a real etcd (v3 API, tested against Debian's `etcd-server` 3.4), with the
//! `etcd-client` crate.
//!
//! `etcd-client` is asynchronous; this backend owns a small tokio runtime (one worker thread,
//! which also carries the watch streams) and blocks the caller on each request, so that the
//! control plane's callers (driver threads, tests) stay plain threads. Mod revision 0 in a
//! compare means "the key is absent", as in etcd itself.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};

use crate::{Change, ClusterError, KeyValue, Kv, LeaseId, Result, Write};

/// How long a request may take before it is an error (etcd answers in milliseconds; a dead
/// etcd must not hang a driver thread).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn backend(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Backend(e.to_string())
}

fn key_string(k: &[u8]) -> Result<String> {
    String::from_utf8(k.to_vec()).map_err(|_| ClusterError::BadValue {
        key: String::from_utf8_lossy(k).into_owned(),
        reason: "expected a UTF-8 key".into(),
    })
}

/// A connection to etcd. Clones share it.
#[derive(Clone)]
pub struct EtcdKv {
    rt: Arc<tokio::runtime::Runtime>,
    client: Client,
}

impl std::fmt::Debug for EtcdKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EtcdKv")
    }
}

impl EtcdKv {
    /// Connects to the etcd members at `endpoints` (`http://host:port`).
    pub fn connect(endpoints: &[String]) -> Result<EtcdKv> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-client")
            .enable_all()
            .build()
            .map_err(|e| backend(format!("starting the etcd client's runtime: {e}")))?;
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        let client = rt
            .block_on(Client::connect(endpoints, Some(options)))
            .map_err(|e| backend(format!("connecting to etcd at {endpoints:?}: {e}")))?;
        Ok(EtcdKv {
            rt: Arc::new(rt),
            client,
        })
    }
}

impl Kv for EtcdKv {
    fn get_prefix(&self, prefix: &str) -> Result<(i64, Vec<KeyValue>)> {
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.get(prefix, Some(GetOptions::new().with_prefix())))
            .map_err(backend)?;
        let revision = r.header().map_or(0, |h| h.revision());
        let kvs = r
            .kvs()
            .iter()
            .map(|kv| {
                Ok(KeyValue {
                    key: key_string(kv.key())?,
                    value: kv.value().to_vec(),
                    mod_revision: kv.mod_revision(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((revision, kvs))
    }

    fn txn(&self, unchanged: &[(String, i64)], writes: Vec<Write>) -> Result<bool> {
        let compares: Vec<Compare> = unchanged
            .iter()
            .map(|(k, rev)| Compare::mod_revision(k.as_str(), CompareOp::Equal, *rev))
            .collect();
        let ops: Vec<TxnOp> = writes
            .into_iter()
            .map(|w| match w {
                Write::Put { key, value, lease } => {
                    TxnOp::put(key, value, lease.map(|l| PutOptions::new().with_lease(l.0)))
                }
                Write::Delete { key } => TxnOp::delete(key, None),
            })
            .collect();
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.txn(Txn::new().when(compares).and_then(ops)))
            .map_err(backend)?;
        Ok(r.succeeded())
    }

    fn grant(&self, ttl: Duration) -> Result<LeaseId> {
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut c = self.client.clone();
        let r = self
            .rt
            .block_on(c.lease_grant(secs, None))
            .map_err(backend)?;
        Ok(LeaseId(r.id()))
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<()> {
        let mut c = self.client.clone();
        self.rt.block_on(async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease.0).await.map_err(backend)?;
            keeper.keep_alive().await.map_err(backend)?;
            match stream.message().await.map_err(backend)? {
                Some(r) if r.ttl() > 0 => Ok(()),
                _ => Err(backend(format!("lease {} not found", lease.0))),
            }
        })
    }

    fn revoke(&self, lease: LeaseId) -> Result<()> {
        let mut c = self.client.clone();
        self.rt.block_on(c.lease_revoke(lease.0)).map_err(backend)?;
        Ok(())
    }

    fn watch_prefix(&self, prefix: &str) -> Result<mpsc::Receiver<Change>> {
        let mut c = self.client.clone();
        let mut stream = self
            .rt
            .block_on(c.watch(prefix, Some(WatchOptions::new().with_prefix())))
            .map_err(backend)?;
        let (tx, rx) = mpsc::channel();
        self.rt.spawn(async move {
            // Ends when etcd closes the stream, or when the receiver is gone.
            while let Ok(Some(r)) = stream.message().await {
                for e in r.events() {
                    let Some(kv) = e.kv() else { continue };
                    let Ok(key) = key_string(kv.key()) else {
                        continue;
                    };
                    let change = match e.event_type() {
                        EventType::Put => Change::Put {
                            key,
                            value: kv.value().to_vec(),
                        },
                        EventType::Delete => Change::Delete { key },
                    };
                    if tx.send(change).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }
}
