use std::{net::SocketAddr, time::Instant};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::{test_helpers::*, test_support::*, *};

#[test]
fn monitor_new_names_the_key_and_skips_blank_urls() {
    assert!(DatabaseMonitor::new(&DatabaseConfig::default())
        .unwrap()
        .is_none());
    let c = DatabaseConfig {
        url: "redis://127.0.0.1:6379".into(),
        urls: vec![
            "redis://127.0.0.1:6379".into(),
            "mysql://:Sekr1t@h:x".into(),
        ],
        ..DatabaseConfig::default()
    };
    let err = DatabaseMonitor::new(&c).unwrap_err().to_string();
    assert!(err.starts_with("database.urls[1]: "), "{err}");
    assert!(!err.contains("Sekr1t"), "{err}");
    let c = DatabaseConfig {
        url: "  ".into(),
        urls: vec!["redis://h".into(), "redis://h".into()],
        ..DatabaseConfig::default()
    };
    let m = monitor(&c);
    let r = m.report();
    assert_eq!(r.databases.len(), 1, "duplicates are checked once");
    assert_eq!(r.state, DbState::Unknown, "nothing checked yet");
    assert_eq!(r.databases[0].last_checked, None);
}

#[test]
fn worst_database_decides_and_reason_names_it() {
    let m = monitor(&DatabaseConfig {
        slow_after: Duration::from_secs(1),
        ..cfg(&["redis://:Sekr1t@127.0.0.1:1", "mysql://127.0.0.1:2"])
    });
    let good = |ms| Outcome {
        result: Ok(Good {
            latency: Duration::from_millis(ms),
            detail: None,
        }),
        lookup: Lookup::Known,
        at: SystemTime::now(),
    };
    let r = m.record(vec![good(3), good(2)]);
    assert_eq!((r.state, r.reason.as_deref()), (DbState::Connected, None));
    assert_eq!(r.databases[0].latency_ms, Some(3.0));
    let r = m.record(vec![good(3), good(1500)]);
    assert_eq!(r.state, DbState::Slow);
    assert!(r
        .reason
        .as_deref()
        .unwrap()
        .starts_with("mysql://127.0.0.1:2 slow"));
    let failed = Outcome {
        result: Err(Failure::Outage("connect: refused".into())),
        lookup: Lookup::Known,
        at: SystemTime::now(),
    };
    let r = m.record(vec![failed, good(1500)]);
    assert_eq!(r.state, DbState::Unreachable);
    assert_eq!(r.databases[0].state, DbState::Unreachable);
    assert_eq!(r.databases[0].latency_ms, None);
    assert_eq!(r.databases[0].consecutive_failures, 1);
    assert!(r.databases[0].last_checked.is_some());
    let reason = r.reason.clone().unwrap();
    assert!(
        reason.contains("redis://127.0.0.1:1 unreachable: connect: refused"),
        "{reason}"
    );
    assert_no_secret(&r, &["Sekr1t"]);
    assert_eq!(r.summary(), "unreachable");
}

#[test]
fn a_name_that_never_resolved_is_misconfigured_and_one_that_did_is_an_outage() {
    let m = monitor(&DatabaseConfig {
        fail_after: 2,
        ..cfg(&["postgres://app:Sekr1t@db.example.invalid:5432/app"])
    });
    let at = SystemTime::now();
    let failed = |e: &str| {
        let why = NoAddress::of(&std::io::Error::other(e));
        Outcome {
            result: Err(Failure::Outage(e.into())),
            lookup: Lookup::Failed(why),
            at,
        }
    };
    let nxdomain = "failed to lookup address information: Name or service not known";
    // Never resolved: a mistake in the URL, said at once, naming the host and the resolver.
    let r = m.record(vec![failed(nxdomain)]);
    assert_eq!(r.state, DbState::Misconfigured);
    let why = r.misconfigured_reason().unwrap();
    assert!(
        why.starts_with(
            "database.urls[0] postgres://app@db.example.invalid:5432/app: the host \
             db.example.invalid does not resolve (failed to lookup address information: Name \
             or service not known)"
        ),
        "{why}"
    );
    assert!(
        why.contains("fix the host name in database.urls[0]"),
        "{why}"
    );
    // The record is fixed and the database answers...
    let r = m.record(vec![Outcome {
        result: Ok(Good {
            latency: Duration::from_millis(3),
            detail: None,
        }),
        lookup: Lookup::Known,
        at,
    }]);
    assert_eq!(r.state, DbState::Connected);
    // ... then the name stops resolving: an outage now, damped, naming the host and the error.
    let r = m.record(vec![failed(nxdomain)]);
    assert_eq!(r.state, DbState::Connected, "damped: 1 of fail_after 2");
    let r = m.record(vec![failed(nxdomain)]);
    assert_eq!(r.state, DbState::Unreachable);
    let reason = r.reason.clone().unwrap();
    assert!(
        reason.contains(
            "unreachable: the host db.example.invalid no longer resolves (failed to lookup \
             address information: Name or service not known); it did earlier"
        ),
        "{reason}"
    );
    assert_no_secret(&r, &["Sekr1t"]);
}

#[tokio::test]
async fn addresses_and_socket_paths_are_not_looked_up() {
    let m = monitor(&cfg(&[
        "postgres://app@127.0.0.1:5432/app",
        "redis://[::1]:6379",
        "postgres://app@/app?host=/run/postgresql",
        "postgres://app@db1.invalid,db2.invalid/app",
    ]));
    for t in m.targets.iter() {
        assert_eq!(look_up(t, Duration::from_secs(1)).await, Ok(()), "{t:?}");
    }
}

#[test]
fn runner_timeout_goes_through_the_same_damping() {
    let m = monitor(&DatabaseConfig {
        fail_after: 2,
        ..cfg(&["redis://127.0.0.1:1"])
    });
    let overrun = m.on_timeout();
    let r = overrun();
    assert_eq!(r.state, DbState::Unknown);
    assert_eq!(r.databases[0].consecutive_failures, 1);
    assert!(r.databases[0].error.as_deref().unwrap().contains("overran"));
    assert_eq!(overrun().state, DbState::Unreachable);
    assert_eq!(m.report().state, DbState::Unreachable, "state is shared");
}

#[tokio::test]
async fn nothing_listening_is_unreachable_after_fail_after_rounds_not_before() {
    let port = free_port();
    let mut m = monitor(&DatabaseConfig {
        fail_after: 3,
        ..cfg(&[&format!("postgres://hc@127.0.0.1:{port}/postgres")])
    });
    for round in 1..=2 {
        let r = m.check().await;
        assert_eq!(r.state, DbState::Unknown, "round {round}: {r:?}");
        assert_eq!(r.databases[0].consecutive_failures, round);
        let reason = r.reason.unwrap();
        assert!(
            reason.contains(&format!("{round} of 3 failed round trips")),
            "{reason}"
        );
    }
    let r = m.check().await;
    assert_eq!(r.state, DbState::Unreachable, "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(err.contains("connect"), "{err}");
}

/// Accepts connections and never says a word.
async fn silent_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("local addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    addr
}

#[tokio::test]
async fn silent_server_fails_within_the_timeout() {
    let addr = silent_server().await;
    let timeout = Duration::from_millis(400);
    for url in [
        format!("postgres://hc:x@{addr}/postgres"),
        format!("redis://{addr}"),
        format!("mysql://{addr}"),
    ] {
        let mut m = monitor(&DatabaseConfig {
            timeout,
            ..cfg(&[&url])
        });
        let start = Instant::now();
        let r = m.check().await;
        let took = start.elapsed();
        assert_eq!(r.state, DbState::Unreachable, "{url}: {r:?}");
        let err = r.databases[0].error.clone().unwrap();
        assert!(err.contains("no answer within 400ms"), "{url}: {err}");
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(1),
            "{url}: took {took:?}"
        );
    }
}

// --- Redis, against an in-test RESP server -----------------------------------------------

#[tokio::test]
async fn redis_ping_gets_pong() {
    let (addr, seen) = fake_redis(redis_ok, Duration::ZERO).await;
    let r = monitor(&cfg(&[&format!("redis://{addr}")])).check().await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    assert_eq!(r.databases[0].kind, DbKind::Redis);
    assert_eq!(*seen.lock().unwrap(), vec![vec!["PING".to_string()]]);
}

#[tokio::test]
async fn redis_auth_and_select_come_before_ping() {
    let (addr, seen) = fake_redis(redis_ok, Duration::ZERO).await;
    let r = monitor(&cfg(&[&format!("redis://:s3cr%3At@{addr}/2")]))
        .check()
        .await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    assert_eq!(r.databases[0].name, format!("redis://{addr}/2"));
    let want: Vec<Vec<String>> = [&["AUTH", "s3cr:t"][..], &["SELECT", "2"], &["PING"]]
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(*seen.lock().unwrap(), want);
    assert_no_secret(&r, &["s3cr:t", "s3cr%3At"]);
}

#[tokio::test]
async fn redis_password_file_and_acl_user() {
    let (addr, seen) = fake_redis(redis_ok, Duration::ZERO).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("pw");
    std::fs::write(&file, "from-file\n").unwrap();
    let r = monitor(&DatabaseConfig {
        password_file: file.display().to_string(),
        ..cfg(&[&format!("redis://app@{addr}")])
    })
    .check()
    .await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    assert_eq!(seen.lock().unwrap()[0], ["AUTH", "app", "from-file"]);
}

#[tokio::test]
async fn redis_noauth_is_a_configuration_error() {
    let (addr, _) = fake_redis(
        |_| "-NOAUTH Authentication required.\r\n".into(),
        Duration::ZERO,
    )
    .await;
    let r = monitor(&cfg(&[&format!("redis://{addr}")])).check().await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(err.contains("-NOAUTH Authentication required."), "{err}");
}

#[tokio::test]
async fn a_password_echoed_by_the_server_is_never_shown() {
    let (addr, _) = fake_redis(
        |cmd| format!("-WRONGPASS invalid password {:?}\r\n", cmd.last().unwrap()),
        Duration::ZERO,
    )
    .await;
    let r = monitor(&cfg(&[&format!("redis://:Echo%2FMe@{addr}")]))
        .check()
        .await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(err.starts_with("AUTH refused: -WRONGPASS: "), "{err}");
    assert!(
        !err.contains("invalid password"),
        "only the code is quoted: {err}"
    );
    assert_no_secret(&r, &["Echo/Me", "Echo%2FMe"]);
}

#[tokio::test]
async fn slow_pong_is_slow_and_flapping_is_damped() {
    let (addr, _) = fake_redis(redis_ok, Duration::from_millis(150)).await;
    let r = monitor(&DatabaseConfig {
        slow_after: Duration::from_millis(100),
        ..cfg(&[&format!("redis://{addr}")])
    })
    .check()
    .await;
    assert_eq!(r.state, DbState::Slow, "{r:?}");
    assert!(r.databases[0].latency_ms.unwrap() >= 150.0, "{r:?}");

    // A server that fails while `failing` is set.
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = failing.clone();
    let (addr, _) = fake_redis(
        move |_| {
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                "-LOADING Redis is loading the dataset in memory\r\n".into()
            } else {
                "+PONG\r\n".into()
            }
        },
        Duration::ZERO,
    )
    .await;
    let mut m = monitor(&DatabaseConfig {
        fail_after: 2,
        recover_after: 2,
        ..cfg(&[&format!("redis://{addr}")])
    });
    let mut states = Vec::new();
    for fail in [false, true, false, true, true, false, false] {
        failing.store(fail, std::sync::atomic::Ordering::SeqCst);
        states.push(m.check().await.state);
    }
    use DbState::{Connected as C, Unreachable as X};
    assert_eq!(states, [C, C, C, C, X, X, C]);
}

// --- MySQL, against an in-test greeting -------------------------------------------------

fn v10_greeting(version: &str) -> Vec<u8> {
    let mut p = vec![10u8];
    p.extend_from_slice(version.as_bytes());
    p.push(0);
    p.extend_from_slice(&7u32.to_le_bytes()); // connection id
    p.extend_from_slice(b"abcdefgh"); // auth-plugin-data part 1
    p.push(0); // filler
    p.extend_from_slice(&0xf7ffu16.to_le_bytes()); // capability flags (lower)
    p.push(0xff); // character set
    p.extend_from_slice(&2u16.to_le_bytes()); // status flags
    p.extend_from_slice(&0x81ffu16.to_le_bytes()); // capability flags (upper)
    p.push(21); // auth-plugin-data length
    p.extend_from_slice(&[0; 10]); // reserved
    p.extend_from_slice(b"ijklmnopqrst\0"); // auth-plugin-data part 2
    p.extend_from_slice(b"caching_sha2_password\0");
    packet(&p)
}

fn packet(payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_le_bytes()[..3].to_vec();
    out.push(0); // sequence id
    out.extend_from_slice(payload);
    out
}

/// Sends `bytes` to every connection, then holds it open until the client hangs up.
async fn fake_mysql(bytes: Vec<u8>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let bytes = bytes.clone();
            tokio::spawn(async move {
                if s.write_all(&bytes).await.is_ok() {
                    let mut sink = [0u8; 64];
                    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn mysql_greeting_reports_the_server_version() {
    let addr = fake_mysql(v10_greeting("8.0.36-fake")).await;
    let r = monitor(&cfg(&[&format!("mysql://monitor:Sekr1t@{addr}")]))
        .check()
        .await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    let detail = r.databases[0].detail.clone().unwrap();
    assert!(detail.contains("server version 8.0.36-fake"), "{detail}");
    assert!(detail.contains("not authenticated"), "{detail}");
    assert_no_secret(&r, &["Sekr1t"]);
}

#[tokio::test]
async fn mysql_error_packet_and_garbage_are_failures() {
    let mut err = vec![0xffu8];
    err.extend_from_slice(&1040u16.to_le_bytes());
    err.extend_from_slice(b"#08004Too many connections");
    let addr = fake_mysql(packet(&err)).await;
    let r = monitor(&cfg(&[&format!("mysql://{addr}")])).check().await;
    assert_eq!(r.state, DbState::Unreachable, "{r:?}");
    let e = r.databases[0].error.clone().unwrap();
    assert!(e.contains("error 1040: Too many connections"), "{e}");

    let addr = fake_mysql(b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec()).await;
    let r = monitor(&cfg(&[&format!("mysql://{addr}")])).check().await;
    assert_eq!(r.state, DbState::Unreachable, "{r:?}");
    let e = r.databases[0].error.clone().unwrap();
    assert!(e.contains("implausible packet length"), "{e}");
}

#[tokio::test]
async fn several_databases_are_all_checked_and_the_worst_wins() {
    // With Postgres too: tests/tests/database.rs (it needs a real server).
    let (redis, _) = fake_redis(redis_ok, Duration::ZERO).await;
    let mysql = fake_mysql(v10_greeting("10.11.6-MariaDB")).await;
    let c = DatabaseConfig {
        url: format!("redis://:Sekr1t@{redis}/1"),
        ..cfg(&[&format!("mysql://{mysql}"), &format!("redis://{redis}")])
    };
    let r = monitor(&c).check().await;
    assert_eq!(r.state, DbState::Connected, "{r:?}");
    let kinds: Vec<DbKind> = r.databases.iter().map(|d| d.kind).collect();
    assert_eq!(kinds, [DbKind::Redis, DbKind::Mysql, DbKind::Redis]);

    let down = free_port();
    let c = DatabaseConfig {
        urls: vec![
            format!("redis://{redis}"),
            format!("redis://127.0.0.1:{down}"),
        ],
        ..c
    };
    let r = monitor(&c).check().await;
    assert_eq!(r.state, DbState::Unreachable, "{r:?}");
    let states: Vec<DbState> = r.databases.iter().map(|d| d.state).collect();
    assert_eq!(
        states,
        [DbState::Connected, DbState::Connected, DbState::Unreachable]
    );
    assert_no_secret(&r, &["Sekr1t"]);
}

// --- Postgres TLS negotiation, against an in-test listener ---------------------------------

/// Records each connection's first message code (an SSLRequest is 80877103, a plain startup
/// message 196608); answers an SSLRequest with `b'S'` and then hangs up, as a server whose TLS
/// is broken would, and hangs up on anything else.
async fn broken_tls_postgres() -> (SocketAddr, Arc<Mutex<Vec<u32>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("local addr");
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut head = [0u8; 8];
            if s.read_exact(&mut head).await.is_err() {
                continue;
            }
            let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            log.lock().unwrap().push(code);
            if code == 80877103 {
                let _ = s.write_all(b"S").await;
            }
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn postgres_prefer_retries_in_the_clear_after_a_failed_handshake_and_require_does_not() {
    let (addr, seen) = broken_tls_postgres().await;
    let r = monitor(&cfg(&[&format!("postgres://hc:x@{addr}/db")]))
        .check()
        .await;
    // TLS first, then in the clear, as libpq's prefer does; the fake then hangs up: an outage.
    assert_eq!(*seen.lock().unwrap(), [80877103, 196608], "{r:?}");
    assert_eq!(r.state, DbState::Unreachable, "{r:?}");

    let (addr, seen) = broken_tls_postgres().await;
    let r = monitor(&cfg(&[&format!(
        "postgres://hc:x@{addr}/db?sslmode=require"
    )]))
    .check()
    .await;
    assert_eq!(*seen.lock().unwrap(), [80877103], "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(err.starts_with("connect: TLS handshake:"), "{err}");
    // Cut off mid-handshake: the network's doing, not the configuration's.
    assert_eq!(r.state, DbState::Unreachable, "{r:?}");

    let (addr, seen) = broken_tls_postgres().await;
    monitor(&cfg(&[&format!(
        "postgres://hc:x@{addr}/db?sslmode=disable"
    )]))
    .check()
    .await;
    assert_eq!(*seen.lock().unwrap(), [196608]);
}

// --- rediss:// against servers without TLS -------------------------------------------------

/// Answers `+PONG` to a connection that starts like RESP and holds any other open, silent, as
/// Redis does with a TLS hello that holds no line end.
async fn plain_redis_silent_at_tls() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                if s.read_exact(&mut first).await.is_ok() && first[0] == b'*' {
                    let _ = s.write_all(b"+PONG\r\n").await;
                }
                let mut sink = [0u8; 512];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test]
async fn rediss_to_a_port_without_tls_is_misconfigured_not_an_outage() {
    let timeout = Duration::from_millis(800);
    // Hangs up on the hello (the fake reads only RESP): asked again in the clear at once.
    let (addr, _) = fake_redis(redis_ok, Duration::ZERO).await;
    // Stays silent at the hello: asked in the clear halfway through the timeout.
    let silent = plain_redis_silent_at_tls().await;
    for (addr, within) in [(addr, timeout / 4), (silent, timeout)] {
        let mut m = monitor(&DatabaseConfig {
            timeout,
            fail_after: 3,
            ..cfg(&[&format!("rediss://{addr}?sslmode=require")])
        });
        let start = Instant::now();
        let r = m.check().await;
        let took = start.elapsed();
        assert_eq!(r.state, DbState::Misconfigured, "{addr}: {r:?}");
        let err = r.databases[0].error.clone().unwrap();
        assert!(err.contains("does not speak TLS on this port"), "{err}");
        assert!(took < within, "{addr}: took {took:?}");
    }
}

// --- Configuration mistakes: misconfigured from the first round, naming what to change ------

/// The tests below run without `PGPASSWORD`: with it, the check would have a password.
fn without_pgpassword() {
    assert!(
        std::env::var_os("PGPASSWORD").is_none(),
        "unset PGPASSWORD to run the database check's unit tests"
    );
}

/// A Postgres that asks every login for a password by `auth` (the AuthenticationRequest code:
/// 3 cleartext, 5 MD5, 10 SASL, 7 GSS) and then waits; it answers an SSLRequest with `N`.
async fn password_asking_postgres(auth: u32) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("local addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut len = [0u8; 4];
                loop {
                    if s.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut body = vec![0u8; (u32::from_be_bytes(len) as usize).saturating_sub(4)];
                    if s.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    if body.starts_with(&80877103u32.to_be_bytes()) {
                        let _ = s.write_all(b"N").await;
                        continue;
                    }
                    break;
                }
                let extra: &[u8] = match auth {
                    5 => b"salt",
                    10 => b"SCRAM-SHA-256\0\0",
                    _ => b"",
                };
                let mut msg = vec![b'R'];
                msg.extend_from_slice(&(8 + extra.len() as u32).to_be_bytes());
                msg.extend_from_slice(&auth.to_be_bytes());
                msg.extend_from_slice(extra);
                let _ = s.write_all(&msg).await;
                let mut sink = [0u8; 512];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_password_the_server_asks_for_and_nobody_set_is_misconfigured_at_once() {
    without_pgpassword();
    for (auth, query) in [(3, "?sslmode=disable"), (5, ""), (10, "")] {
        let addr = password_asking_postgres(auth).await;
        let url = format!("postgres://app@{addr}/app{query}");
        // fail_after 3: an outage would take three rounds; this is not one.
        let mut m = monitor(&DatabaseConfig {
            url: url.clone(),
            fail_after: 3,
            ..DatabaseConfig::default()
        });
        let r = m.check().await;
        assert_eq!(r.state, DbState::Misconfigured, "auth {auth}: {r:?}");
        let err = r.databases[0].error.clone().unwrap();
        for words in [
            "the server asks for a password and none is set",
            "PGPASSWORD=...",
            "/etc/health-agent/environment",
            "database.password_file",
        ] {
            assert!(err.contains(words), "auth {auth}: {words:?} not in {err}");
        }
        let why = r.misconfigured_reason().unwrap();
        assert!(
            why.starts_with(&format!(
                "database.url {url}: the server asks for a password"
            )),
            "{why}"
        );
        assert_eq!(r.reason.as_deref(), Some(why.as_str()));
    }
}

#[tokio::test]
async fn a_blank_password_file_is_named_when_the_server_asks_for_a_password() {
    without_pgpassword();
    let addr = password_asking_postgres(10).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    std::fs::write(&file, "\n").unwrap();
    let r = monitor(&DatabaseConfig {
        password_file: file.display().to_string(),
        ..cfg(&[&format!("postgres://app@{addr}/app")])
    })
    .check()
    .await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(
        err.contains(&format!(
            "database.password_file {} has no password on its first line",
            file.display()
        )),
        "{err}"
    );
}

#[tokio::test]
async fn a_login_method_the_check_does_not_speak_is_misconfigured() {
    let addr = password_asking_postgres(7).await;
    let r = monitor(&DatabaseConfig {
        fail_after: 3,
        ..cfg(&[&format!("postgres://app:Sekr1t-9z@{addr}/app")])
    })
    .check()
    .await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let err = r.databases[0].error.clone().unwrap();
    assert!(err.contains("does not speak"), "{err}");
    assert_no_secret(&r, &["Sekr1t-9z"]);
}

#[tokio::test]
async fn a_password_file_that_does_not_exist_is_misconfigured_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("db-password");
    // Nothing listens there: the file is found missing before any connect.
    let (redis, _) = fake_redis(redis_ok, Duration::ZERO).await;
    for url in [
        format!("postgres://app@127.0.0.1:{}/app", free_port()),
        format!("redis://{redis}"),
    ] {
        let mut m = monitor(&DatabaseConfig {
            password_file: missing.display().to_string(),
            fail_after: 3,
            ..cfg(&[&url])
        });
        let r = m.check().await;
        assert_eq!(r.state, DbState::Misconfigured, "{url}: {r:?}");
        let why = r.misconfigured_reason().unwrap();
        assert!(
            why.contains(&format!(
                "cannot read database.password_file {}: No such file",
                missing.display()
            )) && why.contains("create it"),
            "{why}"
        );
        assert!(why.starts_with("database.urls[0] "), "{why}");
    }
}

#[tokio::test]
async fn a_certificate_file_that_does_not_exist_is_misconfigured_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let (cert, key) = (dir.path().join("client.crt"), dir.path().join("client.key"));
    // Nothing listens there: the files are read before any connect.
    let port = free_port();
    for (query, words) in [
        (
            format!("sslmode=verify-full&sslrootcert={}", ca.display()),
            format!("cannot read sslrootcert {}", ca.display()),
        ),
        (
            format!(
                "sslmode=require&sslcert={}&sslkey={}",
                cert.display(),
                key.display()
            ),
            format!("cannot read sslcert {}", cert.display()),
        ),
    ] {
        // A password unlike anything in a temp path: errors are sanitised of it.
        for scheme in ["postgres://app:Sekr1t-9z@", "rediss://"] {
            let url = format!("{scheme}127.0.0.1:{port}/0?{query}");
            let mut m = monitor(&DatabaseConfig {
                fail_after: 3,
                ..cfg(&[&url])
            });
            let r = m.check().await;
            assert_eq!(r.state, DbState::Misconfigured, "{url}: {r:?}");
            let why = r.misconfigured_reason().unwrap();
            assert!(why.contains(&words), "{words:?} not in {why}");
            assert!(why.contains("(set in database.urls[0])"), "{why}");
            assert_no_secret(&r, &["Sekr1t-9z"]);
        }
    }
}

#[tokio::test]
async fn redis_asking_for_a_password_says_where_one_goes() {
    let (addr, _) = fake_redis(
        |_| "-NOAUTH Authentication required.\r\n".into(),
        Duration::ZERO,
    )
    .await;
    let r = monitor(&cfg(&[&format!("redis://{addr}")])).check().await;
    assert_eq!(r.state, DbState::Misconfigured, "{r:?}");
    let why = r.misconfigured_reason().unwrap();
    assert!(
        why.contains("-NOAUTH")
            && why.contains("none is set: put it in database.urls[0] (redis://:PASSWORD@"),
        "{why}"
    );
    // A refused password says where it came from.
    let (addr, _) = fake_redis(
        |_| "-WRONGPASS invalid username-password pair\r\n".into(),
        Duration::ZERO,
    )
    .await;
    let r = monitor(&cfg(&[&format!("redis://:nope@{addr}")]))
        .check()
        .await;
    let why = r.misconfigured_reason().unwrap();
    assert!(
        why.contains("fix the user or the password in database.urls[0]"),
        "{why}"
    );
}

#[test]
fn what_can_be_seen_before_connecting_is_said_at_start() {
    without_pgpassword();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let pw = dir.path().join("pw");
    let warnings = |url: &str, file: Option<&std::path::PathBuf>| {
        let c = cfg(&[url]);
        let t = &target::targets(&c).unwrap()[0];
        target::start_warnings(t, file)
    };
    let w = warnings("postgres://app@db.example:5432/app?sslmode=require", None);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].starts_with("database.urls[0] postgres://app@db.example:5432/app?sslmode=require: no password is set")
            && w[0].contains("PGPASSWORD=..."),
        "{w:?}"
    );
    let w = warnings(
        &format!(
            "postgres://app:Sekr1t@db/app?sslmode=verify-ca&sslrootcert={}",
            ca.display()
        ),
        Some(&pw),
    );
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w[0].contains(&format!("cannot read sslrootcert {}", ca.display())),
        "{w:?}"
    );
    assert!(
        w[1].contains(&format!(
            "cannot read database.password_file {}",
            pw.display()
        )),
        "{w:?}"
    );
    assert!(!format!("{w:?}").contains("Sekr1t"), "{w:?}");
    // Nothing to say: a password, a client certificate, a Unix socket, a Redis, a MySQL.
    std::fs::write(&pw, "x\n").unwrap();
    for url in [
        "postgres://app:pw@db/app",
        "postgres://app@%2Frun%2Fpostgresql/app",
        "redis://db:6379",
        "mysql://db:3306",
    ] {
        assert_eq!(warnings(url, None), Vec::<String>::new(), "{url}");
    }
    assert_eq!(
        warnings("postgres://app@db/app", Some(&pw)),
        Vec::<String>::new()
    );
}

/// A resolver that did not answer (EAI_AGAIN, EAI_FAIL, a system error, a timeout) says nothing
/// of the name: an outage, damped, from the first round — never "fix the host name".
#[test]
fn a_resolver_that_does_not_answer_is_an_outage_even_before_the_name_ever_resolved() {
    let m = monitor(&DatabaseConfig {
        fail_after: 2,
        ..cfg(&["postgres://app@db.example.internal:5432/app"])
    });
    let at = SystemTime::now();
    let gai = |w: &str| std::io::Error::other(format!("failed to lookup address information: {w}"));
    for (error, no_resolver) in [
        (gai("Temporary failure in name resolution"), true),
        (gai("Non-recoverable failure in name resolution"), true),
        (std::io::Error::from_raw_os_error(libc::ENOENT), true),
        (gai("Name or service not known"), false),
        (gai("Name does not resolve"), false),
        (gai("No address associated with hostname"), false),
    ] {
        let why = NoAddress::of(&error);
        assert_eq!(
            matches!(why, NoAddress::NoResolver(_)),
            no_resolver,
            "{error}"
        );
    }
    let down = || Outcome {
        result: Err(Failure::Outage(String::new())),
        lookup: Lookup::Failed(NoAddress::of(&gai("Temporary failure in name resolution"))),
        at,
    };
    let r = m.record(vec![down()]);
    assert_eq!(r.state, DbState::Unknown, "damped: 1 of fail_after 2");
    assert_eq!(r.misconfigured_reason(), None);
    let r = m.record(vec![down()]);
    assert_eq!(r.state, DbState::Unreachable);
    let reason = r.reason.unwrap();
    assert!(
        reason.contains(
            "the resolver did not answer for the host db.example.internal (failed to lookup \
             address information: Temporary failure in name resolution): DNS is unreachable or \
             failing from this instance"
        ),
        "{reason}"
    );
    assert!(!reason.contains("fix the host name"), "{reason}");
}
