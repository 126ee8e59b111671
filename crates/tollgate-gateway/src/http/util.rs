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
pub(crate) static TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// A text response with `status`.
pub fn status_response(status: StatusCode, text: &'static str) -> Response<BoxBody> {
    typed_response(status, TEXT_PLAIN.clone(), text.into())
}

/// [`status_response`], its body not boxed.
pub(crate) fn status_response_full(
    status: StatusCode,
    text: &'static str,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN.clone());
    resp
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

/// The body of a gateway connection's answer: the gateway's own, whole (decision mode's 200,
/// a 429 or another refusal), or any other, boxed (an upstream's, one that settles a
/// reservation at its end). The gateway's own are not boxed: decision mode answers every
/// request with one, and a box is an allocation, a free and a dynamic call per poll.
pub(crate) enum ConnBody {
    Own(Full<Bytes>),
    Boxed(BoxBody),
}

impl http_body::Body for ConnBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        // Both are `Unpin`.
        match self.get_mut() {
            ConnBody::Own(full) => std::pin::Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            ConnBody::Boxed(body) => std::pin::Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ConnBody::Own(full) => full.is_end_stream(),
            ConnBody::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            ConnBody::Own(full) => full.size_hint(),
            ConnBody::Boxed(body) => body.size_hint(),
        }
    }
}

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
