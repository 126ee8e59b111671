//! The gateway's header read timeout ([`HEADER_READ_TIMEOUT`]): a connection waiting for a
//! request head (the first one, or the next on a kept-alive connection) longer than that is
//! closed, without an answer, however slowly the head trickles in.
//!
//! hyper's own timeout (`header_read_timeout`) arms a timer each time a connection starts to
//! wait for a head and drops it when the head is parsed: an entry put into tokio's timer wheel
//! and taken out again for every request, and the wheel's work each time the runtime parks.
//! That was 1,300 of a decision-mode request's 15,300 user-space instructions (callgrind,
//! 100,000 keys on the memory store; see docs/benchmarks.md). Here a connection's wait has a
//! deadline in whole seconds, one atomic word, and one sweeper task compares every
//! connection's deadline with its clock once a second, so a request costs two stores and no
//! timer. A connection is closed between [`HEADER_READ_TIMEOUT`] and
//! two seconds more after its wait began (the clock is a second's tick).
//!
//! The wait is as hyper's: it begins when the connection opens and each time an answer's
//! body has been handed to hyper whole (the body is dropped), and ends when a head has been
//! read (the service is called). A request being served (however long its answer or its
//! body take) is never cut; nor is a connection whose last write found the client not
//! reading (hyper waits for no head then either), and a write that proceeds restarts the
//! wait, as hyper starts it only once its answer is written.
//!
//! A connection past its deadline is marked (its deadline set to [`EXPIRED`] by a compare and
//! swap, so a head read at that instant wins) and woken; its next read or write fails with
//! `TimedOut` and hyper closes it.
//!
//! The same list drains the listener at shutdown ([`HeadClock::drain`]): every connection is
//! told and woken, finishes the request it is serving (an idle one closes at once), and
//! [`HeadClock::drained`] resolves when the last has closed. A connection reads one atomic
//! flag each time it is polled ([`until_drained`]), where hyper-util's graceful-shutdown
//! helper polled a watch channel's receiver: 210 fewer instructions a decision-mode request on
//! the memory store, 380 fewer on Redis, whose requests are polled more often (callgrind; see
//! docs/benchmarks.md).

use crate::http::head_end::MAX_EMPTY_LINES;
use crate::http::refusal::HEADER_READ_TIMEOUT;
use atomic_waker::AtomicWaker;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// A deadline that has passed: the connection is closed.
const EXPIRED: u32 = u32::MAX;
/// No deadline: a request is being served.
const SERVING: u32 = 0;

/// The clock and the connections of one listener, and the sweeper's work on them.
pub(crate) struct HeadClock {
    epoch: tokio::time::Instant,
    /// Whole seconds since `epoch` at the last tick, plus one (so no deadline is 0).
    now: AtomicU32,
    /// The wait allowed, in whole seconds.
    allowed: u32,
    /// Every open connection (and some closed since the last sweep).
    conns: Mutex<Vec<Weak<HeadWatch>>>,
    /// Connections not yet closed (their watches alive).
    open: AtomicUsize,
    /// The listener is shutting down: each connection finishes its request and closes.
    draining: AtomicBool,
    /// Told when the last connection closes while draining.
    all_closed: tokio::sync::Notify,
}

/// One connection's wait for a head.
pub(crate) struct HeadWatch {
    clock: Arc<HeadClock>,
    /// The clock's second after which the wait has lasted too long; [`SERVING`] while a
    /// request is being served; [`EXPIRED`] once the sweeper closed the connection.
    deadline: AtomicU32,
    /// The last write could not proceed: the client is not reading what it was answered.
    write_blocked: AtomicBool,
    /// The connection's task while a read waits.
    waker: AtomicWaker,
    /// The waker a read last registered in `waker` (its data and vtable pointers; 0, 0 for
    /// none): a read that would register the same one again does not, as each registration
    /// is two locked instructions (see [`HeadWatch::poll_read_into`]).
    read_waker: (AtomicUsize, AtomicUsize),
}

impl Drop for HeadWatch {
    fn drop(&mut self) {
        let clock = &self.clock;
        if clock.open.fetch_sub(1, SeqCst) == 1 && clock.draining.load(SeqCst) {
            clock.all_closed.notify_waiters();
        }
    }
}

impl HeadClock {
    /// A clock allowing `allowed` (rounded up to whole seconds, at least one), and its
    /// sweeper, which runs on the current runtime while the clock or a connection lives.
    pub(crate) fn start(allowed: Duration) -> Arc<Self> {
        let secs = allowed.as_secs() + u64::from(allowed.subsec_nanos() > 0);
        let clock = Arc::new(Self {
            epoch: tokio::time::Instant::now(),
            now: AtomicU32::new(1),
            allowed: u32::try_from(secs.max(1)).unwrap_or(u32::MAX / 2),
            conns: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            all_closed: tokio::sync::Notify::new(),
        });
        tokio::spawn(sweep(Arc::downgrade(&clock)));
        clock
    }

    /// [`HeadClock::start`] with [`HEADER_READ_TIMEOUT`].
    pub(crate) fn gateway() -> Arc<Self> {
        Self::start(HEADER_READ_TIMEOUT)
    }

    /// A new connection, waiting for its first head from now.
    pub(crate) fn watch(self: &Arc<Self>) -> Arc<HeadWatch> {
        self.open.fetch_add(1, SeqCst);
        let watch = Arc::new(HeadWatch {
            clock: Arc::clone(self),
            deadline: AtomicU32::new(self.deadline()),
            write_blocked: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            read_waker: (AtomicUsize::new(0), AtomicUsize::new(0)),
        });
        self.lock().push(Arc::downgrade(&watch));
        watch
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<HeadWatch>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shutdown: every connection is told, and woken if it waits for a read, to finish the
    /// request it is serving and close (see [`until_drained`]).
    pub(crate) fn drain(&self) {
        self.draining.store(true, SeqCst);
        let conns = self.lock().clone();
        for watch in conns.iter().filter_map(Weak::upgrade) {
            watch.waker.wake();
        }
    }

    /// Resolves once every connection has closed (after [`HeadClock::drain`]).
    pub(crate) async fn drained(&self) {
        loop {
            // Made before the count is read, so a close in between still wakes this wait.
            let closed = self.all_closed.notified();
            if self.open.load(SeqCst) == 0 {
                return;
            }
            closed.await;
        }
    }

    /// The deadline of a wait that begins now. The clock may be up to a tick behind, so one
    /// second more: a wait is never cut short.
    fn deadline(&self) -> u32 {
        self.now
            .load(Relaxed)
            .saturating_add(self.allowed)
            .saturating_add(1)
            .min(EXPIRED - 1)
    }

    /// One tick: the clock advanced, and every connection waiting past its deadline closed;
    /// while draining, every connection woken again (a drain that ran while a tick had the
    /// list out woke none of them). Returns how many were closed.
    fn tick(&self) -> usize {
        let secs = self.epoch.elapsed().as_secs().saturating_add(1);
        self.tick_at(u32::try_from(secs).unwrap_or(EXPIRED - 1).min(EXPIRED - 1))
    }

    /// [`HeadClock::tick`] with the clock at `now`.
    fn tick_at(&self, now: u32) -> usize {
        self.now.store(now, Relaxed);
        // Swept outside the lock: connections opening meanwhile are not held up.
        let conns = std::mem::take(&mut *self.lock());
        let draining = self.draining.load(SeqCst);
        let mut open = Vec::with_capacity(conns.len());
        let mut closed = 0;
        for weak in conns {
            let Some(watch) = weak.upgrade() else {
                continue;
            };
            if watch.expire_if_past(now) {
                closed += 1;
            } else if draining {
                watch.waker.wake();
            }
            open.push(weak);
        }
        self.lock().append(&mut open);
        closed
    }
}

/// The sweeper: a tick a second while the clock lives.
async fn sweep(clock: Weak<HeadClock>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(clock) = clock.upgrade() else {
            return;
        };
        let closed = clock.tick();
        if closed > 0 {
            tracing::debug!(
                closed,
                "closed connections that sent no request head in time"
            );
        }
    }
}

impl HeadWatch {
    /// A head has been read: its request is being served, and no wait runs.
    ///
    /// A load and a store, not a compare and swap (a locked instruction, a request's cost
    /// twice over with [`HeadWatch::waiting`]): the sweeper may mark the connection expired
    /// between the two, and then the head, read before the mark, wins, as it does when the
    /// sweeper's compare and swap finds the deadline changed.
    pub(crate) fn serving(&self) {
        if self.deadline.load(Relaxed) != EXPIRED {
            self.deadline.store(SERVING, Relaxed);
        }
    }

    /// An answer has been handed to hyper whole: the wait for the next head begins. From
    /// serving, a store: the sweeper leaves a connection being served alone, so nothing
    /// changes the deadline between the load and the store. Otherwise (the wait after a
    /// connection's opening) a compare and swap, so that an expired connection stays expired
    /// (it is being closed).
    pub(crate) fn waiting(&self) {
        let deadline = self.clock.deadline();
        if self.deadline.load(Relaxed) == SERVING {
            self.deadline.store(deadline, Relaxed);
            return;
        }
        let _ = self
            .deadline
            .fetch_update(Relaxed, Relaxed, |d| (d != EXPIRED).then_some(deadline));
    }

    /// Registers `waker` to be woken by the sweeper (an expiry or a drain), unless it is the
    /// one a read registered last. The sweeper's wakes take the registered waker, and each
    /// ends the connection for good (expired, or draining: both are looked at before every
    /// read), so the one registered last is either still there or no longer needed.
    fn register_read(&self, waker: &Waker) {
        let (data, vtable) = (
            waker.data() as usize,
            std::ptr::from_ref(waker.vtable()) as usize,
        );
        let (last_data, last_vtable) = &self.read_waker;
        if data != 0 && last_data.load(Relaxed) == data && last_vtable.load(Relaxed) == vtable {
            return;
        }
        last_data.store(data, Relaxed);
        last_vtable.store(vtable, Relaxed);
        self.waker.register(waker);
    }

    fn expired(&self) -> bool {
        self.deadline.load(Relaxed) == EXPIRED
    }

    /// Whether a head is awaited: no request is being served, and the wait has not expired.
    pub(crate) fn awaiting_head(&self) -> bool {
        let d = self.deadline.load(Relaxed);
        d != SERVING && d != EXPIRED
    }

    /// The listener is shutting down.
    pub(crate) fn draining(&self) -> bool {
        self.clock.draining.load(Relaxed)
    }

    /// Resolves once the listener drains: for a connection that has not begun to be read
    /// (its opening), whose task [`HeadClock::drain`] (or a tick while draining) wakes through
    /// the same waker as a read.
    pub(crate) fn drain_begun(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.draining() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // Told between the first look and the registration: the wake went to nobody.
            if self.draining() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Marks the connection expired and wakes it when it has waited past `now`; whether it
    /// did.
    fn expire_if_past(&self, now: u32) -> bool {
        let d = self.deadline.load(Relaxed);
        if d == SERVING || d == EXPIRED || d >= now || self.write_blocked.load(Relaxed) {
            return false;
        }
        // A head read at this instant (or a write that proceeded) changed the deadline: the
        // connection lives.
        if self
            .deadline
            .compare_exchange(d, EXPIRED, Relaxed, Relaxed)
            .is_err()
        {
            return false;
        }
        self.waker.wake();
        true
    }

    /// A write proceeded: while waiting, the wait restarts (hyper starts it only once its
    /// answer is written).
    fn wrote(&self) {
        if self.write_blocked.load(Relaxed) {
            self.write_blocked.store(false, Relaxed);
        }
        let next = self.clock.deadline();
        let _ = self.deadline.fetch_update(Relaxed, Relaxed, |d| {
            (d != SERVING && d != EXPIRED && d != next).then_some(next)
        });
    }
}

/// The I/O of a connection served without hyper (`plain.rs`), under the same rules as
/// [`Watched`]'s.
impl HeadWatch {
    /// Reads what `stream` has into `buf`'s spare room: the count (0 at the end), or
    /// `TimedOut` once the connection has expired (a wait registers this task to be woken
    /// then, and by a drain). As tokio's own reads, a read that fills less than the room
    /// takes the stream for drained: the next waits for the kernel's word, with no read
    /// that finds nothing.
    pub(crate) fn poll_read_into(
        &self,
        cx: &mut Context<'_>,
        stream: &mut tokio::net::TcpStream,
        buf: &mut bytes::BytesMut,
    ) -> Poll<io::Result<usize>> {
        if self.expired() {
            return Poll::Ready(Err(timed_out()));
        }
        let read = tokio_util::io::poll_read_buf(Pin::new(stream), cx, buf);
        if read.is_pending() {
            self.register_read(cx.waker());
            // Expired between the check and the registration: not woken, so now.
            if self.expired() {
                return Poll::Ready(Err(timed_out()));
            }
        }
        read
    }

    /// Writes what of `data` `stream` takes, noting whether the write proceeded (see
    /// [`Watched`]); `TimedOut` once the connection has expired.
    pub(crate) fn poll_write_to(
        &self,
        cx: &mut Context<'_>,
        stream: &tokio::net::TcpStream,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            if self.expired() {
                return Poll::Ready(Err(timed_out()));
            }
            match stream.poll_write_ready(cx) {
                Poll::Pending => {
                    self.write_blocked.store(true, Relaxed);
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => match stream.try_write(data) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Ok(n) => {
                        if n > 0 {
                            self.wrote();
                        }
                        return Poll::Ready(Ok(n));
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                },
            }
        }
    }
}

/// Runs a connection (`conn`, which `shut` asks to close gracefully) until it ends; once its
/// listener drains, it is asked once, and finishes the request it serves (an idle one closes
/// at once). `watch` is the connection's own. Boxed: pinned once a connection, polled in place.
pub(crate) fn until_drained<F: Future>(
    conn: F,
    watch: Arc<HeadWatch>,
    shut: fn(Pin<&mut F>),
) -> UntilDrained<F> {
    UntilDrained {
        conn: Box::pin(conn),
        watch,
        shut,
        asked: false,
    }
}

/// See [`until_drained`].
pub(crate) struct UntilDrained<F> {
    conn: Pin<Box<F>>,
    watch: Arc<HeadWatch>,
    shut: fn(Pin<&mut F>),
    asked: bool,
}

impl<F: Future> Future for UntilDrained<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        loop {
            if !this.asked && this.watch.draining() {
                this.asked = true;
                (this.shut)(this.conn.as_mut());
            }
            let polled = this.conn.as_mut().poll(cx);
            // Told while polled, before a read registered the wake: asked now, polled again.
            if polled.is_pending() && !this.asked && this.watch.draining() {
                continue;
            }
            return polled;
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "no request head within the header read timeout",
    )
}

/// A connection's I/O under its [`HeadWatch`], with the bytes already read from it and not
/// yet served (a connection `plain.rs` hands to hyper) read first.
pub(crate) struct Watched<T> {
    io: T,
    watch: Arc<HeadWatch>,
    unread: Bytes,
}

impl<T> Watched<T> {
    pub(crate) fn new(io: T, watch: Arc<HeadWatch>, unread: Bytes) -> Self {
        Self { io, watch, unread }
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.watch.expired() {
            return Poll::Ready(Err(timed_out()));
        }
        if !this.unread.is_empty() {
            let n = this.unread.len().min(buf.remaining());
            buf.put_slice(&this.unread.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if read.is_pending() {
            this.watch.waker.register(cx.waker());
            // Expired between the check and the registration: not woken, so answered now.
            if this.watch.expired() {
                return Poll::Ready(Err(timed_out()));
            }
        }
        read
    }
}

impl<T: hyper::rt::Write + Unpin> Watched<T> {
    /// A write by `write` unless the connection expired, noting whether it proceeded.
    fn write(
        self: Pin<&mut Self>,
        write: impl FnOnce(Pin<&mut T>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.watch.expired() {
            return Poll::Ready(Err(timed_out()));
        }
        let written = write(Pin::new(&mut this.io));
        match written {
            Poll::Ready(Ok(n)) if n > 0 => this.watch.wrote(),
            Poll::Pending => this.watch.write_blocked.store(true, Relaxed),
            _ => {}
        }
        written
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write(|io| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write(|io| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A connection's stream as hyper reads it (under [`Watched`]): counts the empty-line bytes in
/// a row it reads, and fails a read made while a head is awaited that goes on with the run
/// past [`MAX_EMPTY_LINES`]. Looking at a read costs a look at its first bytes and its last.
pub(crate) struct EmptyLines<T> {
    io: T,
    /// The connection's watch; none on the admin port, whose heads hyper times: there every
    /// read is judged, a body's too (an admin body of 8 KiB of empty lines in a row is no
    /// request).
    watch: Option<Arc<HeadWatch>>,
    /// Empty-line bytes in a row up to the last byte read, whenever they were read: those at
    /// the end of a read that brought a head (or a body) too are in hyper's buffer before the
    /// next head as much as those read alone, and hyper skips them all again on every read
    /// that adds to them.
    run: usize,
}

impl<T> EmptyLines<T> {
    /// `behind`: what was read before it and is handed over to hyper first (`plain.rs`'s
    /// unread bytes): the run its last bytes begin goes on in the reads that follow.
    pub(crate) fn new(io: T, watch: Arc<HeadWatch>, behind: &[u8]) -> Self {
        Self {
            io,
            watch: Some(watch),
            run: run_after(0, behind).1,
        }
    }

    /// Counting every read: for a connection without a [`HeadWatch`] (the admin port).
    pub(crate) fn unwatched(io: T) -> Self {
        Self {
            io,
            watch: None,
            run: 0,
        }
    }
}

/// The run of empty-line bytes in a row a read of `new` continues or begins (from `run`, the
/// run before it, to `new`'s first other byte), and the run after it when `new` has no other
/// byte (else 0: the run after it is that of its last bytes, [`trailing_empty`]). Runs
/// inside one read between other bytes are not counted: they cost hyper one look, in that
/// one read.
fn empty_runs(run: usize, new: &[u8]) -> (usize, usize) {
    let lead = new
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    let longest = run.saturating_add(lead);
    (longest, if lead == new.len() { longest } else { 0 })
}

/// The empty-line bytes (`\r`, `\n`) a read that brought other bytes too ends with, less the
/// four that may end its last head (`\r\n\r\n`, a head's own, not the next one's empty
/// lines): the run the next head may find before it.
fn trailing_empty(new: &[u8]) -> usize {
    new.iter()
        .rev()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count()
        .saturating_sub(4)
}

/// [`empty_runs`] of `run` and `new`, the run after it that of `new`'s last bytes when it
/// brought other bytes too ([`trailing_empty`]).
fn run_after(run: usize, new: &[u8]) -> (usize, usize) {
    let (longest, last) = empty_runs(run, new);
    (longest, if last > 0 { last } else { trailing_empty(new) })
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for EmptyLines<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        let Some(&first) = new.first() else {
            return Poll::Ready(Ok(()));
        };
        let (longest, run) = run_after(this.run, new);
        this.run = run;
        // Only a read that goes on with the run while a head is awaited is judged: one that
        // begins another head ends it, and one made while a request is served may be its
        // body's.
        let goes_on = first == b'\r' || first == b'\n';
        let awaited = this.watch.as_ref().is_none_or(|w| w.awaiting_head());
        if goes_on && awaited && longest > MAX_EMPTY_LINES {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "too many empty lines before a request head",
            )));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for EmptyLines<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A gateway connection's stream as hyper is given it: watched (see [`Watched`]), `unread`
/// (what `plain.rs` read and did not serve) first, its empty lines counted (see
/// [`EmptyLines`]).
pub(crate) fn for_hyper(
    stream: tokio::net::TcpStream,
    watch: Arc<HeadWatch>,
    unread: Bytes,
) -> Watched<hyper_util::rt::TokioIo<EmptyLines<tokio::net::TcpStream>>> {
    let counted = EmptyLines::new(stream, Arc::clone(&watch), &unread);
    Watched::new(hyper_util::rt::TokioIo::new(counted), watch, unread)
}

/// An answer's body that starts the connection's wait for the next head when hyper drops
/// it: after its last frame, or with the connection.
pub(crate) struct WaitAfter<B> {
    body: B,
    watch: Arc<HeadWatch>,
}

impl<B> WaitAfter<B> {
    pub(crate) fn new(body: B, watch: Arc<HeadWatch>) -> Self {
        Self { body, watch }
    }
}

impl<B> Drop for WaitAfter<B> {
    fn drop(&mut self) {
        self.watch.waiting();
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for WaitAfter<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use std::convert::Infallible;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    type TestBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

    /// The wait the tests' clock allows: a connection is closed after more than this, and
    /// by this and two seconds more.
    const ALLOWED: Duration = Duration::from_secs(2);
    /// Longer than any wait can last: what outlasts it was not cut.
    const PAST_ANY_WAIT: Duration = Duration::from_millis(4500);
    /// How long a test waits for what should happen within four seconds (a loaded machine
    /// may be late).
    const PATIENCE: Duration = Duration::from_secs(10);

    /// Serves connections on a loopback port as the gateway does (`server.rs`, `connection`):
    /// hyper without its own header timer, the I/O watched, each call marking the connection
    /// serving and its answer's body starting the wait at its end, under a clock allowing
    /// [`ALLOWED`]. Answers: `/slow`, "ok" after [`PAST_ANY_WAIT`]; `/stream`, nine chunks
    /// 600 ms apart (5.4 s); `/big`, 16 MiB; `/read`, "ok" once the request's body is read;
    /// anything else, "ok" at once.
    async fn serve() -> std::net::SocketAddr {
        serve_with(HeadClock::start(ALLOWED)).await
    }

    /// [`serve`] under `clock`, each connection run [`until_drained`], as the gateway runs it.
    async fn serve_with(clock: Arc<HeadClock>) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let watch = clock.watch();
                let svc_watch = Arc::clone(&watch);
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    svc_watch.serving();
                    let watch = Arc::clone(&svc_watch);
                    let path = req.uri().path().to_string();
                    let request_body = req.into_body();
                    async move {
                        if path == "/read" {
                            let _ = request_body.collect().await;
                        }
                        let body: TestBody = match path.as_str() {
                            "/slow" => {
                                tokio::time::sleep(PAST_ANY_WAIT).await;
                                Full::new(Bytes::from_static(b"ok")).boxed()
                            }
                            "/stream" => Chunks::start(9, Duration::from_millis(600)).boxed(),
                            "/big" => Full::new(Bytes::from(vec![b'x'; 16 << 20])).boxed(),
                            _ => Full::new(Bytes::from_static(b"ok")).boxed(),
                        };
                        Ok::<_, Infallible>(Response::new(WaitAfter::new(body, watch)))
                    }
                });
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new()).header_read_timeout(None);
                let io = for_hyper(stream, Arc::clone(&watch), Bytes::new());
                let conn = b.serve_connection(io, svc);
                tokio::spawn(async move {
                    let _ = until_drained(conn, watch, |c| c.graceful_shutdown()).await;
                });
            }
        });
        addr
    }

    /// A chunked body: `n` chunks of "chunk", `every` apart.
    struct Chunks(tokio::sync::mpsc::Receiver<Bytes>);

    impl Chunks {
        fn start(n: usize, every: Duration) -> Self {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                for _ in 0..n {
                    tokio::time::sleep(every).await;
                    if tx.send(Bytes::from_static(b"chunk")).await.is_err() {
                        return;
                    }
                }
            });
            Chunks(rx)
        }
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.get_mut()
                .0
                .poll_recv(cx)
                .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
        }
    }

    fn get(path: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").into_bytes()
    }

    /// Reads until `done` holds of what came (true) or the peer closes or `PATIENCE` passes
    /// (false).
    async fn read_until(
        s: &mut TcpStream,
        got: &mut Vec<u8>,
        done: impl Fn(&[u8]) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut buf = vec![0u8; 64 << 10];
        while !done(got) {
            match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => return false,
            }
        }
        true
    }

    /// How long until the peer closes `s`, from `since`; `None` past `PATIENCE`.
    async fn closes_after(s: &mut TcpStream, since: Instant) -> Option<Duration> {
        tollgate_testkit::net::closed_after(s, since, PATIENCE).await
    }

    fn answered(got: &[u8], n: usize) -> bool {
        got.windows(4).filter(|w| w == b"\r\nok").count() >= n
    }

    #[tokio::test]
    async fn the_bytes_handed_over_are_read_before_the_stream() {
        let clock = HeadClock::start(ALLOWED);
        let io = Watched::new(
            TokioIo::new(&b" world"[..]),
            clock.watch(),
            Bytes::from_static(b"hello"),
        );
        let mut io = TokioIo::new(io);
        let mut first = [0u8; 3];
        io.read_exact(&mut first).await.expect("read");
        assert_eq!(&first, b"hel");
        let mut rest = Vec::new();
        io.read_to_end(&mut rest).await.expect("read");
        assert_eq!(rest, b"lo world");
    }

    #[test]
    fn a_run_of_empty_line_bytes_goes_on_across_reads_and_ends_at_any_other_byte() {
        assert_eq!(empty_runs(0, b""), (0, 0));
        assert_eq!(empty_runs(7, b""), (7, 7));
        assert_eq!(empty_runs(7, b"\r\n\n"), (10, 10));
        assert_eq!(empty_runs(7, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"), (7, 0));
        assert_eq!(empty_runs(7, b"\r\nGET / HTTP/1.1\r\n"), (9, 0));
        assert_eq!(empty_runs(7, b"\r\nG"), (9, 0));
        assert_eq!(empty_runs(0, b"G\n\n\n\n\nG"), (0, 0));
        assert_eq!(empty_runs(usize::MAX, b"\n"), (usize::MAX, usize::MAX));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn empty_lines_before_a_head_are_skipped_up_to_the_bound_and_then_close() {
        let addr = serve().await;
        // Up to the bound, before each of two requests on one connection (each wait counts
        // anew), written in pieces: both answered.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let mut got = Vec::new();
        for i in 1..=2 {
            for _ in 0..MAX_EMPTY_LINES / 1024 {
                s.write_all(&b"\r\n".repeat(512)).await.expect("write");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            s.write_all(&get("/")).await.expect("write");
            assert!(
                read_until(&mut s, &mut got, |g| answered(g, i)).await,
                "answer {i}"
            );
        }
        // One byte past it: closed without an answer, long before the header read timeout.
        let start = Instant::now();
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let mut flood = vec![b'\n'; MAX_EMPTY_LINES + 1];
        flood.extend_from_slice(&get("/"));
        let _ = s.write_all(&flood).await;
        let mut got = Vec::new();
        let _ = read_until(&mut s, &mut got, |g| answered(g, 1)).await;
        assert!(!answered(&got, 1), "{}", String::from_utf8_lossy(&got));
        assert!(
            start.elapsed() < ALLOWED,
            "closed after {:?}",
            start.elapsed()
        );
    }

    /// Empty lines that came in one read behind a head are in hyper's buffer before the next
    /// head as much as those read alone: they count towards the bound. (Before, a run counted
    /// from a read that brought nothing else, and a client could put up to a read's worth
    /// before each head uncounted; docs/benchmarks.md, twenty-seventh session.)
    /// A body's own empty lines, read while its request is served, count for no head.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn empty_lines_read_behind_a_head_count_towards_the_next_heads_bound() {
        let addr = serve().await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let mut got = Vec::new();
        let mut first = get("/");
        first.extend_from_slice(&vec![b'\n'; MAX_EMPTY_LINES - 100]);
        s.write_all(&first).await.expect("write");
        assert!(
            read_until(&mut s, &mut got, |g| answered(g, 1)).await,
            "the first"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = s.write_all(&[b'\n'; 200]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = s.write_all(&get("/")).await;
        let _ = read_until(&mut s, &mut got, |g| answered(g, 2)).await;
        assert!(!answered(&got, 2), "{}", String::from_utf8_lossy(&got));

        // A body of empty lines, longer than the bound, then the next request: answered.
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let body = vec![b'\n'; 3 * MAX_EMPTY_LINES];
        let mut post = format!(
            "POST /read HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        post.extend_from_slice(&body);
        s.write_all(&post).await.expect("write");
        let mut got = Vec::new();
        assert!(
            read_until(&mut s, &mut got, |g| answered(g, 1)).await,
            "the post"
        );
        s.write_all(&get("/")).await.expect("write");
        assert!(
            read_until(&mut s, &mut got, |g| answered(g, 2)).await,
            "{}",
            String::from_utf8_lossy(&got)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_connection_a_partial_head_and_a_trickled_head_are_closed() {
        let addr = serve().await;
        let start = Instant::now();
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut partial = TcpStream::connect(addr).await.expect("connect");
        partial
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("write");
        let trickled = TcpStream::connect(addr).await.expect("connect");
        let (mut rd, mut wr) = trickled.into_split();
        // A header line, one byte every 200 ms: never silent, never done.
        let trickle = tokio::spawn(async move {
            let _ = wr.write_all(b"GET / HTTP/1.1\r\n").await;
            for _ in 0..100 {
                if wr.write_all(b"a").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let mut buf = [0u8; 64];
        let trickled_closed = tokio::time::timeout(PATIENCE, rd.read(&mut buf));
        let (a, b, c) = tokio::join!(
            closes_after(&mut silent, start),
            closes_after(&mut partial, start),
            trickled_closed
        );
        let trickled_at = start.elapsed();
        trickle.abort();
        for (what, at) in [("silent", a), ("partial", b)] {
            let at = at.unwrap_or_else(|| panic!("{what}: still open after {PATIENCE:?}"));
            assert!(at >= ALLOWED, "{what}: closed after {at:?}");
        }
        assert!(matches!(c, Ok(Ok(0)) | Ok(Err(_))), "trickled: {c:?}");
        assert!(trickled_at >= ALLOWED, "trickled: {trickled_at:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wait_restarts_after_each_answer_and_an_idle_connection_is_closed() {
        let addr = serve().await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let mut got = Vec::new();
        // Eight requests 700 ms apart: 5.6 s in all, past any one wait, each well within its
        // own (more than two seconds).
        for i in 1..=8 {
            s.write_all(&get("/")).await.expect("write");
            assert!(
                read_until(&mut s, &mut got, |g| answered(g, i)).await,
                "answer {i}"
            );
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        let idle = Instant::now();
        let at = closes_after(&mut s, idle)
            .await
            .expect("an idle connection is closed");
        assert!(
            at >= ALLOWED - Duration::from_millis(700),
            "closed after {at:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_answer_and_a_long_stream_are_not_cut() {
        let addr = serve().await;
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(&get("/slow")).await.expect("write");
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(&get("/stream")).await.expect("write");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (slow_done, stream_done) = tokio::join!(
            read_until(&mut slow, &mut a, |g| answered(g, 1)),
            // The chunked body's end: a zero-size chunk.
            read_until(&mut stream, &mut b, |g| g.ends_with(b"\r\n0\r\n\r\n")),
        );
        assert!(slow_done, "{}", String::from_utf8_lossy(&a));
        assert!(stream_done, "{}", String::from_utf8_lossy(&b));
        assert_eq!(b.windows(9).filter(|w| w == b"\r\nchunk\r\n").count(), 9);
        // Both connections serve another request.
        slow.write_all(&get("/")).await.expect("write");
        assert!(read_until(&mut slow, &mut a, |g| answered(g, 2)).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_does_not_read_its_answer_is_not_cut_while_blocked() {
        let addr = serve().await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(&get("/big")).await.expect("write");
        // 16 MiB outgrows the sockets' buffers: the gateway's write blocks while we sleep.
        tokio::time::sleep(PAST_ANY_WAIT).await;
        let mut got = Vec::new();
        let whole = |g: &[u8]| {
            g.windows(4)
                .position(|w| w == b"\r\n\r\n")
                .is_some_and(|end| g.len() >= end + 4 + (16 << 20))
        };
        assert!(
            read_until(&mut s, &mut got, whole).await,
            "{} bytes",
            got.len()
        );
        // The wait starts again once the answer is out.
        let at = closes_after(&mut s, Instant::now())
            .await
            .expect("closed when idle");
        assert!(
            at >= ALLOWED - Duration::from_millis(700),
            "closed after {at:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drain_closes_idle_connections_and_lets_a_request_being_served_finish() {
        // A wait far longer than the test: whatever closes was closed by the drain.
        let clock = HeadClock::start(Duration::from_secs(600));
        let addr = serve_with(Arc::clone(&clock)).await;
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        let mut got = Vec::new();
        idle.write_all(&get("/")).await.expect("write");
        assert!(read_until(&mut idle, &mut got, |g| answered(g, 1)).await);
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        let mut slow = TcpStream::connect(addr).await.expect("connect");
        slow.write_all(&get("/slow")).await.expect("write");
        // Every connection is counted (from its accept); then a moment for the slow request
        // to be read, so that it is being served when the drain comes.
        let counted = tokio::time::timeout(PATIENCE, async {
            while clock.open.load(SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        assert!(counted.await.is_ok(), "{}", clock.open.load(SeqCst));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = Instant::now();
        clock.drain();
        let (idle_at, silent_at) = tokio::join!(
            closes_after(&mut idle, start),
            closes_after(&mut silent, start)
        );
        let idle_at = idle_at.expect("the idle connection is closed");
        assert!(silent_at.is_some(), "the silent connection is closed");
        // The one being served is not: its answer comes whole, and says the connection closes.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), clock.drained())
                .await
                .is_err(),
            "drained while a request was being served"
        );
        let drained = tokio::time::timeout(PATIENCE, clock.drained());
        let mut answer = Vec::new();
        assert!(
            read_until(&mut slow, &mut answer, |g| answered(g, 1)).await,
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(text.contains("connection: close"), "{text}");
        assert!(drained.await.is_ok(), "every connection closed");
        // Not held until the request being served was answered.
        assert!(
            idle_at < PAST_ANY_WAIT,
            "the idle connection closed at {idle_at:?}"
        );
        assert_eq!(clock.open.load(SeqCst), 0);
    }

    /// A waker that counts its wakes.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[tokio::test]
    async fn a_drain_that_misses_a_connection_mid_sweep_wakes_it_at_the_next_tick() {
        let clock = HeadClock::start(Duration::from_secs(600));
        let watch = clock.watch();
        let wakes = Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
        watch
            .waker
            .register(&std::task::Waker::from(Arc::clone(&wakes)));
        // The drain comes while a tick has the list out (as on another worker thread).
        let taken = std::mem::take(&mut *clock.lock());
        clock.drain();
        assert_eq!(wakes.0.load(SeqCst), 0, "the drain saw no connection");
        clock.lock().extend(taken);
        // The next tick wakes it; it is not expired (it waited no time at all).
        watch
            .waker
            .register(&std::task::Waker::from(Arc::clone(&wakes)));
        assert_eq!(clock.tick_at(2), 0);
        assert_eq!(wakes.0.load(SeqCst), 1);
        assert!(!watch.expired());
        assert!(watch.draining());
    }

    #[tokio::test]
    async fn a_read_registers_its_task_once_and_the_sweeper_still_wakes_the_latest() {
        let clock = HeadClock::start(Duration::from_secs(2));
        clock.tick_at(10);
        let count = || Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
        // A connection's reads find nothing, request after request, and wait with the same
        // task's waker: registered by the first, the same one for the others.
        let (task, watch) = (count(), clock.watch());
        let waker = Waker::from(Arc::clone(&task));
        for _ in 0..3 {
            watch.register_read(&waker);
            watch.serving();
            watch.waiting();
        }
        assert_eq!(clock.tick_at(13), 0);
        assert_eq!(clock.tick_at(14), 1, "expired");
        assert_eq!(task.0.load(SeqCst), 1, "and its task woken");
        // Registered by the first read only: a registration taken (as only a wake that ends
        // the connection takes it) is not made again for the same task, and is for another.
        let again = clock.watch();
        again.register_read(&waker);
        assert!(again.waker.take().is_some(), "registered by the first read");
        again.register_read(&waker);
        assert!(again.waker.take().is_none(), "not again for the same task");
        again.register_read(&Waker::from(count()));
        assert!(again.waker.take().is_some(), "another task's is registered");
        // Another task's waker replaces the one registered; a waker with no data (a no-op
        // one) is never taken for the same one.
        let (first, second, watch) = (count(), count(), clock.watch());
        watch.register_read(&Waker::from(Arc::clone(&first)));
        watch.register_read(Waker::noop());
        watch.register_read(Waker::noop());
        watch.register_read(&Waker::from(Arc::clone(&second)));
        clock.drain();
        assert_eq!(first.0.load(SeqCst), 0);
        assert_eq!(second.0.load(SeqCst), 1, "the drain wakes the latest");
    }

    #[tokio::test]
    async fn a_head_read_at_the_sweep_serves_and_an_expired_wait_stays_expired() {
        let clock = HeadClock::start(Duration::from_secs(2));
        clock.tick_at(10);
        let watch = clock.watch();
        // Served and waiting again: plain stores, and the sweeper leaves a request being
        // served alone.
        watch.serving();
        assert_eq!(clock.tick_at(20), 0, "served: never cut");
        watch.waiting();
        assert!(watch.awaiting_head());
        assert_eq!(clock.tick_at(23), 0);
        assert_eq!(clock.tick_at(24), 1);
        // Expired: a head read afterwards does not revive it, nor does a wait begun anew.
        watch.serving();
        assert!(watch.expired());
        watch.waiting();
        assert!(watch.expired());
    }

    #[tokio::test]
    async fn the_sweeper_closes_only_what_waited_past_its_deadline() {
        let clock = HeadClock::start(Duration::from_millis(1500));
        assert_eq!(clock.allowed, 2, "rounded up to whole seconds");
        // The clock at second 10: a wait beginning now ends after second 13 (2 s allowed and
        // a second for the tick the clock may be behind).
        clock.tick_at(10);
        let waiting = clock.watch();
        let serving = clock.watch();
        serving.serving();
        let blocked = clock.watch();
        blocked.write_blocked.store(true, Relaxed);
        let gone = clock.watch();
        drop(gone);
        assert_eq!(clock.tick_at(13), 0, "at its deadline, not past it");
        assert_eq!(clock.tick_at(14), 1, "the waiting one");
        assert!(waiting.expired());
        assert!(!serving.expired(), "a request being served is never cut");
        assert!(
            !blocked.expired(),
            "nor a connection whose client does not read"
        );
        // A write that proceeds unblocks it and restarts its wait from the clock's now.
        blocked.wrote();
        assert_eq!(clock.tick_at(17), 0);
        assert_eq!(clock.tick_at(18), 1);
        assert!(blocked.expired());
        // An expired connection stays so; one that is gone leaves the sweep.
        waiting.waiting();
        assert!(waiting.expired());
        assert_eq!(clock.lock().len(), 3);
        drop((waiting, serving, blocked));
        clock.tick_at(19);
        assert!(clock.lock().is_empty());
    }
}
