//! The control socket end to end: a real `CtlServer` on a Unix socket in a fresh temporary
//! directory per test (so tests run in parallel), a fake application thread that owns the server
//! and answers from the request queue the way the data-plane loop will, and clients that are
//! either `ctl_call` or a raw `UnixStream` writing exact bytes. It proves that answers travel
//! back intact, that bad input (malformed JSON, unknown commands, oversized lines) is answered by
//! the socket thread without reaching the application, that a silent application turns into a
//! "timed out" answer, that the limits (queue, connections) answer instead of hanging, and that
//! the socket path is owned exclusively: stale files are recovered, live servers and non-socket
//! files are never clobbered, and shutdown removes the socket promptly.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;
use spillway_rt::ops::ctl::{
    CtlConfig, CtlError, CtlRequest, CtlResponse, CtlServer, FlowOwner, ctl_call,
};

const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("ctl.sock")
}

/// A thread that owns the server and answers requests like the data-plane loop would.
struct FakeApp {
    stop: Arc<AtomicBool>,
    handled: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApp {
    /// `answer` returns `None` to drop the call unanswered.
    fn spawn(
        server: CtlServer,
        answer: impl Fn(&CtlRequest) -> Option<CtlResponse> + Send + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handled = Arc::new(AtomicUsize::new(0));
        let thread = {
            let stop = Arc::clone(&stop);
            let handled = Arc::clone(&handled);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // The real loop polls with try_recv between batches; a short blocking wait
                    // keeps this fake from spinning.
                    if let Ok(call) = server.calls().recv_timeout(Duration::from_millis(5)) {
                        handled.fetch_add(1, Ordering::Relaxed);
                        match answer(&call.request) {
                            Some(response) => call.respond(response),
                            None => drop(call),
                        }
                    }
                }
                drop(server);
            })
        };
        FakeApp {
            stop,
            handled,
            thread: Some(thread),
        }
    }

    fn handled(&self) -> usize {
        self.handled.load(Ordering::Relaxed)
    }
}

impl Drop for FakeApp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("fake app thread");
        }
    }
}

/// Answers Status with a fixed body and echoes every other request back as its body.
fn echo_app(server: CtlServer) -> FakeApp {
    FakeApp::spawn(server, |request| {
        Some(match request {
            CtlRequest::Status => CtlResponse::ok(json!({"phase": "active", "flows": 3})),
            other => CtlResponse::ok(serde_json::to_value(other).unwrap()),
        })
    })
}

/// Writes `bytes` on a raw connection and reads one response line.
fn raw_exchange(stream: &mut UnixStream, bytes: &[u8]) -> CtlResponse {
    stream.write_all(bytes).unwrap();
    read_response(stream)
}

fn read_response(stream: &mut UnixStream) -> CtlResponse {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    let mut line = String::new();
    BufReader::new(&*stream).read_line(&mut line).unwrap();
    assert!(
        line.ends_with('\n'),
        "response line not terminated: {line:?}"
    );
    serde_json::from_str(&line).unwrap()
}

#[test]
fn status_gets_the_applications_json_body() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let app = echo_app(CtlServer::bind(&path).unwrap());
    let response = ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT).unwrap();
    assert_eq!(
        response,
        CtlResponse::ok(json!({"phase": "active", "flows": 3}))
    );
    assert_eq!(app.handled(), 1);
}

#[test]
fn request_arguments_reach_the_application_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let _app = echo_app(CtlServer::bind(&path).unwrap());
    let requests = [
        CtlRequest::Flows {
            limit: Some(25),
            owner: Some(FlowOwner::Spill),
        },
        CtlRequest::Flows {
            limit: None,
            owner: None,
        },
        CtlRequest::Activate,
        CtlRequest::Release,
        CtlRequest::SetPolicy {
            placement: "stability_topk".into(),
        },
        CtlRequest::Metrics,
    ];
    for request in requests {
        let response = ctl_call(&path, &request, CLIENT_TIMEOUT).unwrap();
        assert!(response.ok);
        let echoed: CtlRequest = serde_json::from_value(response.body).unwrap();
        assert_eq!(echoed, request);
    }
}

#[test]
fn one_connection_carries_several_requests_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let _app = echo_app(CtlServer::bind(&path).unwrap());
    let mut stream = UnixStream::connect(&path).unwrap();
    // Two requests in one write, with CRLF and a blank line in between.
    stream
        .write_all(b"{\"cmd\":\"activate\"}\r\n\n{\"cmd\":\"release\"}\n")
        .unwrap();
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    let mut reader = BufReader::new(&stream);
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let response: CtlResponse = serde_json::from_str(&line).unwrap();
        bodies.push(response.body);
    }
    assert_eq!(
        bodies,
        vec![json!({"cmd": "activate"}), json!({"cmd": "release"})]
    );
    drop(reader);
    // A last request without a newline, followed by EOF, is still answered.
    stream.write_all(b"{\"cmd\":\"status\"}").unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    let response: CtlResponse = serde_json::from_str(rest.trim_end()).unwrap();
    assert_eq!(response.body["phase"], "active");
}

#[test]
fn malformed_lines_are_answered_without_involving_the_application() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let app = echo_app(CtlServer::bind(&path).unwrap());
    let mut stream = UnixStream::connect(&path).unwrap();

    let cases: [(&[u8], &[&str]); 5] = [
        (b"this is not json\n", &["bad request"]),
        (
            b"{\"cmd\":\"frobnicate\"}\n",
            &["unknown variant `frobnicate`", "expected one of", "status"],
        ),
        (b"{\"limit\":3}\n", &["missing field `cmd`"]),
        (
            b"{\"cmd\":\"set_policy\"}\n",
            &["missing field `placement`"],
        ),
        (
            b"{\"cmd\":\"flows\",\"limt\":3}\n",
            &["unknown field `limt`", "limit"],
        ),
    ];
    for (line, expected) in cases {
        let response = raw_exchange(&mut stream, line);
        assert!(!response.ok);
        let error = response.error.expect("error message");
        for part in expected {
            assert!(error.contains(part), "{error:?} lacks {part:?}");
        }
        assert_eq!(response.body, serde_json::Value::Null);
    }
    assert_eq!(app.handled(), 0);
    // The same connection still works.
    let response = raw_exchange(&mut stream, b"{\"cmd\":\"status\"}\n");
    assert!(response.ok);
    assert_eq!(app.handled(), 1);
}

#[test]
fn a_too_long_line_gets_an_error_and_the_connection_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let app = echo_app(CtlServer::bind(&path).unwrap());
    let mut stream = UnixStream::connect(&path).unwrap();
    let mut line = vec![b' '; 70 * 1024];
    line.push(b'\n');
    let response = raw_exchange(&mut stream, &line);
    assert!(!response.ok);
    let error = response.error.unwrap();
    assert!(error.contains("longer than 65536 bytes"), "{error}");
    // Closed after the error: EOF (or a reset, should the kernel deliver one) follows.
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(
        rest.iter().all(|&b| b != b'{'),
        "unexpected second response"
    );
    assert_eq!(app.handled(), 0);

    // A line without any newline that keeps growing hits the same limit.
    let mut stream = UnixStream::connect(&path).unwrap();
    let response = raw_exchange(&mut stream, &vec![b'x'; 100 * 1024]);
    assert!(response.error.unwrap().contains("longer than"));

    // And the server still answers new connections.
    assert!(
        ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT)
            .unwrap()
            .ok
    );
}

#[test]
fn a_silent_application_yields_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let config = CtlConfig {
        reply_timeout: Duration::from_millis(200),
        ..CtlConfig::default()
    };
    // Nobody polls this server.
    let server = CtlServer::bind_with(&path, config).unwrap();
    let started = Instant::now();
    let response = ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT).unwrap();
    assert!(!response.ok);
    assert!(
        response.error.as_deref().unwrap().starts_with("timed out"),
        "{response:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(started.elapsed() < CLIENT_TIMEOUT);
    // The request did reach the queue; answering it late harms nobody.
    let call = server.try_recv().expect("queued request");
    assert_eq!(call.request, CtlRequest::Status);
    call.respond(CtlResponse::ok(json!(null)));
    assert!(server.try_recv().is_none());
}

#[test]
fn a_dropped_call_is_reported_as_unanswered() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let _app = FakeApp::spawn(CtlServer::bind(&path).unwrap(), |_| None);
    let response = ctl_call(&path, &CtlRequest::Activate, CLIENT_TIMEOUT).unwrap();
    assert!(!response.ok);
    assert!(response.error.unwrap().contains("without answering"));
}

#[test]
fn the_client_gives_up_after_its_own_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let _server = CtlServer::bind(&path).unwrap();
    let started = Instant::now();
    let err = ctl_call(&path, &CtlRequest::Status, Duration::from_millis(150)).unwrap_err();
    assert!(matches!(err, CtlError::TimedOut { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(err.to_string().contains(&path.display().to_string()));
}

#[test]
fn a_full_queue_answers_busy() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let config = CtlConfig {
        reply_timeout: Duration::from_millis(100),
        queue_max: 1,
        ..CtlConfig::default()
    };
    let server = CtlServer::bind_with(&path, config).unwrap();
    // The first request times out but stays queued (nobody drains it), filling the queue.
    let first = ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT).unwrap();
    assert!(first.error.unwrap().starts_with("timed out"));
    let second = ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT).unwrap();
    assert!(second.error.unwrap().starts_with("busy"));
    drop(server);
}

#[test]
fn connections_beyond_the_limit_get_an_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let config = CtlConfig {
        connections_max: 1,
        ..CtlConfig::default()
    };
    let _app = echo_app(CtlServer::bind_with(&path, config).unwrap());
    let mut first = UnixStream::connect(&path).unwrap();
    // The backlog is FIFO, so `first` is accepted before the next client; the pause only gives
    // its thread time to start.
    std::thread::sleep(Duration::from_millis(50));
    let rejected = ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT).unwrap();
    assert!(
        rejected
            .error
            .unwrap()
            .contains("too many control connections")
    );
    // The first connection is unaffected.
    assert!(raw_exchange(&mut first, b"{\"cmd\":\"status\"}\n").ok);
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    // A crashed daemon leaves its socket file behind: bound once, nobody listening now.
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    assert!(UnixStream::connect(&path).is_err());

    let _app = echo_app(CtlServer::bind(&path).unwrap());
    assert!(
        ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT)
            .unwrap()
            .ok
    );
}

#[test]
fn a_second_server_on_the_same_path_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let _app = echo_app(CtlServer::bind(&path).unwrap());
    let err = CtlServer::bind(&path).unwrap_err();
    assert!(matches!(err, CtlError::AlreadyRunning { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!("another instance is running at {}", path.display())
    );
    // The first one is untouched.
    assert!(
        ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT)
            .unwrap()
            .ok
    );
}

#[test]
fn a_live_listener_without_the_lock_is_not_clobbered() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    // Some other program (or an older daemon) listening on the path.
    let _foreign = UnixListener::bind(&path).unwrap();
    let err = CtlServer::bind(&path).unwrap_err();
    assert!(matches!(err, CtlError::AlreadyRunning { .. }), "{err}");
    assert!(path.exists());
}

#[test]
fn a_non_socket_file_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    std::fs::write(&path, b"precious").unwrap();
    let err = CtlServer::bind(&path).unwrap_err();
    assert!(matches!(err, CtlError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[test]
fn the_socket_is_private_and_removed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let server = CtlServer::bind(&path).unwrap();
    assert_eq!(server.path(), path.as_path());
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(server);
    assert!(!path.exists());

    let err = ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT).unwrap_err();
    assert!(matches!(err, CtlError::Connect { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("is the spillway daemon running"),
        "{message}"
    );

    // The path is free again for the next daemon.
    let _again = CtlServer::bind(&path).unwrap();
}

#[test]
fn shutdown_is_prompt_with_idle_and_waiting_clients() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let server = CtlServer::bind(&path).unwrap();
    let _idle = UnixStream::connect(&path).unwrap();
    let waiting = {
        let path = path.clone();
        std::thread::spawn(move || ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT))
    };
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    server.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(!path.exists());
    // The waiting client hears about it instead of hanging (an answer or a closed socket).
    match waiting.join().unwrap() {
        Ok(response) => assert!(!response.ok),
        Err(err) => assert!(
            matches!(err, CtlError::Closed { .. } | CtlError::Io { .. }),
            "{err}"
        ),
    }
}

#[test]
fn many_clients_at_once_all_get_their_answer() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    // Room for every client's current connection plus its previous one, whose thread may not
    // have seen the EOF yet on a loaded machine (the limit itself is tested above).
    let config = CtlConfig {
        connections_max: 64,
        ..CtlConfig::default()
    };
    let app = echo_app(CtlServer::bind_with(&path, config).unwrap());
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let path: PathBuf = path.clone();
            std::thread::spawn(move || {
                for j in 0..5 {
                    let request = CtlRequest::SetPolicy {
                        placement: format!("p{i}-{j}"),
                    };
                    let response = ctl_call(Path::new(&path), &request, CLIENT_TIMEOUT).unwrap();
                    assert_eq!(response.body["placement"], format!("p{i}-{j}"));
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    assert_eq!(app.handled(), 40);
}

/// Runs `f` on a thread whose effective uid is `uid` (the raw system call changes only the
/// calling thread, unlike libc's `setresuid`, which would change the whole test process).
fn as_other_user<T: Send + 'static>(uid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: setresuid(2) with -1 for the real and saved ids changes only this thread's
        // effective uid (the raw call is per thread); the thread ends right after `f`.
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, -1i64, i64::from(uid), -1i64) };
        assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("thread")
}

#[test]
fn refused_peers_and_busy_connections_are_counted_by_reason() {
    if !rustix::process::geteuid().is_root() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "needs root to connect as a second local user; under CI=true it must run"
        );
        eprintln!("skipping: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let config = CtlConfig {
        connections_max: 1,
        ..CtlConfig::default()
    };
    let server = CtlServer::bind_with(&path, config).unwrap();
    // As if an operator had opened the mode up: the credential check must hold on its own.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let p = path.clone();
    let answer = as_other_user(65534, move || {
        let mut stream = UnixStream::connect(&p).expect("connect as uid 65534");
        stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
        let _ = stream.write_all(b"{\"cmd\":\"status\"}\n");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        answer
    });
    assert!(
        answer.is_empty(),
        "a foreign peer got an answer: {answer:?}"
    );
    // One connection is served (it holds the only slot); the next is refused as busy.
    let _held = UnixStream::connect(&path).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let busy = ctl_call(&path, &CtlRequest::Status, CLIENT_TIMEOUT).unwrap();
    assert!(busy.error.unwrap().contains("too many control connections"));
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        let counts = server.refused();
        if counts == [("ctl.refused.peer", 1), ("ctl.refused.busy", 1)] {
            break;
        }
        assert!(Instant::now() < deadline, "{counts:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
