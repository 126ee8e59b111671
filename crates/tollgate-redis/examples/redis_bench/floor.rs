//! `redis_bench --script-floor`: what Redis itself spends per plan (issue #25).
//!
//! Coalesced calls (`store.max_batch`) pay a script call's fixed cost once for many plans.
//! What no batching removes is Redis's work per key: each plan reads its key and writes it
//! with `SET ... PX` (a key created, deleted later by active expiry). This mode measures that
//! floor beside tollgate's real scripts, token bucket 100/min, with a synchronous pipelined
//! client of its own (std's TcpStream, no redis-rs), so that what is read is Redis's CPU per
//! plan whatever the client costs:
//!
//! - `single`: the one-plan script, one plan per EVALSHA, `--pipeline` calls per write, with
//!   the arguments `RedisStore::check` sends (`plan_script_sha`, `plan_script_quotas`);
//! - `batch`: the batch script, `--batch` plans per call, `--calls` calls per write, with the
//!   arguments the store writes (`batch_script_sha`, `batch_script_args`);
//! - `minimal`: a script that only MGETs its `--batch` keys and writes each with
//!   `SET key value PX 600 GET` (15 bytes, a token bucket's state; 600 ms, the PX of a fresh
//!   100/min bucket), no decision, `--calls` calls per write;
//! - `set`: `--batch` plain `SET key value PX 600` per call's worth, `--calls` of them per
//!   write, no Lua.
//!
//! A run: FLUSHALL, `--warmup` seconds of the case (the live keys settle), then `--seconds`
//! measured: redis-server's utime + stime (/proc/PID/stat, the PID from `INFO server`, so the
//! server must be local) over the plans answered. Two writes stay in flight, so Redis never
//! waits for the client to read; every reply is read and checked, an error fails the run.
//! The cases take turns in rounds (single, batch, minimal, set; each key count in turn), so a
//! drifting machine favours none, and ratios to `single` are taken within a round. One JSON
//! object per run on stdout, then a summary.
//!
//! ```text
//! redis_bench --script-floor --url redis://127.0.0.1:PORT [--keys 1000000[,100000...]]
//!             [--batch 64] [--seconds 5] [--warmup 1] [--rounds 3] [--pipeline 64] [--calls 4]
//!             [--cases single,batch,minimal,set] [--limits 1]
//! ```
//!
//! `--limits N`: the batch case's plans take N quotas in turn (100 tokens over 60 s, 61 s, ...):
//! 1, one policy's plans; a few, tiers; thousands, a distinct limit a plan (overrides).
//!
//! `--cases` runs some of the cases only (ratios to `single` need it in the list): one case
//! alone is what a profile of redis-server (callgrind) wants.
//!
//! `--ballast 0,256`: the cases run beside that many other batch scripts loaded on the server
//! (`many_forms_batch_scripts`: those a store keeps when its clients' requests match many
//! policies, at most 385), each count in turn within a round, after a `SCRIPT FLUSH`: what the
//! scripts a server keeps cost every call (ratios to the first count, same case and round).

use crate::resp::{self, Reply};
use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use tollgate_core::{Algorithm, Limit, Mode, Quota};
use tollgate_redis::RuleShape;

/// The floor script: one MGET of its keys, then `SET key ARGV[1] PX ARGV[2] GET` per key, as
/// the batch script reads and writes them, and nothing else.
const MINIMAL: &str = "local old = redis.call('MGET', unpack(KEYS))\n\
                       for i = 1, #KEYS do\n  \
                       redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2], 'GET')\n\
                       end\n\
                       return #KEYS\n";
/// A fresh 100/min bucket after one token is full again one emission interval later.
const PX_MS: &[u8] = b"600";
/// Every socket wait is bounded.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest reply read (a batch of 1,024 packed answers is under 40 KiB).
const MAX_REPLY: usize = 1 << 20;
/// More plans a second than any one Redis answers: a run also ends past this count.
const MAX_PLANS_PER_S: f64 = 5_000_000.0;

/// The cases, in the order each round runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    Single,
    Batch,
    Minimal,
    Set,
}

impl Case {
    const ALL: [Case; 4] = [Case::Single, Case::Batch, Case::Minimal, Case::Set];

    fn name(self) -> &'static str {
        match self {
            Case::Single => "single",
            Case::Batch => "batch",
            Case::Minimal => "minimal",
            Case::Set => "set",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    url: String,
    keys: Vec<u64>,
    batch: usize,
    seconds: f64,
    warmup: f64,
    rounds: u32,
    pipeline: usize,
    calls: usize,
    /// How many quotas the batch case's plans take turns with: 1, every plan the same limit
    /// (one policy); a few, tiers; many, a distinct one a plan (limit overrides).
    limits: usize,
    /// Which cases run (all by default, in [`Case::ALL`]'s order): one alone, for a profile of
    /// redis-server under one script.
    cases: Vec<Case>,
    /// Other batch scripts loaded beside the cases', each count in turn (see the module docs).
    ballast: Vec<usize>,
}

/// The options after `--script-floor`.
pub fn parse(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut o = Options {
        url: String::new(),
        keys: vec![1_000_000],
        batch: 64,
        seconds: 5.0,
        warmup: 1.0,
        rounds: 3,
        pipeline: 64,
        calls: 4,
        limits: 1,
        cases: Case::ALL.to_vec(),
        ballast: vec![0],
    };
    let mut it = args;
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bounded = |lo: u64, hi: u64| -> Result<u64, String> {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or(format!(
                    "{flag} takes a whole number in [{lo}, {hi}], not {value:?}"
                ))
        };
        let seconds = |lo: f64| -> Result<f64, String> {
            value
                .parse::<f64>()
                .ok()
                .filter(|s| (lo..=600.0).contains(s))
                .ok_or(format!(
                    "{flag} takes seconds in [{lo}, 600], not {value:?}"
                ))
        };
        let size = |n: u64| usize::try_from(n).map_err(|e| format!("{flag}: {e}"));
        // A comma-separated list of counts, each in [lo, hi].
        let counts = |lo: u64, hi: u64| -> Result<Vec<u64>, String> {
            value
                .split(',')
                .map(|k| {
                    k.trim()
                        .parse::<u64>()
                        .ok()
                        .filter(|n| (lo..=hi).contains(n))
                        .ok_or(format!("{flag} takes counts in [{lo}, {hi}], not {k:?}"))
                })
                .collect()
        };
        match flag.as_str() {
            "--url" => o.url = value.clone(),
            "--keys" => o.keys = counts(1, 100_000_000)?,
            "--batch" => o.batch = size(bounded(2, tollgate_redis::MAX_BATCH as u64)?)?,
            "--seconds" => o.seconds = seconds(0.1)?,
            "--warmup" => o.warmup = seconds(0.0)?,
            "--rounds" => o.rounds = u32::try_from(bounded(1, 20)?).map_err(|e| e.to_string())?,
            "--pipeline" => o.pipeline = size(bounded(1, 10_000)?)?,
            "--calls" => o.calls = size(bounded(1, 1_000)?)?,
            "--limits" => o.limits = size(bounded(1, 100_000)?)?,
            "--cases" => {
                let named: Result<Vec<Case>, String> = value
                    .split(',')
                    .map(|n| {
                        Case::ALL
                            .into_iter()
                            .find(|c| c.name() == n.trim())
                            .ok_or(format!(
                                "--cases takes single, batch, minimal or set, not {n:?}"
                            ))
                    })
                    .collect();
                // In Case::ALL's order, each once.
                let named = named?;
                o.cases = Case::ALL
                    .into_iter()
                    .filter(|c| named.contains(c))
                    .collect();
            }
            "--ballast" => {
                let most = tollgate_redis::MANY_FORMS_SCRIPTS as u64;
                o.ballast = counts(0, most)?
                    .into_iter()
                    .map(size)
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if o.url.is_empty() {
        return Err("--url is required".into());
    }
    Ok(o)
}

/// The server's address: `redis://HOST:PORT` on loopback, nothing else (the CPU read is that
/// of a local process, and this client sends no AUTH or SELECT).
fn loopback(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or(format!("--url {url:?}: redis://HOST:PORT expected"))?;
    let host_port = rest.strip_suffix('/').unwrap_or(rest);
    if host_port.contains(['@', '/', '?']) {
        return Err(format!(
            "--url {url:?}: no user, database or options (a local server as tollgate-testkit starts it)"
        ));
    }
    let addr = host_port
        .to_socket_addrs()
        .map_err(|e| format!("--url {url:?}: {e}"))?
        .next()
        .ok_or(format!("--url {url:?}: no address"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("--url {url:?}: loopback only ({addr})"));
    }
    Ok(addr)
}

/// utime + stime, in clock ticks, from the text of a /proc/PID/stat file (the command name may
/// hold spaces and parentheses: the fields start after the last `)`).
fn stat_ticks(text: &str) -> Result<u64, String> {
    let (_, rest) = text
        .rsplit_once(')')
        .ok_or("a stat line without a command name")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64, String> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or(format!("a stat line without field {}", i + 3))
    };
    // utime and stime are fields 14 and 15, the 12th and 13th after the name and state.
    Ok(field(11)? + field(12)?)
}

fn cpu_ticks(pid: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    stat_ticks(&text).map_err(|e| format!("{path}: {e}"))
}

fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// SplitMix64 step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Client `index`'s key, shaped as the store's: `tollgate:{<32 hex digits>}:api`.
fn key(index: u64) -> String {
    format!("tollgate:{{{:016x}{:016x}}}:api", mix(index), mix(!index))
}

/// The 7-byte big-endian integer at `at`.
fn int7(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 7)
        .unwrap_or(&[])
        .iter()
        .fold(0, |acc, &b| (acc << 8) | u64::from(b))
}

/// What a chunk of commands is owed: its replies, and the plans they answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expect {
    replies: usize,
    plans: u64,
}

/// `n` token buckets of 100 tokens, each over its own period (60 s, 61 s, ...): another
/// quotas string each, the same base and limit, so every plan's answer reads alike.
fn limits_of(n: usize) -> Result<Vec<RuleShape>, String> {
    (0..n as u64)
        .map(|i| {
            let quota = Quota::new(100, Duration::from_secs(60 + i)).map_err(|e| e.to_string())?;
            Ok(RuleShape {
                limit: Limit::new(Algorithm::TokenBucket, quota).map_err(|e| e.to_string())?,
                mode: Mode::Enforce,
            })
        })
        .collect()
}

/// The commands of each case, built with the store's own arguments.
struct Load {
    rule: RuleShape,
    single_sha: String,
    batch_sha: String,
    minimal_sha: String,
    quotas: Vec<u8>,
    /// A token bucket's state: "T", 99 tokens, an instant (15 bytes).
    value: Vec<u8>,
    /// The base of an allowed plan's integer answer, and the rule's limit.
    base: u64,
    limit: u64,
    batch: usize,
    pipeline: usize,
    calls: usize,
    next: u64,
    /// The batch case's limits (`--limits`), taken in turn plan after plan.
    limits: Vec<RuleShape>,
    next_limit: usize,
}

impl Load {
    fn new(o: &Options) -> Result<Load, String> {
        let quota = Quota::per_minute(100).map_err(|e| e.to_string())?;
        let rule = RuleShape {
            limit: Limit::new(Algorithm::TokenBucket, quota).map_err(|e| e.to_string())?,
            mode: Mode::Enforce,
        };
        let none = || "no generated script for token_bucket".to_string();
        let quotas = tollgate_redis::plan_script_quotas(&[rule]).ok_or_else(none)?;
        let mut value = b"T".to_vec();
        value.extend_from_slice(&99u64.to_be_bytes()[1..]);
        value.extend_from_slice(&1_764_442_000_123_456u64.to_be_bytes()[1..]);
        Ok(Load {
            rule,
            single_sha: tollgate_redis::plan_script_sha(&[rule]).ok_or_else(none)?,
            batch_sha: tollgate_redis::batch_script_sha(&[rule]).ok_or_else(none)?,
            minimal_sha: redis::Script::new(MINIMAL).get_hash().to_string(),
            // The quotas: limit, period, burst, interval, then the integer answer's base.
            base: int7(&quotas, 28),
            limit: int7(&quotas, 0),
            quotas,
            value,
            batch: o.batch,
            pipeline: o.pipeline,
            calls: o.calls,
            next: 0,
            limits: limits_of(o.limits)?,
            next_limit: 0,
        })
    }

    /// A random one of `keys` clients' keys.
    fn pick(&mut self, keys: u64) -> String {
        self.next += 1;
        key(mix(self.next) % keys)
    }

    /// One write's worth of `case`'s commands, appended to `out`.
    fn chunk(&mut self, case: Case, keys: u64, out: &mut Vec<u8>) -> Result<Expect, String> {
        let n = self.batch;
        match case {
            Case::Single => {
                for _ in 0..self.pipeline {
                    let k = self.pick(keys);
                    let sha = self.single_sha.as_bytes();
                    resp::command(out, &[b"EVALSHA", sha, b"1", k.as_bytes(), &self.quotas]);
                }
                Ok(Expect {
                    replies: self.pipeline,
                    plans: self.pipeline as u64,
                })
            }
            Case::Batch => {
                for _ in 0..self.calls {
                    let ks: Vec<String> = (0..n).map(|_| self.pick(keys)).collect();
                    let plans: Vec<&[RuleShape]> = (0..n)
                        .map(|i| {
                            let at = (self.next_limit + i) % self.limits.len();
                            std::slice::from_ref(&self.limits[at])
                        })
                        .collect();
                    let args = tollgate_redis::batch_script_args_each(&plans, &ks)
                        .ok_or("no batch call for token_bucket")?;
                    self.next_limit += n;
                    resp::header(out, b'*', 2 + args.len());
                    resp::bulk(out, b"EVALSHA");
                    resp::bulk(out, self.batch_sha.as_bytes());
                    for a in &args {
                        resp::bulk(out, a);
                    }
                }
                Ok(Expect {
                    replies: self.calls,
                    plans: (self.calls * n) as u64,
                })
            }
            Case::Minimal => {
                for _ in 0..self.calls {
                    resp::header(out, b'*', 3 + n + 2);
                    resp::bulk(out, b"EVALSHA");
                    resp::bulk(out, self.minimal_sha.as_bytes());
                    resp::bulk(out, n.to_string().as_bytes());
                    for _ in 0..n {
                        let k = self.pick(keys);
                        resp::bulk(out, k.as_bytes());
                    }
                    resp::bulk(out, &self.value);
                    resp::bulk(out, PX_MS);
                }
                Ok(Expect {
                    replies: self.calls,
                    plans: (self.calls * n) as u64,
                })
            }
            Case::Set => {
                for _ in 0..self.calls * n {
                    let k = self.pick(keys);
                    resp::command(out, &[b"SET", k.as_bytes(), &self.value, b"PX", PX_MS]);
                }
                Ok(Expect {
                    replies: self.calls * n,
                    plans: (self.calls * n) as u64,
                })
            }
        }
    }

    /// Checks one reply of `case`, counting in `tally` what its plans found.
    fn check(&self, case: Case, reply: &Reply, tally: &mut Tally) -> Result<(), String> {
        let unexpected = |what: &Reply| format!("{}: Redis answered {what:?}", case.name());
        match (case, reply) {
            (_, Reply::Error(e)) => Err(format!("{}: Redis answered an error: {e}", case.name())),
            (Case::Single, r) => self.plan(r, tally).map_err(|e| format!("single: {e}")),
            (Case::Batch, Reply::Array(Some(items))) if items.len() == self.batch => {
                for r in items {
                    self.plan(r, tally).map_err(|e| format!("batch: {e}"))?;
                }
                Ok(())
            }
            (Case::Minimal, Reply::Int(n)) if usize::try_from(*n) == Ok(self.batch) => Ok(()),
            (Case::Set, Reply::Status(s)) if s == b"OK" => Ok(()),
            (_, r) => Err(unexpected(r)),
        }
    }

    /// One plan's answer, as the store parses it: the integer of an allowed plan, or the
    /// packed string (the script's now, then allowed, remaining, reset, retry + 1).
    fn plan(&self, reply: &Reply, tally: &mut Tally) -> Result<(), String> {
        let (allowed, remaining) = match reply {
            Reply::Int(v) if self.base > 0 => {
                let v = u64::try_from(*v).map_err(|_| format!("the plan's answer {v}"))?;
                (true, v % self.base)
            }
            Reply::Bulk(Some(b)) if b.len() == 29 => match b[7] {
                0 => (false, int7(b, 8)),
                1 => (true, int7(b, 8)),
                flag => return Err(format!("the plan's answer has flag {flag}")),
            },
            Reply::Error(e) => return Err(format!("Redis refused a plan: {e}")),
            other => return Err(format!("the plan's answer {other:?}")),
        };
        tally.allowed += u64::from(allowed);
        // A full bucket less the plan's token: the key was new (or had expired).
        tally.full += u64::from(allowed && remaining + 1 == self.limit);
        Ok(())
    }
}

/// What the plans of a run found.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    plans: u64,
    allowed: u64,
    /// Plans that found a full bucket (a key new or expired).
    full: u64,
}

/// The connection: the stream written, and a buffered reader of its clone.
struct Conn {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn connect(addr: SocketAddr) -> Result<Conn, String> {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let setup = |s: &TcpStream| -> std::io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))
        };
        setup(&stream).map_err(|e| format!("{addr}: {e}"))?;
        let reader = stream
            .try_clone()
            .map_err(|e| format!("{addr}: cannot clone the socket: {e}"))?;
        Ok(Conn {
            writer: stream,
            reader: BufReader::with_capacity(64 * 1024, reader),
        })
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.writer
            .write_all(bytes)
            .map_err(|e| format!("writing to Redis: {e}"))
    }

    fn reply(&mut self) -> Result<Reply, String> {
        resp::read(&mut self.reader, MAX_REPLY)
    }

    /// One command and its reply; an error reply is an error.
    fn call(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        let mut out = Vec::new();
        resp::command(&mut out, args);
        self.send(&out)?;
        let name = String::from_utf8_lossy(args.first().copied().unwrap_or_default()).into_owned();
        match self.reply()? {
            Reply::Error(e) => Err(format!("{name}: {e}")),
            r => Ok(r),
        }
    }
}

/// One measured run.
#[derive(Debug, Clone)]
struct Run {
    case: Case,
    keys: u64,
    ballast: usize,
    round: u32,
    tally: Tally,
    wall: f64,
    redis_us: f64,
    client_us: f64,
    dbsize: i64,
}

impl Run {
    fn us_per_plan(&self) -> f64 {
        self.redis_us / self.tally.plans as f64
    }

    fn json(&self, batch: usize) -> String {
        let plans = self.tally.plans as f64;
        format!(
            "{{\"case\":\"{}\",\"keys\":{},\"ballast\":{},\"batch\":{},\"round\":{},\"plans\":{},\"seconds\":{:.3},\
             \"plans_per_s\":{:.0},\"redis_cpu_us_per_plan\":{:.4},\"redis_busy\":{:.3},\
             \"client_busy\":{:.3},\"allowed\":{},\"full_buckets\":{},\"keys_at_end\":{}}}",
            self.case.name(),
            self.keys,
            self.ballast,
            if self.case == Case::Single { 1 } else { batch },
            self.round,
            self.tally.plans,
            self.wall,
            plans / self.wall,
            self.us_per_plan(),
            self.redis_us / 1e6 / self.wall,
            self.client_us / 1e6 / self.wall,
            self.tally.allowed,
            self.tally.full,
            self.dbsize,
        )
    }
}

struct Bench {
    conn: Conn,
    load: Load,
    pid: String,
    tick_us: f64,
}

impl Bench {
    /// Sends `case` for `seconds` (at most [`MAX_PLANS_PER_S`] a second), two writes in
    /// flight, every reply read and checked.
    fn drive(&mut self, case: Case, keys: u64, seconds: f64) -> Result<Tally, String> {
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let most = (seconds * MAX_PLANS_PER_S) as u64;
        let mut in_flight: VecDeque<Expect> = VecDeque::with_capacity(2);
        let mut tally = Tally::default();
        let (mut sent, mut out) = (0u64, Vec::with_capacity(64 * 1024));
        loop {
            while in_flight.len() < 2 && sent < most && Instant::now() < deadline {
                out.clear();
                let expect = self.load.chunk(case, keys, &mut out)?;
                self.conn.send(&out)?;
                sent += expect.plans;
                in_flight.push_back(expect);
            }
            let Some(expect) = in_flight.pop_front() else {
                return Ok(tally);
            };
            for _ in 0..expect.replies {
                let reply = self.conn.reply()?;
                self.load.check(case, &reply, &mut tally)?;
            }
            tally.plans += expect.plans;
        }
    }

    fn run(
        &mut self,
        case: Case,
        keys: u64,
        ballast: usize,
        round: u32,
        o: &Options,
    ) -> Result<Run, String> {
        match self.conn.call(&[b"FLUSHALL"])? {
            Reply::Status(s) if s == b"OK" => {}
            other => return Err(format!("FLUSHALL answered {other:?}")),
        }
        self.drive(case, keys, o.warmup)?;
        let (redis0, me0) = (cpu_ticks(&self.pid)?, cpu_ticks("self")?);
        let start = Instant::now();
        let tally = self.drive(case, keys, o.seconds)?;
        let wall = start.elapsed().as_secs_f64();
        let (redis1, me1) = (cpu_ticks(&self.pid)?, cpu_ticks("self")?);
        if tally.plans == 0 {
            return Err(format!("{}: no plan answered in {wall:.1} s", case.name()));
        }
        let dbsize = match self.conn.call(&[b"DBSIZE"])? {
            Reply::Int(n) => n,
            other => return Err(format!("DBSIZE answered {other:?}")),
        };
        Ok(Run {
            case,
            keys,
            ballast,
            round,
            tally,
            wall,
            redis_us: redis1.saturating_sub(redis0) as f64 * self.tick_us,
            client_us: me1.saturating_sub(me0) as f64 * self.tick_us,
            dbsize,
        })
    }
}

/// The server's `process_id` and `redis_version` from `INFO server`.
fn server_info(text: &str) -> Result<(String, String), String> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
            .ok_or(format!("INFO server has no {name}"))
    };
    let pid = field("process_id")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("INFO server's process_id {pid:?}"));
    }
    Ok((pid, field("redis_version")?))
}

/// `SCRIPT FLUSH`, then the cases' scripts (text and SHA) and the `ballast` scripts beside
/// them.
fn load_scripts(
    conn: &mut Conn,
    cases: &[(String, String)],
    ballast: &[String],
) -> Result<(), String> {
    match conn.call(&[b"SCRIPT", b"FLUSH"])? {
        Reply::Status(s) if s == b"OK" => {}
        other => return Err(format!("SCRIPT FLUSH answered {other:?}")),
    }
    for (text, sha) in cases {
        load_script(conn, text, sha)?;
    }
    for text in ballast {
        match conn.call(&[b"SCRIPT", b"LOAD", text.as_bytes()])? {
            Reply::Bulk(Some(_)) => {}
            other => {
                return Err(format!(
                    "SCRIPT LOAD of a ballast script answered {other:?}"
                ))
            }
        }
    }
    Ok(())
}

/// Loads `text` and checks that Redis names it `sha`.
fn load_script(conn: &mut Conn, text: &str, sha: &str) -> Result<(), String> {
    match conn.call(&[b"SCRIPT", b"LOAD", text.as_bytes()])? {
        Reply::Bulk(Some(got)) if got == sha.as_bytes() => Ok(()),
        other => Err(format!("SCRIPT LOAD answered {other:?}, expected {sha}")),
    }
}

/// The lower middle value (always one that was measured).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Per key count and case: Redis CPU µs per plan in each round, its ratio to `single` in the
/// same round, and plans/s.
fn summary(runs: &[Run], o: &Options) -> String {
    let mut out = format!(
        "summary: token_bucket 100/min, batch {}, {} s a run; Redis CPU us per plan by round, \
         ratio to single in the same round (and to the first ballast count), median plans/s\n",
        o.batch, o.seconds
    );
    let first = o.ballast.first().copied().unwrap_or(0);
    for &keys in &o.keys {
        for &n in &o.ballast {
            out.push_str(&format!("keys={keys} ballast={n}\n"));
            for &case in &o.cases {
                let mine: Vec<&Run> = runs
                    .iter()
                    .filter(|r| r.keys == keys && r.ballast == n && r.case == case)
                    .collect();
                // Against the run of the same keys and round, of `case` beside `ballast` others.
                let against = |case: Case, ballast: usize| -> Vec<f64> {
                    mine.iter()
                        .filter_map(|r| {
                            let base = runs.iter().find(|b| {
                                b.keys == keys
                                    && b.round == r.round
                                    && b.case == case
                                    && b.ballast == ballast
                            })?;
                            Some(r.us_per_plan() / base.us_per_plan())
                        })
                        .collect()
                };
                let ratios = against(Case::Single, n);
                let to_first = against(case, first);
                let rate = median(mine.iter().map(|r| r.tally.plans as f64 / r.wall).collect());
                let us: Vec<f64> = mine.iter().map(|r| r.us_per_plan()).collect();
                let shown = |v: &[f64]| {
                    let parts: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
                    parts.join(" ")
                };
                out.push_str(&format!(
                    "  {:<8} us/plan {:<24} ratio {:<20} (median {:.2})  ",
                    case.name(),
                    shown(&us),
                    shown(&ratios),
                    median(ratios.clone()),
                ));
                out.push_str(&format!(
                    "to ballast {first} {:<16} (median {:.2})  plans/s {rate:.0}\n",
                    shown(&to_first),
                    median(to_first),
                ));
            }
        }
    }
    out
}

/// Runs the mode; `args` are those after `--script-floor`.
pub fn main(args: impl Iterator<Item = String>) -> Result<(), String> {
    let o = parse(args)?;
    let mut conn = Conn::connect(loopback(&o.url)?)?;
    let info = match conn.call(&[b"INFO", b"server"])? {
        Reply::Bulk(Some(text)) => String::from_utf8_lossy(&text).into_owned(),
        other => return Err(format!("INFO server answered {other:?}")),
    };
    let (pid, version) = server_info(&info)?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map_err(|e| format!("redis-server's process {pid} is not on this machine: {e}"))?;
    // A redis-server run under valgrind (for a profile) is named after the tool; its command
    // line still names the server.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let names_redis = cmdline
        .split(|&b| b == 0)
        .any(|arg| arg.ends_with(b"redis-server"));
    if !comm.contains("redis") && !names_redis {
        return Err(format!(
            "process {pid} is {:?}, not redis-server: the server must be local",
            comm.trim()
        ));
    }
    let load = Load::new(&o)?;
    let texts: Vec<(String, String)> = [
        (
            tollgate_redis::plan_script_text(&[load.rule]),
            &load.single_sha,
        ),
        (
            tollgate_redis::batch_script_text(&[load.rule]),
            &load.batch_sha,
        ),
        (Some(MINIMAL.to_string()), &load.minimal_sha),
    ]
    .into_iter()
    .map(|(text, sha)| Ok((text.ok_or("no generated script")?, sha.clone())))
    .collect::<Result<_, String>>()?;
    let most = o.ballast.iter().copied().max().unwrap_or(0);
    let ballast = tollgate_redis::many_forms_batch_scripts(most);
    let mut bench = Bench {
        conn,
        load,
        pid,
        tick_us: 1e6 / ticks_per_second() as f64,
    };
    eprintln!(
        "redis_bench --script-floor: redis {version}, keys {:?}, batch {}, ballast {:?}, {} \
         rounds of {} s",
        o.keys, o.batch, o.ballast, o.rounds, o.seconds
    );
    let mut runs = Vec::new();
    for round in 1..=o.rounds {
        for &keys in &o.keys {
            for &n in &o.ballast {
                load_scripts(
                    &mut bench.conn,
                    &texts,
                    ballast.get(..n).unwrap_or(&ballast),
                )?;
                for &case in &o.cases {
                    let run = bench.run(case, keys, n, round, &o)?;
                    println!("{}", run.json(o.batch));
                    runs.push(run);
                }
            }
        }
    }
    print!("{}", summary(&runs, &o));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(line: &str) -> Result<Options, String> {
        parse(line.split_whitespace().map(str::to_string))
    }

    #[test]
    fn options_have_defaults_and_bounds() {
        let o = options("--url redis://127.0.0.1:1").expect("valid");
        assert_eq!(
            (
                o.keys.clone(),
                o.batch,
                o.seconds,
                o.rounds,
                o.pipeline,
                o.calls
            ),
            (vec![1_000_000], 64, 5.0, 3, 64, 4)
        );
        let o = options("--url u --keys 1000000,100000 --batch 32 --seconds 2.5 --rounds 5")
            .expect("valid");
        assert_eq!(
            (o.keys, o.batch, o.seconds, o.rounds),
            (vec![1_000_000, 100_000], 32, 2.5, 5)
        );
        for bad in [
            "",
            "--url u --batch 1",
            "--url u --batch 1025",
            "--url u --keys 0",
            "--url u --keys 10,x",
            "--url u --seconds 0",
            "--url u --seconds 601",
            "--url u --rounds 0",
            "--url u --calls",
            "--url u --fast 1",
            "--url u --cases batch,bogus",
            "--url u --cases",
            "--url u --limits 0",
            "--url u --limits 100001",
            "--url u --ballast 386",
            "--url u --ballast 0,x",
        ] {
            assert!(options(bad).is_err(), "{bad}");
        }
        assert_eq!(options("--url u").expect("valid").cases, Case::ALL.to_vec());
        // Named cases run in the rounds' usual order, each once.
        assert_eq!(
            options("--url u --cases minimal,batch,minimal")
                .expect("valid")
                .cases,
            vec![Case::Batch, Case::Minimal]
        );
        assert_eq!(options("--url u").expect("valid").ballast, vec![0]);
        assert_eq!(
            options("--url u --ballast 0,256,385")
                .expect("valid")
                .ballast,
            vec![0, 256, 385]
        );
    }

    #[test]
    fn only_a_loopback_url_without_credentials_is_taken() {
        assert_eq!(
            loopback("redis://127.0.0.1:6379/").expect("ok"),
            SocketAddr::from(([127, 0, 0, 1], 6379))
        );
        assert!(loopback("redis://[::1]:6379").is_ok());
        for bad in [
            "redis://10.1.2.3:6379",
            "redis://u:p@127.0.0.1:6379",
            "redis://127.0.0.1:6379/2",
            "rediss://127.0.0.1:6379",
            "127.0.0.1:6379",
        ] {
            assert!(loopback(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let line = "42 (redis-server) x) S 1 42 42 0 -1 4194560 10 0 0 0 250 31 0 0 20 0 5 0";
        assert_eq!(stat_ticks(line), Ok(281));
        assert!(stat_ticks("42 (cut").is_err());
        assert!(stat_ticks("42 (a) S 1 2").is_err());
        assert!(cpu_ticks("self").is_ok());
    }

    #[test]
    fn info_gives_the_servers_pid_and_version() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:1234\r\n";
        assert_eq!(
            server_info(info),
            Ok(("1234".to_string(), "7.0.15".to_string()))
        );
        assert!(server_info("process_id:../1\r\nredis_version:7\r\n").is_err());
        assert!(server_info("redis_version:7\r\n").is_err());
    }

    fn load(batch: usize) -> Load {
        let o = options(&format!("--url u --batch {batch} --pipeline 3 --calls 2")).expect("o");
        Load::new(&o).expect("load")
    }

    /// The commands of one chunk, read back as the server reads them.
    fn commands(bytes: &[u8]) -> Vec<Vec<Vec<u8>>> {
        let mut r = bytes;
        let mut out = Vec::new();
        while !r.is_empty() {
            match resp::read(&mut r, 1 << 20).expect("a command") {
                Reply::Array(Some(args)) => out.push(
                    args.into_iter()
                        .map(|a| match a {
                            Reply::Bulk(Some(b)) => b,
                            other => panic!("argument {other:?}"),
                        })
                        .collect(),
                ),
                other => panic!("command {other:?}"),
            }
        }
        out
    }

    /// `--limits 3`: the batch case's plans take three quotas in turn, each another string of
    /// the same base and limit (so an answer reads as with one), the first the default's.
    #[test]
    fn the_batch_plans_take_the_limits_in_turn() {
        let o = options("--url u --batch 4 --calls 2 --limits 3").expect("o");
        let mut l = Load::new(&o).expect("load");
        let mut out = Vec::new();
        l.chunk(Case::Batch, 1000, &mut out).expect("chunk");
        // Each plan's quotas: the call's (after the PX floor) where its byte has 64, else the
        // next of the plans' own, after it.
        let quotas: Vec<Vec<u8>> = commands(&out)
            .into_iter()
            .flat_map(|c| {
                let (spec, shared) = (&c[7], &c[9]);
                let mut own = c[10..].iter();
                spec.iter()
                    .map(|b| {
                        if b & 64 != 0 {
                            shared.clone()
                        } else {
                            own.next().expect("the plan's own quotas").clone()
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(quotas.len(), 8);
        assert_eq!(quotas[0], l.quotas);
        for (i, q) in quotas.iter().enumerate() {
            assert_eq!(q, &quotas[i % 3]);
            assert_eq!((int7(q, 0), int7(q, 28)), (l.limit, l.base));
        }
        assert!(quotas[0] != quotas[1] && quotas[1] != quotas[2] && quotas[0] != quotas[2]);
    }

    #[test]
    fn each_case_sends_the_stores_arguments_or_the_floors() {
        let mut l = load(4);
        let quotas = tollgate_redis::plan_script_quotas(&[l.rule]).expect("quotas");
        assert_eq!((l.limit, l.base, l.value.len()), (100, 101, 15));

        let mut out = Vec::new();
        let e = l.chunk(Case::Single, 1000, &mut out).expect("chunk");
        assert_eq!(
            e,
            Expect {
                replies: 3,
                plans: 3
            }
        );
        for c in commands(&out) {
            assert_eq!(c.len(), 5);
            assert_eq!(
                (&c[0][..], &c[1], &c[2][..]),
                (
                    &b"EVALSHA"[..],
                    &l.single_sha.as_bytes().to_vec(),
                    &b"1"[..]
                )
            );
            assert_eq!(c[3].len(), 47);
            assert!(c[3].starts_with(b"tollgate:{") && c[3].ends_with(b"}:api"));
            assert_eq!(c[4], quotas);
        }

        out.clear();
        let e = l.chunk(Case::Batch, 1000, &mut out).expect("chunk");
        assert_eq!(
            e,
            Expect {
                replies: 2,
                plans: 8
            }
        );
        for c in commands(&out) {
            assert_eq!(c[1], l.batch_sha.as_bytes());
            let keys: Vec<String> = c[3..7]
                .iter()
                .map(|k| String::from_utf8(k.clone()).expect("utf-8"))
                .collect();
            let args = tollgate_redis::batch_script_args(&[l.rule], &keys).expect("args");
            assert_eq!(c[2..], args[..]);
            // One form, its quotas once for the four plans, marked (the high bit) when no
            // key comes twice.
            let mut seen = keys.clone();
            seen.sort();
            seen.dedup();
            let mark = if seen.len() == keys.len() { 128 } else { 0 };
            assert_eq!(c[7], vec![mark + 64 + 1; 4]);
            assert_eq!(c[9..], [quotas.as_slice()]);
        }

        out.clear();
        let e = l.chunk(Case::Minimal, 1000, &mut out).expect("chunk");
        assert_eq!(
            e,
            Expect {
                replies: 2,
                plans: 8
            }
        );
        for c in commands(&out) {
            assert_eq!((c.len(), &c[2][..]), (3 + 4 + 2, &b"4"[..]));
            assert_eq!(c[1], l.minimal_sha.as_bytes());
            assert_eq!((&c[7], &c[8][..]), (&l.value, &b"600"[..]));
        }

        out.clear();
        let e = l.chunk(Case::Set, 1000, &mut out).expect("chunk");
        assert_eq!(
            e,
            Expect {
                replies: 8,
                plans: 8
            }
        );
        for c in commands(&out) {
            assert_eq!(c.len(), 5);
            assert_eq!(
                (&c[0][..], &c[2], &c[3][..], &c[4][..]),
                (&b"SET"[..], &l.value, &b"PX"[..], &b"600"[..])
            );
        }
        // Keys are drawn from the key count asked for.
        let mut l = load(2);
        let drawn: std::collections::BTreeSet<String> = (0..200).map(|_| l.pick(3)).collect();
        assert_eq!(drawn.len(), 3);
    }

    #[test]
    fn replies_are_checked_and_a_full_bucket_is_told_apart() {
        let l = load(2);
        let mut t = Tally::default();
        // Allowed as an integer: reset * base + remaining, 99 left of a fresh bucket.
        l.check(Case::Single, &Reply::Int(600_000 * 101 + 99), &mut t)
            .expect("fresh");
        l.check(Case::Single, &Reply::Int(1_200_000 * 101 + 98), &mut t)
            .expect("live");
        let mut packed = vec![0u8; 29];
        packed[14] = 5;
        l.check(Case::Single, &Reply::Bulk(Some(packed.clone())), &mut t)
            .expect("denied");
        assert_eq!((t.allowed, t.full), (2, 1));
        let batch = Reply::Array(Some(vec![Reply::Int(99), Reply::Int(98)]));
        l.check(Case::Batch, &batch, &mut t).expect("batch");
        assert_eq!((t.allowed, t.full), (4, 2));
        l.check(Case::Minimal, &Reply::Int(2), &mut t)
            .expect("minimal");
        l.check(Case::Set, &Reply::Status(b"OK".to_vec()), &mut t)
            .expect("set");
        packed[7] = 2;
        for (case, bad) in [
            (
                Case::Single,
                Reply::Error("NOSCRIPT No matching script".into()),
            ),
            (Case::Single, Reply::Int(-1)),
            (Case::Single, Reply::Bulk(Some(packed))),
            (Case::Single, Reply::Bulk(None)),
            (Case::Batch, Reply::Array(Some(vec![Reply::Int(99)]))),
            (
                Case::Batch,
                Reply::Array(Some(vec![
                    Reply::Int(99),
                    Reply::Error("ERR plan 2".into()),
                ])),
            ),
            (Case::Minimal, Reply::Int(3)),
            (Case::Set, Reply::Bulk(None)),
            (Case::Set, Reply::Error("OOM".into())),
        ] {
            assert!(
                l.check(case, &bad, &mut Tally::default()).is_err(),
                "{case:?} {bad:?}"
            );
        }
    }

    #[test]
    fn the_summary_takes_ratios_within_a_round() {
        let o = options("--url u --keys 10 --rounds 2 --ballast 0,256").expect("o");
        let run_beside = |case, ballast, round, us: f64| Run {
            case,
            keys: 10,
            ballast,
            round,
            tally: Tally {
                plans: 100,
                ..Tally::default()
            },
            wall: 1.0,
            redis_us: us * 100.0,
            client_us: 0.0,
            dbsize: 0,
        };
        let run = |case, round, us| run_beside(case, 0, round, us);
        let runs = [
            run(Case::Single, 1, 6.0),
            run(Case::Batch, 1, 3.0),
            run_beside(Case::Single, 256, 1, 9.0),
            run_beside(Case::Batch, 256, 1, 3.3),
            run(Case::Single, 2, 12.0),
            run(Case::Batch, 2, 9.0),
            run_beside(Case::Single, 256, 2, 15.0),
            run_beside(Case::Batch, 256, 2, 9.9),
        ];
        let s = summary(&runs, &o);
        assert!(s.contains("single   us/plan 6.00 12.00"), "{s}");
        assert!(s.contains("ratio 0.50 0.75"), "{s}");
        assert!(s.contains("(median 0.50)"), "{s}");
        // Beside 256 scripts: ratios to single of the same round and ballast, and to the
        // same case and round without them.
        let beside = s.split("ballast=256").nth(1).expect("a ballast=256 part");
        assert!(beside.contains("single   us/plan 9.00 15.00"), "{s}");
        assert!(beside.contains("to ballast 0 1.50 1.25"), "{s}");
        assert!(beside.contains("to ballast 0 1.10 1.10"), "{s}");
        let json = runs[1].json(64);
        assert!(
            json.starts_with(
                "{\"case\":\"batch\",\"keys\":10,\"ballast\":0,\"batch\":64,\"round\":1,\"plans\":100,"
            ),
            "{json}"
        );
        assert!(json.contains("\"redis_cpu_us_per_plan\":3.0000,"), "{json}");
    }
}
