//! The upstream connections: HTTP/1 connections made with hyper's `client::conn::http1`, each
//! driven by the task of the downstream request it serves, never by a task of its own. The
//! request is written, its body streamed and the response read from the downstream
//! connection's task, so a proxied request costs no hand-off to another task and back (which
//! is what hyper-util's pooled client does: a connection task per upstream connection, a
//! channel to it and a oneshot back, and a pool checkout under a shared lock).
//!
//! Idle connections wait in a small pool per worker thread (a stack under a lock that worker
//! takes, most recently used on top, at most `max_idle` of them; a connection over the bound
//! is closed). A worker whose stack is empty takes one from another worker's before it opens
//! a new connection (tasks move between workers, so a connection is often given back on
//! another worker than the one that took it): a new connection is made only when no worker
//! has an idle one. An idle connection is not
//! polled while it waits, so a close by the upstream is seen when the connection is next
//! taken (it is then dropped and the next one tried) or by the sweep every
//! [`SWEEP_EVERY`], which also closes connections idle for longer than [`IDLE_TIMEOUT`].
//! A request that hyper hands back unsent (the connection turned out to be closed before it
//! was written) is retried on another connection; one already written is not (it may not be
//! idempotent), and its failure is the caller's 502.
//!
//! A request waits for its response head until a deadline (`upstream_timeout` from when the
//! proxy took it). The wait on a connection is timed by a timer the connection keeps, moved
//! on to each request's deadline: a deadline later than the last one only pushes the timer's
//! expiry on, without the wheel's lock, where a timer per request was put into the timer
//! wheel and taken out again (callgrind: about 380 fewer instructions a proxied request; the
//! reset itself costs about 200, see docs/benchmarks.md). A timer left behind by the last request fires at
//! most once and wakes that request's task for nothing; a connection's next request re-arms
//! it. A new connection is made under a timer of its own (rare: the pool keeps them).
//!
//! The response body ([`UpstreamBody`]) carries its connection back: polling it does the
//! connection's reads, so the response streams at the pace the client takes it (nothing is
//! read ahead of a slow client), and when it ends the connection returns to the pool; one
//! dropped before its end (the client went away) closes the connection, whose state is then
//! unknown. It lives here, beside the pool it returns to: it was `body.rs`, and the two files
//! imported each other.

use crate::http::util::BoxError;
use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// How often idle connections are checked for a close by the upstream and for age.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How long a connection may stay idle before the pool closes it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most idle connections one worker thread keeps.
pub const MAX_IDLE_PER_WORKER: usize = 128;

/// Sweeps an idle connection survives (its age in [`SWEEP_EVERY`] steps).
const IDLE_SWEEPS: u64 = IDLE_TIMEOUT.as_secs() / SWEEP_EVERY.as_secs();

/// What a request body sent upstream must be (the proxy sends the client's, with its
/// deadline).
pub(super) trait RequestBody:
    http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

impl<B> RequestBody for B where
    B: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

/// One upstream connection: the handle requests are sent on and the future that does its
/// reads and writes.
pub(super) struct UpstreamConn<B: RequestBody> {
    sender: SendRequest<B>,
    /// `None` once the connection is over (closed by either side, or broken).
    driver: Option<Connection<TokioIo<TcpStream>, B>>,
    /// Whether it served a request before (a request it hands back unsent is then retried).
    reused: bool,
    /// The timer of the request it serves, kept for the next one (see the module's doc);
    /// `None` until its first request.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B: RequestBody> UpstreamConn<B> {
    /// Does the connection's pending I/O (waking `cx` when there is more); false once the
    /// connection is over.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        drive(&mut self.driver, cx)
    }

    /// Whether it can take a request now, after doing its pending I/O.
    fn ready(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx) && self.sender.is_ready()
    }

    /// Sends `req` and waits for the response head until `deadline` (`None` past it), doing
    /// the connection's I/O meanwhile.
    async fn send(
        &mut self,
        req: Box<Request<B>>,
        deadline: Instant,
    ) -> Option<Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<B>>>> {
        let timer = match &mut self.timer {
            Some(timer) => {
                // Usually later than the last request's deadline (the same `upstream_timeout`
                // from a later instant): tokio then only pushes the expiry on. An earlier one
                // (a reload shortened it) or a fired timer is registered again.
                timer.as_mut().reset(deadline);
                timer
            }
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        let mut answer = std::pin::pin!(self.sender.try_send_request(*req));
        let driver = &mut self.driver;
        std::future::poll_fn(|cx| {
            drive(driver, cx);
            if let Poll::Ready(answer) = answer.as_mut().poll(cx) {
                return Poll::Ready(Some(answer));
            }
            timer.as_mut().poll(cx).map(|()| None)
        })
        .await
    }
}

/// Does a connection's pending I/O (waking `cx` when there is more); false once it is over
/// (`driver` is then `None`).
fn drive<B: RequestBody>(
    driver: &mut Option<Connection<TokioIo<TcpStream>, B>>,
    cx: &mut Context<'_>,
) -> bool {
    let Some(d) = driver else {
        return false;
    };
    match Pin::new(d).poll(cx) {
        Poll::Pending => true,
        Poll::Ready(ended) => {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "upstream connection ended");
            }
            *driver = None;
            false
        }
    }
}

/// A connection as the pool and the response bodies hold it: boxed once when it is made.
/// hyper's connection state (its buffers, its parser) is several hundred bytes, and a
/// connection moves several times a request (out of the pool, into the request's future,
/// into the response body, back into the pool); a box moves as one pointer.
pub(super) type Conn<B> = Box<UpstreamConn<B>>;

/// Why no response head came back.
#[derive(Debug)]
pub(super) enum Failure {
    /// No connection could be made.
    Connect(BoxError),
    /// Connected, but the exchange broke before a response head arrived.
    Exchange(hyper::Error),
    /// No response head by the deadline.
    Timeout,
}

/// Where the upstream is.
#[derive(Debug)]
enum Address {
    /// An IP address: connected to as it is.
    Socket(SocketAddr),
    /// A name, resolved on every new connection.
    Name(String, u16),
}

impl Address {
    fn of(authority: &Authority) -> Self {
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host();
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        match bare.parse::<IpAddr>() {
            Ok(ip) => Address::Socket(SocketAddr::new(ip, port)),
            Err(_) => Address::Name(bare.to_string(), port),
        }
    }
}

/// An idle connection and the sweep it was parked in.
struct Idle<B: RequestBody> {
    conn: Conn<B>,
    sweep: u64,
}

/// The idle connections of one worker thread, most recently used last.
type Shard<B> = Mutex<VecDeque<Idle<B>>>;

/// The connections to one upstream.
pub(super) struct Pool<B: RequestBody> {
    address: Address,
    builder: http1::Builder,
    shards: Box<[Shard<B>]>,
    max_idle: usize,
    /// Sweeps done so far.
    sweeps: AtomicU64,
}

/// Which shard a thread uses: threads are numbered in the order they first ask.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed);
}

fn lock<B: RequestBody>(shard: &Shard<B>) -> MutexGuard<'_, VecDeque<Idle<B>>> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B: RequestBody> Pool<B> {
    /// A pool for `authority` with one shard per worker (`workers`), each keeping at most
    /// `max_idle` idle connections. Inside a runtime, a task sweeps it every [`SWEEP_EVERY`]
    /// until the pool is dropped.
    pub(super) fn new(authority: &Authority, workers: usize, max_idle: usize) -> Arc<Self> {
        let pool = Arc::new(Self {
            address: Address::of(authority),
            builder: http1::Builder::new(),
            shards: (0..workers.max(1)).map(|_| Shard::default()).collect(),
            max_idle,
            sweeps: AtomicU64::new(0),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let pool = Arc::downgrade(&pool);
            rt.spawn(async move {
                let mut every = tokio::time::interval(SWEEP_EVERY);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                every.tick().await;
                loop {
                    every.tick().await;
                    let Some(pool) = pool.upgrade() else { break };
                    pool.sweep();
                }
            });
        }
        pool
    }

    /// This thread's shard.
    fn home(&self) -> usize {
        SHARD.with(|i| *i) % self.shards.len()
    }

    /// The most recently parked connection of another shard than `home`, from the first
    /// one (in turn after `home`) whose lock is free and that has one.
    fn steal(&self, home: usize) -> Option<Idle<B>> {
        let n = self.shards.len();
        (1..n).find_map(|k| match self.shards[(home + k) % n].try_lock() {
            Ok(mut shard) => shard.pop_back(),
            Err(TryLockError::Poisoned(p)) => p.into_inner().pop_back(),
            Err(TryLockError::WouldBlock) => None,
        })
    }

    /// Sends `req` on an idle connection, or a new one, and returns the response (its body
    /// gives the connection back when it ends), or [`Failure::Timeout`] when no response
    /// head has come by `deadline` (connecting included).
    ///
    /// The request comes boxed and goes down boxed to the connection: each future on its way
    /// (this one, the connection's) keeps its arguments for its whole life, so a request
    /// passed by value was held, and copied in, at every level (`size_of_val` in a release
    /// build: the proxied request's future was 2,320 bytes, see docs/benchmarks.md).
    pub(super) async fn send(
        self: &Arc<Self>,
        mut req: Box<Request<B>>,
        deadline: Instant,
    ) -> Result<Response<UpstreamBody<B>>, Failure> {
        loop {
            let idle = std::future::poll_fn(|cx| Poll::Ready(self.checkout(cx))).await;
            let mut conn = match idle {
                Some(conn) => conn,
                None => match tokio::time::timeout_at(deadline, self.connect()).await {
                    Ok(made) => made.map_err(Failure::Connect)?,
                    Err(_) => return Err(Failure::Timeout),
                },
            };
            // Past the deadline the connection is dropped with the request on it.
            let Some(sent) = conn.send(req, deadline).await else {
                return Err(Failure::Timeout);
            };
            match sent {
                Ok(resp) => return Ok(resp.map(|body| UpstreamBody::new(body, conn, self.clone()))),
                Err(mut e) => match e.take_message() {
                    // Never written: safe to send again, on another connection.
                    Some(unsent) if conn.reused => req = Box::new(unsent),
                    _ => return Err(Failure::Exchange(e.into_error())),
                },
            }
        }
    }

    /// The most recently parked idle connection of this thread's shard (or, when it has
    /// none, of another's) that can take a request; closed ones met on the way are dropped.
    fn checkout(&self, cx: &mut Context<'_>) -> Option<Conn<B>> {
        let home = self.home();
        loop {
            let idle = lock(&self.shards[home]).pop_back();
            let mut conn = idle.or_else(|| self.steal(home))?.conn;
            if conn.ready(cx) {
                return Some(conn);
            }
            tracing::debug!("an idle upstream connection was closed; trying the next");
        }
    }

    /// A new connection.
    async fn connect(&self) -> Result<Conn<B>, BoxError> {
        let stream = match &self.address {
            Address::Socket(addr) => TcpStream::connect(addr).await?,
            Address::Name(host, port) => TcpStream::connect((host.as_str(), *port)).await?,
        };
        stream.set_nodelay(true)?;
        tracing::debug!("new upstream connection");
        let (sender, driver) = self.builder.handshake(TokioIo::new(stream)).await?;
        Ok(Box::new(UpstreamConn {
            sender,
            driver: Some(driver),
            reused: false,
            timer: None,
        }))
    }

    /// Takes back a connection whose response has ended: kept if it can take another
    /// request and this thread's shard has room, closed otherwise.
    pub(super) fn put(&self, mut conn: Conn<B>) {
        // Polled with a waker that does nothing: the connection settles into its idle
        // state, and a close while it waits wakes no task (the next checkout sees it).
        if !conn.ready(&mut Context::from_waker(Waker::noop())) {
            tracing::debug!(
                open = conn.driver.is_some(),
                "an upstream connection cannot take another request; closed"
            );
            return;
        }
        conn.reused = true;
        let sweep = self.sweeps.load(Ordering::Relaxed);
        let mut shard = lock(&self.shards[self.home()]);
        if shard.len() < self.max_idle {
            shard.push_back(Idle { conn, sweep });
            return;
        }
        drop(shard);
        drop(conn);
    }

    /// Closes the idle connections the upstream closed and those idle for too long.
    fn sweep(&self) {
        let now = self.sweeps.fetch_add(1, Ordering::Relaxed) + 1;
        let mut cx = Context::from_waker(Waker::noop());
        for shard in self.shards.iter() {
            lock(shard)
                .retain_mut(|idle| now - idle.sweep < IDLE_SWEEPS && idle.conn.ready(&mut cx));
        }
    }

    /// Idle connections in all shards.
    #[cfg(test)]
    pub(super) fn idle(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }
}

/// A response body from the upstream, with the connection it arrives on.
pub(crate) struct UpstreamBody<B: RequestBody> {
    body: Incoming,
    /// `None` once given back (the body ended) or broken.
    conn: Option<Conn<B>>,
    pool: Arc<Pool<B>>,
}

impl<B: RequestBody> UpstreamBody<B> {
    pub(super) fn new(body: Incoming, conn: Conn<B>, pool: Arc<Pool<B>>) -> Self {
        Self {
            body,
            conn: Some(conn),
            pool,
        }
    }

    /// The body is over: the connection may serve another request.
    fn ended(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put(conn);
        }
    }
}

impl<B: RequestBody> Body for UpstreamBody<B> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let mut drove = false;
        loop {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if frame.is_trailers() || this.body.is_end_stream() {
                        this.ended();
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(e))) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(None) => {
                    this.ended();
                    return Poll::Ready(None);
                }
                // Nothing buffered: read from the connection once, then look again.
                Poll::Pending if !drove => {
                    drove = true;
                    match &mut this.conn {
                        Some(conn) => {
                            conn.drive(cx);
                        }
                        None => return Poll::Pending,
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B: RequestBody> Drop for UpstreamBody<B> {
    fn drop(&mut self) {
        // hyper's server drops a body without polling it to `None` once it reports its end
        // (or has none, as for HEAD or a 204): that end counts too.
        if self.body.is_end_stream() {
            self.ended();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::watch;

    /// A loopback upstream that answers `ok` to every request on a connection, counting the
    /// connections it accepted and those that ended; a change of `close` makes it close
    /// every connection it holds (without a word, as an upstream's idle timeout does).
    struct Upstream {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        ended: Arc<AtomicUsize>,
        close: watch::Sender<u64>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Upstream {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Upstream {
        async fn start() -> Upstream {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let accepted = Arc::new(AtomicUsize::new(0));
            let ended = Arc::new(AtomicUsize::new(0));
            let (close, closing) = watch::channel(0);
            let (a, e) = (accepted.clone(), ended.clone());
            let task = tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    a.fetch_add(1, Ordering::SeqCst);
                    let (e, mut closing) = (e.clone(), closing.clone());
                    closing.mark_unchanged();
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = answer_ok(stream) => {}
                            _ = closing.changed() => {}
                        }
                        e.fetch_add(1, Ordering::SeqCst);
                    });
                }
            });
            Upstream {
                addr,
                accepted,
                ended,
                close,
                task,
            }
        }

        fn accepted(&self) -> usize {
            self.accepted.load(Ordering::SeqCst)
        }

        /// Waits (bounded) until `n` connections have ended; returns how many have.
        async fn ended(&self, n: usize) -> usize {
            for _ in 0..500 {
                if self.ended.load(Ordering::SeqCst) >= n {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.ended.load(Ordering::SeqCst)
        }

        fn close_all(&self) {
            self.close.send_modify(|n| *n += 1);
        }
    }

    /// Answers every request head on `stream` with a 2-byte `ok` (requests have no body).
    async fn answer_ok(stream: TcpStream) {
        answer_first(stream, usize::MAX).await;
    }

    /// Answers the first `answered` request heads on `stream` with a 2-byte `ok` and reads
    /// the rest without a word, until the peer closes.
    async fn answer_first(mut stream: TcpStream, answered: usize) {
        let (mut buf, mut chunk, mut done) = (Vec::new(), [0u8; 1024], 0);
        loop {
            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                if done < answered {
                    done += 1;
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(ok).await.is_err() {
                        return;
                    }
                }
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    fn pool_to(up: &Upstream, max_idle: usize) -> Arc<Pool<Empty<Bytes>>> {
        let authority: Authority = up.addr.to_string().parse().expect("authority");
        Pool::new(&authority, 1, max_idle)
    }

    async fn get(pool: &Arc<Pool<Empty<Bytes>>>) -> Response<UpstreamBody<Empty<Bytes>>> {
        get_within(pool, Duration::from_secs(10))
            .await
            .expect("the upstream answers within 10 s")
    }

    async fn get_within(
        pool: &Arc<Pool<Empty<Bytes>>>,
        limit: Duration,
    ) -> Result<Response<UpstreamBody<Empty<Bytes>>>, Failure> {
        let req = Request::builder()
            .uri("/")
            .header(http::header::HOST, "up")
            .body(Empty::new())
            .expect("request");
        pool.send(Box::new(req), Instant::now() + limit).await
    }

    /// An upstream that answers the first `answered` requests of its one connection at
    /// once and never the rest (it reads them and waits); the task ends with the test.
    async fn answers_then_stalls(answered: usize) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            if let Ok((stream, _)) = listener.accept().await {
                answer_first(stream, answered).await;
            }
        });
        (addr, task)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_s_timer_moves_to_each_request_s_deadline_earlier_or_later() {
        let (addr, task) = answers_then_stalls(2).await;
        let authority: Authority = addr.to_string().parse().expect("authority");
        let pool = Pool::<Empty<Bytes>>::new(&authority, 1, 4);
        // The first request arms the connection's timer 50 ms out; it passes while the
        // connection is idle (the timer fires with nobody waiting).
        let first = get_within(&pool, Duration::from_millis(50)).await;
        let body = first.expect("answered").into_body().collect().await;
        assert_eq!(&body.expect("body").to_bytes()[..], b"ok");
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(pool.idle(), 1);
        // A fired timer is re-armed: the second request has its whole 10 s.
        let second = get_within(&pool, Duration::from_secs(10)).await;
        let body = second.expect("answered").into_body().collect().await;
        assert_eq!(&body.expect("body").to_bytes()[..], b"ok");
        // An earlier deadline than the one armed (a reload that shortened
        // upstream_timeout): the third request, never answered, ends at its own 150 ms.
        let start = std::time::Instant::now();
        let third = get_within(&pool, Duration::from_millis(150)).await;
        let took = start.elapsed();
        assert!(
            matches!(third, Err(Failure::Timeout)),
            "the third request: {}",
            match &third {
                Ok(_) => "answered".to_string(),
                Err(e) => format!("{e:?}"),
            }
        );
        assert!(
            took >= Duration::from_millis(150) && took < Duration::from_secs(5),
            "timed out after {took:?}"
        );
        // The connection with its request still on it is not kept.
        assert_eq!(pool.idle(), 0);
        task.abort();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_longest_timeout_an_operator_can_write_is_a_deadline_not_a_panic() {
        // `upstream_timeout` parses up to u64::MAX microseconds; the deadline is that far
        // from now, and the answer comes as from any other.
        let up = Upstream::start().await;
        let pool = pool_to(&up, 4);
        for _ in 0..2 {
            let resp = get_within(&pool, Duration::from_micros(u64::MAX)).await;
            let body = resp.expect("answered").into_body().collect().await;
            assert_eq!(&body.expect("body").to_bytes()[..], b"ok");
        }
        assert_eq!(
            up.accepted(),
            1,
            "the second on the first's connection and timer"
        );
    }

    async fn get_ok(pool: &Arc<Pool<Empty<Bytes>>>) {
        let body = get(pool).await.into_body().collect().await;
        assert_eq!(&body.expect("body").to_bytes()[..], b"ok");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn sequential_requests_reuse_one_connection() {
        let up = Upstream::start().await;
        let pool = pool_to(&up, 4);
        for _ in 0..10 {
            get_ok(&pool).await;
        }
        assert_eq!(up.accepted(), 1);
        assert_eq!(pool.idle(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_pool_keeps_at_most_max_idle_connections_and_closes_the_rest() {
        let up = Upstream::start().await;
        let pool = pool_to(&up, 2);
        // Five responses in flight at once: five connections.
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(get(&pool).await);
        }
        assert_eq!(up.accepted(), 5);
        for resp in held {
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(&body[..], b"ok");
        }
        assert_eq!(pool.idle(), 2);
        assert_eq!(up.ended(3).await, 3, "the three over the bound are closed");
        // The two kept serve what follows.
        for _ in 0..4 {
            get_ok(&pool).await;
        }
        assert_eq!(up.accepted(), 5);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_response_dropped_before_its_end_closes_its_connection() {
        let up = Upstream::start().await;
        let pool = pool_to(&up, 4);
        let resp = get(&pool).await;
        assert!(!http_body::Body::is_end_stream(resp.body()));
        drop(resp);
        assert_eq!(pool.idle(), 0);
        assert_eq!(up.ended(1).await, 1);
        get_ok(&pool).await;
        assert_eq!(up.accepted(), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_the_upstream_closed_while_idle_is_replaced_by_a_new_one() {
        let up = Upstream::start().await;
        let pool = pool_to(&up, 4);
        get_ok(&pool).await;
        up.close_all();
        assert_eq!(up.ended(1).await, 1);
        get_ok(&pool).await;
        assert_eq!(up.accepted(), 2);
        assert_eq!(pool.idle(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_sweep_closes_connections_idle_too_long_and_those_the_upstream_closed() {
        let up = Upstream::start().await;
        let pool = pool_to(&up, 4);
        get_ok(&pool).await;
        for _ in 1..IDLE_SWEEPS {
            pool.sweep();
        }
        assert_eq!(pool.idle(), 1, "young enough to keep");
        pool.sweep();
        assert_eq!(pool.idle(), 0, "idle for IDLE_TIMEOUT");
        assert_eq!(up.ended(1).await, 1);
        get_ok(&pool).await;
        up.close_all();
        assert_eq!(up.ended(2).await, 2);
        // Fewer sweeps than age alone needs: the close is what drops it.
        for _ in 1..IDLE_SWEEPS {
            // Lets the runtime's I/O driver see the close.
            tokio::time::sleep(Duration::from_millis(20)).await;
            pool.sweep();
            if pool.idle() == 0 {
                break;
            }
        }
        assert_eq!(pool.idle(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_worker_without_idle_connections_takes_another_workers() {
        let up = Upstream::start().await;
        let authority: Authority = up.addr.to_string().parse().expect("authority");
        let pool: Arc<Pool<Empty<Bytes>>> = Pool::new(&authority, 3, 4);
        get_ok(&pool).await;
        // As if the connection had been given back on another worker.
        let home = pool.home();
        let idle = lock(&pool.shards[home]).pop_back().expect("parked at home");
        lock(&pool.shards[(home + 2) % 3]).push_back(idle);
        get_ok(&pool).await;
        assert_eq!(up.accepted(), 1);
        assert_eq!(lock(&pool.shards[home]).len(), 1, "given back at home");
    }

    #[test]
    fn an_address_is_an_ip_or_a_name_with_port_80_by_default() {
        let of = |s: &str| format!("{:?}", Address::of(&s.parse().expect("authority")));
        assert_eq!(of("127.0.0.1:3000"), "Socket(127.0.0.1:3000)");
        assert_eq!(of("[::1]:8080"), "Socket([::1]:8080)");
        assert_eq!(of("backend"), "Name(\"backend\", 80)");
        assert_eq!(of("backend.internal:81"), "Name(\"backend.internal\", 81)");
    }
}
