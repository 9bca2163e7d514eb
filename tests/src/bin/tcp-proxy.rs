//! A plain TCP forwarder for the integration tests: the "network path to the database".
//!
//! ```text
//! tcp-proxy --listen 127.0.0.1:P --to 127.0.0.1:Q
//! ```
//!
//! Every connection accepted on `--listen` gets its own connection to `--to`, and bytes are
//! copied both ways by one thread per direction. Once it listens it prints one line,
//! `listening on ADDR`, to stdout (the test's cue); errors go to stderr.
//!
//! The tests freeze it with SIGSTOP: the kernel still completes handshakes into its listen
//! queue and ACKs the bytes clients send, but nothing is forwarded or answered — a path to the
//! database that silently eats packets, as a firewall that drops them does. SIGCONT thaws it
//! and everything queued meanwhile goes through. std only, so it builds anywhere.

use std::{
    io::{self, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    process, thread,
    time::Duration,
};

const USAGE: &str = "usage: tcp-proxy --listen IP:PORT --to IP:PORT";

fn main() {
    let (listen, to) = parse_args().unwrap_or_else(|e| {
        eprintln!("tcp-proxy: {e}\n{USAGE}");
        process::exit(2)
    });
    let listener = TcpListener::bind(listen).unwrap_or_else(|e| {
        eprintln!("tcp-proxy: cannot listen on {listen}: {e}");
        process::exit(1)
    });
    {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "listening on {listen}");
        let _ = out.flush();
    }
    for conn in listener.incoming() {
        match conn {
            Ok(client) => {
                thread::spawn(move || forward(client, to));
            }
            Err(e) => {
                // EMFILE and friends: do not spin.
                eprintln!("tcp-proxy: accept: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A command line tcp-proxy cannot use: printed above the usage, and the process exits 2.
#[derive(Debug)]
struct BadArgs(String);

impl std::fmt::Display for BadArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn parse_args() -> Result<(SocketAddr, SocketAddr), BadArgs> {
    let mut listen = None;
    let mut to = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let slot = match flag.as_str() {
            "--listen" => &mut listen,
            "--to" => &mut to,
            "-h" | "--help" => {
                println!("{USAGE}");
                process::exit(0)
            }
            other => return Err(BadArgs(format!("unknown argument {other:?}"))),
        };
        let value = args
            .next()
            .ok_or_else(|| BadArgs(format!("{flag} needs a value")))?;
        let addr = value
            .parse::<SocketAddr>()
            .map_err(|e| BadArgs(format!("{flag} {value:?}: {e}")))?;
        *slot = Some(addr);
    }
    let required = |flag: &str| BadArgs(format!("{flag} is required"));
    Ok((
        listen.ok_or_else(|| required("--listen"))?,
        to.ok_or_else(|| required("--to"))?,
    ))
}

fn forward(client: TcpStream, to: SocketAddr) {
    let upstream = match TcpStream::connect_timeout(&to, Duration::from_secs(10)) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("tcp-proxy: connect {to}: {e}");
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let up = thread::spawn(move || pipe(client2, upstream2));
    pipe(upstream, client);
    let _ = up.join();
}

/// Copies `from` → `to` until EOF (then half-closes `to`, so the far side sees the EOF too) or
/// an error (then closes both, which ends the other direction as well).
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    match io::copy(&mut from, &mut to) {
        Ok(_) => {
            let _ = to.shutdown(Shutdown::Write);
        }
        Err(_) => {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        }
    }
}
