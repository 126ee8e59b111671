//! Calls without a socket: requests with scripted bodies, time paused where deadlines matter.

use super::*;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::grpc::health::v1::HealthCheckResponse;
use crate::service::{RlsOptions, RlsService};
use http_body::Frame;
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll};
use tollgate::{Backend, IdentityHasher, Limiter, LimiterConfig};

const YAML: &str = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1000\n";
const PEER: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));

fn services(calls_per_address: usize) -> Arc<Services> {
    let limiter = Limiter::new(LimiterConfig::new(Backend::default()));
    let config = crate::config::load_str([("test.yaml", YAML)]).expect("yaml");
    let rls = RlsService::new(
        limiter.clone(),
        IdentityHasher::new(b"test secret"),
        config,
        RlsOptions::default(),
    )
    .expect("service");
    Arc::new(Services {
        rls: LiveRls::new(rls),
        health: HealthService::new(limiter),
        budget: budget::places(calls_per_address, 1000),
    })
}

/// A request body: its frames, then its end, or (`stall`) nothing more for ever.
struct Script {
    frames: VecDeque<Frame<Bytes>>,
    stall: bool,
    polls: Arc<AtomicUsize>,
}

impl Body for Script {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        match self.frames.pop_front() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None if self.stall => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

fn rls_request(value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "remote_address".into(),
                value: value.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

struct Call {
    request: Request<Script>,
    polls: Arc<AtomicUsize>,
}

fn call(path: &str, body: &[u8]) -> Call {
    let polls = Arc::new(AtomicUsize::new(0));
    let script = Script {
        frames: [Frame::data(Bytes::copy_from_slice(body))].into(),
        stall: false,
        polls: Arc::clone(&polls),
    };
    let request = Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(script)
        .expect("request");
    Call { request, polls }
}

fn rls_call(value: &str) -> Call {
    let framed = frame::encode(&rls_request(value)).expect("small");
    call(SHOULD_RATE_LIMIT, &framed)
}

/// An answer, read whole: headers, the message's bytes (prefix removed), trailers.
struct Read {
    headers: HeaderMap,
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Read {
    /// `grpc-status` from the trailers, else from the headers (trailers-only).
    fn status(&self) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
    }

    fn grpc_message(&self) -> Option<&str> {
        self.headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
    }
}

fn read(response: Response<Answer>) -> Read {
    let (parts, mut body) = response.into_parts();
    let mut out = Read {
        headers: parts.headers,
        message: None,
        trailers: None,
    };
    let mut cx = Context::from_waker(std::task::Waker::noop());
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
        match frame.into_data() {
            Ok(data) => out.message = Some(data.slice(frame::PREFIX..)),
            Err(frame) => out.trailers = frame.into_trailers().ok(),
        }
    }
    out
}

async fn answered(services: &Arc<Services>, call: Call) -> Read {
    let response = answer(Arc::clone(services), PEER, call.request)
        .await
        .unwrap_or_else(|e| match e {});
    read(response)
}

#[tokio::test]
async fn should_rate_limit_answers_one_message_then_grpc_status_zero() {
    let s = services(8);
    let read = answered(&s, rls_call("192.0.2.1")).await;
    assert_eq!(read.headers["content-type"], "application/grpc");
    assert_eq!(read.headers.get("grpc-status"), None, "in the trailers");
    assert_eq!(read.status(), Some("0"));
    let response = RateLimitResponse::decode(read.message.expect("a message")).expect("decodes");
    assert_eq!(response.overall_code, 1, "OK");
    assert_eq!(response.statuses.len(), 1);
}

#[tokio::test]
async fn the_path_alone_chooses_the_method_as_tonic_did() {
    let s = services(8);
    // Neither the HTTP method nor the content-type is looked at; a query is not the path.
    let framed = frame::encode(&rls_request("192.0.2.1")).expect("small");
    let mut c = call(&format!("{SHOULD_RATE_LIMIT}?x=1"), &framed);
    *c.request.method_mut() = http::Method::GET;
    c.request
        .headers_mut()
        .insert("content-type", http::HeaderValue::from_static("text/plain"));
    assert_eq!(answered(&s, c).await.status(), Some("0"));
}

#[tokio::test]
async fn a_path_no_method_is_served_at_is_unimplemented_and_its_body_is_never_read() {
    let s = services(8);
    // (path, whether tonic's router answered it from its fallback, with content-length: 0)
    for (path, no_service) in [
        ("/envoy.service.ratelimit.v3.RateLimitService/Other", false),
        (
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit/",
            false,
        ),
        ("/grpc.health.v1.Health/Check/more", false),
        ("/grpc.health.v1.Health/check", false),
        ("/grpc.health.v1.Health//", false),
        ("/grpc.health.v1.Health/%43heck", false),
        ("/", true),
        ("/nothing.Here/At", true),
        ("/grpc.health.v1.Health/", true),
        ("/grpc.health.v1.Health", true),
        ("//grpc.health.v1.Health/Check", true),
        ("/GRPC.health.v1.Health/Check", true),
        ("/grpc.health.v1.%48ealth/Check", true),
    ] {
        let c = call(path, b"\x00\x00\x00\x00\x00");
        let polls = Arc::clone(&c.polls);
        let read = answered(&s, c).await;
        assert_eq!(read.status(), Some("12"), "{path}");
        assert_eq!(read.grpc_message(), None, "{path}: no message");
        assert_eq!(read.headers["content-type"], "application/grpc");
        assert_eq!(
            read.headers.get("content-length").map(|v| v.as_bytes()),
            no_service.then_some(&b"0"[..]),
            "{path}"
        );
        assert!(
            read.message.is_none() && read.trailers.is_none(),
            "trailers-only"
        );
        assert_eq!(polls.load(Ordering::Relaxed), 0, "{path}: body not read");
    }
}

#[tokio::test]
async fn health_check_answers_serving_and_not_found_for_another_service() {
    let s = services(8);
    let ask = |service: &str| {
        let framed = frame::encode(&HealthCheckRequest {
            service: service.into(),
        })
        .expect("small");
        call(HEALTH_CHECK, &framed)
    };
    for name in ["", crate::SERVICE_NAME] {
        let read = answered(&s, ask(name)).await;
        assert_eq!(read.status(), Some("0"));
        let answer =
            HealthCheckResponse::decode(read.message.expect("a message")).expect("decodes");
        assert_eq!(answer.status, 1, "SERVING");
    }
    let read = answered(&s, ask("other thing")).await;
    assert_eq!(read.status(), Some("5"), "NOT_FOUND");
    assert_eq!(
        read.grpc_message(),
        Some("unknown%20service%20%22other%20thing%22")
    );
}

#[tokio::test]
async fn health_watch_reads_its_request_then_says_use_check() {
    let s = services(8);
    let framed = frame::encode(&HealthCheckRequest::default()).expect("small");
    let read = answered(&s, call(HEALTH_WATCH, &framed)).await;
    assert_eq!(read.status(), Some("12"));
    assert_eq!(read.grpc_message(), Some("use%20Check"));
    // Its request is decoded first, as tonic did: garbage is INTERNAL.
    let read = answered(&s, call(HEALTH_WATCH, b"\x00\x00\x00\x00\x02\xff\xff")).await;
    assert_eq!(read.status(), Some("13"));
}

#[tokio::test]
async fn bad_messages_get_the_statuses_tonic_gave() {
    let s = services(8);
    let cases: [(&[u8], &str, &str); 5] = [
        (b"", "13", "Missing%20request%20message."),
        (b"\x00\x00\x00\x00\x09ab", "13", "Unexpected%20EOF%20decoding%20stream."),
        (b"\x01\x00\x00\x00\x00", "13", "protocol%20error:%20received%20message%20with%20compressed-flag%20but%20no%20grpc-encoding%20was%20specified"),
        (b"\x00\x00\x01\x00\x01", "11", "Error,%20decoded%20message%20length%20too%20large:%20found%2065537%20bytes,%20the%20limit%20is:%2065536%20bytes"),
        (b"\x00\x00\x00\x00\x02\xff\xff", "13", "failed%20to%20decode%20Protobuf%20message:%20invalid%20varint"),
    ];
    for (body, status, message) in cases {
        let read = answered(&s, call(SHOULD_RATE_LIMIT, body)).await;
        assert_eq!(read.status(), Some(status), "{body:?}");
        assert_eq!(read.grpc_message(), Some(message), "{body:?}");
    }
    // A request the service refuses: its status, trailers-only.
    let framed = frame::encode(&RateLimitRequest::default()).expect("small");
    let read = answered(&s, call(SHOULD_RATE_LIMIT, &framed)).await;
    assert_eq!(read.status(), Some("3"), "INVALID_ARGUMENT");
    assert!(read.message.is_none());
}

#[tokio::test]
async fn a_compressed_request_is_unimplemented_before_its_body_is_read() {
    let s = services(8);
    let mut c = rls_call("192.0.2.1");
    c.request
        .headers_mut()
        .insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
    let polls = Arc::clone(&c.polls);
    let read = answered(&s, c).await;
    assert_eq!(read.status(), Some("12"));
    assert_eq!(
        read.grpc_message(),
        Some("Content%20is%20compressed%20with%20%60gzip%60%20which%20isn't%20supported")
    );
    assert_eq!(read.headers["grpc-accept-encoding"], "identity");
    assert_eq!(polls.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn past_the_budget_a_call_is_refused_at_once_and_its_answer_holds_its_place() {
    let s = services(1);
    // The first call's answer, not yet sent: it holds the address's one place.
    let first = answer(Arc::clone(&s), PEER, rls_call("a").request)
        .await
        .unwrap_or_else(|e| match e {});
    let c = rls_call("b");
    let polls = Arc::clone(&c.polls);
    let refused = answered(&s, c).await;
    assert_eq!(refused.status(), Some("8"), "RESOURCE_EXHAUSTED");
    assert_eq!(
        refused.grpc_message(),
        Some("too%20many%20calls%20in%20progress%20from%20this%20address;%20retry%20when%20some%20have%20finished")
    );
    assert_eq!(polls.load(Ordering::Relaxed), 0, "not read");
    // Another address has its own share.
    let other = answer(
        Arc::clone(&s),
        Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9))),
        rls_call("c").request,
    )
    .await
    .unwrap_or_else(|e| match e {});
    assert_eq!(read(other).status(), Some("0"));
    // Sent (the body dropped): the place is back.
    assert_eq!(read(first).status(), Some("0"));
    assert_eq!(answered(&s, rls_call("d")).await.status(), Some("0"));
}

fn stalled(path: &str, timeout: Option<&'static str>) -> Call {
    let polls = Arc::new(AtomicUsize::new(0));
    let script = Script {
        frames: VecDeque::new(),
        stall: true,
        polls: Arc::clone(&polls),
    };
    let mut request = Request::post(path).body(script).expect("request");
    if let Some(t) = timeout {
        request
            .headers_mut()
            .insert("grpc-timeout", http::HeaderValue::from_static(t));
    }
    Call { request, polls }
}

#[tokio::test(start_paused = true)]
async fn a_call_past_its_deadline_is_cancelled_and_frees_its_place() {
    let s = services(1);
    for (timeout, took) in [
        (None, CALL_TIMEOUT),
        (Some("100m"), Duration::from_millis(100)),
        (Some("1H"), CALL_TIMEOUT),
        (Some("not a timeout"), CALL_TIMEOUT),
    ] {
        let start = tokio::time::Instant::now();
        let read = answered(&s, stalled(SHOULD_RATE_LIMIT, timeout)).await;
        assert_eq!(start.elapsed(), took, "{timeout:?}");
        assert_eq!(read.status(), Some("1"), "CANCELLED");
        assert_eq!(read.grpc_message(), Some("Timeout%20expired"));
        // The place is free again: the next call of this address is served.
        assert_eq!(answered(&s, rls_call("x")).await.status(), Some("0"));
    }
    // A call answered at once is answered even with a zero deadline (the call first).
    let mut c = rls_call("y");
    c.request
        .headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("0n"));
    assert_eq!(answered(&s, c).await.status(), Some("0"));
}

/// The deadline covers the whole body, not only its first message: a body that stalls after
/// a whole message (no end, no trailers) is cancelled at the deadline, counted from the call's
/// first wait, and so is a health check whose body stalls; each frees its place.
#[tokio::test(start_paused = true)]
async fn a_body_that_stalls_after_its_message_is_cancelled_at_the_deadline() {
    let s = services(1);
    for path in [SHOULD_RATE_LIMIT, HEALTH_CHECK] {
        let mut c = if path == SHOULD_RATE_LIMIT {
            rls_call("stalls")
        } else {
            call(
                HEALTH_CHECK,
                &frame::encode(&HealthCheckRequest::default()).expect("small"),
            )
        };
        c.request.body_mut().stall = true;
        c.request
            .headers_mut()
            .insert("grpc-timeout", http::HeaderValue::from_static("300m"));
        let start = tokio::time::Instant::now();
        let read = answered(&s, c).await;
        assert_eq!(start.elapsed(), Duration::from_millis(300), "{path}");
        assert_eq!(read.status(), Some("1"), "CANCELLED: {path}");
        assert_eq!(answered(&s, rls_call("x")).await.status(), Some("0"));
    }
}

#[tokio::test]
async fn traceparent_parents_the_decision_span_from_headers_or_trailers() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Seen(Arc::clone(&seen)));
    let _default = tracing::subscriber::set_default(subscriber);
    let s = services(8);

    let mut c = rls_call("a");
    c.request.headers_mut().insert(
        "traceparent",
        http::HeaderValue::from_static("00-header-01"),
    );
    answered(&s, c).await;

    let mut c = rls_call("b");
    c.request.headers_mut().insert(
        "traceparent",
        http::HeaderValue::from_static("00-header-01"),
    );
    let mut trailers = HeaderMap::new();
    trailers.insert(
        "traceparent",
        http::HeaderValue::from_static("00-trailer-01"),
    );
    c.request
        .body_mut()
        .frames
        .push_back(Frame::trailers(trailers));
    answered(&s, c).await;

    let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
    assert_eq!(seen, ["00-header-01", "00-trailer-01"]);
}

/// Records every `traceparent` a span is given.
struct Seen(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
    fn on_record(
        &self,
        _span: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Visit<'a>(&'a Mutex<Vec<String>>);
        impl tracing::field::Visit for Visit<'_> {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "traceparent" {
                    if let Ok(mut seen) = self.0.lock() {
                        seen.push(value.to_owned());
                    }
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        values.record(&mut Visit(&self.0));
    }
}

#[tokio::test]
async fn a_calls_future_stays_small() {
    // It lives in the task spawned for the stream, which lasts as long as the stream: a
    // client that never reads holds it (up to its address's share of places). Under hyper,
    // which moved it whole into that task more than once, at 3.5 KiB (an async fn per step, the
    // decision inline) the moves cost about 2,000 instructions a call under callgrind, and a
    // held stream 3 KiB more than under tonic; the decision's future is boxed instead.
    let s = services(8);
    let call = answer(Arc::clone(&s), PEER, rls_call("a").request);
    let service = s.rls.current();
    let request = rls_request("a");
    let decision = service.decide(&request);
    let (call, decision) = (size_of_val(&call), size_of_val(&decision));
    assert!(call <= 1024, "{call} bytes (the decision's: {decision})");
}

/// Hostile messages through the whole call, read in place: each is refused with the status
/// and words tonic's prost decoder gave (or, read whole, with the service's own refusal),
/// nothing panics, and the next call is decided as before.
#[tokio::test]
async fn hostile_messages_are_refused_as_prost_refused_them_and_the_next_call_is_decided() {
    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        out.extend_from_slice(message);
        out
    }
    // Unknown field 9 as groups nested `n` deep: prost skips a hundred, refuses one more.
    let groups = |n: usize| [vec![0x4b; n], vec![0x4c; n]].concat();
    // A descriptor whose entry's key is not UTF-8.
    let bad_key = [0x12, 0x06, 0x0a, 0x04, 0x0a, 0x02, 0xc3, 0x28];
    // As many empty descriptors as the message bound allows.
    let many = [0x12, 0x00].repeat(30_000);
    let cases: [(Vec<u8>, &str, &str); 4] = [
        (groups(101), "13", "recursion limit reached"),
        (
            bad_key.to_vec(),
            "13",
            "RateLimitDescriptor.entries: RateLimitRequest.descriptors: invalid string value",
        ),
        // Read whole (a hundred groups skipped): no domain, which the service refuses.
        (groups(100), "3", "domain must not be empty"),
        (
            [&[0x0a, 0x04][..], b"edge", &many].concat(),
            "3",
            "at most 256 descriptors",
        ),
    ];
    let s = services(8);
    for (message, status, words) in cases {
        let theirs = RateLimitRequest::decode(&message[..])
            .map(drop)
            .map_err(|e| e.to_string());
        let read = answered(&s, call(SHOULD_RATE_LIMIT, &framed(&message))).await;
        assert_eq!(read.status(), Some(status), "{words}");
        let said = read.grpc_message().unwrap_or_default().replace("%20", " ");
        assert!(said.contains(words), "{words}: {said}");
        if let Err(prost_said) = theirs {
            assert_eq!(said, prost_said, "prost's words");
        }
        assert_eq!(
            answered(&s, rls_call("192.0.2.9")).await.status(),
            Some("0")
        );
    }
}
