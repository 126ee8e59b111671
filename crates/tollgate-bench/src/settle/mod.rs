//! `tollgate bench --store`: costs known later, measured on the library itself.
//!
//! Why in process rather than through a gateway: what is measured is the limiter's contract
//! (shared/DESIGN.md "Costs known later"), the real units it lets through when every
//! request's cost is known only after it ran, and the store calls settling costs. Driving
//! `Limiter::reserve` directly against the store (memory, or a Redis shared with nothing else)
//! measures exactly that, with no HTTP in the way and no gateway to configure.
//!
//! Each virtual client keeps `--in-flight C` requests going: reserve (the estimate is
//! charged), hold for a random time up to `--hold`, settle at a random real cost in
//! `[1, --max-real]`. The same traffic then runs again with `settle: false` (the estimate is
//! the cost) to count the store calls settling adds. The run fails when a client was admitted
//! more than [`bound`] allows.

pub(crate) mod bound;
mod report;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tollgate::policy::FailurePolicy;
use tollgate::quota::{Limit, Quota};
use tollgate::store::RedisConfig;
use tollgate::{Backend, ClientKey, Limiter, LimiterConfig, Plan, PolicySpec};

use crate::accuracy::Algorithm;
use crate::BenchArgs;
use bound::{Admitted, Terms};
pub(crate) use report::SettleReport;

/// Every store call may take this long before it counts as failed: long enough that a loaded
/// machine does not turn a slow answer into a failure (which would deny, `on_failure =
/// "closed"`), so that the bound is about settling only.
const STORE_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest wait of a denied worker before it asks again.
const DENIED_PAUSE: Duration = Duration::from_millis(5);

/// What one run does, checked.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub store: String,
    pub clients: u64,
    pub in_flight: u64,
    pub estimate: u64,
    pub max_real: u64,
    pub hold: Duration,
    pub duration: Duration,
    pub max_requests: u64,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub period: Duration,
    pub burst: u64,
    pub seed: u64,
}

impl Settings {
    pub(crate) fn from_args(args: &BenchArgs) -> anyhow::Result<Self> {
        let store = args.store.clone().context("--store is not set")?;
        let (Some(limit), Some(period)) = (args.limit, args.period) else {
            anyhow::bail!("--store needs --limit and --period (the policy to run)");
        };
        let algorithm = args.algorithm;
        if !matches!(
            algorithm,
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket
        ) {
            anyhow::bail!(
                "--store: the bound is stated for token_bucket, gcra and leaky_bucket, not {}",
                algorithm.name()
            );
        }
        if args.clients.saturating_mul(args.in_flight) > 100_000 {
            anyhow::bail!("--store: --clients x --in-flight is at most 100000");
        }
        Ok(Self {
            store,
            clients: args.clients,
            in_flight: args.in_flight,
            estimate: args.estimate,
            max_real: args.max_real,
            hold: args.hold,
            duration: args.duration,
            max_requests: args.max_requests,
            algorithm,
            limit,
            period,
            burst: args.burst.unwrap_or(limit),
            seed: args.seed,
        })
    }

    fn terms(&self) -> Terms {
        Terms {
            limit: self.limit,
            period_ns: self.period.as_nanos(),
            burst: self.burst,
            in_flight: self.in_flight,
            estimate: self.estimate,
            max_real: self.max_real,
        }
    }

    fn backend(&self) -> anyhow::Result<Backend> {
        if self.store == "memory" {
            return Ok(Backend::Memory(Default::default()));
        }
        if self.store.starts_with("redis://") {
            return Ok(Backend::Redis(RedisConfig::standalone(self.store.clone())));
        }
        anyhow::bail!("--store {:?}: give `memory` or a redis:// URL", self.store)
    }
}

/// One phase's traffic as the bench saw it.
pub(crate) struct Phase {
    /// Per client: when its first call left (ns since the phase started), its admissions.
    clients: Vec<(u128, Vec<Admitted>)>,
    requests: u64,
    limited: u64,
    store_calls: u64,
    elapsed: Duration,
    settled: (u64, u64),
    deny_cache_hits: u64,
}

/// Runs both phases and judges the first.
pub(crate) async fn execute(settings: &Settings) -> anyhow::Result<SettleReport> {
    let limiter = Limiter::new(LimiterConfig {
        timeout: STORE_TIMEOUT,
        ..LimiterConfig::new(settings.backend()?)
    });
    let settling = phase(&limiter, settings, true).await?;
    let estimated = phase(&limiter, settings, false).await?;
    Ok(SettleReport::build(settings, &settling, &estimated))
}

/// Runs the traffic once: every client's `C` workers until the duration or the request
/// budget runs out, then waits for every settle to reach the store.
async fn phase(limiter: &Limiter, s: &Settings, settle: bool) -> anyhow::Result<Phase> {
    let name = if settle { "settling" } else { "estimate" };
    let quota = Quota::new(s.limit, s.period)
        .and_then(|q| q.with_burst(s.burst))
        .map_err(|e| anyhow::anyhow!("--limit/--period/--burst: {e}"))?;
    let limit = Limit::new(core_algorithm(s.algorithm), quota)
        .map_err(|e| anyhow::anyhow!("--limit/--period/--burst: {e}"))?;
    let mut spec = PolicySpec::new(name, limit);
    spec.cost = s.estimate;
    spec.settle = settle;
    spec.on_failure = FailurePolicy::Closed;
    let policy = limiter.policy(spec).context("the bench policy")?;
    if !limiter.connect(Duration::from_secs(5)).await {
        anyhow::bail!("--store {}: cannot connect within 5 s", s.store);
    }
    let nonce = run_nonce(settle);
    let budget = Arc::new(AtomicU64::new(s.max_requests));
    let started = Instant::now();
    let deadline = started + s.duration;
    let mut tasks = Vec::new();
    for client in 0..s.clients {
        let plan = Arc::new(Plan::for_client(client_key(nonce, client), [&policy]));
        for worker in 0..s.in_flight {
            let worker = Worker {
                limiter: limiter.clone(),
                plan: Arc::clone(&plan),
                budget: Arc::clone(&budget),
                rng: Rng::new(s.seed ^ (client << 20) ^ worker),
                started,
                deadline,
                settle,
                max_real: s.max_real,
                hold: s.hold,
            };
            tasks.push((client, tokio::spawn(worker.run())));
        }
    }
    let before = limiter.metrics().store_calls();
    let mut clients = vec![(u128::MAX, Vec::new()); usize::try_from(s.clients)?];
    let (mut requests, mut limited) = (0, 0);
    for (client, task) in tasks {
        let done = task.await.context("a bench worker panicked")?;
        let slot = &mut clients[usize::try_from(client)?];
        slot.0 = slot.0.min(done.first_sent_ns);
        slot.1.extend(done.admitted);
        requests += done.requests;
        limited += done.limited;
    }
    let elapsed = started.elapsed();
    limiter.flush_settles().await;
    let counts = limiter.metrics();
    let policy = counts.policy(name);
    let settled = policy.map_or((0, 0), |p| p.settled_units());
    let deny_cache_hits = policy.map_or(0, |p| p.deny_cache_hits());
    Ok(Phase {
        clients,
        requests,
        limited,
        store_calls: counts.store_calls().saturating_sub(before),
        elapsed,
        settled,
        deny_cache_hits,
    })
}

/// One of a client's `C` request loops.
struct Worker {
    limiter: Limiter,
    plan: Arc<Plan>,
    budget: Arc<AtomicU64>,
    rng: Rng,
    started: Instant,
    deadline: Instant,
    settle: bool,
    max_real: u64,
    hold: Duration,
}

/// What a worker saw.
struct Done {
    first_sent_ns: u128,
    admitted: Vec<Admitted>,
    requests: u64,
    limited: u64,
}

impl Worker {
    async fn run(mut self) -> Done {
        let mut done = Done {
            first_sent_ns: u128::MAX,
            admitted: Vec::new(),
            requests: 0,
            limited: 0,
        };
        // Bounded by the deadline and by the shared request budget.
        while Instant::now() < self.deadline && take(&self.budget) {
            let sent = self.started.elapsed().as_nanos();
            done.first_sent_ns = done.first_sent_ns.min(sent);
            done.requests += 1;
            let (result, reservation) = self.limiter.reserve(&self.plan).await;
            let answered_ns = self.started.elapsed().as_nanos();
            let Some(reservation) = reservation.filter(|_| result.is_allowed()) else {
                done.limited += 1;
                let wait = result.retry_after().unwrap_or(DENIED_PAUSE);
                tokio::time::sleep(wait.clamp(Duration::from_millis(1), DENIED_PAUSE)).await;
                continue;
            };
            let hold = self
                .rng
                .below(u64::try_from(self.hold.as_micros()).unwrap_or(0) + 1);
            let real = 1 + self.rng.below(self.max_real);
            tokio::time::sleep(Duration::from_micros(hold)).await;
            if self.settle {
                reservation.settle(real);
            } else {
                drop(reservation);
            }
            done.admitted.push(Admitted { answered_ns, real });
        }
        done
    }
}

/// The limiter's algorithm of the bench's name (the bucket family only reaches here).
fn core_algorithm(algorithm: Algorithm) -> tollgate::quota::Algorithm {
    use tollgate::quota::Algorithm as Core;
    match algorithm {
        Algorithm::TokenBucket => Core::TokenBucket,
        Algorithm::Gcra => Core::Gcra,
        Algorithm::LeakyBucket => Core::LeakyBucket,
        Algorithm::SlidingWindowLog => Core::SlidingWindowLog,
        Algorithm::SlidingWindowCounter => Core::SlidingWindowCounter,
        Algorithm::FixedWindow => Core::FixedWindow,
    }
}

/// Takes one request from the run's budget; false when it is spent.
fn take(budget: &AtomicU64) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

/// Keys unique to this run and phase, so a run on a shared Redis starts from fresh state.
fn run_nonce(settle: bool) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ (u64::from(std::process::id()) << 40) ^ u64::from(settle)
}

fn client_key(nonce: u64, client: u64) -> ClientKey {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&nonce.to_le_bytes());
    key[8..].copy_from_slice(&client.to_le_bytes());
    ClientKey(key)
}

/// splitmix64: a seeded, reproducible stream, so both phases offer the same traffic.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform enough in `[0, n)` for a bench (`n` far below 2^64); 0 when `n` is 0.
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.next() % n
    }
}
