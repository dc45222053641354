//! A FIFO server with a bounded queue, in the fluid limit: the model of every processing
//! resource in the fabric (hardware fast path, SoC cores, phy vNIC, host workers, rule inserts).
//!
//! A resource with `parallel` identical units (cores) serving a FIFO queue is modelled as one
//! server `parallel` times as fast: a job of cost `c` occupies it for `c / parallel`. That is
//! exact for throughput and queue length under load and slightly optimistic for the latency of a
//! lone job (a real core would take `c`); the model adds the job's own cost back for latency.
//! Time is integer picoseconds so that no rounding depends on float formatting.
//!
//! A batch of `n` jobs of one flow offered at `now` is admitted as far as the queue has room
//! (`queue_max` jobs waiting or in service); the rest is refused and the caller drops it with its
//! reason. Jobs finish in order; the server keeps one `(finish, count)` record per admitted batch
//! so it can count exactly how many jobs are still queued at any `now`.

use std::collections::VecDeque;

/// Picoseconds per nanosecond.
pub const PS_PER_NS: u64 = 1000;

/// What [`Server::offer`] admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Jobs admitted (the rest of the batch was refused).
    pub count: u32,
    /// When the last admitted job finishes, ps.
    pub finish_ps: u64,
    /// Sum over admitted jobs of (finish - now), ps: latency of the batch.
    pub wait_sum_ps: u64,
    /// Time each admitted job occupies the server, ps (its cost over the units).
    pub per_ps: u64,
}

/// Jobs admitted to a [`Server`] and not yet finished, one `(finish of the batch's last job,
/// jobs left, ps per job)` record per batch: what the server keeps of its whole queue, and
/// what a caller may keep of one class of jobs in it (a tenant's share of a plane's workers).
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    queued: u32,
    batches: VecDeque<(u64, u32, u64)>,
}

impl Ledger {
    fn with_capacity(n: usize) -> Ledger {
        Ledger {
            queued: 0,
            batches: VecDeque::with_capacity(n),
        }
    }

    /// Lets the jobs finished by `now_ps` leave.
    pub fn retire(&mut self, now_ps: u64) {
        while let Some(&mut (finish, ref mut n, per)) = self.batches.front_mut() {
            if finish > now_ps {
                // Partly served: the jobs whose finish time has passed leave the queue.
                let start = finish - per * u64::from(*n);
                let done = (now_ps.saturating_sub(start) / per).min(u64::from(*n)) as u32;
                *n -= done;
                self.queued -= done;
                break;
            }
            self.queued -= *n;
            self.batches.pop_front();
        }
    }

    /// Jobs not yet finished at `now_ps`.
    pub fn queued(&mut self, now_ps: u64) -> u32 {
        self.retire(now_ps);
        self.queued
    }

    /// Records what [`Server::offer`] admitted.
    pub fn push(&mut self, a: &Admitted) {
        if a.count == 0 {
            return;
        }
        let start = a.finish_ps - a.per_ps * u64::from(a.count);
        self.queued += a.count;
        match self.batches.back_mut() {
            // A batch that starts where the last one ends, at the same cost, extends it: the
            // deque stays short under steady load.
            Some((f, c, p)) if *p == a.per_ps && *f == start => {
                *f = a.finish_ps;
                *c += a.count;
            }
            _ => self.batches.push_back((a.finish_ps, a.count, a.per_ps)),
        }
    }

    /// Forgets every job.
    pub fn clear(&mut self) {
        self.batches.clear();
        self.queued = 0;
    }

    fn check(&self) -> Result<(), String> {
        let sum: u64 = self.batches.iter().map(|&(_, n, _)| u64::from(n)).sum();
        if sum != u64::from(self.queued) {
            return Err(format!("queued {} != batches {sum}", self.queued));
        }
        Ok(())
    }
}

/// The server. See the module doc.
#[derive(Clone, Debug)]
pub struct Server {
    parallel: u32,
    queue_max: u32,
    busy_until_ps: u64,
    /// The jobs waiting or in service.
    ledger: Ledger,
    busy_ps_window: u64,
    window_start_ps: u64,
    served_total: u64,
    refused_total: u64,
}

impl Server {
    /// A server of `parallel` units holding at most `queue_max` jobs.
    pub fn new(parallel: u32, queue_max: u32) -> Server {
        assert!(parallel > 0, "a server has at least one unit");
        assert!(queue_max > 0, "a server holds at least one job");
        Server {
            parallel,
            queue_max,
            busy_until_ps: 0,
            // One record per admitted batch; at most `queue_max` are queued at once.
            ledger: Ledger::with_capacity(queue_max.min(1 << 16) as usize),
            busy_ps_window: 0,
            window_start_ps: 0,
            served_total: 0,
            refused_total: 0,
        }
    }

    /// Units of the server (cores).
    pub fn parallel(&self) -> u32 {
        self.parallel
    }

    /// Changes the number of units; queued work keeps its finish times.
    pub fn set_parallel(&mut self, parallel: u32) {
        assert!(parallel > 0, "a server has at least one unit");
        self.parallel = parallel;
    }

    /// Jobs waiting or in service at `now_ps`.
    pub fn queued(&mut self, now_ps: u64) -> u32 {
        self.ledger.queued(now_ps)
    }

    /// Jobs waiting or in service as of the last call (no retirement).
    pub fn queued_hint(&self) -> u32 {
        self.ledger.queued
    }

    /// When the server drains, ps.
    pub fn busy_until_ps(&self) -> u64 {
        self.busy_until_ps
    }

    /// Offers `count` jobs of `cost_ps` each (cost on one unit) at `now_ps`.
    pub fn offer(&mut self, now_ps: u64, count: u32, cost_ps: u64) -> Admitted {
        let room = self.queue_max - self.ledger.queued(now_ps);
        let n = count.min(room);
        self.refused_total += u64::from(count - n);
        let per = (cost_ps / u64::from(self.parallel)).max(1);
        if n == 0 {
            return Admitted {
                count: 0,
                finish_ps: now_ps,
                wait_sum_ps: 0,
                per_ps: per,
            };
        }
        let start = self.busy_until_ps.max(now_ps);
        let finish = start + per * u64::from(n);
        self.busy_until_ps = finish;
        let admitted = Admitted {
            count: n,
            finish_ps: finish,
            wait_sum_ps: 0,
            per_ps: per,
        };
        self.ledger.push(&admitted);
        self.busy_ps_window += per * u64::from(n);
        self.served_total += u64::from(n);
        // Job i (1-based) finishes at start + i*per; a lone job still takes its full cost on one
        // unit, so latency is at least `cost_ps`.
        let queue_wait =
            (start - now_ps) * u64::from(n) + per * (u64::from(n) * (u64::from(n) + 1) / 2);
        let floor = cost_ps.saturating_sub(per) * u64::from(n);
        Admitted {
            wait_sum_ps: queue_wait + floor,
            ..admitted
        }
    }

    /// Utilisation since the last call (busy time / elapsed, may exceed 1 briefly because
    /// admitted work is charged when admitted), and starts a new window.
    pub fn take_util(&mut self, now_ps: u64) -> f64 {
        let elapsed = now_ps.saturating_sub(self.window_start_ps);
        let u = if elapsed == 0 {
            0.0
        } else {
            self.busy_ps_window as f64 / elapsed as f64
        };
        self.busy_ps_window = 0;
        self.window_start_ps = now_ps;
        u
    }

    /// Jobs admitted in all.
    pub fn served_total(&self) -> u64 {
        self.served_total
    }

    /// Jobs refused in all.
    pub fn refused_total(&self) -> u64 {
        self.refused_total
    }

    /// Drops all queued work (the resource failed); returns the number of jobs lost.
    pub fn fail(&mut self, now_ps: u64) -> u32 {
        let lost = self.ledger.queued(now_ps);
        self.ledger.clear();
        self.busy_until_ps = now_ps;
        lost
    }

    /// Checks the queue bound and the bookkeeping.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.ledger.check().map_err(|e| format!("server: {e}"))?;
        if self.ledger.queued > self.queue_max {
            return Err(format!(
                "server: queued {} > queue_max {}",
                self.ledger.queued, self.queue_max
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_queue_and_refuses_the_rest() {
        let mut s = Server::new(1, 10);
        let a = s.offer(0, 15, 1000);
        assert_eq!(a.count, 10);
        assert_eq!(a.finish_ps, 10_000);
        assert_eq!(s.refused_total(), 5);
        // Half drained: five slots free again.
        let b = s.offer(5_000, 7, 1000);
        assert_eq!(b.count, 5);
        assert_eq!(b.finish_ps, 15_000);
        s.check_invariants().unwrap();
    }

    #[test]
    fn parallel_units_serve_proportionally_faster() {
        let mut s = Server::new(4, 1000);
        let a = s.offer(0, 400, 4000);
        assert_eq!(a.finish_ps, 400_000);
        assert!((s.take_util(400_000) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn throughput_matches_capacity_under_overload() {
        // 1 us per job, offered 2 jobs per us for 1 ms: half are served.
        let mut s = Server::new(1, 64);
        let mut served = 0u64;
        for t in 0..2000u64 {
            served += u64::from(s.offer(t * 500_000, 1, 1_000_000).count);
        }
        assert!((990..=1070).contains(&served), "served {served}");
    }

    #[test]
    fn fail_loses_exactly_the_queued_jobs() {
        let mut s = Server::new(1, 100);
        s.offer(0, 10, 1000);
        assert_eq!(s.fail(3_500), 7);
        assert_eq!(s.queued(3_500), 0);
    }
}
