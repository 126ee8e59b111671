//! A RESP2 reply reader for the store's own connections (`direct.rs`).
//!
//! The connection reads bytes into a buffer and asks for one reply: `Ok(None)` while the buffer
//! holds only part of it, `Ok(Some((value, used)))` once it holds all of it. Most replies
//! arrive in one read, so the first try after a reply's first read builds it at once
//! ([`parse_once`], one pass); when that finds it incomplete, the tries after the next reads
//! first measure it without allocating ([`parse`]), so a reply that arrives in many reads is
//! measured again on each and built once. Both read a whole reply the same way: the same
//! value, the same length, the same error. Errors are the values redis-rs builds (it parses
//! the error line), so their kinds (NOSCRIPT, READONLY, ...) read as with redis-rs's own
//! connections; a top-level error is a `Value::ServerError` the caller turns into an `Err`.
//!
//! The reader is bounded against a broken or hostile server: at most [`MAX_DEPTH`] nested
//! arrays, [`MAX_REPLY`] bytes per reply, and no allocation larger than the bytes already
//! received (an array's announced length preallocates no more than the buffer could hold).
//! The connections never send `HELLO 3`, so RESP3's types are a protocol error.

use redis::Value;

/// The most nested arrays in one reply. The store's scripts answer at most three deep.
pub(crate) const MAX_DEPTH: usize = 16;

/// The largest reply read, in bytes. The largest this connection gets is a batch's: at most
/// 1,024 plans (`store.max_batch`) of at most 8 rules, each plan a packed string of 7 + 22
/// bytes per rule (`script.rs`), under 200 KiB in all; plans of more rules run the generic
/// script on redis-rs's connection. The bound also bounds what a broken or hostile server
/// costs: an incomplete reply is measured again after every read, so the work of reading one
/// is at most about `MAX_REPLY / read size` scans of at most `MAX_REPLY` bytes.
pub(crate) const MAX_REPLY: usize = 4 << 20;

/// A reply the reader cannot read: the connection is unusable after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtocolError(pub(crate) String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unreadable Redis reply: {}", self.0)
    }
}

fn bad(what: impl Into<String>) -> ProtocolError {
    ProtocolError(what.into())
}

/// One reply from the start of `buf`, and how many bytes it took; `None` when `buf` holds only
/// part of it. Measures before it builds: no allocation for an incomplete reply.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, ProtocolError> {
    let Some(len) = measure(buf, 0, 0)? else {
        return incomplete(buf);
    };
    if len > MAX_REPLY {
        return Err(too_long());
    }
    match build(buf, 0, 0)? {
        Some((value, used)) => {
            debug_assert_eq!(used, len);
            Ok(Some((value, used)))
        }
        None => Err(bad("a reply that ended early")),
    }
}

/// [`parse`] in one pass: builds as it reads, so an incomplete reply costs the values built
/// before its end (use [`parse`] once a reply has been found incomplete).
pub(crate) fn parse_once(buf: &[u8]) -> Result<Option<(Value, usize)>, ProtocolError> {
    match build(buf, 0, 0)? {
        Some((_, used)) if used > MAX_REPLY => Err(too_long()),
        Some(done) => Ok(Some(done)),
        None => incomplete(buf),
    }
}

/// What an incomplete reply in `buf` is: `None`, or an error once `buf` is longer than any
/// reply may be.
fn incomplete(buf: &[u8]) -> Result<Option<(Value, usize)>, ProtocolError> {
    if buf.len() > MAX_REPLY {
        return Err(too_long());
    }
    Ok(None)
}

fn too_long() -> ProtocolError {
    bad(format!("a reply longer than {MAX_REPLY} bytes"))
}

/// The line at `at` (its end, not counting CRLF, and where the next item starts); `None` when
/// the buffer ends before its CRLF.
fn line(buf: &[u8], at: usize) -> Result<Option<(usize, usize)>, ProtocolError> {
    let rest = buf.get(at..).unwrap_or_default();
    match rest.iter().position(|&b| b == b'\n') {
        Some(i) if i > 0 && rest[i - 1] == b'\r' => Ok(Some((at + i - 1, at + i + 1))),
        Some(_) => Err(bad("a line that does not end in CRLF")),
        None => {
            if rest.len() > MAX_REPLY {
                return Err(bad("a line longer than the largest reply"));
            }
            Ok(None)
        }
    }
}

/// The integer of a length or `:` line: optional `-`, then 1 to 19 digits.
fn integer(text: &[u8]) -> Result<i64, ProtocolError> {
    let (neg, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    let not_an_integer = || {
        bad(format!(
            "{:?} is not an integer",
            String::from_utf8_lossy(&text[..text.len().min(32)])
        ))
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(not_an_integer());
    }
    // Nineteen digits fit a u64: checked and summed in one pass (every reply of a batch is
    // such an integer), then put in range (i64::MIN included).
    let mut n: u64 = 0;
    for &d in digits {
        let v = d.wrapping_sub(b'0');
        if v > 9 {
            return Err(not_an_integer());
        }
        n = n * 10 + u64::from(v);
    }
    let n = if neg {
        0i64.checked_sub_unsigned(n)
    } else {
        i64::try_from(n).ok()
    };
    n.ok_or_else(|| bad("an integer out of range"))
}

/// A bulk string's or array's announced length: -1 (nil) or 0..=MAX_REPLY.
fn length(text: &[u8]) -> Result<i64, ProtocolError> {
    let n = integer(text)?;
    if n < -1 || n > MAX_REPLY as i64 {
        return Err(bad(format!("a length of {n}")));
    }
    Ok(n)
}

/// What reading an item makes of it: nothing (measuring, [`Measure`]) or its value
/// ([`Build`]). One reader ([`read`]) serves both, so they check the same things in the same
/// order and agree on every reply whose bytes are all there.
trait Make {
    type Item;
    fn simple(text: &[u8]) -> Self::Item;
    /// The whole error line, CRLF included.
    fn error(line: &[u8]) -> Result<Self::Item, ProtocolError>;
    fn int(n: i64) -> Self::Item;
    fn nil() -> Self::Item;
    fn bulk(bytes: &[u8]) -> Self::Item;
    /// `items` of a measured array are `()`: its vector never allocates.
    fn array(items: Vec<Self::Item>) -> Self::Item;
}

/// Reads where an item ends, allocating nothing (an error line is not looked into).
struct Measure;

impl Make for Measure {
    type Item = ();
    fn simple(_: &[u8]) {}
    fn error(_: &[u8]) -> Result<(), ProtocolError> {
        Ok(())
    }
    fn int(_: i64) {}
    fn nil() {}
    fn bulk(_: &[u8]) {}
    fn array(_: Vec<()>) {}
}

/// Builds the item's value.
struct Build;

impl Make for Build {
    type Item = Value;
    fn simple(text: &[u8]) -> Value {
        if text == b"OK" {
            Value::Okay
        } else {
            Value::SimpleString(String::from_utf8_lossy(text).into_owned())
        }
    }
    fn error(line: &[u8]) -> Result<Value, ProtocolError> {
        server_error(line)
    }
    fn int(n: i64) -> Value {
        Value::Int(n)
    }
    fn nil() -> Value {
        Value::Nil
    }
    fn bulk(bytes: &[u8]) -> Value {
        Value::BulkString(bytes.to_vec())
    }
    fn array(items: Vec<Value>) -> Value {
        Value::Array(items)
    }
}

/// Where the item at `at` ends, without building it; `None` when the buffer ends first.
fn measure(buf: &[u8], at: usize, depth: usize) -> Result<Option<usize>, ProtocolError> {
    Ok(read::<Measure>(buf, at, depth)?.map(|((), end)| end))
}

/// Builds the item at `at`; `None` when the buffer ends first.
fn build(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, ProtocolError> {
    read::<Build>(buf, at, depth)
}

/// The item at `at` as `M` makes it, and where it ends; `None` when the buffer ends first.
fn read<M: Make>(
    buf: &[u8],
    at: usize,
    depth: usize,
) -> Result<Option<(M::Item, usize)>, ProtocolError> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some((end, next)) = line(buf, at + 1)? else {
        return Ok(None);
    };
    let text = &buf[at + 1..end];
    Ok(Some(match kind {
        b'+' => (M::simple(text), next),
        b'-' => (M::error(&buf[at..next])?, next),
        b':' => (M::int(integer(text)?), next),
        b'$' => {
            let n = length(text)?;
            if n < 0 {
                return Ok(Some((M::nil(), next)));
            }
            let stop = next + n as usize;
            if buf.len() < stop + 2 {
                return Ok(None);
            }
            if &buf[stop..stop + 2] != b"\r\n" {
                return Err(bad("a bulk string not followed by CRLF"));
            }
            (M::bulk(&buf[next..stop]), stop + 2)
        }
        b'*' => {
            let n = length(text)?;
            if depth + 1 > MAX_DEPTH {
                return Err(bad(format!("arrays nested deeper than {MAX_DEPTH}")));
            }
            if n < 0 {
                return Ok(Some((M::nil(), next)));
            }
            // Every item takes at least 3 bytes ("+\r\n"): an announced length reserves no
            // more than the bytes received could hold.
            let room = (buf.len() - next) / 3;
            let mut items = Vec::with_capacity((n as usize).min(room));
            let mut at = next;
            for _ in 0..n {
                let Some((v, end)) = read::<M>(buf, at, depth + 1)? else {
                    return Ok(None);
                };
                items.push(v);
                at = end;
            }
            (M::array(items), at)
        }
        other => {
            return Err(bad(format!(
                "a reply of type {:?} (this connection speaks RESP2)",
                char::from(other)
            )))
        }
    }))
}

/// An error line (`-CODE detail\r\n`) as redis-rs reads it, so its kind is redis-rs's.
fn server_error(line: &[u8]) -> Result<Value, ProtocolError> {
    match redis::parse_redis_value(line) {
        Ok(v @ Value::ServerError(_)) => Ok(v),
        Ok(other) => Err(bad(format!("an error line read as {other:?}"))),
        Err(e) => Err(bad(format!("an error line redis-rs cannot read: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RESP2 bytes of `v` (the types this reader builds).
    fn encode(v: &Value, out: &mut Vec<u8>) {
        match v {
            Value::Okay => out.extend_from_slice(b"+OK\r\n"),
            Value::SimpleString(s) => {
                out.push(b'+');
                out.extend_from_slice(s.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Value::Nil => out.extend_from_slice(b"$-1\r\n"),
            Value::BulkString(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    encode(i, out);
                }
            }
            Value::ServerError(e) => {
                out.push(b'-');
                out.extend_from_slice(e.code().as_bytes());
                if let Some(d) = e.details() {
                    out.push(b' ');
                    out.extend_from_slice(d.as_bytes());
                }
                out.extend_from_slice(b"\r\n");
            }
            other => panic!("not a RESP2 value: {other:?}"),
        }
    }

    fn error(line: &str) -> Value {
        match redis::parse_redis_value(line.as_bytes()) {
            Ok(v @ Value::ServerError(_)) => v,
            other => panic!("{line:?} read as {other:?}"),
        }
    }

    fn values() -> impl Strategy<Value = Value> {
        let simple = "[a-zA-Z0-9 ]{0,12}"
            .prop_filter_map("not OK", |s| (s != "OK").then_some(Value::SimpleString(s)));
        let leaf = prop_oneof![
            Just(Value::Okay),
            Just(Value::Nil),
            any::<i64>().prop_map(Value::Int),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::BulkString),
            simple,
            "[A-Z]{1,10}( [a-z0-9 ]{1,20})?".prop_map(|s| error(&format!("-{s}\r\n"))),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            proptest::collection::vec(inner, 0..8).prop_map(Value::Array)
        })
    }

    proptest! {
        /// Every value reads back as itself, with the bytes it took, whatever follows it.
        #[test]
        fn a_value_reads_back_as_itself(v in values(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
            let mut bytes = Vec::new();
            encode(&v, &mut bytes);
            let len = bytes.len();
            bytes.extend_from_slice(&tail);
            prop_assert_eq!(parse(&bytes), Ok(Some((v.clone(), len))));
            prop_assert_eq!(parse_once(&bytes), Ok(Some((v, len))));
        }

        /// Every strict prefix of a reply is incomplete, never an error or a wrong value.
        #[test]
        fn a_prefix_is_incomplete(v in values()) {
            let mut bytes = Vec::new();
            encode(&v, &mut bytes);
            for cut in 0..bytes.len() {
                prop_assert_eq!(parse(&bytes[..cut]), Ok(None), "cut at {}", cut);
                prop_assert_eq!(parse_once(&bytes[..cut]), Ok(None), "cut at {}", cut);
            }
        }

        /// Arbitrary bytes never panic: a value, incomplete, or an error.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
            agree(&bytes)?;
        }

        /// Bytes close to RESP (its type bytes, digits, CRLF) never panic either.
        #[test]
        fn resp_like_bytes_never_panic(bytes in proptest::collection::vec(
            prop_oneof![Just(b'*'), Just(b'$'), Just(b':'), Just(b'+'), Just(b'-'), Just(b'\r'),
                        Just(b'\n'), Just(b'1'), Just(b'0'), Just(b'9'), Just(b'x')], 0..64)) {
            if let Ok(Some((_, used))) = parse(&bytes) {
                prop_assert!(used <= bytes.len());
            }
            agree(&bytes)?;
        }
    }

    /// The one-pass reader and the measuring one read whatever is whole alike: a value found
    /// by either is found by both, with the same length, and an error on all the bytes of a
    /// reply is an error for both.
    fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
        let (two, one) = (parse(bytes), parse_once(bytes));
        match (&two, &one) {
            (Ok(Some(_)), _) | (_, Ok(Some(_))) => prop_assert_eq!(&two, &one),
            // An incomplete array may hold an error line redis-rs cannot read: the one-pass
            // reader finds it first, the measuring one once the array is whole.
            (Ok(None), Err(_)) => {}
            _ => prop_assert_eq!(two.is_err(), one.is_err()),
        }
        Ok(())
    }

    #[test]
    fn errors_keep_redis_rs_kinds() {
        let Ok(Some((Value::ServerError(e), _))) =
            parse(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
        else {
            panic!("not an error");
        };
        assert_eq!(e.kind(), Some(redis::ServerErrorKind::NoScript));
        let Ok(Some((Value::Array(items), _))) = parse(b"*2\r\n:1\r\n-ELSEWHERE slot 7\r\n") else {
            panic!("not an array");
        };
        assert!(matches!(&items[1], Value::ServerError(e) if e.code() == "ELSEWHERE"));
    }

    #[test]
    fn hostile_lengths_are_refused_without_allocating() {
        // An array announcing a million items in a few bytes: incomplete, nothing reserved
        // for it; more items than the largest reply could hold: refused.
        assert_eq!(parse(b"*1000000\r\n:1\r\n"), Ok(None));
        assert!(parse(b"*2147483647\r\n:1\r\n").is_err());
        assert!(parse(b"$99999999999\r\n").is_err());
        assert!(parse(b"*-2\r\n").is_err());
        assert!(parse(b":12345678901234567890\r\n").is_err());
        assert!(parse(b":9223372036854775808\r\n").is_err());
        assert_eq!(
            parse(b":-9223372036854775807\r\n"),
            Ok(Some((Value::Int(-9223372036854775807), 23)))
        );
        assert!(parse(b":1\n").is_err());
        assert!(parse(b"$3\r\nabcd\r\n").is_err());
        assert!(parse(b"%1\r\n").is_err(), "RESP3 is not spoken here");
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
        let ok = "*1\r\n".repeat(MAX_DEPTH) + ":1\r\n";
        assert!(matches!(parse(ok.as_bytes()), Ok(Some(_))));
    }

    /// Integers of every width read as std reads them, and a line std refuses (or one of
    /// more than 19 digits) is refused, whichever byte is wrong: the one-pass check of the
    /// first 18 digits and the checked 19th agree with it.
    #[test]
    fn integers_read_as_std_reads_them() {
        let mut texts: Vec<String> = vec![
            "0".into(),
            "-0".into(),
            "-".into(),
            "".into(),
            "+1".into(),
            i64::MAX.to_string(),
            (i64::MIN + 1).to_string(),
            i64::MIN.to_string(),
            "9223372036854775808".into(),
            "99999999999999999999".into(),
        ];
        for width in 1..=20 {
            let digits: String = (0..width)
                .map(|i| char::from(b'1' + (i % 9) as u8))
                .collect();
            texts.push(digits.clone());
            texts.push(format!("-{digits}"));
            for bad_at in 0..width {
                for bad in [b'/', b':', b' ', b'a'] {
                    let mut b = digits.clone().into_bytes();
                    b[bad_at] = bad;
                    texts.push(String::from_utf8(b).unwrap_or_default());
                }
            }
        }
        for t in &texts {
            let std = t.parse::<i64>().ok().filter(|_| {
                let digits = t.strip_prefix('-').unwrap_or(t);
                !digits.is_empty() && digits.len() <= 19 && !t.starts_with('+')
            });
            let line = format!(":{t}\r\n");
            let ours = parse(line.as_bytes());
            match std {
                // -0 reads as 0, as std has it.
                Some(n) => assert_eq!(ours, Ok(Some((Value::Int(n), line.len()))), "{t:?}"),
                None => assert!(ours.is_err(), "{t:?} was read as {ours:?}"),
            }
        }
    }

    #[test]
    fn the_one_pass_reader_refuses_what_the_measuring_one_refuses() {
        for bytes in [
            &b"*2147483647\r\n:1\r\n"[..],
            b"$99999999999\r\n",
            b"*-2\r\n",
            b":12345678901234567890\r\n",
            b":1\n",
            b"$3\r\nabcd\r\n",
            b"%1\r\n",
            b"*1\r\n$3\r\nabcd\r\n",
        ] {
            assert!(parse_once(bytes).is_err(), "{bytes:?}");
        }
        assert_eq!(parse_once(b"*1000000\r\n:1\r\n"), Ok(None));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse_once(deep.as_bytes()).is_err());
        let ok = "*1\r\n".repeat(MAX_DEPTH) + ":1\r\n";
        assert!(matches!(parse_once(ok.as_bytes()), Ok(Some(_))));
        // A whole reply past the bound is refused, built or not.
        let mut big = format!("${}\r\n", MAX_REPLY).into_bytes();
        big.resize(big.len() + MAX_REPLY, b'a');
        big.extend_from_slice(b"\r\n");
        assert!(parse_once(&big).is_err());
        assert!(parse(&big).is_err());
    }

    #[test]
    fn a_line_without_its_end_is_bounded() {
        let mut long = vec![b'+'];
        long.resize(MAX_REPLY + 2, b'a');
        assert!(parse(&long).is_err());
        assert!(parse_once(&long).is_err());
    }
}
