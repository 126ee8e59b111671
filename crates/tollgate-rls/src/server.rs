//! The listener: each accepted connection ([`crate::incoming`]) served by the `h2` crate's
//! HTTP/2 server, its streams by [`crate::calls`]; on shutdown, no new connection and every
//! open one drained.
//!
//! Each stream's call runs in a task of its own, as under hyper's HTTP/2 server, but without
//! hyper's layer around `h2` (its service call, its body wrappers, its copy of the request's
//! parts, its keep-alive recorder taking a lock on every frame received), and boxed before it
//! is spawned (spawning moves a future several times on its way into its task; a box moves as
//! a pointer). Under the rls section's load (docs/benchmarks.md), callgrind counts 49,737 to
//! 46,088 instructions an answer with one descriptor and 85,129 to 81,420 with ten. Running a
//! connection's calls inside the connection's own task instead, in a set of futures, counted
//! fewer still (45,893) but cost more CPU: Redis batches shrank from about 29 plans a script
//! call to 11 (why, this was not traced), so the gateway made more store calls and system
//! calls (9.1 µs a decision against 8.2 on hyper's server).
//!
//! What a client sees is what it saw on hyper's server (the tests in `tests/` hold it):
//! - the HTTP/2 settings hyper used: at most [`MAX_STREAMS`] concurrent streams per
//!   connection, windows of 1 MiB for the connection and for each stream, frames of 16 KiB,
//!   header lists of at most 16 KiB, 400 KiB of buffered answers per stream, and h2's bound on
//!   the streams a client can make the server reset with protocol errors (1024 per connection;
//!   past it the connection is closed with ENHANCE_YOUR_CALM), the defence against
//!   "MadeYouReset" (CVE-2025-8671; tonic had switched it off);
//! - a keep-alive PING every 30 s, the connection closed when one goes unanswered for 10 s
//!   (hyper pinged 30 s after the last frame received; this pings every 30 s, busy or not:
//!   one frame a connection every 30 s);
//! - a call whose stream the client resets is dropped at once, its place in the budget freed;
//!   an answer waits for its stream's window before it is written, and holds its place until
//!   then (a client that never reads holds at most its streams' places);
//! - answers carry no `date` header (gRPC has no use for it; hyper added one unless told not
//!   to, and HPACK-encoding it cost every answer about 1,200 instructions).
//!
//! Shutdown is graceful: the listening socket is closed at once, each connection is sent
//! GOAWAY and lets its calls in progress finish, and [`run`] returns when every connection
//! has closed.

use crate::calls::{self, Services};
use crate::incoming::{self, Admit, PrefaceDeadline};
use bytes::Bytes;
use h2::server::{Connection, SendResponse};
use h2::{Ping, PingPong, RecvStream, SendStream};
use http::{Request, Response};
use http_body::{Body, Frame};
use std::future::{poll_fn, Future};
use std::net::IpAddr;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// The most concurrent calls on one HTTP/2 connection (a client that needs more opens
/// another connection, as Envoy's pool does when a server's SETTINGS say so).
pub const MAX_STREAMS: u32 = 256;
/// How often an HTTP/2 connection is pinged.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// The flow-control windows granted: of the connection, and of each stream (hyper's).
const WINDOW: u32 = 1024 * 1024;
/// The largest header list a request may carry (hyper's bound).
const MAX_HEADER_LIST: u32 = 16 * 1024;
/// The most bytes of an answer buffered per stream (hyper's bound).
const MAX_SEND_BUFFER: usize = 400 * 1024;
/// The streams a client may make the server reset with protocol errors before its
/// connection is closed (hyper's bound, h2's own default).
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// Serves `services` on `listener` until `shutdown` resolves, then drains the connections.
pub(crate) async fn run(
    listener: TcpListener,
    services: Services,
    admit: Option<Admit>,
    shutdown: impl Future<Output = ()>,
) {
    let services = Arc::new(services);
    let http2 = Arc::new(http2_settings());
    // Each connection holds a receiver; the sender says "close" and sees the last one go.
    let (closing, open) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            () = &mut shutdown => break,
            conn = incoming::accept(&listener, admit.as_ref()) => conn,
        };
        tokio::spawn(connection(
            Arc::clone(&http2),
            io,
            Arc::clone(&services),
            peer,
            open.clone(),
        ));
    }
    drop(listener);
    let _ = closing.send(());
    drop(open);
    closing.closed().await;
}

/// The listener's HTTP/2 settings, hyper's: at most [`MAX_STREAMS`] concurrent streams a
/// connection, windows of 1 MiB, header lists of 16 KiB, 400 KiB of answers buffered a stream,
/// 1024 streams reset for a client's errors before ENHANCE_YOUR_CALM. Public for a tool that
/// measures the server under the RLS with exactly these (the gateway's example `rls_floor`).
pub fn http2_settings() -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(MAX_STREAMS)
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS));
    builder
}

/// One connection, until it closes, or until `closing` says so and its calls have finished.
async fn connection(
    http2: Arc<h2::server::Builder>,
    io: PrefaceDeadline,
    services: Arc<Services>,
    peer: IpAddr,
    mut closing: watch::Receiver<()>,
) {
    // The handshake reads the preface (which `io` bounds in time) and sends SETTINGS; a
    // shutdown meanwhile closes the connection before it serves anything.
    let handshake = http2.handshake::<_, Bytes>(io);
    let mut conn = tokio::select! {
        shaken = handshake => match shaken {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "rls connection ended in its handshake");
                return;
            }
        },
        _ = closing.changed() => return,
    };
    let mut keep_alive = KeepAlive::new(conn.ping_pong());
    let mut closed = pin!(closing.changed());
    let mut draining = false;
    poll_fn(|cx| {
        // A closed sender (the server dropped mid-way) is a shutdown too.
        if !draining && closed.as_mut().poll(cx).is_ready() {
            draining = true;
            conn.graceful_shutdown();
        }
        // Ready once: the keep-alive is off after it.
        if keep_alive.poll(cx).is_ready() {
            tracing::debug!("rls connection's keep-alive ping went unanswered; closing it");
            conn.abrupt_shutdown(h2::Reason::NO_ERROR);
        }
        accept(&mut conn, cx, &services, peer)
    })
    .await;
}

/// Accepts the connection's streams, each call spawned: ready when the connection has ended
/// (closed by either side, or broken). Polling it is also what writes what the calls answer.
fn accept(
    conn: &mut Connection<PrefaceDeadline, Bytes>,
    cx: &mut Context<'_>,
    services: &Arc<Services>,
    peer: IpAddr,
) -> Poll<()> {
    loop {
        match ready!(conn.poll_accept(cx)) {
            Some(Ok((request, respond))) => {
                // Boxed first: spawning moves a future several times on its way into the
                // task (1,170 instructions of copies for a call's under callgrind), a box as
                // a pointer.
                tokio::spawn(Box::pin(call(Arc::clone(services), peer, request, respond)));
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "rls connection ended");
                return Poll::Ready(());
            }
            None => return Poll::Ready(()),
        }
    }
}

/// One call: answered, its answer written as the stream's window allows; dropped at once
/// when the client resets the stream (its place in the budget with it).
async fn call(
    services: Arc<Services>,
    peer: IpAddr,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let request = request.map(RequestBody::new);
    let mut answer = pin!(calls::answer(services, Some(peer), request));
    let response = poll_fn(|cx| {
        if let Poll::Ready(answered) = answer.as_mut().poll(cx) {
            return Poll::Ready(Some(answered));
        }
        // Reset by the client (or the connection gone): nobody waits for the answer.
        respond.poll_reset(cx).map(|_| None)
    })
    .await;
    let response = match response {
        Some(Ok(response)) => response,
        Some(Err(never)) => match never {},
        None => return,
    };
    let (parts, mut body) = response.into_parts();
    let end = body.is_end_stream();
    let Ok(mut send) = respond.send_response(Response::from_parts(parts, ()), end) else {
        return;
    };
    if end {
        return;
    }
    loop {
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let frame = match frame {
            Some(Ok(frame)) => frame,
            Some(Err(never)) => match never {},
            None => {
                let _ = send.send_data(Bytes::new(), true);
                return;
            }
        };
        match frame.into_data() {
            Ok(data) => {
                if send_data(&mut send, data).await.is_err() {
                    return;
                }
            }
            // A frame that is not data is the trailers, which end the stream.
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = send.send_trailers(trailers);
                }
                return;
            }
        }
    }
}

/// The stream ended or was reset before its answer was written.
struct Gone;

/// Writes `data` on `send` as its window opens: each part once the peer has room for it.
async fn send_data(send: &mut SendStream<Bytes>, mut data: Bytes) -> Result<(), Gone> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        let room = match poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(room)) => room,
            Some(Err(_)) | None => return Err(Gone),
        };
        if room == 0 {
            continue;
        }
        let part = data.split_to(room.min(data.len()));
        send.send_data(part, false).map_err(|_| Gone)?;
    }
    Ok(())
}

/// A request's body as [`crate::calls`] reads it: its data, each chunk's window given back
/// as it is read, then its trailers.
struct RequestBody {
    stream: RecvStream,
    /// The data has ended: only the trailers are asked for. h2 would say so again, but each
    /// question to a stream takes its connection's lock.
    data_done: bool,
}

impl RequestBody {
    fn new(stream: RecvStream) -> Self {
        Self {
            stream,
            data_done: false,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match ready!(this.stream.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.stream.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        Poll::Ready(match ready!(this.stream.poll_trailers(cx)) {
            Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }
}

/// The connection's keep-alive: a PING every [`KEEP_ALIVE_INTERVAL`]; ready (the connection
/// to be closed) when one has gone unanswered for [`KEEP_ALIVE_TIMEOUT`].
struct KeepAlive {
    state: Pinging,
    timer: Pin<Box<Sleep>>,
}

enum Pinging {
    /// Waiting for the timer to send the next ping.
    Idle(PingPong),
    /// A ping sent, its pong awaited.
    Sent(Pin<Box<Pong>>),
    /// No pings: h2 gave no handle (it gives one, once), or the connection is ending.
    Off,
}

/// A ping's pong, and the handle to send the next ping with.
type Pong = dyn Future<Output = (PingPong, Result<h2::Pong, h2::Error>)> + Send;

impl KeepAlive {
    fn new(pings: Option<PingPong>) -> Self {
        Self {
            state: pings.map_or(Pinging::Off, Pinging::Idle),
            timer: Box::pin(tokio::time::sleep(KEEP_ALIVE_INTERVAL)),
        }
    }

    /// Ready when a ping has gone unanswered for [`KEEP_ALIVE_TIMEOUT`]; off after that.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            // Taken, and put back by every way out that keeps pinging.
            self.state = match std::mem::replace(&mut self.state, Pinging::Off) {
                Pinging::Off => return Poll::Pending,
                Pinging::Idle(mut pings) => {
                    if self.timer.as_mut().poll(cx).is_pending() {
                        self.state = Pinging::Idle(pings);
                        return Poll::Pending;
                    }
                    self.timer
                        .as_mut()
                        .reset(Instant::now() + KEEP_ALIVE_TIMEOUT);
                    Pinging::Sent(Box::pin(async move {
                        let pong = pings.ping(Ping::opaque()).await;
                        (pings, pong)
                    }))
                }
                Pinging::Sent(mut pong) => match pong.as_mut().poll(cx) {
                    Poll::Ready((pings, Ok(_))) => {
                        self.timer
                            .as_mut()
                            .reset(Instant::now() + KEEP_ALIVE_INTERVAL);
                        Pinging::Idle(pings)
                    }
                    // The connection is ending; it says so itself.
                    Poll::Ready((_, Err(_))) => return Poll::Pending,
                    Poll::Pending if self.timer.as_mut().poll(cx).is_ready() => {
                        return Poll::Ready(())
                    }
                    Poll::Pending => {
                        self.state = Pinging::Sent(pong);
                        return Poll::Pending;
                    }
                },
            }
        }
    }
}
