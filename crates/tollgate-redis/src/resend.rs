//! Calls on redis-rs's Cluster connection are sent again only when their node certainly did
//! not run them.
//!
//! redis-rs's own retries (`ClusterClientBuilder::retries`) also resend a call after a dropped
//! connection or a response timeout, when the node may already have run it. Measured on three
//! masters behind a relay that dropped the connection once a node had answered a settle: the
//! call was sent again and the refund of 6 units applied twice (20 left of 20 where 16 were
//! due: the second capped at the limit). A hold's release applied twice would free another
//! request's slot. So the store's Cluster client has no retries of its own, and [`again`]
//! sends a call again (at most [`RESENDS`] times after a wait, and as many to follow a
//! redirection) only on an answer that says nothing ran:
//! - MOVED and ASK: to the node they name (ASK after `ASKING`, on the same connection; a
//!   user needs `+asking` for it, docs/operations.md), on a connection of the store's own
//!   ([`Cluster`]): redis-rs's connection reaches by address only a node it is already
//!   connected to, and answers any other with an error that makes it drop its connections and
//!   start again from the seeds. Measured with a master added to three and a slot's keys
//!   moved to it one by one under load (a cluster scaled out): every call that met an ASK
//!   failed, and with `max_batch = 1` redis-rs's connection then stopped answering anything
//!   for good (its recovery waits on a lock that a request it no longer polls was given), so
//!   every later call timed out. Where the store's connection does not take the first URL
//!   (`direct.rs`; no URL this build connects with), a MOVED waits for redis-rs's new slot
//!   map and goes by slot, and an ASK is the call's failure. A node so reached that answers
//!   NOSCRIPT (a master added to scale out, which a SCRIPT LOAD sent to every master misses
//!   while it serves no slot) is noted, and the store loads its script there before it sends
//!   the call again ([`Cluster::load_where_lacking`]);
//! - TRYAGAIN, CLUSTERDOWN, MASTERDOWN and READONLY, no connection to the slot's node, or a
//!   refused connection: after a wait, by slot again (redis-rs reads the slot map again
//!   after each of them).
//!
//! Any other failure (a dropped connection, a timeout) is the caller's: the request follows
//! its failure policy, and a settle that failed leaves its estimate charged. Except for a
//! command that does the same run twice as once ([`idempotent`]: a script's load, a PING, a
//! question): it is also sent again after a dropped connection or a timeout. A SCRIPT LOAD
//! goes to every master, so without that a master whose connection had just dropped (a
//! restart the keep-alive PING had not seen yet) failed the first call of a new form on a
//! healthy one (`broken pipe`).

use crate::direct::Direct;
use crate::error::{is_noscript, not_run_here};
use crate::reply::reply_of;
use crate::watchdog::Shared;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, IntoConnectionInfo, RedisError, ServerErrorKind, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The most nodes the store keeps a connection of its own to for redirections (past it, they
/// are all closed and opened again as needed).
const MAX_REDIRECT_NODES: usize = 64;

/// The longest a SCRIPT LOAD on a node that answered a redirected call NOSCRIPT may take
/// ([`Cluster::load_where_lacking`]): past it, the node is no longer loaded.
const LOAD_TIMEOUT: Duration = Duration::from_secs(1);

/// Sockets kept between calls on the connection to one node a redirection named.
const REDIRECT_IDLE: usize = 4;

/// A Cluster's connections: redis-rs's, which routes every call by its slot (built again when
/// it stops answering, `watchdog.rs`), and the store's own to the nodes that MOVED and ASK name
/// (`direct.rs`, with the first URL's credentials and TLS; none where that connection does not
/// take the URL, see its module docs).
#[derive(Clone)]
pub(crate) struct Cluster {
    shared: Arc<Shared>,
    redirects: Arc<Redirects>,
}

/// The store's own connections to the nodes redirections named, by address, made like
/// `template` (none without one).
struct Redirects {
    template: Option<redis::ConnectionInfo>,
    nodes: Mutex<HashMap<(String, u16), Arc<Direct>>>,
    /// The nodes that answered a redirected call NOSCRIPT, loaded by each caller that meets
    /// one ([`Cluster::load_where_lacking`]): a master added to scale out has none of the
    /// store's scripts, and a SCRIPT LOAD sent to every master misses it while it serves no
    /// slot.
    lacking: Mutex<Vec<Arc<Direct>>>,
}

impl Cluster {
    /// `shared` (redis-rs's), with connections of the store's own made like `first_url`'s.
    pub(crate) fn new(shared: Shared, first_url: Option<&str>) -> Self {
        let template = first_url
            .and_then(|u| u.into_connection_info().ok())
            .filter(Direct::takes);
        Self {
            shared: Arc::new(shared),
            redirects: Arc::new(Redirects {
                template,
                nodes: Mutex::default(),
                lacking: Mutex::default(),
            }),
        }
    }

    /// `cmd`'s reply (an error reply is an `Err`), sent again where the module says so; after
    /// an ASK only when `follows_ask` (not a call of an across-slots script, see
    /// `Packed::across_slots`).
    pub(crate) async fn query(&self, cmd: &Cmd, follows_ask: bool) -> Result<Value, RedisError> {
        match reply_of(&mut self.shared.conn(), cmd).await {
            // A failure (rare) goes to the resend, boxed: the future every call carries
            // stays small.
            Err(e) => Box::pin(again(self, cmd, e, follows_ask)).await,
            reply => reply,
        }
    }

    /// redis-rs's connection and its watchdog.
    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The store's own connection to the node at `host:port`.
    fn node(&self, host: &str, port: u16) -> Option<Arc<Direct>> {
        let template = self.redirects.template.as_ref()?;
        let mut nodes = self
            .redirects
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (host.to_owned(), port);
        if let Some(d) = nodes.get(&key) {
            return Some(Arc::clone(d));
        }
        if nodes.len() >= MAX_REDIRECT_NODES {
            nodes.clear();
        }
        let d = Arc::new(Direct::for_node(template, host, port, REDIRECT_IDLE)?);
        nodes.insert(key, Arc::clone(&d));
        Some(d)
    }

    /// `reply`, the answer of a call redirected to `node`; a NOSCRIPT notes the node for
    /// [`Cluster::load_where_lacking`].
    fn noting(
        &self,
        node: &Arc<Direct>,
        reply: Result<Value, RedisError>,
    ) -> Result<Value, RedisError> {
        if matches!(&reply, Err(e) if is_noscript(e)) {
            let mut lacking = self.redirects.lacking();
            if !lacking.iter().any(|d| Arc::ptr_eq(d, node)) && lacking.len() < MAX_REDIRECT_NODES {
                lacking.push(Arc::clone(node));
            }
        }
        reply
    }

    /// `load()` (a SCRIPT LOAD, as the store's own connection writes it) on each node that
    /// answered a redirected call NOSCRIPT. Every caller loads its own script there before it
    /// sends its call again: taken by one caller, the node list would send the others' calls
    /// back before that caller's load had landed (measured: scaled out under load, calls were
    /// still sent whole). A node stays listed (a load of a script it has costs little, and only
    /// a NOSCRIPT leads here) until a load there fails or takes longer than [`LOAD_TIMEOUT`]: a
    /// node gone, or one not reached. The loads run on a task of their own, so a caller that
    /// gives up first (its deadline passed) does not leave a dead node listed.
    pub(crate) async fn load_where_lacking(&self, load: impl FnOnce() -> Vec<u8>) {
        let lacking = self.redirects.lacking().clone();
        if lacking.is_empty() {
            return;
        }
        // Packed only when a node needs it: a script's SCRIPT LOAD is its whole text.
        let load = load();
        let redirects = Arc::clone(&self.redirects);
        let loads = tokio::spawn(async move {
            for node in lacking {
                let loaded = tokio::time::timeout(LOAD_TIMEOUT, node.query(&load)).await;
                if !matches!(loaded, Ok(Ok(_))) {
                    redirects.lacking().retain(|d| !Arc::ptr_eq(d, &node));
                }
            }
        });
        // A panic in a load is the task's; the call that follows says what the node has.
        let _ = loads.await;
    }
}

impl Redirects {
    fn lacking(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Direct>>> {
        self.lacking.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The most times one call is sent again after a wait, and, apart from those, the most times
/// it follows a redirection (redis-rs's `retries` was 3 in all). Apart: a plan whose keys a
/// slot's migration had split (TRYAGAIN) for longer than the waits was answered MOVED or ASK
/// once the keys were together, and that answer, which names where the call runs, was the
/// plan's failure (measured: 113 such failures in 12 runs of the scale test, three at once;
/// one of them a MOVED, which the test did not expect).
const RESENDS: u32 = 3;

/// The resends of one call so far, by kind ([`RESENDS`] each).
#[derive(Default)]
struct Sent {
    waits: u32,
    redirects: u32,
}

impl Sent {
    /// Whether `next` sends the call again within its kind's budget (counted if so).
    fn may(&mut self, next: &Next) -> bool {
        let n = match next {
            Next::Fail => return false,
            Next::Wait => &mut self.waits,
            Next::To(..) | Next::Asking(..) => &mut self.redirects,
        };
        *n += 1;
        *n <= RESENDS
    }
}

/// The first wait before sending a call again by slot; each next one doubles, up to
/// [`MAX_WAIT`].
const MIN_WAIT: Duration = Duration::from_millis(20);
const MAX_WAIT: Duration = Duration::from_millis(200);

/// What to do after a failed try.
#[derive(Debug, PartialEq)]
enum Next {
    /// The node may have run it (or the failure is final): the caller's failure.
    Fail,
    /// Send it to this node (MOVED).
    To(String, u16),
    /// Send `ASKING` then the call to this node (ASK).
    Asking(String, u16),
    /// Wait, then send it by slot again.
    Wait,
}

/// Whether running `cmd` twice does what running it once does: SCRIPT LOAD and EXISTS, PING,
/// INFO, TIME, CLUSTER SLOTS (what the store sends besides its scripts, which charge).
fn idempotent(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(bytes) => bytes,
        _ => &b""[..],
    });
    let is = |arg: Option<&[u8]>, name: &str| {
        arg.is_some_and(|a| a.eq_ignore_ascii_case(name.as_bytes()))
    };
    let (first, second) = (args.next(), args.next());
    ["PING", "INFO", "TIME"].iter().any(|n| is(first, n))
        || (is(first, "SCRIPT") && (is(second, "LOAD") || is(second, "EXISTS")))
        || (is(first, "CLUSTER") && is(second, "SLOTS"))
}

/// `cmd` sent again on `cluster` after it failed with `first`, where the module says so (after
/// an ASK only when `follows_ask`): the last reply (`first` itself when nothing was sent
/// again).
async fn again(
    cluster: &Cluster,
    cmd: &Cmd,
    first: RedisError,
    follows_ask: bool,
) -> Result<Value, RedisError> {
    let mut c = cluster.shared.conn();
    let mut reply = Err(first);
    let mut wait = MIN_WAIT;
    let idempotent = idempotent(cmd);
    let mut sent = Sent::default();
    loop {
        let next = match &reply {
            Ok(_) => break,
            Err(e) => next_after(e, idempotent),
        };
        if !sent.may(&next) {
            break;
        }
        reply = match next {
            Next::Fail => break,
            Next::Asking(..) if !follows_ask => break,
            Next::To(host, port) => match cluster.node(&host, port) {
                Some(node) => cluster.noting(&node, node.query(&cmd.get_packed_command()).await),
                // redis-rs reads the slot map again after a MOVED: by slot, after a wait.
                None => by_slot_after(&mut c, cmd, &mut wait).await,
            },
            Next::Asking(host, port) => match cluster.node(&host, port) {
                Some(node) => cluster.noting(&node, asking_on(&node, cmd).await),
                // Not by address on redis-rs's client (see the module docs): the ASK is the
                // call's failure.
                None => break,
            },
            Next::Wait => by_slot_after(&mut c, cmd, &mut wait).await,
        };
    }
    reply
}

/// `cmd` by slot on `c` after `wait`, which doubles for the next (up to [`MAX_WAIT`]).
async fn by_slot_after(
    c: &mut ClusterConnection,
    cmd: &Cmd,
    wait: &mut Duration,
) -> Result<Value, RedisError> {
    tokio::time::sleep(*wait).await;
    *wait = (*wait * 2).min(MAX_WAIT);
    reply_of(c, cmd).await
}

/// `ASKING` and `cmd` written together on `node`: `cmd`'s reply, or `ASKING`'s refusal (a user
/// without `+asking`).
async fn asking_on(node: &Direct, cmd: &Cmd) -> Result<Value, RedisError> {
    let mut both = redis::cmd("ASKING").get_packed_command();
    both.extend_from_slice(&cmd.get_packed_command());
    let mut replies = node.query_many(&both, 2).await?.into_iter();
    match (replies.next(), replies.next()) {
        (Some(Err(refused)), _) => Err(refused),
        (Some(Ok(_)), Some(reply)) => reply,
        _ => Err(RedisError::from((
            ErrorKind::Parse,
            "no reply after ASKING",
        ))),
    }
}

/// What follows the failure `e` of a command ([`idempotent`] or not).
fn next_after(e: &RedisError, idempotent: bool) -> Next {
    match e.kind() {
        ErrorKind::Server(k @ (ServerErrorKind::Moved | ServerErrorKind::Ask)) => {
            match e
                .redirect_node()
                .and_then(|(addr, _slot)| host_and_port(addr))
            {
                Some((host, port)) if k == ServerErrorKind::Moved => Next::To(host, port),
                Some((host, port)) => Next::Asking(host, port),
                // A node named in a form not understood: by slot, once the map is read again.
                None => Next::Wait,
            }
        }
        // TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, a refused connection, or none for
        // the slot: nothing ran.
        ErrorKind::ClusterConnectionNotFound => Next::Wait,
        _ if not_run_here(e) => Next::Wait,
        // Whether or not it ran, once more does no harm.
        _ if idempotent && (e.is_io_error() || e.is_connection_dropped() || e.is_timeout()) => {
            Next::Wait
        }
        _ => Next::Fail,
    }
}

/// `host:port` (the host may be an IPv6 address, whose colons come before the last).
fn host_and_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(text: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(Value::ServerError(e)) => e.into(),
            other => panic!("not a server error: {other:?}"),
        }
    }

    fn io(kind: std::io::ErrorKind) -> RedisError {
        std::io::Error::from(kind).into()
    }

    #[test]
    fn waits_and_redirections_have_a_budget_each() {
        let mut sent = Sent::default();
        let moved = Next::To("127.0.0.1".into(), 7001);
        let ask = Next::Asking("127.0.0.1".into(), 7002);
        assert!(!sent.may(&Next::Fail));
        for _ in 0..RESENDS {
            assert!(sent.may(&Next::Wait));
        }
        assert!(!sent.may(&Next::Wait), "a fourth wait");
        // The waits spent, a redirection that names where the call runs is still followed.
        assert!(sent.may(&moved));
        assert!(sent.may(&ask));
        assert!(sent.may(&moved));
        assert!(!sent.may(&ask), "a fourth redirection");
        assert!(!sent.may(&Next::Wait));
    }

    #[test]
    fn only_answers_that_say_nothing_ran_are_sent_again() {
        assert_eq!(
            next_after(&server("MOVED 3999 127.0.0.1:6381"), false),
            Next::To("127.0.0.1".into(), 6381)
        );
        assert_eq!(
            next_after(&server("ASK 3999 [::1]:7002"), false),
            Next::Asking("::1".into(), 7002)
        );
        assert_eq!(
            next_after(&server("ASK 3999 ::1:7002"), false),
            Next::Asking("::1".into(), 7002)
        );
        for text in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down",
            "READONLY You can't write against a read only replica.",
            "MOVED 3999 nowhere",
            "MOVED 3999 :6379",
        ] {
            assert_eq!(next_after(&server(text), false), Next::Wait, "{text}");
        }
        assert_eq!(
            next_after(&io(std::io::ErrorKind::ConnectionRefused), false),
            Next::Wait
        );
        let not_found: RedisError = (ErrorKind::ClusterConnectionNotFound, "none").into();
        assert_eq!(next_after(&not_found, false), Next::Wait);
        // The node may have run these: never sent again.
        for kind in [
            std::io::ErrorKind::UnexpectedEof,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::TimedOut,
        ] {
            assert_eq!(next_after(&io(kind), false), Next::Fail, "{kind:?}");
            // A load or a question is sent again whatever happened to the first.
            assert_eq!(next_after(&io(kind), true), Next::Wait, "{kind:?}");
        }
        for text in [
            "BUSY Redis is busy running a script",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOSCRIPT No matching script",
            "ERR user_script:1: boom",
        ] {
            assert_eq!(next_after(&server(text), false), Next::Fail, "{text}");
            assert_eq!(next_after(&server(text), true), Next::Fail, "{text}");
        }
    }

    #[test]
    fn loads_and_questions_are_idempotent_and_script_calls_are_not() {
        let cmd = |args: &[&str]| {
            let mut c = redis::cmd(args[0]);
            for a in &args[1..] {
                c.arg(*a);
            }
            c
        };
        for yes in [
            &["SCRIPT", "LOAD", "return 1"][..],
            &["script", "exists", "abc"],
            &["PING"],
            &["INFO", "memory"],
            &["TIME"],
            &["CLUSTER", "SLOTS"],
        ] {
            assert!(idempotent(&cmd(yes)), "{yes:?}");
        }
        for no in [
            &["EVALSHA", "abc", "1", "k"][..],
            &["EVAL", "return 1", "0"],
            &["SCRIPT", "FLUSH"],
            &["CLUSTER", "FAILOVER"],
            &["SET", "k", "v"],
            &["DEL", "k"],
        ] {
            assert!(!idempotent(&cmd(no)), "{no:?}");
        }
    }
}
