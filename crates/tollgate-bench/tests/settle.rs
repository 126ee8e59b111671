//! `tollgate bench --store` end to end, as the binary runs it (arguments parsed by clap, then
//! [`tollgate_bench::run_async`]), on the memory store and on a real redis-server started on
//! 127.0.0.1 by the test: the real units admitted stay within the bound, and the report's
//! figures add up.

use clap::Parser;
use serde_json::Value;
use tollgate_testkit::RedisServer;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: tollgate_bench::BenchArgs,
}

/// Two clients with 4 requests in flight each, estimate 5, real costs in [1, 20]: the bucket
/// (100 per second) runs dry, so both refunds and debts happen and the bound is exercised.
const ARGS: &str = "--clients 2 --in-flight 4 --estimate 5 --max-real 20 --hold 5ms \
                    --limit 100 --period 1s --duration 1500ms --quiet";

fn parse(line: &str) -> Result<tollgate_bench::BenchArgs, clap::Error> {
    let argv = std::iter::once("bench").chain(line.split_whitespace());
    Cli::try_parse_from(argv).map(|cli| cli.args)
}

async fn bench(store: &str, name: &str) -> Value {
    bench_with(store, ARGS, name).await
}

async fn bench_with(store: &str, args: &str, name: &str) -> Value {
    let dir = std::env::temp_dir().join(format!("tollgate-bench-settle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let json = dir.join(name);
    let line = format!("--store {store} {args} --json {}", json.display());
    let args = parse(&line).expect("valid arguments");
    tollgate_bench::run_async(args)
        .await
        .expect("the run passes its bound");
    let text = std::fs::read_to_string(&json).expect("report written");
    serde_json::from_str(&text).expect("valid json")
}

fn u(report: &Value, path: &str) -> u64 {
    report
        .pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} is not a number in {report}"))
}

/// What every report must say, whatever the store.
fn assert_consistent(report: &Value) {
    assert_eq!(report["mode"], "settle");
    assert_eq!(report["bound"]["holds"], true, "{report}");
    assert_eq!(u(report, "/bound/clients_over"), 0);
    assert_eq!(u(report, "/bound/settle_slack"), 4 * (20 - 5));
    for phase in ["/settling", "/estimate_only"] {
        let requests = u(report, &format!("{phase}/requests"));
        let admitted = u(report, &format!("{phase}/admitted"));
        let limited = u(report, &format!("{phase}/limited"));
        assert_eq!(requests, admitted + limited, "{phase}");
        assert!(
            admitted > 0 && limited > 0,
            "{phase}: the limit was reached"
        );
    }
    // Costs in [1, 20] around an estimate of 5: some settle below it, some above.
    assert!(u(report, "/settling/refunded_units") > 0);
    assert!(u(report, "/settling/charged_units") > 0);
    let worst = &report["worst"];
    let (real, allows, bound) = (
        u(worst, "/admitted_real"),
        u(worst, "/algorithm_allows"),
        u(worst, "/bound"),
    );
    assert_eq!(bound, allows + 60);
    assert!(real <= bound, "{worst}");
    assert_eq!(worst["headroom"].as_i64(), Some(bound as i64 - real as i64));
    let per_client = report["per_client"].as_array().expect("per_client");
    assert_eq!(per_client.len(), 2);
    for c in per_client {
        assert!(u(c, "/admitted_real") <= u(c, "/bound"), "{c}");
        assert!(u(c, "/headroom") >= u(worst, "/headroom"));
    }
    // Real units admitted are those of the admitted requests, each in [1, 20].
    let admitted = u(report, "/settling/admitted");
    let units = u(report, "/settling/admitted_units");
    assert!((admitted..=admitted * 20).contains(&units));
    assert_eq!(
        u(report, "/estimate_only/admitted_units"),
        u(report, "/estimate_only/admitted") * 5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_units_admitted_on_redis_stay_within_the_bound() {
    let server = RedisServer::start();
    let report = bench(&server.url(), "redis.json").await;
    assert_consistent(&report);
    // Each decision at most one call (coalesced, fewer), each settle at most one; denials the
    // deny cache answers none.
    for phase in ["/settling", "/estimate_only"] {
        let calls = u(&report, &format!("{phase}/store_calls"));
        let requests = u(&report, &format!("{phase}/requests"));
        let hits = u(&report, &format!("{phase}/deny_cache_hits"));
        assert!(calls > 0, "{phase}: decisions on Redis are store calls");
        let settles = if phase == "/settling" {
            u(&report, "/settling/admitted")
        } else {
            0
        };
        assert!(calls <= requests - hits + settles, "{phase}: {calls} calls");
    }
}

/// With a limit no client reaches, both phases decide the same requests the same way, so the
/// difference in store calls is what settling costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_on_redis_adds_store_calls_for_the_same_admitted_traffic() {
    let server = RedisServer::start();
    let args = "--clients 2 --in-flight 4 --estimate 5 --max-real 20 --hold 2ms \
                --limit 1000000 --period 1s --duration 700ms --quiet";
    let report = bench_with(&server.url(), args, "unlimited.json").await;
    assert_eq!(report["bound"]["holds"], true);
    for phase in ["/settling", "/estimate_only"] {
        assert_eq!(u(&report, &format!("{phase}/limited")), 0, "{phase}");
    }
    let with = u(&report, "/settling/store_calls");
    let without = u(&report, "/estimate_only/store_calls");
    let admitted = u(&report, "/settling/admitted");
    assert!(without > 0);
    assert!(
        with > without && with <= 2 * admitted,
        "{with} calls settling, {without} not, {admitted} admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_units_admitted_on_memory_stay_within_the_bound() {
    let report = bench("memory", "memory.json").await;
    assert_consistent(&report);
    assert!(u(&report, "/settling/store_calls") >= u(&report, "/estimate_only/store_calls"));
}

#[test]
fn the_store_mode_needs_a_limit_and_a_bucket() {
    let error = parse("--store memory").expect_err("--limit is required");
    assert_eq!(error.exit_code(), 2);
    assert!(parse("--store memory --target http://127.0.0.1:1/ --limit 1 --period 1s").is_err());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let args =
        parse("--store memory --limit 10 --period 1s --algorithm fixed_window").expect("parsed");
    let refused = runtime.block_on(tollgate_bench::run_async(args));
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("token_bucket, gcra and leaky_bucket"),
        "{message}"
    );
}
