//! Reading a command's reply without losing the errors inside it, and the texts of an `INFO`.

use redis::{Cmd, RedisError, Value};

/// The reply to `cmd`; an error reply is an `Err`, an error inside an array stays where it is
/// (a batch's plan that failed alone: `Cmd::query_async` would fail the whole batch for it).
pub(crate) async fn reply_of(
    con: &mut impl redis::aio::ConnectionLike,
    cmd: &Cmd,
) -> Result<redis::Value, RedisError> {
    server_error_as_err(con.req_packed_command(cmd).await?)
}

/// A reply as redis-rs gives it: a server error is an `Err`.
pub(crate) fn server_error_as_err(v: Value) -> Result<Value, RedisError> {
    match v {
        Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}

/// Every text of an `INFO` reply: one (a server), or one per node (a Cluster's reply, a map or
/// an array of them).
pub(crate) fn info_texts(reply: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    collect_texts(reply, &mut out);
    out
}

fn collect_texts<'a>(reply: &'a Value, out: &mut Vec<&'a str>) {
    match reply {
        Value::BulkString(bytes) => out.extend(std::str::from_utf8(bytes).ok()),
        Value::SimpleString(text) => out.push(text),
        Value::VerbatimString { text, .. } => out.push(text),
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_texts(v, out)),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| collect_texts(v, out)),
        _ => {}
    }
}

/// The value of the field `name` (`name:value` on a line of its own) in an `INFO` text.
pub(crate) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
}
