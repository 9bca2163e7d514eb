//! Fuzz targets for the parsers that read what others send: the config file, Redis and MySQL
//! replies, the kernel's BTF and sock_diag replies. Each target takes any bytes, runs the
//! parser the agent runs, and panics only when an invariant breaks (the parser panicked, or an
//! answer contradicts its input).
//!
//! Two drivers run the same targets:
//! - [`smoke`]: the seeds in `fuzz/corpus/<target>/` plus random mutations of them, on stable,
//!   for a fixed number of cases (`cargo test`) or seconds (`cargo xtask test`'s `fuzz-smoke`
//!   stage). `HEALTH_AGENT_FUZZ_CASES`, `HEALTH_AGENT_FUZZ_SECONDS` and `HEALTH_AGENT_FUZZ_SEED`
//!   override the defaults; a failure prints the seed and saves the input.
//! - cargo-fuzz (`fuzz/`, nightly, coverage guided): `cargo xtask fuzz --seconds N`.

use std::{
    panic::{self, AssertUnwindSafe},
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{
    checks::database::{parse_mysql_packet, parse_resp_line, ping_verdict, RESP_LINE_MAX},
    config::Config,
    ebpf::btf,
    net,
};

/// A fuzz target: its name (the cargo-fuzz target and corpus directory) and its body.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
}

pub const TARGETS: &[Target] = &[
    Target {
        name: "config",
        run: config,
    },
    Target {
        name: "redis",
        run: redis,
    },
    Target {
        name: "mysql",
        run: mysql,
    },
    Target {
        name: "btf",
        run: btf,
    },
    Target {
        name: "sock_diag",
        run: sock_diag,
    },
    Target {
        name: "peer_view",
        run: peer_view,
    },
];

/// `Config::parse` on any text; what it accepts must survive a save and a load unchanged.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Config::parse(text, "fuzz.toml") else {
        return;
    };
    let saved = toml::to_string(&cfg).expect("an accepted config serializes");
    let again = Config::parse(&saved, "fuzz.toml")
        .unwrap_or_else(|e| panic!("an accepted config, saved, is refused: {e}\n{saved}"));
    assert_eq!(again, cfg, "a config changes through a save and a load");
}

/// A Redis reply stream read as the check reads it: lines of at most `RESP_LINE_MAX` bytes.
pub fn redis(data: &[u8]) {
    let mut rest = data;
    loop {
        let limit = rest.len().min(RESP_LINE_MAX as usize);
        let end = rest[..limit]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(limit, |i| i + 1);
        let (line, next) = rest.split_at(end);
        match parse_resp_line(line) {
            Ok(reply) => {
                assert_eq!(reply.trim_end(), reply, "the line end is trimmed");
                assert_eq!(ping_verdict(&reply).is_ok(), reply == "+PONG");
                // A plain status line comes back as it was sent.
                if let Some(text) = line.strip_suffix(b"\r\n") {
                    if text.iter().all(|b| b.is_ascii_graphic() || *b == b' ')
                        && text.last() != Some(&b' ')
                    {
                        assert_eq!(reply.as_bytes(), text);
                    }
                }
            }
            Err(_) => {
                assert!(line.is_empty(), "only no line at all is an error");
                return;
            }
        }
        rest = next;
    }
}

/// The first packet a MySQL server sends: a v10 greeting gives its version, anything else an
/// error.
pub fn mysql(data: &[u8]) {
    if let Ok(version) = parse_mysql_packet(data) {
        // Accepted: a v10 greeting whose NUL-terminated version lies inside the packet.
        let len = u32::from_le_bytes([data[0], data[1], data[2], 0]) as usize;
        let payload = &data[4..4 + len];
        assert_eq!(payload[0], 10, "only a v10 greeting is accepted");
        let nul = payload[1..]
            .iter()
            .position(|&b| b == 0)
            .expect("the version ends inside the packet");
        assert_eq!(version, String::from_utf8_lossy(&payload[1..1 + nul]));
    }
}

/// The kernel's BTF: `sock_offsets` and a few more look-ups, on any blob.
pub fn btf(data: &[u8]) {
    let _ = btf::sock_offsets_in(data);
    if let Ok(parsed) = btf::Btf::parse(data) {
        for (strukt, field) in [("sock", "sk_protocol"), ("net", "ns"), ("", "")] {
            let _ = parsed.field_offset(strukt, field);
        }
    }
}

/// A sock_diag dump reply as one `recv` returns it, each message read both as a listener and
/// as a connection with `tcp_info`.
pub fn sock_diag(data: &[u8]) {
    let mut messages = 0;
    let _ = net::parse_reply(data, &mut |msg, attrs| {
        messages += 1;
        assert_eq!(msg.len(), 72, "an inet_diag_msg is 72 bytes");
        let listener = net::parse_msg(msg);
        let conn = net::parse_conn(msg, attrs);
        assert_eq!(listener.port, conn.local.port());
        assert_eq!(listener.inode, conn.inode);
    });
    assert!(
        messages <= data.len() / 88,
        "{messages} messages in {} bytes",
        data.len()
    );
}

/// A peer's answer as the exchange reads it (`PeerView::parse`), and, when accepted, the judge
/// and the latency comparison reading it as a round's views: nothing a peer sends may panic the
/// check loop, whichever fault this instance has and however old the round.
pub fn peer_view(data: &[u8]) {
    use crate::fleet::{self, latency, FleetReport, Judge, PeerView, Round};
    use crate::status::FaultClass;
    let Ok(view) = PeerView::parse(data) else {
        return;
    };
    let t0 = Instant::now();
    let peers = ["10.0.0.1:8080", "10.0.0.2:8080"].map(String::from);
    let round = Round {
        started: Some(t0),
        asked: peers.to_vec(),
        answered: peers.iter().map(|p| (p.clone(), view.clone())).collect(),
        ..Round::default()
    };
    let second = Duration::from_secs(1);
    let mut judge = Judge::new(second, second, 8 * second);
    let all = [
        FaultClass::Web,
        FaultClass::Dependency,
        FaultClass::Containers,
        FaultClass::Errors,
    ];
    for at in [0, 1, 9, 3_600] {
        let now = t0 + at * second;
        let _ = judge.judge(&all, Some(&round), now);
        let _ = judge.judge_own(&all[1..2], true, Some(&round), now);
    }
    let _ = fleet::classes_of(view.web, view.database, view.containers);
    let Some(own) = view.latency.clone() else {
        return;
    };
    let _ = latency::compare(&own, &[(peers[0].clone(), own.clone())], 3.0);
    let _ = latency::may_go_out("0", false, &[(view.instance.clone(), Some(own.clone()))]);
    let mut tracker = latency::SlowTracker::new(3.0, own.instance_type.clone());
    for at in [0, 1, 30] {
        let now = t0 + at * second;
        let _ = tracker.round(
            latency::RoundInput {
                own: Some(own.clone()),
                since: Some(t0),
                answered: Some(&round.answered),
                threshold: 3.0,
                round_started: Some(t0),
                now,
            },
            &mut FleetReport::default(),
        );
    }
}

/// How long [`smoke`] runs each target.
#[derive(Debug, Clone, Copy)]
pub enum Budget {
    Cases(u64),
    Time(Duration),
}

impl Budget {
    /// `HEALTH_AGENT_FUZZ_SECONDS`, else `HEALTH_AGENT_FUZZ_CASES`, else `cases`.
    pub fn from_env(cases: u64) -> Self {
        let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        match (
            var("HEALTH_AGENT_FUZZ_SECONDS"),
            var("HEALTH_AGENT_FUZZ_CASES"),
        ) {
            (Some(secs), _) => Self::Time(Duration::from_secs(secs)),
            (None, Some(n)) => Self::Cases(n),
            (None, None) => Self::Cases(cases),
        }
    }
}

/// What a [`smoke`] run did.
#[derive(Debug)]
pub struct Stats {
    pub cases: u64,
    pub elapsed: Duration,
    pub seed: u64,
}

/// Runs `target` on each seed, then on random mutations of them until `budget` is spent.
/// Panics with the seed, the case and where the failing input was saved when the target does.
pub fn smoke(target: &Target, seeds: &[Vec<u8>], budget: Budget, seed: u64) -> Stats {
    let start = Instant::now();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut cases = 0u64;
    let mut input = Vec::new();
    loop {
        let done = match budget {
            Budget::Cases(n) => cases >= n,
            Budget::Time(limit) => start.elapsed() >= limit,
        };
        if done {
            break;
        }
        input.clear();
        match seeds.get(cases as usize) {
            Some(seed_input) => input.extend_from_slice(seed_input),
            None => mutate(&mut rng, seeds, &mut input),
        }
        if panic::catch_unwind(AssertUnwindSafe(|| (target.run)(&input))).is_err() {
            let saved = save_failure(target.name, &input);
            panic!(
                "fuzz target {} failed on case {cases} (HEALTH_AGENT_FUZZ_SEED={seed}); input \
                 saved to {saved}; reproduce with `cargo xtask fuzz --target {} --input {saved}` \
                 or rerun this test with the same seed. First bytes: {:02x?}",
                target.name,
                target.name,
                &input[..input.len().min(64)]
            );
        }
        cases += 1;
    }
    Stats {
        cases,
        elapsed: start.elapsed(),
        seed,
    }
}

/// The seed for [`smoke`]: `HEALTH_AGENT_FUZZ_SEED`, else `default`.
pub fn seed_from_env(default: u64) -> u64 {
    std::env::var("HEALTH_AGENT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn save_failure(name: &str, input: &[u8]) -> String {
    let dir = std::env::temp_dir().join("health-agent-fuzz-smoke");
    let path = dir.join(format!("{name}-{:016x}", fxhash(input)));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, input)) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("(not saved: {e})"),
    }
}

fn fxhash(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Values that sit on the edges parsers check: zero, one, sign bits, all ones, the sizes of
/// the records these formats use.
const INTERESTING: &[u32] = &[
    0,
    1,
    2,
    3,
    4,
    8,
    12,
    16,
    20,
    24,
    32,
    72,
    88,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x00ff_ffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
];

/// One to four random edits of a random seed (sometimes spliced with another), or plain noise.
fn mutate(rng: &mut fastrand::Rng, seeds: &[Vec<u8>], out: &mut Vec<u8>) {
    if seeds.is_empty() || rng.u8(..16) == 0 {
        out.extend((0..rng.usize(..256)).map(|_| rng.u8(..)));
        return;
    }
    out.extend_from_slice(&seeds[rng.usize(..seeds.len())]);
    for _ in 0..rng.usize(1..=4) {
        let len = out.len();
        match rng.u8(..9) {
            // Flip a bit.
            0 if len > 0 => out[rng.usize(..len)] ^= 1 << rng.u8(..8),
            // A random byte.
            1 if len > 0 => out[rng.usize(..len)] = rng.u8(..),
            // An interesting little-endian u32 (or u16) over whatever is there.
            2 | 3 if len > 0 => {
                let at = rng.usize(..len);
                let value = INTERESTING[rng.usize(..INTERESTING.len())];
                let width = if rng.bool() { 4 } else { 2 };
                for (i, b) in value.to_le_bytes()[..width].iter().enumerate() {
                    if let Some(slot) = out.get_mut(at + i) {
                        *slot = *b;
                    }
                }
            }
            // Cut it short.
            4 => out.truncate(rng.usize(..=len)),
            // Remove a range.
            5 if len > 0 => {
                let at = rng.usize(..len);
                let n = rng.usize(1..=(len - at).min(64));
                out.drain(at..at + n);
            }
            // Insert random bytes.
            6 => {
                let at = rng.usize(..=len);
                let bytes: Vec<u8> = (0..rng.usize(1..=16)).map(|_| rng.u8(..)).collect();
                out.splice(at..at, bytes);
            }
            // Repeat a chunk of itself.
            7 if len > 0 => {
                let at = rng.usize(..len);
                let n = rng.usize(1..=(len - at).min(256));
                let chunk = out[at..at + n].to_vec();
                let to = rng.usize(..=len);
                out.splice(to..to, chunk);
            }
            // Splice: our head, another seed's tail.
            _ => {
                let other = &seeds[rng.usize(..seeds.len())];
                out.truncate(rng.usize(..=len));
                out.extend_from_slice(&other[rng.usize(..=other.len())..]);
            }
        }
    }
}

/// The seed corpus a target starts from: the files in `fuzz/corpus/<name>/`, which cargo-fuzz
/// starts from too.
pub fn corpus(name: &str) -> std::io::Result<Vec<Vec<u8>>> {
    let dir = corpus_dir(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    files.iter().map(std::fs::read).collect()
}

pub fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cases per target under plain `cargo test`: a few seconds in all on a debug build.
    const CASES: u64 = 3000;

    fn run(name: &str) {
        let target = TARGETS
            .iter()
            .find(|t| t.name == name)
            .expect("a target by that name");
        let seeds = corpus(name).unwrap_or_else(|e| panic!("{}: {e}", corpus_dir(name).display()));
        assert!(seeds.len() >= 2, "{name}: a few seeds in the corpus");
        let stats = smoke(
            target,
            &seeds,
            Budget::from_env(CASES),
            seed_from_env(0x6865_616c_7468),
        );
        // Shown with --nocapture, and by `cargo xtask test`'s fuzz-smoke stage.
        println!(
            "fuzz-smoke {name}: {} cases in {:.1} s (seed {})",
            stats.cases,
            stats.elapsed.as_secs_f64(),
            stats.seed
        );
    }

    /// The BTF seeds are built by `btf::sample`; this keeps the files in step with it
    /// (`HEALTH_AGENT_WRITE_SEEDS=1` rewrites them).
    #[test]
    fn btf_seeds_are_current() {
        let seeds = [
            ("kernel_like.btf", btf::sample::kernel_like()),
            ("every_known_kind.btf", btf::sample::every_known_kind()),
            (
                "future_kind_with_layout.btf",
                btf::sample::future_kind(true),
            ),
            (
                "future_kind_without_layout.btf",
                btf::sample::future_kind(false),
            ),
        ];
        for (file, blob) in seeds {
            let path = corpus_dir("btf").join(file);
            if std::env::var("HEALTH_AGENT_WRITE_SEEDS").as_deref() == Ok("1") {
                std::fs::write(&path, &blob).unwrap();
            }
            let saved = std::fs::read(&path).unwrap_or_default();
            assert!(
                saved == blob,
                "{} is stale: rerun with HEALTH_AGENT_WRITE_SEEDS=1",
                path.display()
            );
        }
    }

    /// Valid inputs read back what they hold.
    #[test]
    fn the_seeds_parse_as_what_they_are() {
        assert_eq!(
            corpus("redis").unwrap().len(),
            6,
            "redis seeds changed: update this test"
        );
        assert_eq!(parse_resp_line(b"+PONG\r\n").as_deref(), Ok("+PONG"));
        let noauth = std::fs::read(corpus_dir("redis").join("noauth")).unwrap();
        let reply = parse_resp_line(&noauth).unwrap();
        assert_eq!(reply, "-NOAUTH Authentication required.");
        assert!(ping_verdict(&reply).is_err());

        let mysql =
            |f: &str| parse_mysql_packet(&std::fs::read(corpus_dir("mysql").join(f)).unwrap());
        assert_eq!(mysql("v10_greeting_mysql8").as_deref(), Ok("8.0.36"));
        assert_eq!(
            mysql("v10_greeting_mariadb").as_deref(),
            Ok("5.5.5-10.11.6-MariaDB-0+deb12u1")
        );
        let err = mysql("err_too_many_connections").unwrap_err().to_string();
        assert!(err.ends_with("error 1040: Too many connections"), "{err}");

        for seed in corpus("config").unwrap() {
            let text = std::str::from_utf8(&seed).unwrap();
            Config::parse(text, "seed").unwrap();
        }

        let diag = |f: &str| {
            let data = std::fs::read(corpus_dir("sock_diag").join(f)).unwrap();
            let mut conns = Vec::new();
            let done = net::parse_reply(&data, &mut |m, a| conns.push(net::parse_conn(m, a)));
            (done.map_err(|e| e.raw_os_error()), conns)
        };
        let (done, conns) = diag("connections_v4_tcp_info");
        assert_eq!(done, Ok(true));
        assert_eq!(conns.len(), 3);
        assert!(conns
            .iter()
            .all(|c| c.local.ip().is_loopback() && c.inode != 0));
        assert!(
            conns.iter().any(|c| c.bytes_acked > 1),
            "tcp_info was read: {conns:?}"
        );
        let (_, conns) = diag("connections_v6_tcp_info");
        // The dual-stack socket's IPv4 peer reads as IPv4.
        assert!(conns.iter().any(|c| c.local.is_ipv4()), "{conns:?}");
        assert_eq!(diag("error_unknown_family").0, Err(Some(libc::EINVAL)));
    }

    #[test]
    fn fuzz_smoke_config() {
        run("config");
    }

    #[test]
    fn fuzz_smoke_redis() {
        run("redis");
    }

    #[test]
    fn fuzz_smoke_mysql() {
        run("mysql");
    }

    #[test]
    fn fuzz_smoke_btf() {
        run("btf");
    }

    #[test]
    fn fuzz_smoke_sock_diag() {
        run("sock_diag");
    }

    #[test]
    fn fuzz_smoke_peer_view() {
        run("peer_view");
    }
}
