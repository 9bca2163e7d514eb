//! The agent's CPU while 10,000 idle connections are held open to its backend.

use super::*;

/// The agent's own CPU and its programs' kernel time while IDLE_CONNS idle connections are held
/// open to nginx, per agent variant: connections that never sent anything (pre-opened by a
/// proxy, or a slow client), and keep-alive connections idle after one answered request.
pub(super) fn idle_connections(
    variants: &[Variant],
    nport: u16,
    aport: u16,
    dir: &Path,
    secs: u64,
) -> Result<String> {
    let cfg = dir.join("agent-idle.toml");
    fs::write(&cfg, agent_config(aport, nport, true))?;
    let mut rows = String::new();
    let mut verdicts = Vec::new();
    for (vi, variant) in variants.iter().enumerate() {
        let Some(bin) = &variant.bin else { continue };
        let vcfg = variant_config(&cfg, variant, &format!("v{vi}"))?;
        let agent = start_agent(bin, &vcfg, &dir.join("agent-idle.log"), aport)?;
        thread::sleep(SETTLE);
        let pid = agent.pid();
        // The same window with no connections held: what the connections add to it.
        let bare = idle_cpu(pid, secs);
        println!(
            "bench: {}: agent {bare:.2} % of a core with no connections held",
            variant.label
        );
        let _ = writeln!(
            rows,
            "| {} | none | — | **{bare:.2} %** | — | — |",
            variant.label
        );
        for (kind, request) in [
            ("never sent a byte", false),
            ("keep-alive, idle after one answered request", true),
        ] {
            let t0 = Instant::now();
            let (held, failed) = hold(nport, IDLE_CONNS, request);
            println!(
                "bench: {} idle connections ({kind}) open, {failed} failed, in {:.1} s; measuring {} for {secs} s",
                held.len(),
                t0.elapsed().as_secs_f64(),
                variant.label
            );
            // The agent has seen them arrive; what is measured is the steady state of holding
            // them.
            thread::sleep(Duration::from_secs(3));
            let (cpu, prog_ns) = {
                let on = harness(
                    "turning the kernel's run statistics on (BPF_ENABLE_STATS)",
                    BpfStats::enable,
                )?;
                let before = agent_programs(pid)?;
                let c0 = cpu_seconds(pid).context("the agent's schedstat")?;
                thread::sleep(Duration::from_secs(secs));
                let c1 = cpu_seconds(pid).context("the agent's schedstat")?;
                let after = agent_programs(pid)?;
                drop(on);
                let ns: u64 = diff(&before, &after).values().map(|c| c.1).sum();
                ((c1 - c0) / secs as f64 * 100.0, ns)
            };
            let open = still_open(&held);
            let (code, body) = health(aport)?;
            drop(held);
            let prog_pct = prog_ns as f64 / (secs as f64 * 1e9) * 100.0;
            let counters = &body["details"]["web"]["counters"];
            let seen = format!(
                "{code}, `{}`; waiting {}, pending {}, accept() traced {}",
                body["checks"]["webserver"].as_str().unwrap_or("?"),
                counters["waiting"],
                counters["pending"],
                counters["accepts_traced"]
            );
            let following = &body["details"]["web"]["kernel"]["following"];
            if body["checks"]["webserver"] != "up"
                || (following["attached"] == true && following["mode"] == "on_suspicion")
            {
                println!(
                    "bench: {} ({kind}): /health says {}; kernel view {}",
                    variant.label,
                    body["details"]["web"]["detail"],
                    body["details"]["web"]["kernel"]
                );
                // What the kernel said of the connections read as holding work, before they
                // close: tcp_info as `ss` prints it.
                for l in ss_with_work(nport) {
                    println!("bench:   ss: {l}");
                }
            }
            println!(
                "bench: {} ({kind}): agent {cpu:.2} % of a core, programs {prog_pct:.4} %, {open} of {IDLE_CONNS} still open; /health {seen}",
                variant.label
            );
            let _ = writeln!(
                rows,
                "| {} | {kind} | {open} of {IDLE_CONNS} | **{cpu:.2} %** | {prog_pct:.4} % | {seen} |",
                variant.label,
            );
            if variant.judged {
                verdicts.push(format!(
                    "{kind}: {cpu:.2} % {}",
                    if cpu < 2.0 { "✓" } else { "✗" }
                ));
            }
            // The closes pass before the next window.
            thread::sleep(Duration::from_secs(3));
        }
        drop(agent);
    }
    let mut md =
        String::from("\n### The agent's own CPU while 10,000 idle connections are held open\n\n");
    let _ = writeln!(
        md,
        "The agent watching nginx (1 worker, 16,384 worker connections). First {secs} s with no connections held; then {IDLE_CONNS} connections from 127.0.0.2–5, held for 3 s and then a {secs} s window, twice: connections that never send a byte, then keep-alive connections idle after one answered request. The agent's CPU time from the scheduler's account (/proc/<pid>/task/*/schedstat), its programs' `run_time_ns` over the same window, and what `/health` said at its end (`details.web.counters`). \"Still open\": a non-blocking read on each at the end would block (nginx had not closed it).\n"
    );
    md.push_str("| agent | idle connections | still open at the end | agent CPU, % of a core | its programs, % of a core | /health at the end |\n|---|---|---|---|---|---|\n");
    md.push_str(&rows);
    if !verdicts.is_empty() {
        let _ = writeln!(
            md,
            "\nTarget: this build < 2 % of a core while they are held: {}\n",
            verdicts.join("; ")
        );
    }
    println!(
        "bench: idle connections, this build: {}",
        verdicts.join("; ")
    );
    Ok(md)
}

/// `ss -tin` of the port's established connections that hold unread bytes or a receive later
/// than their last send (at most 5), each as its two lines joined.
pub(super) fn ss_with_work(port: u16) -> Vec<String> {
    let out = match Command::new("ss")
        .args([
            "-tinH",
            "state",
            "established",
            &format!("( sport = :{port} )"),
        ])
        .output()
    {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return vec![format!("ss: {e}")],
    };
    let field = |info: &str, key: &str| -> Option<u64> {
        info.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
    };
    let mut found = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(head) = lines.next() {
        let info = match lines.peek() {
            Some(l) if l.starts_with(char::is_whitespace) => lines.next().unwrap_or_default(),
            _ => "",
        };
        let unread = head
            .split_whitespace()
            .next()
            .and_then(|q| q.parse::<u64>().ok())
            .unwrap_or(0);
        let later = match (field(info, "lastrcv:"), field(info, "lastsnd:")) {
            (Some(r), Some(s)) => r < s,
            (Some(_), None) => true,
            _ => false,
        };
        if unread > 0 || later {
            found.push(format!("{} | {}", head.trim(), info.trim()));
            if found.len() == 5 {
                break;
            }
        }
    }
    found
}

/// `n` connections to 127.0.0.1:`port`, spread over IDLE_SOURCES; with `request`, each has one
/// request answered first. Those that failed are counted.
pub(super) fn hold(port: u16, n: usize, request: bool) -> (Vec<TcpStream>, usize) {
    let to: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut held = Vec::with_capacity(n);
    let mut failed = 0;
    for i in 0..n {
        let from = IDLE_SOURCES[i % IDLE_SOURCES.len()];
        let conn = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .and_then(|s| {
                s.bind(&SocketAddr::from((from, 0)).into())?;
                s.connect_timeout(&to.into(), Duration::from_secs(1))?;
                Ok(TcpStream::from(s))
            });
        match conn {
            Ok(s) => held.push(s),
            Err(_) => failed += 1,
        }
    }
    if request {
        // All requests first, then the answers: nginx serves them while the rest are written.
        let req = b"GET /index.html HTTP/1.1\r\nHost: idle\r\n\r\n";
        held.retain(|s| {
            let ok = (&*s).write_all(req).is_ok();
            failed += usize::from(!ok);
            ok
        });
        held.retain(|s| {
            let ok = read_answer(s).is_ok();
            failed += usize::from(!ok);
            ok
        });
    }
    (held, failed)
}

/// Reads one HTTP answer with a Content-Length body off `s`.
pub(super) fn read_answer(mut s: &TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .and_then(|v| v.trim().parse::<usize>().ok())
                })
                .unwrap_or(0);
            if body.len() >= len {
                return Ok(());
            }
        }
    }
}

/// How many of `conns` the server has not closed: a non-blocking read would block.
pub(super) fn still_open(conns: &[TcpStream]) -> usize {
    conns
        .iter()
        .filter(|&s| {
            let mut r: &TcpStream = s;
            s.set_nonblocking(true).is_ok()
                && matches!(r.read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count()
}
