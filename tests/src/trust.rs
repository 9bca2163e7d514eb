//! The fleet key as the tests hold it, and stand-ins for peers that do not play fair.
//!
//! The proofs are written here a second time, from the protocol as docs/fleet.md states it
//! (HMAC-SHA256 with ring), not taken from the agent's code: a test that signs with the agent's
//! own functions would pass whatever those functions did.
//!
//! Every agent the harness starts holds [`FLEET_KEY`] (`HEALTH_AGENT_FLEET_KEY`) unless a test
//! passes the variable itself.

use std::{
    io::{Read, Write},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ring::{digest, hmac};

use crate::load::MAX_RUN;

/// The fleet key of the harness's agents.
pub const FLEET_KEY: &str = "tEsT-fLeEt-KeY-0123456789abcdefghijklmnopqrstuv";
/// The variable the agent reads its key from by default (`fleet.key_env`).
pub const KEY_VAR: &str = "HEALTH_AGENT_FLEET_KEY";
/// The answer's proof header.
pub const PROOF_HEADER: &str = "x-health-agent-proof";

/// A key's public id: the first 4 bytes of SHA-256("health-agent fleet key id\n" + key), hex.
pub fn key_id(key: &str) -> String {
    let mut d = digest::Context::new(&digest::SHA256);
    d.update(b"health-agent fleet key id\n");
    d.update(key.as_bytes());
    hex(&d.finish().as_ref()[..4])
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn mac(key: &str, parts: &[&[u8]]) -> String {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key.as_bytes());
    let mut c = hmac::Context::with_key(&k);
    for p in parts {
        c.update(p);
    }
    hex(c.sign().as_ref())
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh nonce (32 hex digits).
pub fn nonce() -> String {
    format!("{:016x}{:016x}", rand_u64(), rand_u64())
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    u64::from_ne_bytes(b)
}

/// The ask's `Authorization` value: `HealthAgent-Fleet key=ID,ts=UNIX,mac=HEX`, the MAC over
/// "health-agent fleet ask v1\n" + path with query + "\n" + ts.
pub fn ask_authorization(key: &str, path_and_query: &str, ts: u64) -> String {
    let m = mac(
        key,
        &[
            b"health-agent fleet ask v1\n",
            path_and_query.as_bytes(),
            b"\n",
            ts.to_string().as_bytes(),
        ],
    );
    format!("HealthAgent-Fleet key={},ts={ts},mac={m}", key_id(key))
}

/// The answer's proof: `key=ID,mac=HEX`, the MAC over "health-agent fleet view v1\n" + nonce +
/// "\n" + body.
pub fn prove_view(key: &str, nonce: &str, body: &[u8]) -> String {
    let m = mac(
        key,
        &[
            b"health-agent fleet view v1\n",
            nonce.as_bytes(),
            b"\n",
            body,
        ],
    );
    format!("key={},mac={m}", key_id(key))
}

/// The nonce of an ask's path (`?nonce=…`).
pub fn nonce_of(path: &str) -> Option<&str> {
    path.split_once('?')?
        .1
        .split('&')
        .find_map(|p| p.strip_prefix("nonce="))
}

/// A view as an agent answered one ask: what a recording replays.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub code: u16,
    /// The ask's nonce.
    pub nonce: String,
    /// The answer's proof header ("" when none).
    pub proof: String,
    pub body: String,
}

/// `GET /fleet/v1/view` of the agent at `addr`, asked as a peer holding `key` does.
pub fn ask_view_raw(addr: SocketAddr, key: &str) -> std::io::Result<Recorded> {
    let nonce = nonce();
    let path = format!("/fleet/v1/view?nonce={nonce}");
    let auth = ask_authorization(key, &path, unix_now());
    let (code, head, body) = crate::http::request_at(
        addr,
        "GET",
        &path,
        &[("Authorization", auth.as_str())],
        Duration::from_secs(5),
    )?;
    let proof = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(PROOF_HEADER))
        .map_or("", |(_, v)| v.trim())
        .to_string();
    Ok(Recorded {
        code,
        nonce,
        proof,
        body,
    })
}

/// `GET /fleet/v1/view` of the agent at `addr`, asked as a peer holding `key` does: the
/// status, and the body when its proof answers this ask (an error when it does not).
pub fn ask_view(addr: SocketAddr, key: &str) -> std::io::Result<(u16, String)> {
    let r = ask_view_raw(addr, key)?;
    if r.code != 200 {
        return Ok((r.code, r.body));
    }
    let expected = prove_view(key, &r.nonce, r.body.as_bytes());
    if r.proof != expected {
        return Err(std::io::Error::other(format!(
            "the view's proof {:?} is not the one for this ask ({expected:?})",
            r.proof
        )));
    }
    Ok((r.code, r.body))
}

/// What a [`PeerStandIn`] sends for one ask.
pub enum Reply {
    /// A view: the body as given, with `proof` as its proof header (None: unsigned).
    View { body: String, proof: Option<String> },
    /// That many bytes of a JSON string, streamed as fast as the asker reads; `declared`: with
    /// a `Content-Length` saying so, else until the connection closes.
    Flood { bytes: u64, declared: bool },
}

impl Reply {
    /// `body` signed with `key` for the ask on `path`.
    pub fn signed(key: &str, path: &str, body: String) -> Self {
        let proof = nonce_of(path).map(|n| prove_view(key, n, body.as_bytes()));
        Self::View { body, proof }
    }
}

/// A stand-in at a peer's address on loopback that answers every ask through `reply`, and
/// counts the bytes it streamed. Dropping it stops it.
pub struct PeerStandIn {
    pub addr: SocketAddr,
    streamed: Arc<AtomicU64>,
    asks: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

type Replier = dyn Fn(&str) -> Reply + Send + Sync;

impl PeerStandIn {
    /// On `ip`, port `port` (0: any); `reply` gets the ask's path with its query.
    pub fn start(
        ip: IpAddr,
        port: u16,
        reply: impl Fn(&str) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind((ip, port))
            .unwrap_or_else(|e| panic!("binding a peer stand-in on {ip}:{port}: {e}"));
        let addr = listener.local_addr().expect("stand-in address");
        listener.set_nonblocking(true).expect("non-blocking");
        let reply: Arc<Replier> = Arc::new(reply);
        let streamed = Arc::new(AtomicU64::new(0));
        let asks = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sd, ak) = (stop.clone(), streamed.clone(), asks.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + MAX_RUN;
            while !st.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((s, _)) => {
                        let (reply, st, sd, ak) =
                            (reply.clone(), st.clone(), sd.clone(), ak.clone());
                        std::thread::spawn(move || answer(s, &*reply, &st, &sd, &ak));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            addr,
            streamed,
            asks,
            stop,
            thread: Some(thread),
        }
    }

    /// Bytes of floods written to askers so far.
    pub fn streamed(&self) -> u64 {
        self.streamed.load(Ordering::SeqCst)
    }

    /// Asks answered so far.
    pub fn asks(&self) -> u64 {
        self.asks.load(Ordering::SeqCst)
    }
}

impl Drop for PeerStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(
    mut s: TcpStream,
    reply: &Replier,
    stop: &AtomicBool,
    streamed: &AtomicU64,
    asks: &AtomicU64,
) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let path = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/")
        .to_string();
    asks.fetch_add(1, Ordering::SeqCst);
    match reply(&path) {
        Reply::View { body, proof } => {
            let proof = proof
                .map(|p| format!("{PROOF_HEADER}: {p}\r\n"))
                .unwrap_or_default();
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{proof}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes());
        }
        Reply::Flood { bytes, declared } => {
            let length = if declared {
                format!("Content-Length: {bytes}\r\n")
            } else {
                String::new()
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}Connection: close\r\n\r\n{{\"host\":\""
            );
            if s.write_all(head.as_bytes()).is_err() {
                return;
            }
            let block = vec![b'x'; 64 * 1024];
            let mut sent = 0u64;
            while sent < bytes && !stop.load(Ordering::SeqCst) {
                match s.write(&block) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        sent += n as u64;
                        streamed.fetch_add(n as u64, Ordering::SeqCst);
                    }
                }
            }
        }
    }
    let _ = s.shutdown(Shutdown::Both);
}
