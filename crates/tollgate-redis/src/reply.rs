//! Reading a command's reply without losing the errors inside it.

use redis::{Cmd, RedisError};

/// The reply to `cmd`; an error reply is an `Err`, an error inside an array stays where it is
/// (a batch's plan that failed alone: `Cmd::query_async` would fail the whole batch for it).
pub(crate) async fn reply_of(
    con: &mut impl redis::aio::ConnectionLike,
    cmd: &Cmd,
) -> Result<redis::Value, RedisError> {
    match con.req_packed_command(cmd).await? {
        redis::Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}
