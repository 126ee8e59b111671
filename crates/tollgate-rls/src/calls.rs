//! One call, from its request to its answer: its place in the budget, its deadline, its
//! method found by path, its message read and decoded, the answer encoded.
//!
//! This is what tonic's server did around the two services (routing, the call budget layer,
//! the timeout layer, recovering errors as statuses, the codec), written as one async
//! function per call in a small future for its deadline. The listener boxes that future
//! (with its writing of the answer) and spawns it for each stream ([`crate::server`]), so a
//! call costs no boxed service or body, and one more boxed future: the decision's, which is
//! most of the call's size and would otherwise stay in the call's box for as long as the
//! stream does (measured under hyper: 3 KiB more per stream a client holds open, and more
//! instructions, not fewer, for the moves of a larger task). What a client sees is what tonic
//! answered:
//!
//! - a place first, for any path: past the budget, `RESOURCE_EXHAUSTED` ([`crate::budget`]);
//! - the path alone chooses the method (not the HTTP method, not the `content-type`, which
//!   tonic did not look at either); a path no method is served at is `UNIMPLEMENTED` without
//!   a message, and its body is never read (outside the two services' paths, with the
//!   `content-length: 0` that tonic's router added there);
//! - `Health/Watch` reads its request, then answers `UNIMPLEMENTED` ("use Check");
//! - `traceparent` (from the request's headers, or its trailers, which tonic merged over
//!   them) parents the decision's span.

use crate::budget;
use crate::health::HealthService;
use crate::live::LiveRls;
use crate::proto::grpc::health::v1::HealthCheckRequest;
use crate::request::RlsRequest;
use crate::wire::answer::Answer;
use crate::wire::deadline::{self, Deadline};
use crate::wire::frame;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use prost::Message;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tollgate::places::{Place, Places};
use tonic::Status;
use tracing::Instrument as _;

/// The largest request message accepted, by both services (Envoy's are a few hundred bytes;
/// under tonic the health service took its default, 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// How long one call may take at most (the store call has its own, shorter, timeout).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
/// The services' paths: `/<service>/<method>`, the method not empty.
const SERVICES: [&str; 2] = [
    "/envoy.service.ratelimit.v3.RateLimitService/",
    "/grpc.health.v1.Health/",
];

/// What the calls of one listener share.
pub(crate) struct Services {
    /// `ShouldRateLimit`.
    pub(crate) rls: LiveRls,
    /// `Health/Check`.
    pub(crate) health: HealthService,
    /// The places of the calls in progress.
    pub(crate) budget: Arc<Places>,
}

/// The methods served, by path.
enum Method {
    ShouldRateLimit,
    HealthCheck,
    HealthWatch,
    /// A method of neither service at a service's path.
    Unknown,
    /// No service's path.
    NoService,
}

impl Method {
    fn of(path: &str) -> Self {
        match path {
            SHOULD_RATE_LIMIT => Self::ShouldRateLimit,
            HEALTH_CHECK => Self::HealthCheck,
            HEALTH_WATCH => Self::HealthWatch,
            _ if SERVICES
                .iter()
                .any(|s| path.len() > s.len() && path.starts_with(s)) =>
            {
                Self::Unknown
            }
            _ => Self::NoService,
        }
    }
}

/// The answer to `request`, a call from `peer` (`None`: not bounded per address), within
/// its deadline ([`deadline`]: what the client makes the call wait for). Never an error:
/// every failure is a gRPC status.
///
/// The listener boxes this future into the task it spawns for the stream, which lasts as long
/// as the stream does: it is kept small (under 1 KiB) by taking the request apart before any future holds it, by nesting
/// a single async function (each keeps its arguments for its whole life) in a plain future,
/// and by boxing the decision.
pub(crate) fn answer<B>(
    services: Arc<Services>,
    peer: Option<IpAddr>,
    request: Request<B>,
) -> Call<impl Future<Output = Response<Answer>>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let deadline = Deadline::new(deadline::of(request.headers(), CALL_TIMEOUT));
    let method = Method::of(request.uri().path());
    let (parts, body) = request.into_parts();
    Call {
        route: route(services, peer, method, deadline, parts.headers, body),
    }
}

pin_project_lite::pin_project! {
    /// A call, answered.
    pub(crate) struct Call<F> {
        #[pin]
        route: F,
    }
}

impl<F: Future<Output = Response<Answer>>> Future for Call<F> {
    type Output = Result<Response<Answer>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().route.poll(cx).map(Ok)
    }
}

/// The answer to a call whose deadline passed: its place freed first.
fn expired(place: Option<Place>) -> Response<Answer> {
    drop(place);
    Answer::status(&deadline::expired(), None)
}

async fn route<B>(
    services: Arc<Services>,
    peer: Option<IpAddr>,
    method: Method,
    mut deadline: Deadline,
    headers: HeaderMap,
    body: B,
) -> Response<Answer>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(place) = services.budget.take(peer) else {
        return Answer::status(&budget::refusal(), None);
    };
    let place = Some(place);
    match method {
        Method::ShouldRateLimit => {
            should_rate_limit(&services, &headers, body, deadline, place).await
        }
        // The health service's whole call under the deadline: it is rare, and its check asks
        // the store.
        Method::HealthCheck => {
            let answered = deadline
                .within(async {
                    let (request, _) = unary::<HealthCheckRequest, B>(&headers, body).await?;
                    let response = services.health.check(&request).await?;
                    frame::encode(&response)
                })
                .await;
            match answered {
                Ok(framed) => bytes_or_status(framed, place),
                Err(deadline::Expired) => expired(place),
            }
        }
        Method::HealthWatch => {
            match deadline
                .within(unary::<HealthCheckRequest, B>(&headers, body))
                .await
            {
                Ok(Ok(_)) => Answer::status(&Status::unimplemented("use Check"), place),
                Ok(Err(status)) => Answer::status(&status, place),
                Err(deadline::Expired) => expired(place),
            }
        }
        Method::Unknown => Answer::unimplemented(place),
        Method::NoService => Answer::no_service(place),
    }
}

/// `ShouldRateLimit`: its message read in place ([`RlsRequest::decode`]: the strings borrow
/// the body's bytes) and decided. As [`unary`]: the first message is decoded the moment it is
/// whole, then the body is read to its end, every further message decoded and dropped. The
/// reading is under the call's deadline; the decision is bounded by the store's timeout.
async fn should_rate_limit<B>(
    services: &Services,
    headers: &HeaderMap,
    body: B,
    mut deadline: Deadline,
    place: Option<Place>,
) -> Response<Answer>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Err(status) = frame::uncompressed(headers) {
        return Answer::status(&status, place);
    }
    let mut messages = frame::Messages::new(body, MAX_MESSAGE_BYTES);
    let message = match deadline.within(messages.first()).await {
        Ok(Ok(message)) => message,
        Ok(Err(status)) => return Answer::status(&status, place),
        Err(deadline::Expired) => return expired(place),
    };
    let request = match RlsRequest::decode(&message) {
        Ok(request) => request,
        Err(e) => return Answer::status(&frame::decode_error(e), place),
    };
    match deadline
        .within(messages.rest(|more| RlsRequest::decode(&more).map(drop)))
        .await
    {
        Ok(Ok(())) => {}
        Ok(Err(status)) => return Answer::status(&status, place),
        Err(deadline::Expired) => return expired(place),
    }
    drop(deadline);
    let trailers = messages.take_trailers();
    drop(messages);
    let service = services.rls.current();
    let span = tollgate::trace::decision_span(|| traceparent(headers, trailers.as_deref()));
    // Boxed: the decision's future is most of a call's, and a call's future lives in the
    // task spawned for the stream, which lasts as long as the stream (a client that never
    // reads keeps it): boxed, it is freed once decided.
    let framed = match Box::pin(service.decide_request(&request).instrument(span)).await {
        Ok(decided) => decided.encode(),
        Err(status) => Err(status),
    };
    bytes_or_status(framed, place)
}

/// The framed answer, or its status.
fn bytes_or_status(framed: Result<Bytes, Status>, place: Option<Place>) -> Response<Answer> {
    match framed {
        Ok(bytes) => Answer::message(bytes, place),
        Err(status) => Answer::status(&status, place),
    }
}

/// The `traceparent` tonic's metadata gave: the trailers' over the headers'.
fn traceparent<'a>(headers: &'a HeaderMap, trailers: Option<&'a HeaderMap>) -> Option<&'a str> {
    trailers
        .and_then(|t| t.get("traceparent"))
        .or_else(|| headers.get("traceparent"))
        .and_then(|v| v.to_str().ok())
}

/// A unary call's one message, and its body's trailers.
async fn unary<M, B>(headers: &HeaderMap, body: B) -> Result<(M, Option<Box<HeaderMap>>), Status>
where
    M: Message + Default,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    frame::uncompressed(headers)?;
    frame::read_unary(body, MAX_MESSAGE_BYTES).await
}

#[cfg(test)]
mod tests;
