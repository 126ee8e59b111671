//! A delay relay: a loopback TCP relay that holds every chunk it reads for a fixed time before
//! writing it on, each way, so a server on this machine answers as one in another zone does
//! (each round trip through it takes twice the delay more).
//!
//! Per connection and direction, one thread reads (each chunk stamped with its arrival) and one
//! writes (each chunk when its time comes, in order). A chunk is held from its arrival, not from
//! the previous chunk's departure, so the relay adds latency, not a bandwidth limit. Dropping the
//! relay shuts every socket it holds and stops accepting; its threads then end.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;

/// The largest chunk read at once.
const CHUNK: usize = 64 * 1024;

/// A running relay (see the module docs).
pub struct DelayRelay {
    port: u16,
    stopping: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl DelayRelay {
    /// Relays 127.0.0.1:[`DelayRelay::port`] to 127.0.0.1:`upstream`, holding each chunk
    /// `delay` each way.
    pub fn start(upstream: u16, delay: Duration) -> anyhow::Result<Self> {
        let listener =
            TcpListener::bind("127.0.0.1:0").context("the relay cannot bind a loopback port")?;
        let port = listener.local_addr().context("no local address")?.port();
        let stopping = Arc::new(AtomicBool::new(false));
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (stop, held) = (stopping.clone(), sockets.clone());
        thread::Builder::new()
            .name("relay-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let to = SocketAddr::from(([127, 0, 0, 1], upstream));
                    let Ok(server) = TcpStream::connect_timeout(&to, Duration::from_secs(2)) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    if connect_pumps(&client, &server, delay, &held).is_err() {
                        let _ = client.shutdown(Shutdown::Both);
                        let _ = server.shutdown(Shutdown::Both);
                    }
                }
            })
            .context("cannot start the relay's thread")?;
        Ok(Self {
            port,
            stopping,
            sockets,
        })
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stopping`.
        let _ = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_millis(200),
        );
        if let Ok(sockets) = self.sockets.lock() {
            for s in sockets.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Starts both directions of one relayed connection, keeping a handle on each socket.
fn connect_pumps(
    client: &TcpStream,
    server: &TcpStream,
    delay: Duration,
    held: &Mutex<Vec<TcpStream>>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    if let Ok(mut held) = held.lock() {
        held.push(client.try_clone()?);
        held.push(server.try_clone()?);
    }
    pump(client.try_clone()?, server.try_clone()?, delay)?;
    pump(server.try_clone()?, client.try_clone()?, delay)
}

/// Copies `from` to `to`, each chunk held `delay` from its arrival; the write side of `to` is
/// shut when `from` ends.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::Builder::new()
        .name("relay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let chunk = buf.get(..n).map(<[u8]>::to_vec).unwrap_or_default();
                        if tx.send((Instant::now() + delay, chunk)).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        })?;
    thread::Builder::new()
        .name("relay-write".into())
        .spawn(move || {
            while let Ok((due, chunk)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port, answering every chunk it reads; it ends with its first
    /// connection.
    fn echo() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        port
    }

    /// A connection to the relay whose reads give up after 10 s (a hung relay fails the test).
    fn client(relay: &DelayRelay) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", relay.port())).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s
    }

    #[test]
    fn a_round_trip_takes_the_delay_each_way_and_keeps_the_bytes_in_order() {
        let relay = DelayRelay::start(echo(), Duration::from_millis(40)).expect("relay");
        let mut s = client(&relay);
        let t0 = Instant::now();
        s.write_all(b"one ").expect("write");
        s.write_all(b"two").expect("write");
        let mut got = Vec::new();
        let mut buf = [0u8; 16];
        while got.len() < 7 {
            let n = s.read(&mut buf).expect("read");
            assert!(n > 0, "the relay closed early");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"one two");
        // 40 ms each way: at least 80 ms, whatever the machine's load.
        assert!(
            t0.elapsed() >= Duration::from_millis(80),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn dropping_the_relay_closes_its_connections() {
        let relay = DelayRelay::start(echo(), Duration::from_millis(1)).expect("relay");
        let mut s = client(&relay);
        s.write_all(b"x").expect("write");
        let mut buf = [0u8; 4];
        assert_eq!(s.read(&mut buf).expect("echo"), 1);
        drop(relay);
        // The relay shut its side: the client reads the end (or a reset), not the read
        // timeout that a connection left open would give.
        let end = s.read(&mut buf);
        let timed_out = matches!(&end, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut));
        assert!(matches!(end, Ok(0) | Err(_)) && !timed_out, "{end:?}");
    }
}
