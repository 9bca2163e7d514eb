//! HTTP to loopback: one exchange, the `/health` poller, and the traffic.

use std::{
    io::{self, BufRead, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::*;

/// One HTTP/1.1 exchange on `stream`: the status code and the body (Content-Length framed).
pub(crate) fn exchange(
    stream: &mut TcpStream,
    path: &str,
    close: bool,
) -> io::Result<(u16, Vec<u8>)> {
    let connection = if close { "close" } else { "keep-alive" };
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: {connection}\r\n\r\n"
    )?;
    let mut reader = io::BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let code = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
    let mut length = 0usize;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok((code, body))
}

pub(crate) fn connect(port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

pub(crate) fn get(port: u16, path: &str, timeout: Duration) -> io::Result<(u16, Vec<u8>)> {
    exchange(&mut connect(port, timeout)?, path, true)
}

/// `/health` every 100 ms: each answer with its time from `zero`, reduced to what the host
/// asserts on; the first answer's `details.web.kernel` whole.
pub(crate) struct Poller {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Value>>>,
    kernel: Arc<Mutex<Value>>,
    /// The latest answer's `details.web.answers`.
    answers: Arc<Mutex<Value>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Poller {
    pub(crate) fn start(zero: Instant) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let kernel = Arc::new(Mutex::new(Value::Null));
        let answers = Arc::new(Mutex::new(Value::Null));
        let thread = {
            let (stop, samples, kernel) = (stop.clone(), samples.clone(), kernel.clone());
            let answers = answers.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let at = zero.elapsed().as_secs_f64();
                    let sample = match get(HEALTH, "/health", Duration::from_secs(2)) {
                        Ok((code, body)) => {
                            let b: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            let mut k = kernel.lock().unwrap();
                            if k.is_null() && !b["details"]["web"]["kernel"].is_null() {
                                *k = b["details"]["web"]["kernel"].clone();
                            }
                            drop(k);
                            *answers.lock().unwrap() = b["details"]["web"]["answers"].clone();
                            json!({
                                "t": at,
                                "code": code,
                                "status": b["status"],
                                "webserver": b["checks"]["webserver"],
                                "heal": b["details"]["heal"]["total_attempts"],
                                "reasons": b["reasons"],
                                // What sock_diag saw of the port's connections (the sock_diag
                                // tier's evidence of answers going out, `since_sent_ms`).
                                "sockets": b["details"]["web"]["kernel"]["following"]["connections"],
                            })
                        }
                        Err(e) => json!({ "t": at, "error": e.to_string() }),
                    };
                    samples.lock().unwrap().push(sample);
                    thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Poller {
            stop,
            samples,
            kernel,
            answers,
            thread: Some(thread),
        }
    }

    pub(crate) fn latest(&self) -> Value {
        self.samples
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Waits for an answer after `since` (seconds from zero) that `pred` accepts.
    pub(crate) fn wait(
        &self,
        limit: Duration,
        since: f64,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            let found = self
                .samples
                .lock()
                .unwrap()
                .iter()
                .find(|s| s["t"].as_f64().unwrap_or(0.0) >= since && pred(s))
                .cloned();
            if found.is_some() {
                return found;
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Every answer, the first `details.web.kernel` and the last `details.web.answers`.
    pub(crate) fn stop(mut self) -> (Vec<Value>, Value, Value) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let samples = std::mem::take(&mut *self.samples.lock().unwrap());
        let kernel = self.kernel.lock().unwrap().clone();
        let answers = self.answers.lock().unwrap().clone();
        (samples, kernel, answers)
    }
}

/// Clients that each send a request on a new connection, then pause, until stopped; answers
/// counted by status code, failures by kind.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<std::collections::BTreeMap<String, u64>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Load {
    pub(crate) fn start(
        clients: usize,
        path: &'static str,
        pause: Duration,
        timeout: Duration,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
        let threads = (0..clients)
            .map(|_| {
                let (stop, counts) = (stop.clone(), counts.clone());
                thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let key = match get(WEB, path, timeout) {
                            Ok((code, _)) => code.to_string(),
                            Err(e) => format!("{:?}", e.kind()),
                        };
                        *counts.lock().unwrap().entry(key).or_insert(0) += 1;
                        thread::sleep(pause);
                    }
                })
            })
            .collect();
        Load {
            stop,
            counts,
            threads,
        }
    }

    pub(crate) fn stop(self) -> Value {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        json!(*self.counts.lock().unwrap())
    }
}
