//! In-test servers shared by this module's tests and the runner's.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

pub(crate) type Commands = Arc<Mutex<Vec<Vec<String>>>>;

pub(crate) async fn read_command(r: &mut BufReader<TcpStream>) -> Option<Vec<String>> {
    let mut line = String::new();
    if r.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let n: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        r.read_line(&mut line).await.ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0; len + 2];
        r.read_exact(&mut buf).await.ok()?;
        buf.truncate(len);
        args.push(String::from_utf8(buf).ok()?);
    }
    Some(args)
}

/// A RESP server on loopback: answers each command with `reply(args)` after `delay`, and
/// records what it was sent.
pub(crate) async fn fake_redis(
    reply: impl Fn(&[String]) -> String + Send + Sync + 'static,
    delay: Duration,
) -> (SocketAddr, Commands) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("local addr");
    let seen: Commands = Arc::default();
    let (reply, log) = (Arc::new(reply), seen.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (reply, log) = (reply.clone(), log.clone());
            tokio::spawn(async move {
                let mut r = BufReader::new(s);
                while let Some(cmd) = read_command(&mut r).await {
                    let answer = reply(&cmd);
                    log.lock().unwrap().push(cmd);
                    tokio::time::sleep(delay).await;
                    if r.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

pub(crate) fn redis_ok(cmd: &[String]) -> String {
    match cmd.first().map(String::as_str) {
        Some("PING") => "+PONG\r\n".into(),
        Some("AUTH" | "SELECT") => "+OK\r\n".into(),
        _ => "-ERR unknown command\r\n".into(),
    }
}

/// A port nothing listens on (bound, then released).
pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("local addr").port()
}
