//! Where a head read in pieces ends. A head (or a trailer section) that arrives over many
//! reads is parsed again only once the empty line that ends it has come: parsing it from its
//! start on every read would cost the square of its length, in CPU a peer controls by
//! writing a byte at a time. Read by decision mode's plain requests (`plain.rs`) and by the
//! proxy's upstream responses and trailers (`proxy/h1.rs`); hyper's server does the same for
//! the requests it reads.
//!
//! Empty lines before a head are no end: httparse skips them (RFC 9112 section 2.2), from the
//! start on every parse, and the scan below takes them for one. So the readers take them off
//! their buffers as they come ([`empty_line_bytes`]) and bound how many in a row they take
//! ([`MAX_EMPTY_LINES`]); hyper's connections are bounded by a reader under hyper
//! (`head_timeout::EmptyLines`).

/// The most bytes of empty lines (`\r\n` or `\n`) in a row taken before a head. 64 KiB of
/// them written a few bytes at a time, each read skipping them all again, cost hyper's server
/// one to two seconds of CPU (`scripts/trickle-heads --empty-lines`, docs/benchmarks.md).
/// Past this many a client's connection is closed without an answer, as by the header read
/// timeout, and an upstream's answer is a bad one.
pub(crate) const MAX_EMPTY_LINES: usize = 8 * 1024;

/// How many bytes of empty lines `buf` begins with: whole ones, `\r\n` or `\n` (a `\r`
/// last waits for what follows it; before anything but `\n` it is httparse's error).
pub(crate) fn empty_line_bytes(buf: &[u8]) -> usize {
    let mut n = 0;
    loop {
        match buf[n..] {
            [b'\n', ..] => n += 1,
            [b'\r', b'\n', ..] => n += 2,
            _ => return n,
        }
    }
}

/// Whether `buf` holds an empty line (the end of a head or of a trailer section) beginning at
/// or after `from`: a `\n` then `\n` or `\r\n`, every ending httparse takes. A reader that
/// looked at `buf[..n]` before and found no end passes `n - 2`: the end may begin in the last
/// two bytes it looked at.
pub(crate) fn blank_line_from(buf: &[u8], from: usize) -> bool {
    let from = from.min(buf.len());
    buf[from..].iter().enumerate().any(|(i, &b)| {
        b == b'\n' && matches!(&buf[from + i + 1..], [b'\n', ..] | [b'\r', b'\n', ..])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_is_found_across_every_split_and_nothing_else_is_one() {
        for head in [
            &b"GET / HTTP/1.1\r\nA: 1\r\n\r\n"[..],
            b"GET / HTTP/1.1\nA: 1\n\n",
            b"A\n\r\n",
        ] {
            // Looked at up to `n` before: the end is found from `n - 2` for every `n`.
            for n in 1..head.len() {
                assert!(blank_line_from(head, n.saturating_sub(2)), "{n} {head:?}");
            }
            assert!(!blank_line_from(&head[..head.len() - 1], 0), "{head:?}");
        }
        assert!(!blank_line_from(b"GET / HTTP/1.1\r\nA: 1\r\n\rB: 2\r\n", 0));
        assert!(!blank_line_from(b"", 5));
    }

    #[test]
    fn empty_lines_are_whole_ones_at_the_start() {
        assert_eq!(empty_line_bytes(b""), 0);
        assert_eq!(empty_line_bytes(b"\r\n\n\r\nGET"), 5);
        assert_eq!(empty_line_bytes(b"\n\r"), 1);
        assert_eq!(empty_line_bytes(b"\rX"), 0);
        assert_eq!(empty_line_bytes(b"GET\r\n\r\n"), 0);
    }
}
