//! The web port: the accept loop and the connections, each behaving as the mode says.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::http::{read_request, write_bad_request, write_response, ReadOutcome};
use crate::mode::{Mode, Shared, EXIT_MODE_CODE, MODE_POLL};
use crate::socket::poll_fd;

/// The web port's accept loop.
///
/// Rather than sitting in a blocking `accept()` (which could not notice a
/// switch to `stop-accepting` until the next client arrived, and would then
/// accept that one client), the loop polls the listener for readiness with a
/// short timeout and re-reads the mode right before each `accept()`. A mode
/// switch therefore takes effect within ~20 ms; the only leak is the
/// microsecond window between that final mode check and `accept()`, in which
/// at most one more connection may be accepted.
pub(crate) fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let lfd = listener.as_raw_fd();
    loop {
        // Like Puma's thread pool: with every worker busy, the server does not accept, and
        // the kernel queues the handshakes. Progress continues as workers free up.
        let max = shared.max_workers;
        if max > 0 && shared.active.load(Ordering::SeqCst) >= max {
            thread::sleep(Duration::from_millis(1));
            continue;
        }
        if shared.mode() == Mode::StopAccepting {
            // Not calling accept() is the whole point: the kernel keeps
            // queueing completed handshakes, which is what the agent sees.
            thread::sleep(MODE_POLL);
            continue;
        }
        match poll_fd(lfd, libc::POLLIN, MODE_POLL.as_millis() as libc::c_int) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) => {
                eprintln!("fixture-backend: poll on listener failed: {e}");
                thread::sleep(MODE_POLL);
                continue;
            }
        }
        if shared.mode() == Mode::StopAccepting {
            continue;
        }
        match listener.accept() {
            Ok((stream, _peer)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                shared.active.fetch_add(1, Ordering::SeqCst);
                let shared = Arc::clone(&shared);
                let spawned = thread::Builder::new()
                    .name("conn".into())
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        serve_web_connection(stream, &shared);
                        shared.active.fetch_sub(1, Ordering::SeqCst);
                    });
                if let Err(e) = spawned {
                    // The stream was moved into the closure and is dropped
                    // (closed) with it; nothing else to clean up.
                    eprintln!("fixture-backend: cannot spawn connection thread: {e}");
                }
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning, the
                // pending connection stays queued for the next attempt.
                eprintln!("fixture-backend: accept failed: {e}");
                thread::sleep(MODE_POLL);
            }
        }
    }
}

enum Parked {
    PeerGone,
    ModeChanged,
}

/// Holds a connection whose request was read but will not be answered, the
/// way a wedged worker does. Only the peer going away or a mode change ends
/// the wait; we never close first, because the agent must see the request
/// outstanding on an open socket.
fn park_no_respond(stream: &TcpStream, shared: &Shared) -> Parked {
    loop {
        if shared.mode() != Mode::NoRespond {
            return Parked::ModeChanged;
        }
        // POLLRDHUP rather than POLLIN: a pipelined follow-up request would
        // make POLLIN fire continuously, while we only care about the FIN.
        match poll_fd(
            stream.as_raw_fd(),
            libc::POLLRDHUP,
            MODE_POLL.as_millis() as libc::c_int,
        ) {
            Ok(0) => {}
            Ok(_) | Err(_) => return Parked::PeerGone,
        }
    }
}

fn serve_web_connection(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    loop {
        let req = match read_request(&mut stream, &mut buf) {
            Ok(ReadOutcome::Request(r)) => r,
            Ok(ReadOutcome::Closed) | Err(_) => return,
            Ok(ReadOutcome::Malformed) => {
                if write_bad_request(&mut stream).is_ok() {
                    shared.responses.fetch_add(1, Ordering::SeqCst);
                }
                return;
            }
        };
        shared.requests.fetch_add(1, Ordering::SeqCst);
        let head_only = req.method.eq_ignore_ascii_case("HEAD");

        // The mode is sampled after the request is read, so a keep-alive
        // connection follows mode switches request by request.
        let (status, body) = loop {
            match shared.mode() {
                Mode::Normal | Mode::StopAccepting => break ("200 OK", "ok\n"),
                Mode::Slow => {
                    thread::sleep(Duration::from_millis(
                        shared.delay_ms.load(Ordering::SeqCst),
                    ));
                    break ("200 OK", "ok\n");
                }
                Mode::Error => break ("500 Internal Server Error", "error\n"),
                Mode::NoRespond => match park_no_respond(&stream, shared) {
                    Parked::PeerGone => return,
                    // Answer the held request per the new mode, like a
                    // worker that finally gets unstuck.
                    Parked::ModeChanged => continue,
                },
                Mode::Exit => process::exit(EXIT_MODE_CODE),
            }
        };
        if write_response(
            &mut stream,
            status,
            body,
            "text/plain",
            req.keep_alive,
            head_only,
        )
        .is_err()
        {
            return;
        }
        shared.responses.fetch_add(1, Ordering::SeqCst);
        if !req.keep_alive {
            return;
        }
    }
}
