//! A TCP relay on 127.0.0.1 in front of a redis-server that, once armed, lets a script call
//! through, waits for the server's answer (the script ran), and drops the connection instead
//! of passing it on: the reply is lost after the call did its work, as when a network cuts
//! between a node's answer and its client. Error answers pass (a NOSCRIPT is not what it
//! cuts). One [`Cut`] may arm the relays of several servers: the first answer cut disarms it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
pub struct Cut {
    armed: AtomicBool,
    cuts: AtomicUsize,
}

impl Cut {
    /// The next script call's answer (on any of the relays) is cut.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Nothing more is cut.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// Answers cut so far.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

/// A relay to `upstream` (a port of 127.0.0.1), cutting when `cut` is armed: its port.
pub async fn relay(upstream: u16, cut: Arc<Cut>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the relay");
    let port = listener.local_addr().expect("relay address").port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                continue;
            };
            tokio::spawn(connection(client, server, Arc::clone(&cut)));
        }
    });
    port
}

async fn connection(client: TcpStream, server: TcpStream, cut: Arc<Cut>) {
    let ((client_read, mut client_write), (mut server_read, server_write)) =
        super::relay::ends(client, server);
    // A script call went up while armed (`called`), and has been written to the server
    // (`sent`): the next answer is cut, its own or one before it, and with it the call's.
    let called = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicBool::new(false));
    let (up_called, up_sent) = (Arc::clone(&called), Arc::clone(&sent));
    let up_cut = Arc::clone(&cut);
    let up = tokio::spawn(super::relay::pass_up(
        client_read,
        server_write,
        move |chunk| {
            let call =
                up_cut.armed.load(Ordering::SeqCst) && chunk.windows(7).any(|w| w == b"EVALSHA");
            if call {
                up_called.store(true, Ordering::SeqCst);
            }
            call
        },
        move |call| {
            if call {
                up_sent.store(true, Ordering::SeqCst);
            }
        },
    ));
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match server_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if called.load(Ordering::SeqCst)
            && buf[0] != b'-'
            && cut.armed.swap(false, Ordering::SeqCst)
        {
            // What is cut never keeps the call from the server (bounded: a hung test only).
            for _ in 0..1_000 {
                if sent.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            cut.cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if called.load(Ordering::SeqCst) && buf[0] == b'-' {
            // An error answer (NOSCRIPT): passed on; the call sent after it is cut instead.
            called.store(false, Ordering::SeqCst);
        }
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
}
