//! The upstream connections: HTTP/1.1 connections of the gateway's own (`h1.rs` writes and
//! reads the messages), each driven by the task of the downstream request it serves, never by
//! a task of its own. The request is written, its body streamed and the response read from
//! the downstream connection's task, so a proxied request costs no hand-off to another task
//! and back (which is what hyper-util's pooled client does: a connection task per upstream
//! connection, a channel to it and a oneshot back, and a pool checkout under a shared lock).
//! Until 2026-12-05 they were hyper's `client::conn::http1` connections, driven the same way;
//! hyper's dispatch between its handle and its connection, its response parser and its body
//! channel were a third of a proxied request's instructions (see docs/benchmarks.md).
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
//! A request whose head could not be written at all on a connection used before (it turned
//! out to be closed) is retried on another connection; one written is not (it may not be
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
//! The request's body is sent while the response is read, and after its head has come: an
//! upstream may answer as the body arrives (the response's body then drives the rest of the
//! request's). The response body ([`UpstreamBody`]) carries its connection back: polling it
//! does the connection's reads, so the response streams at the pace the client takes it
//! (nothing is read ahead of a slow client), and when it ends the connection returns to the
//! pool if it can serve another request (see `h1.rs`; and the request's body was sent whole,
//! and nothing came after the response); one dropped before its end (the client went away)
//! closes the connection, whose state is then unknown.

use super::h1::{self, Chunked, Incoming, Malformed, Outgoing, Read, Step};
use crate::http::util::BoxError;
use bytes::{Bytes, BytesMut};
use http::uri::Authority;
use http::{HeaderMap, Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::AsyncWrite;
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

/// The least room a read is given (hyper's first read buffer size).
const READ_ROOM: usize = 8 * 1024;

/// The most room a read is given: a read that fills its room doubles the next one's, up to
/// this (a large body is read in fewer, larger reads).
const MAX_READ_ROOM: usize = 64 * 1024;

/// The most bytes of a request's body held to be written: more waits for the upstream to
/// take what is held.
const OUT_ROOM: usize = 64 * 1024;

/// What a request body sent upstream must be (the proxy sends the client's, with its
/// deadline).
pub(super) trait RequestBody:
    http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static
{
}

impl<B> RequestBody for B where
    B: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static
{
}

/// One upstream connection: its socket, what was read and not yet taken, what is to be
/// written, and the request body still being sent.
pub(super) struct UpstreamConn<B: RequestBody> {
    io: TcpStream,
    read: BytesMut,
    /// The room the next read is given (from [`READ_ROOM`] up to [`MAX_READ_ROOM`]).
    room: usize,
    /// Bytes to write, of which `written` are.
    out: Vec<u8>,
    written: usize,
    /// The request body still to send, and how it is framed (`None` once sent whole).
    sending: Option<(B, Outgoing)>,
    /// Its reader of response heads (the names the upstream's earlier heads had).
    heads: h1::HeadReader,
    /// False once the connection cannot serve another request: closed, broken, a response
    /// framed by its close, a request body not sent whole.
    usable: bool,
    /// Whether it served a request before (a request it could not write at all is then
    /// retried).
    reused: bool,
    /// The timer of the request it serves, kept for the next one (see the module's doc);
    /// `None` until its first request.
    timer: Option<Pin<Box<Sleep>>>,
}

/// Why an exchange failed.
#[derive(Debug)]
pub(super) enum ExchangeError {
    /// The socket failed, or closed before the response's end.
    Io(io::Error),
    /// The upstream's response broke HTTP/1.1.
    Malformed(Malformed),
    /// The request's body failed (the client's fault: the proxy answers that first).
    Body(BoxError),
}

impl std::fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExchangeError::Io(e) => write!(f, "upstream connection: {e}"),
            ExchangeError::Malformed(e) => e.fmt(f),
            ExchangeError::Body(e) => write!(f, "request body: {e}"),
        }
    }
}

impl std::error::Error for ExchangeError {}

/// How a send ended before a response head.
enum Unanswered<B> {
    /// Nothing of the request was written: it may go on another connection.
    Unsent(Box<Request<B>>),
    Failed(ExchangeError),
}

fn closed_early() -> ExchangeError {
    ExchangeError::Io(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the upstream closed the connection before the response's end",
    ))
}

impl<B: RequestBody> UpstreamConn<B> {
    fn new(io: TcpStream) -> Self {
        Self {
            io,
            read: BytesMut::new(),
            room: READ_ROOM,
            out: Vec::new(),
            written: 0,
            sending: None,
            heads: h1::HeadReader::default(),
            usable: true,
            reused: false,
            timer: None,
        }
    }

    /// Whether it can take a request now: it is usable, and the upstream has neither closed
    /// it nor sent anything unasked. Looked at without waiting and without a waker: the
    /// socket is read only when the runtime saw it become readable (a close, or bytes).
    fn ready(&mut self) -> bool {
        if !self.idle() {
            return false;
        }
        let mut probe = [0u8; 1];
        match self.io.try_read(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
            // Closed, unasked bytes, or an error.
            _ => {
                self.usable = false;
                false
            }
        }
    }

    /// Lets go of buffers a large exchange grew (a download read in reads of up to
    /// [`MAX_READ_ROOM`], an upload written in pieces of up to [`OUT_ROOM`]), so that an idle
    /// connection holds at most the room of an ordinary exchange: the pool keeps up to
    /// [`MAX_IDLE_PER_WORKER`] of them a worker.
    fn shed(&mut self) {
        if self.read.capacity() > 2 * READ_ROOM {
            self.read = BytesMut::new();
        }
        self.room = READ_ROOM;
        if self.out.capacity() > 2 * READ_ROOM {
            self.out = Vec::new();
        }
    }

    /// The bytes its buffers hold room for.
    #[cfg(test)]
    fn buffered(&self) -> usize {
        self.read.capacity() + self.out.capacity()
    }

    /// Whether, as far as this side knows, it can take another request: usable, its last
    /// request's body sent whole and nothing read past its last response.
    fn idle(&self) -> bool {
        self.usable && self.read.is_empty() && self.sending.is_none()
    }

    /// Writes what is held and what of the request's body is ready, as far as the socket
    /// takes it. A write that fails ends the sending (the upstream may still answer: it
    /// often closes its side after an early answer); a body that fails is an error.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Result<(), ExchangeError> {
        loop {
            while self.written < self.out.len() {
                match Pin::new(&mut self.io).poll_write(cx, &self.out[self.written..]) {
                    Poll::Ready(Ok(n)) if n > 0 => self.written += n,
                    Poll::Pending => return Ok(()),
                    Poll::Ready(_) => {
                        self.usable = false;
                        self.sending = None;
                        self.out.clear();
                        self.written = 0;
                        return Ok(());
                    }
                }
            }
            self.out.clear();
            self.written = 0;
            let Some((body, framing)) = &mut self.sending else {
                return Ok(());
            };
            while self.out.len() < OUT_ROOM {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Pending => break,
                    Poll::Ready(None) => {
                        match *framing {
                            Outgoing::Chunked => self.out.extend_from_slice(h1::LAST_CHUNK),
                            // Shorter than its length: the upstream waits for the rest.
                            Outgoing::Length(left) if left > 0 => self.usable = false,
                            _ => {}
                        }
                        self.sending = None;
                        break;
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        let Ok(data) = frame.into_data() else {
                            continue;
                        };
                        match framing {
                            Outgoing::Chunked if !data.is_empty() => {
                                h1::write_chunk(&data, &mut self.out)
                            }
                            Outgoing::Length(left) => {
                                let n = (data.len() as u64).min(*left);
                                self.out.extend_from_slice(&data[..n as usize]);
                                *left -= n;
                            }
                            _ => {}
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        self.usable = false;
                        self.sending = None;
                        return Err(ExchangeError::Body(e.into()));
                    }
                }
            }
            if self.out.is_empty() {
                return Ok(());
            }
        }
    }

    /// Reads more into the read buffer: the count (0: the upstream closed).
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < self.room / 2 {
            self.read.reserve(self.room);
        }
        let spare = self.read.capacity() - self.read.len();
        let read = tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.read);
        match read {
            Poll::Ready(Ok(0) | Err(_)) => self.usable = false,
            Poll::Ready(Ok(n)) if n == spare => self.room = (self.room * 2).min(MAX_READ_ROOM),
            _ => {}
        }
        read
    }

    /// Sends `req`, with `fields` (whole header lines) after its own, and waits for the
    /// response head until `deadline` (`None` past it), doing the connection's writes
    /// meanwhile.
    async fn send(
        &mut self,
        req: Box<Request<B>>,
        fields: &[u8],
        deadline: Instant,
    ) -> Option<Result<Box<h1::ResponseHead>, Unanswered<B>>> {
        let mut timer = match self.timer.take() {
            Some(mut timer) => {
                // Usually later than the last request's deadline (the same `upstream_timeout`
                // from a later instant): tokio then only pushes the expiry on. An earlier one
                // (a reload shortened it) or a fired timer is registered again.
                timer.as_mut().reset(deadline);
                timer
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        let (mut parts, body) = (*req).into_parts();
        let framing = h1::frame_request(
            &parts.method,
            &mut parts.headers,
            body.is_end_stream(),
            body.size_hint().exact(),
        );
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        self.out.clear();
        self.written = 0;
        h1::write_request_head(&parts.method, target, &parts.headers, fields, &mut self.out);
        // The head's first write, apart: a connection used before that takes none of it was
        // closed, and the request may go on another one.
        let first = {
            let (io, out) = (&mut self.io, &self.out);
            std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, out)).await
        };
        match first {
            Ok(n) if n > 0 => self.written = n,
            failed => {
                self.usable = false;
                if self.reused {
                    let req = Request::from_parts(parts, body);
                    return Some(Err(Unanswered::Unsent(Box::new(req))));
                }
                let e = failed
                    .err()
                    .unwrap_or_else(|| io::Error::from(io::ErrorKind::WriteZero));
                return Some(Err(Unanswered::Failed(ExchangeError::Io(e))));
            }
        }
        if framing != Outgoing::None {
            self.sending = Some((body, framing));
        }
        let method = parts.method;
        // The request's map, written, holds the response's fields (its room reused).
        let mut map = Some(parts.headers);
        let answer = std::future::poll_fn(|cx| {
            if let Err(e) = self.poll_send(cx) {
                return Poll::Ready(Some(Err(e)));
            }
            match self.poll_head(cx, &method, &mut map) {
                Poll::Ready(head) => Poll::Ready(Some(head)),
                Poll::Pending => timer.as_mut().poll(cx).map(|()| None),
            }
        })
        .await;
        self.timer = Some(timer);
        Some(answer?.map_err(Unanswered::Failed))
    }

    /// Reads until a response head (to a `method` request) is whole, its fields in `map`
    /// (taken; a new one when there is none).
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
        map: &mut Option<HeaderMap>,
    ) -> Poll<Result<Box<h1::ResponseHead>, ExchangeError>> {
        loop {
            if !self.read.is_empty() {
                let into = map.take().unwrap_or_default();
                match self.heads.read(&mut self.read, method, into) {
                    Ok(Read::Head(head)) => {
                        if !head.keep_alive {
                            self.usable = false;
                        }
                        return Poll::Ready(Ok(head));
                    }
                    Ok(Read::Partial(unused)) => *map = Some(unused),
                    Err(e) => {
                        self.usable = false;
                        return Poll::Ready(Err(ExchangeError::Malformed(e)));
                    }
                }
            }
            match std::task::ready!(self.poll_read(cx)) {
                Ok(0) => return Poll::Ready(Err(closed_early())),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(ExchangeError::Io(e))),
            }
        }
    }
}

/// A connection as the pool and the response bodies hold it: boxed once when it is made.
/// Its state (its buffers, its names) is a few hundred bytes, and a connection moves several
/// times a request (out of the pool, into the request's future, into the response body, back
/// into the pool); a box moves as one pointer.
pub(super) type Conn<B> = Box<UpstreamConn<B>>;

/// Why no response head came back.
#[derive(Debug)]
pub(super) enum Failure {
    /// No connection could be made.
    Connect(BoxError),
    /// Connected, but the exchange broke before a response head arrived.
    Exchange(ExchangeError),
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
        fields: Vec<u8>,
        deadline: Instant,
    ) -> Result<Response<UpstreamBody<B>>, Failure> {
        loop {
            let mut conn = match self.checkout() {
                Some(conn) => conn,
                None => match tokio::time::timeout_at(deadline, self.connect()).await {
                    Ok(made) => made.map_err(Failure::Connect)?,
                    Err(_) => return Err(Failure::Timeout),
                },
            };
            // Past the deadline the connection is dropped with the request on it.
            let Some(sent) = conn.send(req, &fields, deadline).await else {
                return Err(Failure::Timeout);
            };
            match sent {
                Ok(head) => {
                    let head = *head;
                    let mut resp = Response::new(UpstreamBody::new(head.body, conn, self.clone()));
                    *resp.status_mut() = head.status;
                    *resp.version_mut() = head.version;
                    *resp.headers_mut() = head.headers;
                    if let Some(reason) = head.reason {
                        if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(reason) {
                            resp.extensions_mut().insert(reason);
                        }
                    }
                    return Ok(resp);
                }
                // Never written: safe to send again, on another connection.
                Err(Unanswered::Unsent(unsent)) => req = unsent,
                Err(Unanswered::Failed(e)) => return Err(Failure::Exchange(e)),
            }
        }
    }

    /// The most recently parked idle connection of this thread's shard (or, when it has
    /// none, of another's) that can take a request; closed ones met on the way are dropped.
    fn checkout(&self) -> Option<Conn<B>> {
        let home = self.home();
        loop {
            let idle = lock(&self.shards[home]).pop_back();
            let mut conn = idle.or_else(|| self.steal(home))?.conn;
            if conn.ready() {
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
        Ok(Box::new(UpstreamConn::new(stream)))
    }

    /// Takes back a connection whose response has ended: kept if it can take another
    /// request and this thread's shard has room, closed otherwise.
    pub(super) fn put(&self, mut conn: Conn<B>) {
        // Not read here: a close while it waits is seen by the next checkout or sweep.
        if !conn.idle() {
            tracing::debug!("an upstream connection cannot take another request; closed");
            return;
        }
        conn.reused = true;
        conn.shed();
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
        for shard in self.shards.iter() {
            lock(shard).retain_mut(|idle| now - idle.sweep < IDLE_SWEEPS && idle.conn.ready());
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
    /// What is left to read of it.
    left: Left,
    /// `None` once given back (the body ended) or broken.
    conn: Option<Conn<B>>,
    pool: Arc<Pool<B>>,
}

/// What is left of a response body.
enum Left {
    /// This many bytes, more than none (the body is `Done` once they are read).
    Length(u64),
    Chunked(Chunked),
    /// Everything up to the close.
    Close,
    /// Nothing: it is over.
    Done,
}

impl<B: RequestBody> UpstreamBody<B> {
    fn new(framing: Incoming, conn: Conn<B>, pool: Arc<Pool<B>>) -> Self {
        let left = match framing {
            Incoming::Empty | Incoming::Length(0) => Left::Done,
            Incoming::Length(n) => Left::Length(n),
            Incoming::Chunked => Left::Chunked(Chunked::default()),
            Incoming::Close => Left::Close,
        };
        Self {
            left,
            conn: Some(conn),
            pool,
        }
    }

    /// The body is over: the connection may serve another request, if the request's body
    /// was sent whole and nothing came after the response.
    fn ended(&mut self) {
        self.left = Left::Done;
        if let Some(conn) = self.conn.take() {
            // A request body still being sent (the upstream answered before its end) or bytes
            // after the response: `put` closes it.
            self.pool.put(conn);
        }
    }

    /// The next frame from what is read already, if any; `Ok(None)` when more must be read.
    fn take(&mut self) -> Result<Option<Frame<Bytes>>, ExchangeError> {
        let Some(conn) = &mut self.conn else {
            return Ok(None);
        };
        let frame = match &mut self.left {
            Left::Done => return Ok(None),
            Left::Length(left) => {
                if conn.read.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(conn.read.len());
                *left -= n as u64;
                let data = conn.read.split_to(n).freeze();
                if *left == 0 {
                    self.ended();
                }
                Frame::data(data)
            }
            Left::Close => {
                if conn.read.is_empty() {
                    return Ok(None);
                }
                Frame::data(conn.read.split().freeze())
            }
            Left::Chunked(chunked) => match chunked
                .step(&mut conn.read)
                .map_err(ExchangeError::Malformed)?
            {
                Step::Data(data) => Frame::data(data),
                Step::Trailers(trailers) => {
                    self.ended();
                    Frame::trailers(trailers)
                }
                Step::End => {
                    self.ended();
                    return Ok(None);
                }
                Step::More => return Ok(None),
            },
        };
        Ok(Some(frame))
    }

    /// A failure: the connection is closed, and the body reports it.
    fn broke(&mut self, e: ExchangeError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.conn = None;
        self.left = Left::Done;
        Poll::Ready(Some(Err(Box::new(e))))
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
        loop {
            match this.take() {
                Ok(Some(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(None) => {}
                Err(e) => return this.broke(e),
            }
            let Some(conn) = &mut this.conn else {
                return Poll::Ready(None);
            };
            if matches!(this.left, Left::Done) {
                this.ended();
                return Poll::Ready(None);
            }
            // The request's body may still be going: the upstream may wait for it.
            if let Err(e) = conn.poll_send(cx) {
                return this.broke(e);
            }
            match std::task::ready!(conn.poll_read(cx)) {
                Ok(0) if matches!(this.left, Left::Close) => {
                    this.ended();
                    return Poll::Ready(None);
                }
                Ok(0) => return this.broke(closed_early()),
                Ok(_) => {}
                Err(e) => return this.broke(ExchangeError::Io(e)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.left, Left::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Left::Done => SizeHint::with_exact(0),
            Left::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

impl<B: RequestBody> Drop for UpstreamBody<B> {
    fn drop(&mut self) {
        // hyper's server drops a body without polling it to `None` once it reports its end
        // (or has none, as for HEAD or a 204): that end counts too.
        if self.is_end_stream() {
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
        pool.send(Box::new(req), Vec::new(), Instant::now() + limit)
            .await
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

    /// A request body that gives one piece, then waits forever (a client that stopped
    /// sending).
    struct Stalled(Option<Bytes>);

    impl Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.0.take() {
                Some(piece) => Poll::Ready(Some(Ok(Frame::data(piece)))),
                None => Poll::Pending,
            }
        }
    }

    /// A loopback upstream that reads each request's head only (requests here have no body)
    /// and writes what `answer` makes of it: given the connection's number (from 0), how many
    /// heads that connection answered before, and the head.
    struct Scripted {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        heads: Arc<AtomicUsize>,
        _task: tokio::task::JoinHandle<()>,
    }

    async fn scripted(answer: fn(usize, usize, &str) -> Vec<u8>) -> Scripted {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (accepted, heads) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, h) = (accepted.clone(), heads.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (conn, h) = (a.fetch_add(1, Ordering::SeqCst), h.clone());
                tokio::spawn(async move {
                    let (mut buf, mut chunk, mut served) = (Vec::new(), [0u8; 1024], 0);
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                            buf.drain(..end + 4);
                            h.fetch_add(1, Ordering::SeqCst);
                            let bytes = answer(conn, served, &head);
                            served += 1;
                            if stream.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        Scripted {
            addr,
            accepted,
            heads,
            _task: task,
        }
    }

    /// A 2-byte `ok`.
    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// An upstream that answers a `HEAD` with the length its `GET` would have and no body,
    /// and anything else `ok`: the first `GET` after a `HEAD` shows whether the `HEAD`'s
    /// answer was taken to have a body.
    async fn answers_heads() -> Scripted {
        scripted(|_, _, head| {
            if head.starts_with("HEAD ") {
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_vec()
            } else {
                OK.to_vec()
            }
        })
        .await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_before_the_request_body_ends_closes_the_connection_after_it() {
        let up = answers_heads().await;
        let authority: Authority = up.addr.to_string().parse().expect("authority");
        let pool: Arc<Pool<Stalled>> = Pool::new(&authority, 1, 4);
        let req = Request::post("/")
            .header(http::header::HOST, "up")
            .header(http::header::CONTENT_LENGTH, "100")
            .body(Stalled(Some(Bytes::from_static(b"the first ten"))))
            .expect("request");
        let deadline = Instant::now() + Duration::from_secs(10);
        let resp = pool
            .send(Box::new(req), Vec::new(), deadline)
            .await
            .expect("an answer");
        let body = resp.into_body().collect().await.expect("a body").to_bytes();
        assert_eq!(&body[..], b"ok");
        assert_eq!(up.heads.load(Ordering::SeqCst), 1);
        // The upstream would read the rest of the body as the next request's head.
        assert_eq!(
            pool.idle(),
            0,
            "a connection whose request body was cut is closed"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_head_answer_has_no_body_whatever_its_length_and_the_connection_serves_on() {
        let up = answers_heads().await;
        let authority: Authority = up.addr.to_string().parse().expect("authority");
        let pool: Arc<Pool<Empty<Bytes>>> = Pool::new(&authority, 1, 4);
        let deadline = || Instant::now() + Duration::from_secs(10);
        for (i, method) in [
            http::Method::HEAD,
            http::Method::GET,
            http::Method::HEAD,
            http::Method::GET,
        ]
        .into_iter()
        .enumerate()
        {
            let req = Request::builder()
                .method(method.clone())
                .uri("/")
                .header(http::header::HOST, "up")
                .body(Empty::new())
                .expect("request");
            let resp = pool
                .send(Box::new(req), Vec::new(), deadline())
                .await
                .expect("an answer");
            assert_eq!(
                resp.headers()["content-length"],
                if method == http::Method::HEAD {
                    "5"
                } else {
                    "2"
                }
            );
            let body = resp.into_body().collect().await.expect("a body").to_bytes();
            let want: &[u8] = if method == http::Method::HEAD {
                b""
            } else {
                b"ok"
            };
            assert_eq!(&body[..], want, "request {i}");
            assert_eq!(pool.idle(), 1, "request {i}: the connection is kept");
        }
        assert_eq!(up.heads.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn bytes_after_a_response_s_end_are_never_the_next_request_s_answer() {
        // An upstream that splits its first answer: a whole response, then in the same write
        // a second one nobody asked for. Its connections' later requests are answered `ok`.
        let up = scripted(|conn, served, _| {
            if conn == 0 && served == 0 {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok\
                  HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nevil"
                    .to_vec()
            } else {
                OK.to_vec()
            }
        })
        .await;
        let authority: Authority = up.addr.to_string().parse().expect("authority");
        let pool: Arc<Pool<Empty<Bytes>>> = Pool::new(&authority, 1, 4);
        for i in 0..3 {
            let resp = get(&pool).await;
            let body = resp.into_body().collect().await.expect("a body").to_bytes();
            assert_eq!(&body[..], b"ok", "request {i}");
        }
        assert_eq!(
            up.accepted.load(Ordering::SeqCst),
            2,
            "the split connection is closed, the next one kept"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_idle_connection_keeps_no_more_room_than_an_ordinary_exchange_needs() {
        // A 1 MiB answer grows the connection's reads to their largest; parked, it lets go.
        const BIG: usize = 1 << 20;
        let up = scripted(|_, _, _| {
            let mut answer =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n").into_bytes();
            answer.resize(answer.len() + BIG, b'x');
            answer
        })
        .await;
        let authority: Authority = up.addr.to_string().parse().expect("authority");
        let pool: Arc<Pool<Empty<Bytes>>> = Pool::new(&authority, 1, 4);
        let mut body = get(&pool).await.into_body();
        let (mut got, mut largest) = (0, 0);
        while let Some(frame) = body.frame().await {
            let data = frame.expect("a frame").into_data().unwrap_or_default();
            largest = largest.max(data.len());
            got += data.len();
        }
        drop(body);
        assert_eq!(got, BIG);
        assert!(largest > READ_ROOM, "reads grew: {largest}");
        let idle = lock(&pool.shards[0]).pop_back().expect("kept");
        assert!(
            idle.conn.buffered() <= 2 * READ_ROOM,
            "{} bytes of room",
            idle.conn.buffered()
        );
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
