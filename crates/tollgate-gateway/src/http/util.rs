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

/// The content type of [`status_response`], checked once: `HeaderValue::from_static` checks
/// its text byte by byte each time it runs, and decision mode answers every request with it.
static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// A text response with `status`.
pub fn status_response(status: StatusCode, text: &'static str) -> Response<BoxBody> {
    typed_response(status, TEXT_PLAIN.clone(), text.into())
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
    typed_response(status, HeaderValue::from_static(content_type), body)
}

fn typed_response(
    status: StatusCode,
    content_type: HeaderValue,
    body: String,
) -> Response<BoxBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, content_type);
    resp
}

/// What the rate-limited service answers.
pub(crate) type Answer = Response<tollgate_tower::RateLimitBody<BoxBody>>;

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn status_and_text_responses_carry_their_status_type_and_body() {
        let resp = status_response(StatusCode::OK, "");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
        assert_eq!(resp.headers().len(), 1);
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert!(body.is_empty());
        let resp = text_response(StatusCode::ACCEPTED, "application/json", "{}\n".into());
        assert_eq!(resp.status(), StatusCode::ACCEPTED);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"{}\n");
    }
}
