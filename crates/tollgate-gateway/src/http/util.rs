//! Small shared HTTP pieces: the gateway's body type, plain-text responses for what is not
//! an error, and error answers as tollgate-tower's problems (one format for every refusal).

use bytes::Bytes;
use http::{header::CONTENT_TYPE, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate_tower::Problem;

/// Errors of a streamed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The gateway's response body: upstream bodies stream through, its own are small.
pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// A text response with `status`.
pub fn status_response(status: StatusCode, text: &'static str) -> Response<BoxBody> {
    text_response(status, "text/plain; charset=utf-8", text.into())
}

/// An error answer: `problem` as `application/problem+json`.
pub fn problem_response(problem: Problem) -> Response<BoxBody> {
    problem
        .into_response()
        .map(|b| b.map_err(|never| match never {}).boxed())
}

/// A response with `status`, a content type and a body.
pub fn text_response(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<BoxBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// What the rate-limited service answers.
pub(crate) type Answer = Response<tollgate_tower::RateLimitBody<BoxBody>>;
