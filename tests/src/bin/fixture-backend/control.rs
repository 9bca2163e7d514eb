//! The control port: switches the mode and reports the counters; it never hangs.

use std::net::{TcpListener, TcpStream};
use std::process;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::http::{read_request, write_bad_request, write_response, ReadOutcome};
use crate::mode::{Mode, Shared, EXIT_MODE_CODE, MODE_POLL};

pub(crate) fn control_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fixture-backend: control accept failed: {e}");
                thread::sleep(MODE_POLL);
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        let spawned = thread::Builder::new()
            .name("control".into())
            .stack_size(256 * 1024)
            .spawn(move || serve_control_connection(stream, &shared));
        if let Err(e) = spawned {
            eprintln!("fixture-backend: cannot spawn control thread: {e}");
        }
    }
}

fn serve_control_connection(mut stream: TcpStream, shared: &Shared) {
    // A stuck test client must not pin a control thread forever.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let req = match read_request(&mut stream, &mut buf) {
        Ok(ReadOutcome::Request(r)) => r,
        Ok(ReadOutcome::Closed) | Err(_) => return,
        Ok(ReadOutcome::Malformed) => {
            let _ = write_bad_request(&mut stream);
            return;
        }
    };
    let head_only = req.method.eq_ignore_ascii_case("HEAD");
    let (path, query) = match req.target.split_once('?') {
        Some((p, q)) => (p, q),
        None => (req.target.as_str(), ""),
    };
    let is_get = req.method.eq_ignore_ascii_case("GET") || head_only;
    let is_post = req.method.eq_ignore_ascii_case("POST");

    let mut exit_after_reply = false;
    let (status, body, ctype): (&str, String, &str) = if path == "/mode" && is_get {
        ("200 OK", shared.mode().name().to_string(), "text/plain")
    } else if path == "/stats" && is_get {
        let json = format!(
            "{{\"accepted\":{},\"requests\":{},\"responses\":{},\"mode\":\"{}\"}}",
            shared.accepted.load(Ordering::SeqCst),
            shared.requests.load(Ordering::SeqCst),
            shared.responses.load(Ordering::SeqCst),
            shared.mode().name(),
        );
        ("200 OK", json, "application/json")
    } else if let Some(name) = path.strip_prefix("/mode/").filter(|_| is_get || is_post) {
        match (Mode::parse(name), parse_delay(query)) {
            (None, _) => (
                "400 Bad Request",
                format!("unknown mode {name:?}\n"),
                "text/plain",
            ),
            (_, Err(e)) => (
                "400 Bad Request",
                format!("delay_ms: not a number: {e}\n"),
                "text/plain",
            ),
            (Some(mode), Ok(delay)) => {
                if let Some(d) = delay {
                    shared.delay_ms.store(d, Ordering::SeqCst);
                }
                eprintln!(
                    "fixture-backend: mode -> {} (delay_ms {})",
                    mode.name(),
                    shared.delay_ms.load(Ordering::SeqCst)
                );
                if mode == Mode::Exit {
                    // Reply first so the test's control call does not itself
                    // look like a failure, then die.
                    exit_after_reply = true;
                }
                shared.set_mode(mode);
                ("200 OK", "ok\n".to_string(), "text/plain")
            }
        }
    } else {
        ("404 Not Found", "not found\n".to_string(), "text/plain")
    };
    let _ = write_response(&mut stream, status, &body, ctype, false, head_only);
    if exit_after_reply {
        eprintln!("fixture-backend: exiting with code {EXIT_MODE_CODE} (mode exit)");
        process::exit(EXIT_MODE_CODE);
    }
}

/// `delay_ms` of the query, when it has one.
fn parse_delay(query: &str) -> Result<Option<u64>, std::num::ParseIntError> {
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("delay_ms="));
    value.map(str::parse).transpose()
}
