use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use health_common::{MapErrorKind, PortCounters, MAX_PORTS};

use super::{KernelView, MapErrors};

#[test]
fn map_errors_sum_every_cpu_of_each_kind() {
    let sums = MapErrors::sum([
        (MapErrorKind::ConnInsert, &[1, 2][..]),
        (MapErrorKind::PortCounters, &[0, 0][..]),
        (MapErrorKind::Other, &[5, 0][..]),
    ]);
    assert_eq!(sums.get(MapErrorKind::ConnInsert), 3);
    assert_eq!(sums.get(MapErrorKind::PortCounters), 0);
    assert_eq!(sums.get(MapErrorKind::Other), 5);
    // A kind that could not be read is absent and reads 0.
    let partial = MapErrors::sum([(MapErrorKind::Other, &[7, 1][..])]);
    assert_eq!(
        partial.iter().collect::<Vec<_>>(),
        [
            (MapErrorKind::ConnInsert, 0),
            (MapErrorKind::PortCounters, 0),
            (MapErrorKind::Other, 8)
        ]
    );
}

#[test]
fn map_errors_serialize_by_kind_zeros_included() {
    let errors = MapErrors::sum([(MapErrorKind::ConnInsert, &[4][..])]);
    assert_eq!(
        serde_json::to_value(errors).unwrap(),
        serde_json::json!({"conn_insert": 4, "port_counters": 0, "other": 0})
    );
}

/// Inode of this process's network namespace: what the programs key watched ports by.
fn own_netns() -> u64 {
    std::fs::metadata("/proc/self/ns/net")
        .expect("reading /proc/self/ns/net")
        .ino()
}

/// `n` connections to `port`, each accepted, asked and answered, then closed.
fn exchange(listener: &TcpListener, n: usize) {
    let port = listener.local_addr().unwrap().port();
    for _ in 0..n {
        let mut client = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).unwrap();
        server.write_all(b"pong").unwrap();
        client.read_exact(&mut buf).unwrap();
    }
}

/// Polls the programs' view until `done` holds: the server side of a loopback handshake may
/// complete in a softirq a moment after `connect` returns.
fn settle(k: &KernelView, done: impl Fn(&super::KernelSample) -> bool) -> super::KernelSample {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let s = k.sample();
        if done(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "needs root and a kernel with BTF: loads the eBPF programs (cargo test -- --ignored)"]
async fn map_errors_read_zero_under_normal_traffic_and_count_a_failed_update() {
    // A small table, like a tight `web.max_connections_tracked`.
    let mut k = KernelView::load(64, true, true, true).expect("loading the kernel programs");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    k.watch(&[(own_netns(), port)]).unwrap();

    exchange(&listener, 20);
    let s = settle(&k, |s| s.ports[0].counters.answered >= 20);
    assert_eq!(s.ports[0].counters.established, 20, "{s:?}");
    assert_eq!(s.ports[0].counters.answered, 20, "{s:?}");
    assert_eq!(s.map_errors, MapErrors::default(), "{s:?}");

    // A watched port whose counter slot lies past the arrays (a slot `watch` never hands out):
    // every update of its counters fails, and each failure is counted.
    let bad = TcpListener::bind("127.0.0.1:0").unwrap();
    let bad_port = bad.local_addr().unwrap().port();
    let key = health_common::WatchKey::new(
        if k.netns_keyed() {
            own_netns() as u32
        } else {
            0
        },
        bad_port,
    );
    k.watched_map.insert(key, MAX_PORTS, 0).unwrap();
    let (word, mask) = health_common::port_bit(bad_port);
    let bits = k.bitmap.get(&word, 0).unwrap();
    k.bitmap.set(word, bits | mask, 0).unwrap();

    exchange(&bad, 3);
    let s = settle(&k, |s| s.map_errors.get(MapErrorKind::PortCounters) >= 3);
    // At least one per handshake; the reads and writes of those connections add more.
    assert!(s.map_errors.get(MapErrorKind::PortCounters) >= 3, "{s:?}");
    assert_eq!(s.map_errors.get(MapErrorKind::ConnInsert), 0, "{s:?}");
    assert_eq!(k.map_errors(), s.map_errors);
    // The good port's figures are untouched.
    assert_eq!(s.ports[0].counters.established, 20, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "needs root and a kernel with BTF: loads the eBPF programs (cargo test -- --ignored)"]
async fn keep_alive_requests_count_one_exchange_each_and_an_unanswered_one_is_dropped_at_close() {
    let mut k = KernelView::load(1024, true, true, true).expect("loading the kernel programs");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    k.watch(&[(own_netns(), port)]).unwrap();

    let mut client = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let (mut server, _) = listener.accept().expect("accept");
    let mut buf = [0u8; 4];
    // Five requests on one connection, each answered, the last after 30 ms.
    for i in 0..5 {
        client.write_all(b"ping").unwrap();
        server.read_exact(&mut buf).unwrap();
        if i == 4 {
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        server.write_all(b"pong").unwrap();
        client.read_exact(&mut buf).unwrap();
    }
    // A request read in two reads, answered in two sends: one exchange.
    client.write_all(b"pi").unwrap();
    server.read_exact(&mut buf[..2]).unwrap();
    client.write_all(b"ng").unwrap();
    server.read_exact(&mut buf[..2]).unwrap();
    server.write_all(b"po").unwrap();
    server.write_all(b"ng").unwrap();
    client.read_exact(&mut buf).unwrap();
    // A seventh request, read and not answered: in service now.
    client.write_all(b"ping").unwrap();
    server.read_exact(&mut buf).unwrap();

    let s = settle(&k, |s| s.ports[0].counters.exchanges_in >= 7);
    let c = s.ports[0].counters;
    assert_eq!((c.exchanges_in, c.exchanges_out), (7, 6), "{c:?}");
    assert_eq!(c.in_service(), 1, "{c:?}");
    assert_eq!(
        c.arrivals(),
        7,
        "one handshake and six later requests: {c:?}"
    );
    // The per-connection counters saw one request and one answer, and nothing pending.
    assert_eq!((c.requests, c.answered, c.pending()), (1, 1, 0), "{c:?}");
    // Every answered exchange has its latency, not only the connection's first: the 30 ms one
    // among them.
    let latency = crate::checks::web::percentiles(&s.ports[0].latency);
    assert_eq!(latency.samples, 6, "{latency:?}");
    assert!((24.0..60.0).contains(&latency.p99_ms), "{latency:?}");

    // The client gives up: the open exchange is dropped, nothing stays in service.
    drop(client);
    drop(server);
    let s = settle(&k, |s| s.ports[0].counters.exchanges_dropped >= 1);
    let c = s.ports[0].counters;
    assert_eq!(c.exchanges_dropped, 1, "{c:?}");
    assert_eq!(c.in_service(), 0, "{c:?}");
    assert_eq!(s.map_errors, MapErrors::default(), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "needs root and a kernel with BTF: loads the eBPF programs (cargo test -- --ignored)"]
async fn detached_programs_count_nothing_and_attach_afresh() {
    // Loaded detached, as `web.socket_tracing = "on_suspicion"` starts.
    let mut k = KernelView::load(1024, false, false, true).expect("loading the kernel programs");
    assert!(!k.following());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    k.watch(&[(own_netns(), port)]).unwrap();
    exchange(&listener, 5);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(k.sample().ports[0].counters, PortCounters::default());

    // A connection opened while detached, then the programs attach: its handshake and claim
    // are past and count nothing (sock_diag covers them), but it is taken up at its first
    // socket call, so its exchanges count from then on, keep-alive ones included; what the
    // programs count of the connections after the attach is exact.
    let mut early = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    k.follow(true).unwrap();
    assert!(k.following());
    let (mut taken, _) = listener.accept().expect("accept");
    early.write_all(b"ping").unwrap();
    taken.read_exact(&mut [0u8; 4]).unwrap();
    taken.write_all(b"pong").unwrap();
    exchange(&listener, 3);
    // Its next request, read and not answered yet.
    early.write_all(b"ping").unwrap();
    taken.read_exact(&mut [0u8; 4]).unwrap();
    let s = settle(&k, |s| s.ports[0].counters.answered >= 3);
    let c = s.ports[0].counters;
    assert_eq!((c.established, c.answered, c.waiting()), (3, 3, 0), "{c:?}");
    assert_eq!(s.ports[0].waiting, 0, "{s:?}");
    assert_eq!(
        s.ports[0].pending, 0,
        "an adopted connection has no first request: {s:?}"
    );
    assert_eq!(
        (c.exchanges_in, c.exchanges_out, c.in_service()),
        (5, 4, 1),
        "three new exchanges and the early connection's two: {c:?}"
    );
    assert_eq!(s.map_errors, MapErrors::default(), "{s:?}");
    // It closes with its request open: dropped, like any other's.
    drop(early);
    drop(taken);
    let s = settle(&k, |s| s.ports[0].counters.exchanges_dropped >= 1);
    let c = s.ports[0].counters;
    assert_eq!((c.exchanges_dropped, c.in_service()), (1, 0), "{c:?}");
    assert_eq!(
        (c.closed_unclaimed, c.closed_unanswered),
        (0, 0),
        "nothing of it was unclaimed or unanswered by the per-connection counts: {c:?}"
    );

    // Detached again: the counters stand still; attached again: they start from zero.
    k.follow(false).unwrap();
    exchange(&listener, 2);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(k.sample().ports[0].counters.established, 3);
    k.follow(true).unwrap();
    assert_eq!(k.sample().ports[0].counters, PortCounters::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "needs root and a kernel with BTF: loads the eBPF programs (cargo test -- --ignored)"]
async fn the_connection_table_reads_the_same_in_batches_as_entry_by_entry() {
    let mut k = KernelView::load(4096, false, true, true).expect("loading the kernel programs");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    k.watch(&[(own_netns(), port)]).unwrap();
    // More connections than one batch holds, accepted and never read: each waits in the
    // table, so the sample walks it.
    let n = 2500;
    let held: Vec<(TcpStream, TcpStream)> = (0..n)
        .map(|_| {
            let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            let (s, _) = listener.accept().expect("accept");
            (c, s)
        })
        .collect();
    let s = settle(&k, |s| s.ports[0].waiting as usize >= n);
    assert_eq!(s.ports[0].waiting as usize, n, "{:?}", s.ports[0]);
    assert!(
        !k.conns_batch_failed
            .load(std::sync::atomic::Ordering::Relaxed),
        "batch reads fell back to entry by entry"
    );
    let mut batched: Vec<_> = k
        .conn_entries()
        .into_iter()
        .map(|c| (c.established_ns, c.slot))
        .collect();
    let mut one_by_one: Vec<_> = k
        .conns
        .iter()
        .filter_map(Result::ok)
        .map(|(_, c)| (c.established_ns, c.slot))
        .collect();
    batched.sort_unstable();
    one_by_one.sort_unstable();
    assert_eq!(batched.len(), n);
    assert_eq!(batched, one_by_one);
    drop(held);
}

/// One keep-alive connection to `port`: each request written, read by the server and answered
/// with `answer`, read back whole.
fn keep_alive(listener: &TcpListener, requests: &[&[u8]], answer: impl Fn(usize) -> Vec<u8>) {
    let port = listener.local_addr().unwrap().port();
    let mut client = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let (mut server, _) = listener.accept().expect("accept");
    for (i, req) in requests.iter().enumerate() {
        client.write_all(req).unwrap();
        let mut buf = vec![0u8; req.len()];
        server.read_exact(&mut buf).unwrap();
        let a = answer(i);
        server.write_all(&a).unwrap();
        let mut back = vec![0u8; a.len()];
        client.read_exact(&mut back).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "needs root and a kernel with BTF: loads the eBPF programs (cargo test -- --ignored)"]
async fn answers_count_by_status_class_and_the_probe_path_apart() {
    // Detached connection programs, as `on_suspicion` starts: the answer programs do not need
    // them.
    let mut k = KernelView::load(1024, false, false, true).expect("loading the kernel programs");
    if let Some(why) = k.answers_unavailable() {
        panic!("answer programs not loaded: {why}");
    }
    // Loaded detached, as `on_suspicion` starts them between sampling windows.
    assert!(!k.answers_attached());
    k.attach_answers(true)
        .expect("attaching the answer programs");
    k.set_probe_path("/up");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Another server on another port: never counted.
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    k.watch(&[(own_netns(), port)]).unwrap();

    let get = b"GET /orders/7 HTTP/1.1\r\nHost: x\r\n\r\n".as_slice();
    let probe = b"GET /up HTTP/1.1\r\nHost: x\r\nUser-Agent: health-agent\r\n\r\n".as_slice();
    let query = b"HEAD /up?full=1 HTTP/1.1\r\nHost: x\r\n\r\n".as_slice();
    let longer = b"GET /upload HTTP/1.1\r\nHost: x\r\n\r\n".as_slice();
    let post = b"POST /orders HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".as_slice();
    let status =
        |code: u16| format!("HTTP/1.1 {code} X\r\nContent-Length: 2\r\n\r\nok").into_bytes();
    // Six requests on one connection (keep-alive): 500, 500, 200 (probe), 204 (probe), 404,
    // 503.
    let codes = [500, 500, 200, 204, 404, 503];
    keep_alive(&listener, &[get, post, probe, query, longer, get], |i| {
        status(codes[i])
    });
    // A new connection per request, three times: 302.
    for _ in 0..3 {
        keep_alive(&listener, &[get], |_| status(302));
    }
    // A TLS record, and a body segment that merely follows an answer: neither is a status.
    keep_alive(&listener, &[b"\x16\x03\x01\x00\x05hello world!"], |_| {
        b"\x17\x03\x03\x00\x10abcdefghijklmnop".to_vec()
    });
    keep_alive(&other, &[get], |_| status(500));

    let s = settle(&k, |s| {
        s.ports[0]
            .answers
            .is_some_and(|a| a.answers() >= 9 && a.tls >= 1)
    });
    let a = s.ports[0].answers.expect("answer counters");
    assert_eq!(a.status, [0, 0, 2, 3, 1, 3], "{a:?}");
    assert_eq!(a.tls, 1, "{a:?}");
    assert_eq!(a.requests, 9, "{a:?}");
    assert_eq!(a.probe_requests, 2, "{a:?}");
    assert_eq!(a.h2, 0, "{a:?}");
}

/// Where an answer starts, exchange by exchange (`answers/due.rs`): a request that came before
/// the attach still has its answer counted; a body segment that begins like a 500 is no answer;
/// `100 Continue` leaves the final status to count; a status line nobody asked for is not
/// counted; after `101` the frames are not HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
#[ignore = "needs root and a kernel with BTF: loads the eBPF programs (cargo test -- --ignored)"]
async fn a_status_line_counts_only_where_an_answer_starts() {
    let mut k = KernelView::load(1024, false, false, true).expect("loading");
    k.set_probe_path("/up");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    k.watch(&[(own_netns(), port)]).unwrap();
    // 0: a request that arrives while detached, answered after the attach: 1×2xx, its body not.
    {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut sv, _) = listener.accept().unwrap();
        sv.set_nodelay(true).unwrap();
        let g = b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n";
        c.write_all(g).unwrap();
        let mut b = vec![0u8; g.len()];
        sv.read_exact(&mut b).unwrap();
        k.attach_answers(true).expect("attach");
        let body = b"HTTP/1.1 500 Internal Server Error\r\n\r\n";
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
        sv.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        sv.write_all(body).unwrap();
        let mut b = vec![0u8; head.len() + body.len()];
        c.read_exact(&mut b).unwrap();
    }
    let get = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n".as_slice();
    let post = b"POST /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 20\r\n\r\n"
        .as_slice();
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    server.set_nodelay(true).unwrap();
    let read_n = |s: &mut TcpStream, n: usize| {
        let mut b = vec![0u8; n];
        s.read_exact(&mut b).unwrap();
    };
    // 1: 200 head, then a body segment that starts like a 500: 1×2xx.
    client.write_all(get).unwrap();
    read_n(&mut server, get.len());
    let body = b"HTTP/1.1 500 Internal Server Error\r\n\r\n";
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
    server.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    server.write_all(body).unwrap();
    read_n(&mut client, head.len() + body.len());
    // 2: 100 Continue, the body, then 503: 1×5xx, no 1xx.
    client.write_all(post).unwrap();
    read_n(&mut server, post.len());
    let cont = b"HTTP/1.1 100 Continue\r\n\r\n";
    server.write_all(cont).unwrap();
    read_n(&mut client, cont.len());
    client.write_all(b"01234567890123456789").unwrap();
    read_n(&mut server, 20);
    let fin = b"HTTP/1.1 503 X\r\nContent-Length: 0\r\n\r\n";
    server.write_all(fin).unwrap();
    read_n(&mut client, fin.len());
    // 3: an unsolicited status line (no request): not counted.
    server
        .write_all(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        .unwrap();
    read_n(&mut client, 32);
    // 4: 101: 1×1xx, then a frame that starts like a status line: not counted.
    client.write_all(get).unwrap();
    read_n(&mut server, get.len());
    let up = b"HTTP/1.1 101 Switching Protocols\r\n\r\n";
    server.write_all(up).unwrap();
    read_n(&mut client, up.len());
    server
        .write_all(b"HTTP/1.1 500 in a frame\r\n\r\n")
        .unwrap();
    read_n(&mut client, 27);
    settle(&k, |s| s.ports[0].answers.is_some_and(|a| a.answers() >= 3));
    // Whatever else would be counted has been by now.
    std::thread::sleep(Duration::from_millis(200));
    let a = k.sample().ports[0].answers.expect("answers");
    assert_eq!(a.status, [0, 1, 2, 0, 0, 1], "{a:?}");
    assert_eq!(a.requests, 3, "{a:?}");
}
