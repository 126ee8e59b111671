//! The load driver: virtual clients over a pool of HTTP/1 connections.
//!
//! Request `k` belongs to client `k % clients`, so every client offers the same share of the
//! load, and goes to target `(client + k / clients) % targets`, so each client visits every
//! gateway in turn. Closed loop: `connections` workers each send a request as soon as the
//! previous one is answered. Open loop (`--rate`): a pacer keeps the schedule `k / rate`; a
//! request due while every connection is busy is not sent but counted as missed, so a slow
//! target cannot quietly lower the offered rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::MissedTickBehavior;

use crate::report::{ErrorKind, Outcome, Recorder, Sample};
use crate::warm::Warm;

/// The most of a response body that is read (and thrown away) to reuse the connection.
const MAX_BODY: usize = 1 << 20;

/// What to send, where, and for how long.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Gateways, visited round-robin.
    pub targets: Vec<Uri>,
    /// The header each virtual client identifies with.
    pub identity: HeaderName,
    /// One identity per virtual client.
    pub keys: Vec<HeaderValue>,
    /// Requests per second over all clients; `None` for closed loop.
    pub rate: Option<f64>,
    /// Concurrent requests at most.
    pub connections: usize,
    /// No request is started after this.
    pub duration: Duration,
    /// No more than this many requests are scheduled.
    pub max_requests: u64,
    /// A request without a complete answer after this is an error.
    pub timeout: Duration,
    /// Envoy RLS targets: `ShouldRateLimit` calls instead of HTTP requests.
    pub rls: Option<super::rls::RlsPlan>,
}

/// Counters the progress bar reads while the bench runs.
#[derive(Debug, Default)]
pub struct Live {
    /// Requests started.
    pub sent: AtomicU64,
    /// 2xx answers.
    pub admitted: AtomicU64,
    /// 429 answers.
    pub limited: AtomicU64,
    /// Other answers and errors.
    pub failed: AtomicU64,
    /// Open loop: due but not sent because every connection was busy.
    pub missed: AtomicU64,
}

/// What a finished run hands back.
#[derive(Debug)]
pub struct Finished {
    /// Every finished request, aggregated.
    pub recorder: Recorder,
    /// Requests due but never sent (open loop only).
    pub missed: u64,
    /// The first `RateLimit-Policy` header seen, if any.
    pub policy_header: Option<String>,
}

struct Shared {
    plan: Plan,
    client: Client<Warm, Empty<Bytes>>,
    rls: Option<super::rls::RlsClients>,
    start: Instant,
    live: Arc<Live>,
    policy_header: OnceLock<String>,
    samples: mpsc::Sender<Sample>,
}

/// Runs the plan to the end and returns what happened.
pub async fn drive(plan: Plan, live: Arc<Live>) -> anyhow::Result<Finished> {
    anyhow::ensure!(!plan.targets.is_empty(), "no target");
    anyhow::ensure!(!plan.keys.is_empty(), "no client");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(plan.timeout));
    let warm = Warm::new(connector);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(plan.connections)
        .build(warm.clone());
    let rls = match plan.rls {
        Some(_) => Some(super::rls::RlsClients::new(&plan.targets, plan.timeout)?),
        None => None,
    };
    if plan.rls.is_none() {
        // Before the clock starts: a run measures the targets, not a storm of handshakes.
        // Bounded by one request's timeout in all, however many targets do not answer.
        let _ =
            tokio::time::timeout(plan.timeout, warm.open(&plan.targets, opened_ahead(&plan))).await;
        let warm = warm.clone();
        tokio::spawn(async move {
            tokio::time::sleep(super::warm::MAX_AGE).await;
            warm.close_rest();
        });
    }
    // The clock starts here: the wall time the accuracy spans are placed by, and `start`.
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the system clock is before 1970")?
        .as_nanos();
    let start = Instant::now();
    let (samples, mut received) = mpsc::channel::<Sample>(4_096);
    let mut recorder = Recorder::new(plan.keys.len(), start_unix_ns);
    let collector = tokio::spawn(async move {
        while let Some(sample) = received.recv().await {
            recorder.record(sample);
        }
        recorder
    });
    let shared = Arc::new(Shared {
        plan,
        client,
        rls,
        start,
        live,
        policy_header: OnceLock::new(),
        samples,
    });
    match shared.plan.rate {
        Some(rate) => open_loop(&shared, rate).await?,
        None => closed_loop(&shared).await?,
    }
    let missed = shared.live.missed.load(Ordering::Relaxed);
    let policy_header = shared.policy_header.get().cloned();
    drop(shared); // closes the sample channel, so the collector finishes
    let recorder = collector.await.context("the sample collector failed")?;
    Ok(Finished {
        recorder,
        missed,
        policy_header,
    })
}

async fn closed_loop(shared: &Arc<Shared>) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..shared.plan.connections)
        .map(|_| {
            let (shared, next) = (Arc::clone(shared), Arc::clone(&next));
            tokio::spawn(async move {
                while shared.start.elapsed() < shared.plan.duration {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= shared.plan.max_requests {
                        break;
                    }
                    let sample = send_one(&shared, k).await;
                    if shared.samples.send(sample).await.is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.context("a load worker failed")?;
    }
    Ok(())
}

async fn open_loop(shared: &Arc<Shared>, rate: f64) -> anyhow::Result<()> {
    let plan = &shared.plan;
    let permits = Arc::new(Semaphore::new(plan.connections));
    let tick = Duration::from_secs_f64((1.0 / rate).clamp(0.001, 0.1));
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut scheduled = 0u64;
    while scheduled < plan.max_requests {
        interval.tick().await;
        let elapsed = shared.start.elapsed();
        if elapsed >= plan.duration {
            break;
        }
        let due = ((elapsed.as_secs_f64() * rate).floor() as u64)
            .saturating_add(1)
            .min(plan.max_requests);
        while scheduled < due {
            let k = scheduled;
            scheduled += 1;
            let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                shared.live.missed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let shared = Arc::clone(shared);
            tokio::spawn(async move {
                let sample = send_one(&shared, k).await;
                let _ = shared.samples.send(sample).await;
                drop(permit);
            });
        }
    }
    let all = u32::try_from(plan.connections).unwrap_or(u32::MAX);
    let _drained = permits
        .acquire_many(all)
        .await
        .context("the request pool closed early")?;
    Ok(())
}

/// How many connections are opened before the run: every worker's in a closed loop; in an open
/// loop what the rate keeps busy at 4 ms a request (at least one per target), since the pool
/// opens more if answers are slower and every one opened ahead and not taken is closed again.
fn opened_ahead(plan: &Plan) -> usize {
    let wanted = match plan.rate {
        None => plan.connections,
        Some(rate) => ((rate * 0.004).ceil() as usize).max(plan.targets.len()),
    };
    let scheduled = usize::try_from(plan.max_requests).unwrap_or(usize::MAX);
    wanted.min(plan.connections).min(scheduled)
}

/// Which client and which target request `k` is for.
pub fn slot(k: u64, clients: usize, targets: usize) -> (usize, usize) {
    let clients = clients.max(1) as u64;
    let targets = targets.max(1) as u64;
    let client = k % clients;
    let target = (client + k / clients) % targets;
    (client as usize, target as usize)
}

async fn send_one(shared: &Shared, k: u64) -> Sample {
    let plan = &shared.plan;
    let (client, target) = slot(k, plan.keys.len(), plan.targets.len());
    shared.live.sent.fetch_add(1, Ordering::Relaxed);
    let sent_at = shared.start.elapsed();
    let outcome = match tokio::time::timeout(plan.timeout, exchange(shared, client, target)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Error(ErrorKind::Timeout),
    };
    let done_at = shared.start.elapsed();
    let counter = match outcome {
        Outcome::Status(200..=299) => &shared.live.admitted,
        Outcome::Status(429) => &shared.live.limited,
        _ => &shared.live.failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    Sample {
        client,
        sent_at,
        done_at,
        outcome,
    }
}

async fn exchange(shared: &Shared, client: usize, target: usize) -> Outcome {
    let plan = &shared.plan;
    let (Some(uri), Some(key)) = (plan.targets.get(target), plan.keys.get(client)) else {
        return Outcome::Error(ErrorKind::Http);
    };
    if let (Some(rls), Some(clients)) = (&plan.rls, &shared.rls) {
        let key = key.to_str().unwrap_or("");
        return super::rls::exchange(clients, rls, target, key, &shared.policy_header).await;
    }
    let request = match Request::get(uri.clone())
        .header(plan.identity.clone(), key.clone())
        .body(Empty::<Bytes>::new())
    {
        Ok(request) => request,
        Err(_) => return Outcome::Error(ErrorKind::Http),
    };
    let response = match shared.client.request(request).await {
        Ok(response) => response,
        Err(error) if error.is_connect() => return Outcome::Error(ErrorKind::Connect),
        Err(_) => return Outcome::Error(ErrorKind::Http),
    };
    let status = response.status().as_u16();
    if shared.policy_header.get().is_none() {
        if let Some(value) = response.headers().get("ratelimit-policy") {
            if let Ok(value) = value.to_str() {
                let _ = shared.policy_header.set(value.to_owned());
            }
        }
    }
    // Read the body so the connection goes back to the pool; its content does not matter,
    // and a body too large or cut short does not change the status that was answered.
    let _ = Limited::new(response.into_body(), MAX_BODY).collect().await;
    Outcome::Status(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_gets_an_equal_share_and_visits_every_target() {
        let mut per_client = [0u32; 4];
        let mut visits = [[0u32; 2]; 4];
        for k in 0..80 {
            let (client, target) = slot(k, 4, 2);
            per_client[client] += 1;
            visits[client][target] += 1;
        }
        assert_eq!(per_client, [20; 4]);
        for client in visits {
            assert_eq!(client, [10, 10]);
        }
    }

    #[test]
    fn one_target_gets_everything() {
        assert!((0..50).all(|k| slot(k, 7, 1).1 == 0));
    }
}
