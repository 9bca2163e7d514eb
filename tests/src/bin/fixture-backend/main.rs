//! A stand-in for a web backend (think Puma behind a load balancer) that can be
//! made to hang, at run time, in each of the shapes we see in production.
//!
//! The health agent decides "this backend is hung" from kernel-side signals
//! (accept queue depth, requests read but never answered, crash loops), so the
//! integration tests need a backend that reproduces those shapes on demand
//! without depending on a real Ruby stack. This binary is that backend. It is
//! deliberately dependency-light (std + libc) so it links statically and can be
//! copied into a `FROM scratch` image: no DNS, no NSS, no TLS.
//!
//! ```text
//! fixture-backend --listen 127.0.0.1:9000 [--control 127.0.0.1:9001]
//!                 [--mode MODE] [--delay-ms N] [--backlog N]
//! ```
//!
//! Modes (switchable through the control port, which never hangs):
//!
//! * `normal`         – every request gets `200 OK`, body `ok\n`; keep-alive.
//! * `slow`           – like `normal`, but waits `delay_ms` before answering.
//! * `stop-accepting` – the listening socket stays open but `accept()` is no
//!   longer called, so the kernel keeps completing handshakes into the accept
//!   queue (Recv-Q grows) – the "all workers busy / deadlocked acceptor" shape.
//!   Connections that were already accepted keep being served.
//! * `no-respond`     – requests are read completely and then never answered;
//!   the connection is held open until the peer gives up or the mode changes
//!   (then the pending request is answered according to the new mode).
//! * `exit`           – the process exits with code 3 (at start-up, too), to
//!   emulate a crash-looping container.
//! * `error`          – every request gets `500 Internal Server Error`.
//!
//! Control port (plain HTTP, one request per connection):
//!
//! * `GET /mode`                            → current mode name
//! * `GET|POST /mode/<name>[?delay_ms=N]`   → switch mode, `ok\n`
//! * `GET /stats` → `{"accepted":N,"requests":N,"responses":N,"mode":"..."}`
//!   (web port counters since start)

mod control;
mod http;
mod mode;
mod socket;
mod web;

use std::net::SocketAddr;
use std::process;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::Arc;
use std::thread;

use control::control_loop;
use mode::{Mode, Shared, EXIT_MODE_CODE};
use socket::bind_listener;
use web::accept_loop;

const USAGE: &str = "usage: fixture-backend --listen IP:PORT [--control IP:PORT] \
[--mode normal|slow|stop-accepting|no-respond|exit|error] [--delay-ms N] [--backlog N] [--workers N]";

struct Config {
    listen: SocketAddr,
    control: Option<SocketAddr>,
    mode: Mode,
    delay_ms: u64,
    backlog: i32,
    workers: u64,
}

fn usage_error(msg: &str) -> ! {
    eprintln!("fixture-backend: {msg}\n{USAGE}");
    process::exit(2);
}

fn parse_addr(flag: &str, value: &str) -> SocketAddr {
    // Only literal addresses: resolving names would pull in NSS, which does
    // not work in a static binary inside a scratch image.
    value.parse().unwrap_or_else(|_| {
        usage_error(&format!(
            "{flag}: expected a literal IP:PORT (e.g. 127.0.0.1:9000), got {value:?}"
        ))
    })
}

fn parse_args() -> Config {
    let mut listen = None;
    let mut control = None;
    let mut mode = Mode::Normal;
    let mut delay_ms = 500u64;
    let mut backlog = 128i32;
    let mut workers = 0u64;

    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            process::exit(0);
        }
        // Accept both `--flag value` and `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let known = [
            "--listen",
            "--control",
            "--mode",
            "--delay-ms",
            "--backlog",
            "--workers",
        ];
        if !known.contains(&flag.as_str()) {
            usage_error(&format!("unknown argument {arg:?}"));
        }
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => usage_error(&format!("{flag} needs a value")),
        };
        match flag.as_str() {
            "--listen" => listen = Some(parse_addr(&flag, &value)),
            "--control" => control = Some(parse_addr(&flag, &value)),
            "--mode" => {
                mode = Mode::parse(&value)
                    .unwrap_or_else(|| usage_error(&format!("unknown mode {value:?}")))
            }
            "--delay-ms" => {
                delay_ms = value.parse().unwrap_or_else(|_| {
                    usage_error(&format!("--delay-ms: not a number: {value:?}"))
                })
            }
            "--backlog" => {
                backlog = match value.parse::<i32>() {
                    Ok(n) if n > 0 => n,
                    _ => usage_error(&format!(
                        "--backlog: expected a positive integer, got {value:?}"
                    )),
                }
            }
            "--workers" => {
                workers = value
                    .parse()
                    .unwrap_or_else(|_| usage_error(&format!("--workers: not a number: {value:?}")))
            }
            _ => unreachable!("flag checked against the known list above"),
        }
    }

    let listen = listen.unwrap_or_else(|| usage_error("--listen is required"));
    Config {
        listen,
        control,
        mode,
        delay_ms,
        backlog,
        workers,
    }
}

fn main() {
    let cfg = parse_args();

    if cfg.mode == Mode::Exit {
        // The crash-loop shape: die before ever listening, every start.
        eprintln!("fixture-backend: mode exit, exiting with code {EXIT_MODE_CODE}");
        process::exit(EXIT_MODE_CODE);
    }

    let shared = Arc::new(Shared {
        mode: AtomicU8::new(cfg.mode as u8),
        delay_ms: AtomicU64::new(cfg.delay_ms),
        accepted: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        responses: AtomicU64::new(0),
        active: AtomicU64::new(0),
        max_workers: cfg.workers,
    });

    let listener = bind_listener(cfg.listen, cfg.backlog).unwrap_or_else(|e| {
        eprintln!("fixture-backend: cannot listen on {}: {e}", cfg.listen);
        process::exit(1);
    });
    // Report the real address so `--listen 127.0.0.1:0` is usable.
    let listen_addr = listener.local_addr().map_or(cfg.listen, |a| a);

    let control_desc = match cfg.control {
        Some(addr) => {
            let control = bind_listener(addr, 128).unwrap_or_else(|e| {
                eprintln!("fixture-backend: cannot listen on control {addr}: {e}");
                process::exit(1);
            });
            let control_addr = control.local_addr().map_or(addr, |a| a);
            let shared = Arc::clone(&shared);
            if let Err(e) = thread::Builder::new()
                .name("control-accept".into())
                .spawn(move || control_loop(control, shared))
            {
                eprintln!("fixture-backend: cannot start control server: {e}");
                process::exit(1);
            }
            control_addr.to_string()
        }
        None => "none".to_string(),
    };

    eprintln!(
        "fixture-backend listening on {listen_addr} (mode {}), control on {control_desc}",
        cfg.mode.name()
    );
    accept_loop(listener, shared);
}
