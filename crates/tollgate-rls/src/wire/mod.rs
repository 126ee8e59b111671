//! gRPC's wire format for unary calls, written for the two services served here instead of
//! taken from tonic's server stack.
//!
//! A unary call is one length-prefixed protobuf message each way and a status at the end. tonic
//! reaches that through a router, boxed services and bodies, a streaming decoder and encoder
//! per call, and a timeout and an error-recovery layer: about a fifth of the instructions of a
//! simple decision (docs/benchmarks.md, issue #25). Here the message is decoded from the bytes
//! HTTP/2 received, without a copy when it arrived in one piece; the answer is encoded into
//! one buffer, its prefix reserved; and the response body is a plain value that yields that
//! buffer and then the trailers. What a client sees is what tonic answered, status for status
//! and message for message; the tests of each module say which.
//!
//! - [`frame`]: reading a request's messages under a hard bound, and framing an answer.
//! - [`answer`]: the response: one message then `grpc-status: 0`, or a status alone.
//! - [`deadline`]: how long a call may take (`grpc-timeout` and the server's bound).
//! - [`response`]: a `RateLimitResponse` framed with each descriptor status measured once.

pub(crate) mod answer;
pub(crate) mod deadline;
pub(crate) mod frame;
pub(crate) mod response;
