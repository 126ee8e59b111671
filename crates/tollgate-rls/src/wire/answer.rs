//! The response of a call, as the listener ([`crate::server`]) sends it: `content-type: application/grpc`, then either
//! one framed message and `grpc-status: 0` in the trailers, or a status alone in the headers
//! (a trailers-only response, which is how a gRPC server answers an error).
//!
//! The body is a plain value, not a boxed stream: its one data frame is the buffer the answer
//! was encoded into. It also holds the call's place in the listener's budget
//! ([`crate::budget`]) for as long as the listener holds the body, which is until the answer
//! has left or the stream is gone. A trailers-only answer is at its end before it starts, so
//! its headers go with END_STREAM and it is dropped at once: flow control cannot hold it back.
//!
//! The body gives no exact size (hyper turned one into a `content-length`, which tonic's
//! answers carried only where its router answered a path of no service, and `no_service`
//! writes that one itself).

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use http_body::{Body, Frame};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tollgate::places::Place;
use tonic::Status;

const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// The body of an answer; see the module docs.
#[derive(Debug)]
pub(crate) struct Answer {
    state: State,
    /// The call's place, held only to be dropped with the body.
    _place: Option<Place>,
}

#[derive(Debug)]
enum State {
    /// The framed message, then the trailers.
    Message(Bytes),
    Trailers,
    Done,
}

impl Answer {
    /// A message (framed by [`super::frame::encode`]) followed by `grpc-status: 0`.
    pub(crate) fn message(framed: Bytes, place: Option<Place>) -> Response<Self> {
        let mut response = Response::new(Self {
            state: State::Message(framed),
            _place: place,
        });
        response.headers_mut().insert(CONTENT_TYPE, GRPC);
        response
    }

    /// `status` alone, in the headers, with what tonic wrote there: its metadata,
    /// `grpc-status`, and `grpc-message` percent-encoded when there is one.
    pub(crate) fn status(status: &Status, place: Option<Place>) -> Response<Self> {
        let mut response = Self::headers_only(place);
        let headers = response.headers_mut();
        if status.add_header(headers).is_err() {
            // Only a metadata value could fail; the code alone still says what happened.
            headers.insert(GRPC_STATUS, HeaderValue::from(status.code() as i32));
        }
        response
    }

    /// `UNIMPLEMENTED` without a message: a method a service does not have.
    pub(crate) fn unimplemented(place: Option<Place>) -> Response<Self> {
        let mut response = Self::headers_only(place);
        response
            .headers_mut()
            .insert(GRPC_STATUS, HeaderValue::from_static("12"));
        response
    }

    /// `UNIMPLEMENTED` for a path of no service, with the `content-length: 0` tonic's router
    /// (axum's fallback) wrote there.
    pub(crate) fn no_service(place: Option<Place>) -> Response<Self> {
        let mut response = Self::unimplemented(place);
        response
            .headers_mut()
            .insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
        response
    }

    fn headers_only(place: Option<Place>) -> Response<Self> {
        let mut response = Response::new(Self {
            state: State::Done,
            _place: place,
        });
        response.headers_mut().insert(CONTENT_TYPE, GRPC);
        response
    }
}

/// The trailers of a message: the call succeeded.
fn ok() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
    trailers
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let frame = match std::mem::replace(&mut this.state, State::Done) {
            State::Message(data) => {
                this.state = State::Trailers;
                Frame::data(data)
            }
            State::Trailers => Frame::trailers(ok()),
            State::Done => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use tollgate::places::Places;

    fn frames(mut body: Answer) -> Vec<Frame<Bytes>> {
        let mut out = Vec::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while let Poll::Ready(Some(Ok(f))) = Pin::new(&mut body).poll_frame(&mut cx) {
            out.push(f);
        }
        out
    }

    #[test]
    fn a_message_is_one_data_frame_then_grpc_status_zero() {
        let response = Answer::message(Bytes::from_static(b"\0\0\0\0\x02hi"), None);
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(response.headers().len(), 1);
        assert!(!response.body().is_end_stream());
        assert_eq!(
            response.body().size_hint().exact(),
            None,
            "no content-length"
        );
        let frames = frames(response.into_body());
        assert_eq!(frames.len(), 2);
        assert_eq!(
            frames[0].data_ref().map(|d| &d[..]),
            Some(&b"\0\0\0\0\x02hi"[..])
        );
        let trailers = frames[1].trailers_ref().expect("trailers");
        assert_eq!(trailers.len(), 1);
        assert_eq!(trailers["grpc-status"], "0");
    }

    #[test]
    fn a_status_is_a_trailers_only_answer_as_tonic_wrote_it() {
        let status = Status::not_found("unknown service \"x y\"");
        let response = Answer::status(&status, None);
        assert!(response.body().is_end_stream());
        let headers = response.headers();
        assert_eq!(headers[CONTENT_TYPE], "application/grpc");
        assert_eq!(headers["grpc-status"], "5");
        assert_eq!(headers["grpc-message"], "unknown%20service%20%22x%20y%22");
        assert_eq!(headers, status.into_http::<()>().headers(), "tonic's own");
        assert!(frames(response.into_body()).is_empty());

        let unimplemented = Answer::unimplemented(None);
        assert_eq!(unimplemented.headers()["grpc-status"], "12");
        assert_eq!(
            unimplemented.headers(),
            Status::unimplemented("").into_http::<()>().headers()
        );
        let no_service = Answer::no_service(None);
        assert_eq!(no_service.headers()["grpc-status"], "12");
        assert_eq!(no_service.headers()["content-length"], "0");
        assert!(no_service.body().is_end_stream());
    }

    #[test]
    fn the_place_is_held_until_the_body_is_dropped() {
        let pool = Places::new(8, 1);
        let ip = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let place = pool.take(ip).expect("a place");
        let response = Answer::message(Bytes::from_static(b"\0\0\0\0\0"), Some(place));
        assert!(pool.take(ip).is_none(), "held by the answer");
        let body = response.into_body();
        assert!(pool.take(ip).is_none(), "still held by the body");
        drop(body);
        assert!(pool.take(ip).is_some(), "freed with it");
    }
}
