//! A TCP relay on 127.0.0.1 between a store and its redis-server, for tests that watch what
//! the store's own connection (the one that names itself `tollgate-batch`) writes, or hold
//! the server's replies to it. Every other connection passes through untouched.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Only a guard against a hung test; nothing asserts on time.
const HANG: Duration = Duration::from_secs(30);

pub struct Relay {
    port: u16,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    /// Replies to the own connection wait (but `pass` of them).
    hold: bool,
    pass: usize,
    /// Script calls (`EVALSHA` or `EVAL`) the own connection wrote in all.
    calls: usize,
    /// Those written since it was last given a reply, and the most of them ever.
    in_a_row: usize,
    most_in_a_row: usize,
}

impl Relay {
    /// A relay to the server on `upstream` (a port of 127.0.0.1).
    pub async fn start(upstream: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, Arc::clone(&s)));
            }
        });
        Relay {
            port,
            shared,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// From now on the server's replies to the own connection wait until passed or released.
    pub fn hold(&self) {
        self.change(|s| s.hold = true);
    }

    /// Lets the next reply chunk held (or the next to arrive) through, and holds on.
    pub fn pass_one(&self) {
        self.change(|s| s.pass += 1);
    }

    /// Lets every held reply through and holds no more.
    pub fn release(&self) {
        self.change(|s| {
            s.hold = false;
            s.pass = 0;
        });
    }

    /// Script calls the own connection has written.
    pub fn calls(&self) -> usize {
        self.read(|s| s.calls)
    }

    /// The most script calls the own connection wrote with no reply given to it in between.
    pub fn most_calls_written_together(&self) -> usize {
        self.read(|s| s.most_in_a_row)
    }

    /// Waits (bounded) until the own connection has written `n` script calls in all.
    pub async fn wait_for_calls(&self, n: usize) {
        let waited = tokio::time::timeout(HANG, async {
            while self.calls() < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "the store wrote {} of {n} calls",
            self.calls()
        );
    }

    fn change(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.shared.lock());
        self.shared.changed.notify_waiters();
    }

    fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.shared.lock())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until a reply chunk to the own connection may go (and counts it as gone).
    async fn may_reply(&self) {
        loop {
            let changed = self.changed.notified();
            {
                let mut s = self.lock();
                if !s.hold {
                    break;
                }
                if s.pass > 0 {
                    s.pass -= 1;
                    break;
                }
            }
            changed.await;
        }
    }
}

/// How many script calls `chunk` holds (each call's command name is a bulk string).
fn script_calls(chunk: &[u8]) -> usize {
    let count = |needle: &[u8]| chunk.windows(needle.len()).filter(|w| *w == needle).count();
    count(b"$7\r\nEVALSHA\r\n") + count(b"$4\r\nEVAL\r\n")
}

/// What a client writes, passed on to its server chunk by chunk: `before` sees each chunk
/// before it is written, `after` once it is (true: the chunk was a script call `before`
/// marked). Ends with either side; the server's side is shut down then.
pub async fn pass_up(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut before: impl FnMut(&[u8]) -> bool,
    mut after: impl FnMut(bool),
) {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let marked = before(&buf[..n]);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        after(marked);
    }
    let _ = to.shutdown().await;
}

/// Both ends of a relayed connection, without Nagle's delay, split into their halves.
pub fn ends(
    client: TcpStream,
    server: TcpStream,
) -> (
    (OwnedReadHalf, OwnedWriteHalf),
    (OwnedReadHalf, OwnedWriteHalf),
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    (client.into_split(), server.into_split())
}

async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let ((client_read, mut client_write), (mut server_read, server_write)) = ends(client, server);
    let own = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let own_up = Arc::clone(&own);
    let shared_up = Arc::clone(&shared);
    let up = tokio::spawn(pass_up(
        client_read,
        server_write,
        move |chunk| {
            if chunk.windows(14).any(|w| w == b"tollgate-batch") {
                own_up.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            if own_up.load(std::sync::atomic::Ordering::SeqCst) {
                let calls = script_calls(chunk);
                let mut s = shared_up.lock();
                s.calls += calls;
                s.in_a_row += calls;
                s.most_in_a_row = s.most_in_a_row.max(s.in_a_row);
            }
            false
        },
        |_| {},
    ));
    // Replies are read as they come and queued, so that holding them never stops the server.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let read = tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    while let Some(chunk) = rx.recv().await {
        if own.load(std::sync::atomic::Ordering::SeqCst) {
            shared.may_reply().await;
            shared.lock().in_a_row = 0;
        }
        if client_write.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = client_write.shutdown().await;
    up.abort();
    read.abort();
}
