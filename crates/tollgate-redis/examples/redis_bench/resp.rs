//! RESP2 for the `--script-floor` client: commands written as arrays of bulk strings, replies
//! read by a bounded reader.
//!
//! Why bounded: the client trusts nothing it reads. Every byte of a reply is counted against a
//! budget before it is read or allocated, so a length prefix that a broken or hostile server
//! sends (`$9999999999`, `*2147483647`, a line with no end) is an error at once, never an
//! allocation of that size or a wait for bytes that will not come; nesting is bounded too.

use std::io::{BufRead, Read};

/// The most arrays one reply nests (a batch script's answer is an array of plain values).
const MAX_DEPTH: usize = 4;

/// A reply as RESP2 gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Status(Vec<u8>),
    /// `-ERR ...`: the server refused the command.
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$3 abc`; `None` for the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*2 ...`; `None` for the null array.
    Array(Option<Vec<Reply>>),
}

/// Appends the command `args` to `out`.
pub fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    header(out, b'*', args.len());
    for a in args {
        bulk(out, a);
    }
}

/// Appends an array header of `n` elements (a command of `n` arguments follows), or `kind`'s
/// header of `n`: the store's own writer (`tollgate_redis::push_header`).
pub fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    tollgate_redis::push_header(out, kind, n as u64);
}

/// Appends one bulk string: the store's own writer (`tollgate_redis::push_bulk`).
pub fn bulk(out: &mut Vec<u8>, data: &[u8]) {
    tollgate_redis::push_bulk(out, data);
}

/// Reads one reply of at most `max_bytes` bytes (its type bytes, lengths and line ends
/// included) from `r`.
pub fn read<R: BufRead>(r: &mut R, max_bytes: usize) -> Result<Reply, String> {
    let mut left = max_bytes;
    read_within(r, &mut left, 0)
}

fn read_within<R: BufRead>(r: &mut R, left: &mut usize, depth: usize) -> Result<Reply, String> {
    let line = line(r, left)?;
    let Some((&kind, rest)) = line.split_first() else {
        return Err("an empty line where a reply starts".into());
    };
    match kind {
        b'+' => Ok(Reply::Status(rest.to_vec())),
        b'-' => Ok(Reply::Error(String::from_utf8_lossy(rest).into_owned())),
        b':' => Ok(Reply::Int(integer(rest)?)),
        b'$' => {
            let Some(n) = length(rest)? else {
                return Ok(Reply::Bulk(None));
            };
            let need = n
                .checked_add(2)
                .filter(|&need| need <= *left)
                .ok_or_else(|| {
                    format!("a bulk string of {n} bytes, past the {left} bytes left of the reply's bound")
                })?;
            let mut data = vec![0; need];
            r.read_exact(&mut data)
                .map_err(|e| format!("reading a bulk string of {n} bytes: {e}"))?;
            *left -= need;
            if !data.ends_with(b"\r\n") {
                return Err(format!("a bulk string of {n} bytes not followed by CRLF"));
            }
            data.truncate(n);
            Ok(Reply::Bulk(Some(data)))
        }
        b'*' => {
            if depth >= MAX_DEPTH {
                return Err(format!("arrays nested more than {MAX_DEPTH} deep"));
            }
            let Some(n) = length(rest)? else {
                return Ok(Reply::Array(None));
            };
            // Every element takes at least 3 bytes (`+\r\n`): a count the budget cannot hold
            // is refused before anything is allocated.
            if n > *left / 3 {
                return Err(format!(
                    "an array of {n} elements, past the {left} bytes left of the reply's bound"
                ));
            }
            let mut items = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                items.push(read_within(r, left, depth + 1)?);
            }
            Ok(Reply::Array(Some(items)))
        }
        other => Err(format!("a reply of unknown type {other:#04x}")),
    }
}

/// One line, its CRLF removed, counted against `left`.
fn line<R: BufRead>(r: &mut R, left: &mut usize) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    let limit = u64::try_from(*left).unwrap_or(u64::MAX);
    r.by_ref()
        .take(limit)
        .read_until(b'\n', &mut buf)
        .map_err(|e| format!("reading a reply: {e}"))?;
    if !buf.ends_with(b"\r\n") {
        return Err(if buf.is_empty() {
            "the server closed the connection".into()
        } else if buf.len() == *left {
            format!("a reply line longer than the {left} bytes left of the reply's bound")
        } else {
            format!("a reply line cut short after {} bytes", buf.len())
        });
    }
    *left -= buf.len();
    buf.truncate(buf.len() - 2);
    Ok(buf)
}

fn integer(text: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(text)
        .ok()
        .filter(|t| !t.starts_with('+'))
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("{:?} is not an integer", String::from_utf8_lossy(text)))
}

/// A length: `None` for -1 (null), an error below.
fn length(text: &[u8]) -> Result<Option<usize>, String> {
    match integer(text)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .map(Some)
            .map_err(|_| format!("the length {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(bytes: &[u8], max: usize) -> Result<Reply, String> {
        read(&mut &bytes[..], max)
    }

    /// `reply` as a server writes it.
    fn encode(reply: &Reply, out: &mut Vec<u8>) {
        match reply {
            Reply::Status(s) => {
                out.push(b'+');
                out.extend_from_slice(s);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Error(e) => {
                out.push(b'-');
                out.extend_from_slice(e.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => bulk(out, b),
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(Some(items)) => {
                header(out, b'*', items.len());
                for i in items {
                    encode(i, out);
                }
            }
        }
    }

    #[test]
    fn a_command_is_an_array_of_bulk_strings() {
        let mut out = Vec::new();
        command(&mut out, &[b"SET", b"k", b"", b"PX", b"600"]);
        assert_eq!(
            out,
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$2\r\nPX\r\n$3\r\n600\r\n"
        );
        let mut out = Vec::new();
        header(&mut out, b'*', 1_234_567_890);
        assert_eq!(out, b"*1234567890\r\n");
    }

    #[test]
    fn every_reply_type_is_read_and_the_next_reply_stays_in_the_stream() {
        let bytes =
            b"+OK\r\n-ERR no\r\n:-42\r\n$3\r\na\r\n\r\n$-1\r\n*-1\r\n*2\r\n:1\r\n*1\r\n$0\r\n\r\n";
        let mut r = &bytes[..];
        let want = [
            Reply::Status(b"OK".to_vec()),
            Reply::Error("ERR no".into()),
            Reply::Int(-42),
            Reply::Bulk(Some(b"a\r\n".to_vec())),
            Reply::Bulk(None),
            Reply::Array(None),
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Array(Some(vec![Reply::Bulk(Some(Vec::new()))])),
            ])),
        ];
        for w in want {
            assert_eq!(read(&mut r, 1024), Ok(w));
        }
        assert_eq!(
            read(&mut r, 1024),
            Err("the server closed the connection".into())
        );
    }

    #[test]
    fn a_huge_length_prefix_is_refused_before_anything_is_allocated_or_awaited() {
        // Nothing follows the prefixes: a reader that believed them would wait (or allocate
        // exabytes); this one refuses them at once.
        for bad in [
            &b"$9999999999999999\r\n"[..],
            b"*9223372036854775807\r\n",
            b"*4000\r\n",
            b"$1021\r\n",
        ] {
            let e = parse(bad, 1024).expect_err("refused");
            assert!(e.contains("past the"), "{e}");
        }
        assert!(parse(b"$18446744073709551615\r\n", 1024).is_err());
        // Within the budget a bulk string is read whole.
        let mut ok = b"$1000\r\n".to_vec();
        ok.extend_from_slice(&[b'x'; 1000]);
        ok.extend_from_slice(b"\r\n");
        assert!(matches!(parse(&ok, 1024), Ok(Reply::Bulk(Some(b))) if b.len() == 1000));
        assert!(parse(&ok, 1000).is_err());
    }

    #[test]
    fn a_line_without_end_deep_nesting_and_malformed_lengths_are_errors() {
        let endless = vec![b'+'; 100_000];
        let e = parse(&endless, 4096).expect_err("endless");
        assert!(e.contains("longer than the 4096 bytes"), "{e}");
        let deep = b"*1\r\n".repeat(100);
        assert!(parse(&deep, 4096).expect_err("deep").contains("nested"));
        for bad in [
            &b"$-2\r\n"[..],
            b"*-5\r\n",
            b"$abc\r\n",
            b"$+3\r\nabc\r\n",
            b":99999999999999999999\r\n",
            b"$3\r\nabcd\r\n",
            b"$3\r\nab",
            b"+OK\n",
            b"\r\n",
            b"%1\r\n",
            b"",
        ] {
            assert!(
                parse(bad, 4096).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // An array's elements are counted against the same budget as the array.
        let mut many = b"*100\r\n".to_vec();
        for _ in 0..100 {
            many.extend_from_slice(b":1\r\n");
        }
        assert!(parse(&many, many.len()).is_ok());
        assert!(parse(&many, many.len() - 1).is_err());
    }

    fn replies() -> impl Strategy<Value = Reply> {
        let leaf = prop_oneof![
            "[a-zA-Z0-9 ]{0,8}".prop_map(|s| Reply::Status(s.into_bytes())),
            "[a-zA-Z0-9 ]{0,8}".prop_map(Reply::Error),
            any::<i64>().prop_map(Reply::Int),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(Reply::Bulk),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            proptest::option::of(proptest::collection::vec(inner, 0..6)).prop_map(Reply::Array)
        })
    }

    proptest! {
        #[test]
        fn what_a_server_writes_is_read_back(reply in replies()) {
            let mut bytes = Vec::new();
            encode(&reply, &mut bytes);
            prop_assert_eq!(parse(&bytes, bytes.len()), Ok(reply));
            prop_assert!(parse(&bytes, bytes.len() - 1).is_err());
        }

        #[test]
        fn any_bytes_give_a_reply_or_an_error_within_the_budget(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            max in 0usize..300,
        ) {
            let mut r = &bytes[..];
            let before = r.len();
            let _ = read(&mut r, max);
            prop_assert!(before - r.len() <= max);
        }
    }
}
