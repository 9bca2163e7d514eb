//! Open-loop traffic: requests on Poisson arrival times, whatever the server answers (an
//! overloaded server is offered more than it serves), on new connections or keep-alive ones.

use std::{
    collections::BTreeMap,
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::load::{connect, is_timeout, parse_status, read_response, MAX_RUN};

/// What an [`OpenLoop`] got.
#[derive(Debug, Clone, Default)]
pub struct OpenLoopStats {
    /// Requests sent (connections made and the request written), each on its Poisson time.
    pub sent: u64,
    /// Arrivals that could not be sent (connect or write failed).
    pub send_errors: u64,
    /// Answers by HTTP status.
    pub by_status: BTreeMap<u16, u64>,
    /// Requests without an answer within the timeout.
    pub timeouts: u64,
    /// Connections closed without an answer.
    pub errors: u64,
    /// The latest the dispatcher sent a request after its scheduled time: large means the
    /// clock was not kept (the machine too busy), and the load was less than asked.
    pub max_lag: Duration,
    pub elapsed: Duration,
    /// Each answer's time from the request written to the answer read (loopback: what the
    /// server took, within a fraction of a millisecond).
    pub latencies: Vec<Duration>,
}

impl OpenLoopStats {
    pub fn answers(&self) -> u64 {
        self.by_status.values().sum()
    }

    /// Requests sent per second.
    pub fn offered_rate(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile of the answers' latencies (0 < q ≤ 1), None without answers.
    pub fn latency_quantile(&self, q: f64) -> Option<Duration> {
        let mut v = self.latencies.clone();
        v.sort_unstable();
        let rank = ((v.len() as f64 * q).ceil() as usize).max(1);
        v.get(rank - 1).copied()
    }

    /// The answers' mean latency.
    pub fn mean_latency(&self) -> Option<Duration> {
        let n = u32::try_from(self.latencies.len())
            .ok()
            .filter(|n| *n > 0)?;
        Some(self.latencies.iter().sum::<Duration>() / n)
    }
}

/// One request in flight: its socket, what it read so far, when it was sent.
struct InFlight {
    stream: TcpStream,
    raw: Vec<u8>,
    sent: Instant,
}

/// Open-loop load: `GET path` on a new connection at the instants of a Poisson process of
/// `rate` per second, whatever the server does — a closed-loop client (each waiting for its
/// answer before the next) slows down with the server and hides overload. A dispatcher thread
/// keeps the clock (connect and write only, both immediate on loopback while the accept queue
/// has room); a reader thread polls every open connection for its answer.
/// The seed that sends at evenly spaced times (a fixed rate) instead of Poisson ones: a known
/// load whose every second holds the same count.
pub const EVEN: u64 = u64::MAX;

/// Exponential gaps between arrivals: a Poisson process of `rate`, repeatable from a seed.
struct Arrivals {
    state: u64,
    rate: f64,
}

impl Arrivals {
    fn new(seed: u64, rate: f64) -> Self {
        if seed == EVEN {
            return Self { state: EVEN, rate };
        }
        // The seed scrambled (splitmix64's finaliser): xorshift from a small state such as 1
        // or 2 starts with a run of tiny numbers, whose gaps are seconds long — at 6 a second
        // the first request of seed 1 came 4 s late.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self {
            state: (z ^ (z >> 31)).max(1),
            rate,
        }
    }

    /// The gap to the next arrival (xorshift uniform).
    fn gap(&mut self) -> Duration {
        if self.state == EVEN {
            return Duration::from_secs_f64(1.0 / self.rate);
        }
        let r = &mut self.state;
        *r ^= *r << 13;
        *r ^= *r >> 7;
        *r ^= *r << 17;
        let u = ((*r >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        Duration::from_secs_f64(-u.ln() / self.rate)
    }
}

pub struct OpenLoop {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<OpenLoopStats>>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
}

impl OpenLoop {
    /// `seed` makes the arrival times repeatable; `timeout` bounds each answer.
    pub fn start(port: u16, path: &str, rate: f64, seed: u64, timeout: Duration) -> Self {
        assert!(rate > 0.0 && rate.is_finite(), "rate {rate}");
        raise_open_files_limit();
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(OpenLoopStats::default()));
        let inbox = Arc::new(Mutex::new(Vec::<InFlight>::new()));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let dispatcher = {
            let (stop, stats, inbox) = (stop.clone(), stats.clone(), inbox.clone());
            std::thread::spawn(move || {
                let mut arrivals = Arrivals::new(seed, rate);
                let mut next = Instant::now();
                while !stop.load(Ordering::SeqCst) && started.elapsed() < MAX_RUN {
                    next += arrivals.gap();
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    let lag = Instant::now().saturating_duration_since(next);
                    let sent = (|| {
                        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
                        s.set_nodelay(true)?;
                        (&s).write_all(request.as_bytes())?;
                        s.set_nonblocking(true)?;
                        Ok::<_, io::Error>(s)
                    })();
                    if let Ok(mut st) = stats.lock() {
                        st.max_lag = st.max_lag.max(lag);
                        match &sent {
                            Ok(_) => st.sent += 1,
                            Err(_) => st.send_errors += 1,
                        }
                    }
                    if let (Ok(stream), Ok(mut q)) = (sent, inbox.lock()) {
                        q.push(InFlight {
                            stream,
                            raw: Vec::new(),
                            sent: Instant::now(),
                        });
                    }
                }
            })
        };
        let reader = {
            let (stop, stats) = (stop.clone(), stats.clone());
            std::thread::spawn(move || read_answers(&stop, &stats, &inbox, timeout))
        };
        Self {
            stop,
            stats,
            threads: vec![dispatcher, reader],
            started,
        }
    }

    /// What was recorded so far (the load keeps running).
    pub fn stats(&self) -> OpenLoopStats {
        let mut s = self.stats.lock().map(|s| s.clone()).unwrap_or_default();
        s.elapsed = self.started.elapsed();
        s
    }

    /// Stops sending, drops the connections still open, returns the totals.
    pub fn stop(mut self) -> OpenLoopStats {
        let s = self.stats();
        self.halt();
        s
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for OpenLoop {
    fn drop(&mut self) {
        self.halt();
    }
}

impl OpenLoop {
    /// Open-loop load over keep-alive connections, as a load balancer's pool sends it:
    /// `connections` persistent connections; each request, on its Poisson instant of `rate`
    /// per second, goes out on a connection that is free (one that is answering waits its
    /// turn: with more connections than the server has workers that is rare, and a late send
    /// shows in `max_lag`).
    pub fn keep_alive(
        port: u16,
        path: &str,
        rate: f64,
        seed: u64,
        connections: usize,
        timeout: Duration,
    ) -> Self {
        assert!(rate > 0.0 && rate.is_finite(), "rate {rate}");
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(OpenLoopStats::default()));
        // The schedule: the arrivals and the next one, taken by the free connection.
        let schedule = Arc::new(Mutex::new((Arrivals::new(seed, rate), started)));
        let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        let threads = (0..connections)
            .map(|_| {
                let (stop, stats, schedule) = (stop.clone(), stats.clone(), schedule.clone());
                let request = request.clone();
                std::thread::spawn(move || {
                    let mut conn: Option<(TcpStream, Vec<u8>)> = None;
                    while !stop.load(Ordering::SeqCst) && started.elapsed() < MAX_RUN {
                        let at = {
                            let Ok(mut s) = schedule.lock() else { return };
                            let (arrivals, next) = &mut *s;
                            *next += arrivals.gap();
                            *next
                        };
                        while Instant::now() < at {
                            if stop.load(Ordering::SeqCst) {
                                return;
                            }
                            std::thread::sleep(
                                (at - Instant::now()).min(Duration::from_millis(50)),
                            );
                        }
                        let lag = Instant::now().saturating_duration_since(at);
                        let sent = Instant::now();
                        let result = (|| {
                            if conn.is_none() {
                                conn = Some((
                                    connect(([127, 0, 0, 1], port).into(), timeout)?,
                                    Vec::new(),
                                ));
                            }
                            let (s, buf) = conn.as_mut().expect("connected above");
                            s.write_all(request.as_bytes())?;
                            read_response(s, buf)
                        })();
                        let Ok(mut st) = stats.lock() else { return };
                        st.sent += 1;
                        st.max_lag = st.max_lag.max(lag);
                        match result {
                            Ok((code, close)) => {
                                *st.by_status.entry(code).or_default() += 1;
                                st.latencies.push(sent.elapsed());
                                if close {
                                    conn = None;
                                }
                            }
                            Err(e) if is_timeout(&e) => {
                                st.timeouts += 1;
                                conn = None;
                            }
                            Err(_) => {
                                st.errors += 1;
                                conn = None;
                            }
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            stats,
            threads,
            started,
        }
    }
}

/// The reader: polls every connection in flight, reads answers to EOF, counts them.
fn read_answers(
    stop: &AtomicBool,
    stats: &Mutex<OpenLoopStats>,
    inbox: &Mutex<Vec<InFlight>>,
    timeout: Duration,
) {
    use std::os::fd::AsRawFd;
    let mut open: Vec<InFlight> = Vec::new();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::SeqCst) {
        if let Ok(mut q) = inbox.lock() {
            open.append(&mut q);
        }
        if open.is_empty() {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let mut fds: Vec<libc::pollfd> = open
            .iter()
            .map(|f| libc::pollfd {
                fd: f.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd for the length given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 5) };
        let now = Instant::now();
        let mut done = vec![false; open.len()];
        for (i, (f, p)) in open.iter_mut().zip(&fds).enumerate() {
            if n > 0 && p.revents != 0 {
                loop {
                    match f.stream.read(&mut buf) {
                        Ok(0) => {
                            let code = parse_status(&f.raw);
                            if let Ok(mut st) = stats.lock() {
                                match code {
                                    Ok(c) => {
                                        *st.by_status.entry(c).or_default() += 1;
                                        st.latencies.push(now.saturating_duration_since(f.sent));
                                    }
                                    Err(_) => st.errors += 1,
                                }
                            }
                            done[i] = true;
                            break;
                        }
                        Ok(k) => f.raw.extend_from_slice(&buf[..k]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            if let Ok(mut st) = stats.lock() {
                                st.errors += 1;
                            }
                            done[i] = true;
                            break;
                        }
                    }
                }
            }
            if !done[i] && now.saturating_duration_since(f.sent) > timeout {
                if let Ok(mut st) = stats.lock() {
                    st.timeouts += 1;
                }
                done[i] = true;
            }
        }
        let mut i = 0;
        open.retain(|_| {
            let keep = !done[i];
            i += 1;
            keep
        });
    }
}

/// An overloaded server leaves thousands of connections open on the client side: lift the
/// soft open-files limit to the hard one (often 1024 against 1M or more).
fn raise_open_files_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}
