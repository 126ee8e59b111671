//! The store's own connection to one Redis server, for the coalesced calls (`lane.rs`): a
//! standalone server's, the Sentinel master's, or one Cluster node's (a node lane's, at the
//! address the node table gives; `store.rs` sends a call again on redis-rs's cluster
//! connection when the node answers that it did not run it).
//!
//! A lane has at most one call in flight, and the caller that leads it (the plan that found
//! the lane idle, or the task draining its queue) writes that call on the socket and reads its
//! reply itself: no channel to a connection task and no oneshot back, no timer of the
//! client's own (the caller's `store.timeout`, or the batch's, is the only one). Everything
//! else (script loads, settles, the generic script, `max_batch = 1`) keeps redis-rs's
//! multiplexed connection, which pipelines concurrent calls.
//!
//! A caller that gives up while its reply is still owed leaves the socket behind with that
//! reply to skip: the next call reads and discards it first (at most [`MAX_OWED`], else the
//! connection is closed), so a slow server does not cost a new connection per timeout. A
//! call cut off while writing, a reply the reader cannot read ([`crate::resp`]) or an I/O
//! error closes the connection; the next call opens another (bounded by the connect timeout
//! and the call's own; while the server stays down the caller's circuit breaker stops the
//! calls, as with redis-rs's connection, which also tries again on every call).
//!
//! It speaks RESP2: `AUTH` (with the URL's user and password), `SELECT` (its database) and
//! `CLIENT SETNAME tollgate-batch` on connect (a server or an ACL user that refuses CLIENT
//! leaves the connection unnamed, as redis-rs ignores a refused `CLIENT SETINFO`), then
//! EVALSHA / SCRIPT LOAD. Plain TCP, TLS (`rediss://`, rustls with the system's roots, which honour
//! `SSL_CERT_FILE`, as redis-rs's) and Unix sockets; a URL it does not handle this way (TLS
//! without verification, client certificates) keeps redis-rs's connection for every call.

use crate::config::{redact, CONNECT_TIMEOUT};
use crate::reply::server_error_as_err;
use crate::resp;
use redis::{Cmd, ErrorKind, IntoConnectionInfo, RedisError, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// The replies of several commands written together: each command's own, or the failure of
/// them all.
pub(crate) type Many = Result<Vec<Result<Value, RedisError>>, RedisError>;

/// The name of the store's own connections in `CLIENT LIST`.
pub(crate) const CLIENT_NAME: &str = "tollgate-batch";

/// The most replies of abandoned calls a connection may still owe before it is closed.
pub(crate) const MAX_OWED: usize = 8;

/// A read buffer that grew past this (a large reply) is shrunk back after the call.
const KEEP_BUFFER: usize = 64 << 10;

/// The connection of one server: its address and credentials, the idle socket(s).
pub(crate) struct Direct {
    target: Target,
    /// Sockets between calls: at most `keep` (a lane makes one call at a time, so one; the
    /// redirections of a Cluster's calls come at once from many requests, `resend.rs`).
    idle: Mutex<Vec<Socket>>,
    keep: usize,
    /// A connection was opened (the first, at the first call).
    opened: AtomicBool,
    /// A connection was opened again since [`Direct::reconnected`] last asked: the one before
    /// was lost (a restart, a kill, an error).
    reopened: AtomicBool,
}

struct Target {
    addr: Addr,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// The URL without its password, for messages.
    shown: String,
}

enum Addr {
    Tcp(String, u16),
    #[cfg(feature = "tls")]
    Tls(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

struct Socket {
    stream: Stream,
    /// Bytes read and not yet parsed.
    buf: Vec<u8>,
    /// Replies of abandoned calls, still to be read and discarded.
    owed: usize,
}

fn io_error(what: &'static str, detail: String) -> RedisError {
    RedisError::from(std::io::Error::other(format!("{what}: {detail}")))
}

impl Direct {
    /// The connection for `url`, or `None` where redis-rs's connection must serve every call
    /// (see the module docs). Connects on first use.
    pub(crate) fn for_url(url: &str) -> Option<Self> {
        let info = url.into_connection_info().ok()?;
        Self::for_info(&info, redact(url))
    }

    /// Whether [`Direct::for_info`] takes `info` (see the module docs).
    pub(crate) fn takes(info: &redis::ConnectionInfo) -> bool {
        Self::addr_of(info).is_some()
    }

    /// The connection for `info` (a Sentinel's master: its address, the URL's credentials
    /// and TLS), shown as `shown` in messages.
    pub(crate) fn for_info(info: &redis::ConnectionInfo, shown: String) -> Option<Self> {
        let addr = Self::addr_of(info)?;
        let settings = info.redis_settings();
        Some(Self {
            target: Target {
                addr,
                username: settings.username().map(str::to_string),
                password: settings.password().map(str::to_string),
                db: settings.db(),
                shown,
            },
            idle: Mutex::new(Vec::new()),
            keep: 1,
            opened: AtomicBool::new(false),
            reopened: AtomicBool::new(false),
        })
    }

    /// The connection to the Cluster node at `host:port`, with `template`'s (the first URL's)
    /// credentials and TLS, keeping up to `keep` sockets between calls; `None` where this
    /// connection does not take `template` (see the module docs).
    pub(crate) fn for_node(
        template: &redis::ConnectionInfo,
        host: &str,
        port: u16,
        keep: usize,
    ) -> Option<Self> {
        let addr = match template.addr() {
            redis::ConnectionAddr::Tcp(..) => redis::ConnectionAddr::Tcp(host.to_owned(), port),
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => return None,
        };
        let info = template.clone().set_addr(addr);
        let mut direct = Self::for_info(&info, format!("the Cluster node at {host}:{port}"))?;
        direct.keep = keep.max(1);
        Some(direct)
    }

    /// Where `info` connects, where this connection can reach it.
    fn addr_of(info: &redis::ConnectionInfo) -> Option<Addr> {
        Some(match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            #[cfg(feature = "tls")]
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            } => Addr::Tls(host.clone(), *port),
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            #[allow(unreachable_patterns)]
            _ => return None,
        })
    }

    /// Sends `cmd` (a whole command's RESP bytes, `command.rs`) and reads its reply. A server
    /// error is an `Err`, as with redis-rs.
    pub(crate) async fn query(&self, cmd: &[u8]) -> Result<Value, RedisError> {
        let mut call = self.call(self.socket().await?);
        let reply = call.run(cmd).await;
        self.finish(&mut call, reply.is_ok());
        server_error_as_err(reply?)
    }

    /// Sends `cmds` (the RESP bytes of `n` whole commands, written together) and reads their
    /// `n` replies, in order, each as [`Direct::query`] gives it (a server error is that
    /// command's `Err`); an I/O error, or a reply that cannot be read, is the `Err` of them
    /// all.
    pub(crate) async fn query_many(&self, cmds: &[u8], n: usize) -> Many {
        let mut call = self.call(self.socket().await?);
        let mut replies = Vec::with_capacity(n);
        let done = call.run_many(cmds, n, &mut replies).await;
        self.finish(&mut call, done.is_ok());
        done?;
        Ok(replies.into_iter().map(server_error_as_err).collect())
    }

    /// A call on `socket`, nothing written yet.
    fn call(&self, socket: Socket) -> Call<'_> {
        Call {
            direct: self,
            socket: Some(socket),
            written: false,
            unread: 0,
        }
    }

    /// The idle socket, or a new one.
    async fn socket(&self) -> Result<Socket, RedisError> {
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let mut found = None;
            while let Some(s) = idle.pop() {
                // A socket the server closed while it sat idle (a restart) is not used: the
                // call would fail on it.
                if !s.stream.closed_by_peer() {
                    found = Some(s);
                    break;
                }
            }
            found
        };
        match idle {
            Some(s) => Ok(s),
            None => {
                if self.opened.swap(true, Ordering::Relaxed) {
                    self.reopened.store(true, Ordering::Relaxed);
                }
                self.connect().await
            }
        }
    }

    /// After a call: its socket goes back when it succeeded, and is closed when it failed.
    fn finish(&self, call: &mut Call<'_>, ok: bool) {
        match call.socket.take() {
            Some(mut s) if ok => {
                if s.buf.capacity() > KEEP_BUFFER {
                    s.buf = Vec::with_capacity(4096);
                }
                self.put(s);
            }
            _ => {}
        }
    }

    /// Whether a connection was lost and another opened (or tried) since the last time this
    /// was asked: the server may have restarted, and redis-rs's connection beside this one
    /// only notices on its next call.
    pub(crate) fn reconnected(&self) -> bool {
        // Asked after every call: a plain load, and a write only when it was set.
        self.reopened.load(Ordering::Relaxed) && self.reopened.swap(false, Ordering::Relaxed)
    }

    /// [`Direct::query`] on a server that `shared` (redis-rs's connection) also talks to: when
    /// this connection had to be opened again, the server may have restarted, and `shared`
    /// notices only on its next call (a load, a settle, a readiness probe), which would fail;
    /// a PING now makes it reconnect first.
    pub(crate) async fn query_beside(
        &self,
        cmd: &[u8],
        shared: &redis::aio::ConnectionManager,
    ) -> Result<Value, RedisError> {
        let reply = self.query(cmd).await;
        self.wake_beside(shared);
        reply
    }

    /// [`Direct::query_many`] on a server that `shared` also talks to (see
    /// [`Direct::query_beside`]).
    pub(crate) async fn query_many_beside(
        &self,
        cmds: &[u8],
        n: usize,
        shared: &redis::aio::ConnectionManager,
    ) -> Many {
        let replies = self.query_many(cmds, n).await;
        self.wake_beside(shared);
        replies
    }

    /// A PING on `shared` when this connection was opened again (see
    /// [`Direct::query_beside`]).
    fn wake_beside(&self, shared: &redis::aio::ConnectionManager) {
        if self.reconnected() {
            let mut shared = shared.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = crate::reply::reply_of(&mut shared, &redis::cmd("PING")).await;
                });
            }
        }
    }

    fn put(&self, socket: Socket) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        // One past `keep` (more calls at once than it keeps, which lanes do not make) is
        // closed.
        if idle.len() < self.keep {
            idle.push(socket);
        }
    }

    async fn connect(&self) -> Result<Socket, RedisError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, self.open()).await {
            Ok(r) => r,
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no connection to {} within {CONNECT_TIMEOUT:?}",
                    self.target.shown
                ),
            ))),
        }
    }

    async fn open(&self) -> Result<Socket, RedisError> {
        let t = &self.target;
        let stream = match &t.addr {
            Addr::Tcp(host, port) => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            #[cfg(feature = "tls")]
            Addr::Tls(host, port) => {
                let s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                Stream::Tls(Box::new(tls::connect(host, s).await?))
            }
            #[cfg(unix)]
            Addr::Unix(path) => Stream::Unix(tokio::net::UnixStream::connect(path).await?),
        };
        let mut socket = Socket {
            stream,
            buf: Vec::with_capacity(4096),
            owed: 0,
        };
        if let Some(password) = &t.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &t.username {
                auth.arg(user);
            }
            auth.arg(password);
            expect_ok(socket.call(&auth).await?, "AUTH")?;
        }
        if t.db != 0 {
            expect_ok(socket.call(redis::cmd("SELECT").arg(t.db)).await?, "SELECT")?;
        }
        // So that `CLIENT LIST` tells an operator which connection carries the batches. A
        // least-privilege ACL user (scripts only) or a managed server may refuse CLIENT: the
        // connection serves as well unnamed, so only an I/O error counts here.
        let mut name = redis::cmd("CLIENT");
        name.arg("SETNAME").arg(CLIENT_NAME);
        socket.call(&name).await?;
        Ok(socket)
    }
}

fn expect_ok(v: Value, what: &'static str) -> Result<(), RedisError> {
    match v {
        Value::Okay => Ok(()),
        Value::ServerError(e) => Err(e.into()),
        other => Err(RedisError::from((
            ErrorKind::Parse,
            "unexpected reply",
            format!("{what} answered {other:?}"),
        ))),
    }
}

/// One call (one command, or several written together) on a socket taken from its
/// connection. Dropped before the end (the caller gave up), it gives the socket back owing the
/// replies still unread, or closes it when the commands were not written whole or it would
/// owe more than [`MAX_OWED`].
struct Call<'a> {
    direct: &'a Direct,
    socket: Option<Socket>,
    written: bool,
    /// Replies written for and not read yet.
    unread: usize,
}

impl Call<'_> {
    /// Writes `cmd` (one command) and reads its reply.
    async fn run(&mut self, cmd: &[u8]) -> Result<Value, RedisError> {
        let socket = self.send(cmd, 1).await?;
        let v = socket.read_reply().await?;
        self.unread = 0;
        Ok(v)
    }

    /// Writes `cmds` (`n` commands) and reads their `n` replies into `out`, in order.
    async fn run_many(
        &mut self,
        cmds: &[u8],
        n: usize,
        out: &mut Vec<Value>,
    ) -> Result<(), RedisError> {
        self.send(cmds, n).await?;
        while self.unread > 0 {
            let Some(socket) = self.socket.as_mut() else {
                return Err(io_error("Redis connection", "no socket".to_string()));
            };
            out.push(socket.read_reply().await?);
            self.unread -= 1;
        }
        Ok(())
    }

    /// Reads the replies owed to calls given up earlier, then writes `cmds`, which owe `n`.
    async fn send(&mut self, cmds: &[u8], n: usize) -> Result<&mut Socket, RedisError> {
        let Some(socket) = self.socket.as_mut() else {
            return Err(io_error("Redis connection", "no socket".to_string()));
        };
        while socket.owed > 0 {
            socket.read_reply().await?;
            socket.owed -= 1;
        }
        socket.stream.write_all(cmds).await?;
        self.written = true;
        self.unread = n;
        Ok(socket)
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let Some(mut socket) = self.socket.take() else {
            return;
        };
        if self.written && socket.owed + self.unread <= MAX_OWED {
            socket.owed += self.unread;
            self.direct.put(socket);
        }
    }
}

impl Socket {
    /// Writes `cmd` whole and reads its reply (the connection's setup calls).
    async fn call(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        self.stream.write_all(&cmd.get_packed_command()).await?;
        self.read_reply().await
    }

    async fn read_reply(&mut self) -> Result<Value, RedisError> {
        // Built in one pass on the first try (most replies arrive whole); measured first on
        // the tries after it found the reply incomplete (see `resp.rs`).
        let mut first = true;
        loop {
            if !self.buf.is_empty() {
                let parsed = if first {
                    resp::parse_once(&self.buf)
                } else {
                    resp::parse(&self.buf)
                };
                first = false;
                match parsed {
                    Ok(Some((v, used))) => {
                        self.buf.drain(..used);
                        return Ok(v);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        return Err(RedisError::from((
                            ErrorKind::Parse,
                            "unreadable Redis reply",
                            e.0,
                        )))
                    }
                }
            }
            self.buf.reserve(4096);
            let n = self.stream.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Err(RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::UnexpectedEof,
                )));
            }
        }
    }
}

impl Stream {
    /// Whether the reactor has seen the peer close this socket (or an error on it), asked
    /// without waiting and without a system call.
    fn closed_by_peer(&self) -> bool {
        use std::future::Future;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let ready = match self {
            Stream::Tcp(s) => std::pin::pin!(s.ready(tokio::io::Interest::READABLE)).poll(&mut cx),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                std::pin::pin!(s.get_ref().0.ready(tokio::io::Interest::READABLE)).poll(&mut cx)
            }
            #[cfg(unix)]
            Stream::Unix(s) => std::pin::pin!(s.ready(tokio::io::Interest::READABLE)).poll(&mut cx),
        };
        match ready {
            std::task::Poll::Ready(Ok(r)) => r.is_read_closed() || r.is_error(),
            std::task::Poll::Ready(Err(_)) => true,
            std::task::Poll::Pending => false,
        }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(bytes).await,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                s.write_all(bytes).await?;
                s.flush().await
            }
            #[cfg(unix)]
            Stream::Unix(s) => s.write_all(bytes).await,
        }
    }

    async fn read_buf(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => read_into(s, buf).await,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => read_into(s.as_mut(), buf).await,
            #[cfg(unix)]
            Stream::Unix(s) => read_into(s, buf).await,
        }
    }
}

async fn read_into<R: AsyncRead + Unpin + ?Sized>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    r.read_buf(buf).await
}

#[cfg(feature = "tls")]
mod tls {
    use std::sync::Arc;

    /// A TLS session to `host` over `tcp`, verified against the system's roots (which
    /// `SSL_CERT_FILE` replaces), read on every connect as redis-rs does.
    pub(super) async fn connect(
        host: &str,
        tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let mut roots = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(std::io::Error::other(
                "no trusted root certificates found (set SSL_CERT_FILE)",
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| std::io::Error::other(format!("TLS server name {host:?}: {e}")))?;
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(url: &str) -> Option<String> {
        Direct::for_url(url).map(|d| match &d.target.addr {
            Addr::Tcp(h, p) => format!("tcp {h}:{p}"),
            #[cfg(feature = "tls")]
            Addr::Tls(h, p) => format!("tls {h}:{p}"),
            #[cfg(unix)]
            Addr::Unix(path) => format!("unix {}", path.display()),
        })
    }

    #[test]
    fn urls_the_own_connection_takes_and_those_it_leaves_to_redis_rs() {
        assert_eq!(
            addr("redis://10.0.0.1:6380/2").as_deref(),
            Some("tcp 10.0.0.1:6380")
        );
        #[cfg(feature = "tls")]
        assert_eq!(
            addr("rediss://cache.internal:6379").as_deref(),
            Some("tls cache.internal:6379")
        );
        #[cfg(unix)]
        assert_eq!(
            addr("unix:///run/redis.sock").as_deref(),
            Some("unix /run/redis.sock")
        );
        // Unverified TLS is redis-rs's to refuse or allow, never silently ours.
        assert_eq!(addr("rediss://cache.internal:6379/#insecure"), None);
        assert_eq!(addr("not a url"), None);
        let d = Direct::for_url("redis://gw:s3cret@10.0.0.1:6380/2").expect("takes it");
        assert_eq!(d.target.username.as_deref(), Some("gw"));
        assert_eq!(d.target.password.as_deref(), Some("s3cret"));
        assert_eq!(d.target.db, 2);
        assert!(!d.target.shown.contains("s3cret"), "{}", d.target.shown);
    }
}
