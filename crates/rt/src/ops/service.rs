//! The rt servers' service threads: a stop signal every thread of a server watches, and the
//! handle that fires it and joins the server's accept thread, once, on shutdown or drop. Used by
//! the control socket ([`crate::ops::ctl`]) and the metrics endpoint ([`crate::ops::metrics`]), which
//! used to carry their own copies of the stop-and-join.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

/// The write end of a self-pipe. Dropping it (or calling [`StopSignal::stop`]) makes the read end
/// report hang-up, which wakes every thread polling a [`StopWatch`] at once: no busy loop, no
/// self-connect, and no thread left blocked in `accept` or `read`.
#[derive(Debug)]
pub(crate) struct StopSignal {
    write: Option<OwnedFd>,
}

impl StopSignal {
    /// Fires the signal; idempotent.
    pub(crate) fn stop(&mut self) {
        self.write = None;
    }
}

/// The read end of the self-pipe; clone one per thread.
#[derive(Clone, Debug)]
pub(crate) struct StopWatch {
    read: Arc<OwnedFd>,
}

/// What [`StopWatch::wait_readable`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// The descriptor is readable (data, EOF or an error: a read will not block).
    Ready,
    /// The stop signal fired; it takes precedence over readiness.
    Stopped,
    /// The deadline passed first.
    TimedOut,
}

/// A connected stop signal and watch.
pub(crate) fn stop_pair() -> io::Result<(StopSignal, StopWatch)> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    Ok((
        StopSignal { write: Some(write) },
        StopWatch {
            read: Arc::new(read),
        },
    ))
}

impl StopWatch {
    /// Waits until `fd` is readable, the stop signal fires, or `deadline` (if any) passes.
    pub(crate) fn wait_readable(
        &self,
        fd: impl AsFd,
        deadline: Option<Instant>,
    ) -> io::Result<Readiness> {
        self.wait(Some(fd.as_fd()), deadline)
    }

    /// Sleeps until `deadline` unless the stop signal fires first; `true` if it did.
    pub(crate) fn sleep_until(&self, deadline: Instant) -> io::Result<bool> {
        Ok(self.wait(None, Some(deadline))? == Readiness::Stopped)
    }

    /// An accept loop's wait: true when `listener` is readable, false when the server is
    /// stopping. A failed poll is logged (as `what`'s) and retried after 100 ms, so one bad
    /// wake-up never ends the server.
    pub(crate) fn wait_listener(&self, listener: impl AsFd, what: &str) -> bool {
        loop {
            match self.wait_readable(&listener, None) {
                Ok(Readiness::Stopped) => return false,
                Ok(Readiness::Ready | Readiness::TimedOut) => return true,
                Err(error) => {
                    tracing::warn!(%error, "{what}: poll failed");
                    if !matches!(
                        self.sleep_until(Instant::now() + Duration::from_millis(100)),
                        Ok(false)
                    ) {
                        return false;
                    }
                }
            }
        }
    }

    /// Whether the stop signal has fired.
    pub(crate) fn is_stopped(&self) -> bool {
        // A zero deadline makes this a non-blocking check; if poll itself fails, report stopped
        // so a caller's loop ends instead of spinning on a broken descriptor.
        self.wait(None, Some(Instant::now()))
            .map_or(true, |r| r == Readiness::Stopped)
    }

    fn wait(
        &self,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
        deadline: Option<Instant>,
    ) -> io::Result<Readiness> {
        loop {
            let timeout = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    // Durations that do not fit a timespec are effectively "forever".
                    Timespec::try_from(left).ok()
                }
                None => None,
            };
            let mut fds = [
                PollFd::new(&*self.read, PollFlags::IN),
                PollFd::from_borrowed_fd(fd.unwrap_or_else(|| self.read.as_fd()), PollFlags::IN),
            ];
            let count = if fd.is_some() { 2 } else { 1 };
            match rustix::event::poll(&mut fds[..count], timeout.as_ref()) {
                Ok(0) => return Ok(Readiness::TimedOut),
                Ok(_) => {
                    if !fds[0].revents().is_empty() {
                        return Ok(Readiness::Stopped);
                    }
                    return Ok(Readiness::Ready);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A server's accept thread and its stop signal. [`ServiceThread::stop_and_join`] (also run on
/// drop) fires the signal, which wakes every thread watching it, and joins the accept thread,
/// which joins its connection threads before it returns.
#[derive(Debug)]
pub(crate) struct ServiceThread {
    what: &'static str,
    stop: StopSignal,
    thread: Option<JoinHandle<()>>,
}

impl ServiceThread {
    /// Spawns `body` as thread `name` (`what` names the service in logs) with a watch on a new
    /// stop signal.
    pub(crate) fn spawn(
        name: &str,
        what: &'static str,
        body: impl FnOnce(StopWatch) + Send + 'static,
    ) -> io::Result<ServiceThread> {
        let (stop, watch) = stop_pair()?;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(watch))?;
        Ok(ServiceThread {
            what,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether the thread still has to be stopped.
    pub(crate) fn is_running(&self) -> bool {
        self.thread.is_some()
    }

    /// Fires the stop signal and joins the thread; idempotent. A panicked thread is logged.
    pub(crate) fn stop_and_join(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("{} thread panicked", self.what);
        }
    }
}

impl Drop for ServiceThread {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_watch_wakes_on_stop() {
        let (mut stop, watch) = stop_pair().expect("pipe");
        assert!(!watch.is_stopped());
        let waiter = {
            let watch = watch.clone();
            std::thread::spawn(move || watch.sleep_until(Instant::now() + Duration::from_secs(30)))
        };
        stop.stop();
        assert!(waiter.join().expect("join").expect("poll"));
        assert!(watch.is_stopped());
    }

    #[test]
    fn a_service_thread_is_stopped_and_joined_on_drop() {
        let (tx, rx) = std::sync::mpsc::channel();
        let service = ServiceThread::spawn("svc-test", "test service", move |watch| {
            while !watch
                .sleep_until(Instant::now() + Duration::from_secs(30))
                .unwrap_or(true)
            {}
            tx.send(()).expect("the test waits");
        })
        .expect("spawn");
        assert!(service.is_running());
        drop(service);
        // The body saw the stop and finished before drop returned.
        assert!(rx.try_recv().is_ok());
    }
}
