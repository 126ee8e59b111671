//! Connections opened before the clock starts.
//!
//! The load driver's pool opens a connection when a request finds none idle. At the start of a
//! run every request does, so the first second used to pay for hundreds of TCP handshakes at
//! once, and for the targets accepting them all together: on the 16-core reference machine the
//! first second's p99 was 122 ms against 1.7-5.2 ms for every other second, and it alone made the
//! run's p99.9. A load generator measures a service with its connections already open, as wrk
//! does, so [`Warm`] opens up to `--connections` of them (spread over the targets) before the run
//! starts and hands them to the pool as it asks for new ones; only what the pool asks for beyond
//! them is connected during the run.
//!
//! A connection opened ahead is used only while it is young ([`MAX_AGE`]) and still quiet (open,
//! nothing received): a target may close a connection that never sent a request (a header read
//! timeout), and the pool must not be given one that is already closed. What was not taken by
//! then is closed.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tower_service::Service;

/// How long a connection opened ahead may wait for its first request.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// Connections opened at once while warming.
const AT_ONCE: usize = 256;

type Ready = HashMap<String, Vec<(Instant, TokioIo<TcpStream>)>>;

/// One opening task's end: the target's key and the connection, or why not.
type Joined<E> = Result<(String, Result<TokioIo<TcpStream>, E>), tokio::task::JoinError>;

/// An [`HttpConnector`] that first hands out the connections opened by [`Warm::open`].
#[derive(Clone)]
pub struct Warm {
    inner: HttpConnector,
    ready: Arc<Mutex<Ready>>,
}

/// The pool's key for a target: its authority (the driver speaks plain HTTP only).
fn key(uri: &Uri) -> String {
    uri.authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default()
}

impl Warm {
    /// Wraps `inner`; nothing is opened until [`Warm::open`].
    pub fn new(inner: HttpConnector) -> Self {
        Self {
            inner,
            ready: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Opens `total` connections spread evenly over `targets` (at most [`AT_ONCE`] at a time),
    /// and returns how many opened. A target that cannot be reached is not an error here: the
    /// run's own requests to it will say so.
    pub async fn open(&self, targets: &[Uri], total: usize) -> usize {
        if targets.is_empty() || total == 0 {
            return 0;
        }
        let mut tasks = JoinSet::new();
        let mut opened = 0;
        for n in 0..total {
            if tasks.len() >= AT_ONCE {
                opened += self.keep(tasks.join_next().await);
            }
            let uri = targets[n % targets.len()].clone();
            let mut inner = self.inner.clone();
            tasks.spawn(async move {
                let stream = inner.call(uri.clone()).await;
                (key(&uri), stream)
            });
        }
        while let Some(done) = tasks.join_next().await {
            opened += self.keep(Some(done));
        }
        opened
    }

    fn keep<E>(&self, done: Option<Joined<E>>) -> usize {
        let Some(Ok((key, Ok(stream)))) = done else {
            return 0;
        };
        let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        ready.entry(key).or_default().push((Instant::now(), stream));
        1
    }

    /// A connection opened ahead to `uri`'s target and still young, if any.
    fn take(&self, uri: &Uri) -> Option<TokioIo<TcpStream>> {
        let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        let list = ready.get_mut(&key(uri))?;
        while let Some((opened, stream)) = list.pop() {
            if opened.elapsed() >= MAX_AGE {
                // Too old: the target may have closed it; the rest are older still.
                list.clear();
                break;
            }
            if quiet(&stream) {
                return Some(stream);
            }
        }
        None
    }

    /// Closes every connection opened ahead that was not taken.
    pub fn close_rest(&self) -> usize {
        let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        let closed = ready.values().map(Vec::len).sum();
        ready.clear();
        closed
    }
}

/// Whether a connection opened ahead is still open and has said nothing: a target that closed it
/// (end of file) or already answered something (an error page for a request never sent) has
/// nothing to offer a request.
fn quiet(stream: &TokioIo<TcpStream>) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.inner().try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

impl Service<Uri> for Warm {
    type Response = TokioIo<TcpStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        if let Some(stream) = self.take(&uri) {
            return Box::pin(async move { Ok(stream) });
        }
        let connecting = self.inner.call(uri);
        Box::pin(async move { connecting.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A listener that counts the connections it accepts; it closes the first `close_first` at
    /// once (as a server with a short idle timeout would) and keeps the others open.
    async fn listening(close_first: usize) -> (Uri, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                if count.fetch_add(1, Ordering::SeqCst) >= close_first {
                    kept.push(stream);
                }
            }
        });
        let uri = format!("http://127.0.0.1:{port}/").parse().expect("uri");
        (uri, accepted)
    }

    async fn settled(accepted: &AtomicUsize, want: usize) -> usize {
        for _ in 0..200 {
            if accepted.load(Ordering::SeqCst) >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        accepted.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn connections_opened_ahead_are_handed_out_before_new_ones() {
        let (a, accepted_a) = listening(0).await;
        let (b, accepted_b) = listening(0).await;
        let mut warm = Warm::new(HttpConnector::new());
        assert_eq!(warm.open(&[a.clone(), b.clone()], 5).await, 5);
        assert_eq!(settled(&accepted_a, 3).await, 3, "spread over the targets");
        assert_eq!(settled(&accepted_b, 2).await, 2);
        for _ in 0..3 {
            warm.call(a.clone()).await.expect("connect");
        }
        assert_eq!(
            settled(&accepted_a, 3).await,
            3,
            "the pool got the open ones"
        );
        warm.call(a.clone()).await.expect("connect");
        assert_eq!(settled(&accepted_a, 4).await, 4, "then a new one");
        assert_eq!(warm.close_rest(), 2, "b's two were never taken");
        warm.call(b.clone()).await.expect("connect");
        assert_eq!(
            settled(&accepted_b, 3).await,
            3,
            "closed ones are not handed out"
        );
    }

    #[tokio::test]
    async fn an_old_connection_is_not_handed_out() {
        let (a, accepted) = listening(0).await;
        let mut warm = Warm::new(HttpConnector::new());
        assert_eq!(warm.open(std::slice::from_ref(&a), 2).await, 2);
        std::thread::sleep(MAX_AGE + Duration::from_millis(50));
        warm.call(a.clone()).await.expect("connect");
        assert_eq!(
            settled(&accepted, 3).await,
            3,
            "a new connection, not one a second old"
        );
        assert_eq!(warm.close_rest(), 0, "the old ones were dropped with it");
    }

    #[tokio::test]
    async fn a_connection_the_target_closed_is_not_handed_out() {
        let (uri, accepted) = listening(2).await;
        let mut warm = Warm::new(HttpConnector::new());
        assert_eq!(warm.open(std::slice::from_ref(&uri), 2).await, 2);
        assert_eq!(settled(&accepted, 2).await, 2);
        warm.call(uri.clone()).await.expect("connect");
        assert_eq!(
            settled(&accepted, 3).await,
            3,
            "a new connection, not a closed one"
        );
        assert_eq!(warm.close_rest(), 0, "both closed ones were passed over");
    }

    #[tokio::test]
    async fn an_unreachable_target_opens_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        let uri: Uri = format!("http://127.0.0.1:{port}/").parse().expect("uri");
        let warm = Warm::new(HttpConnector::new());
        assert_eq!(warm.open(&[uri], 3).await, 0);
        assert_eq!(warm.close_rest(), 0);
    }
}
