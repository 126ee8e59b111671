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
//! (`head_timeout::EmptyLines`). A reader keeps its [`Progress`] between reads.

use bytes::{Buf, BytesMut};

/// The most bytes of empty lines (`\r\n` or `\n`) in a row taken before a head. 64 KiB of
/// them written a few bytes at a time, each read skipping them all again, cost hyper's server
/// one to two seconds of CPU (`scripts/trickle-heads --empty-lines`, docs/benchmarks.md).
/// Past this many a client's connection is closed without an answer, as by the header read
/// timeout, and an upstream's answer is a bad one.
pub(crate) const MAX_EMPTY_LINES: usize = 8 * 1024;

/// How far a reader has come with the head (or trailer section) at the start of its buffer,
/// kept between its reads: what it looked at without finding the end, and the empty lines it
/// took before the head. Every reader of heads here keeps one.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Bytes looked at without finding an end (0: none: parse at once).
    looked: usize,
    /// Bytes of empty lines taken before the head.
    empty: usize,
}

impl Progress {
    /// Takes the empty lines at the start of `buf` off it (httparse would skip them again on
    /// every parse); false past [`MAX_EMPTY_LINES`] of them before one head. A `\r` last
    /// waits for what follows it (before anything but `\n` it is httparse's error).
    pub(crate) fn take_empty_lines(&mut self, buf: &mut BytesMut) -> bool {
        let mut n = 0;
        loop {
            match buf[n..] {
                [b'\n', ..] => n += 1,
                [b'\r', b'\n', ..] => n += 2,
                _ => break,
            }
        }
        if n > 0 {
            buf.advance(n);
            self.looked = self.looked.saturating_sub(n);
            self.empty = self.empty.saturating_add(n);
        }
        self.empty <= MAX_EMPTY_LINES
    }

    /// Whether `buf` is worth parsing: at the first look, and then once an end has come after
    /// what was looked at. When it is not, `buf` is noted as looked at.
    pub(crate) fn worth_parsing(&mut self, buf: &[u8]) -> bool {
        if self.looked > 0 && !blank_line_from(buf, self.looked.saturating_sub(2)) {
            self.looked = buf.len();
            return false;
        }
        true
    }

    /// `buf` was parsed and is not whole yet.
    pub(crate) fn not_whole(&mut self, buf: &[u8]) {
        self.looked = buf.len();
    }

    /// A head was read whole: the next begins afresh.
    pub(crate) fn whole(&mut self) {
        *self = Self::default();
    }

    /// Whether the next parse is the first look at this head.
    #[cfg(test)]
    pub(crate) fn first_look(&self) -> bool {
        self.looked == 0
    }
}

/// Whether `buf` holds an empty line (the end of a head or of a trailer section) beginning at
/// or after `from`: a `\n` then `\n` or `\r\n`, every ending httparse takes. A reader that
/// looked at `buf[..n]` before and found no end passes `n - 2`: the end may begin in the last
/// two bytes it looked at.
fn blank_line_from(buf: &[u8], from: usize) -> bool {
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
        let taken = |bytes: &[u8]| {
            let mut buf = BytesMut::from(bytes);
            assert!(Progress::default().take_empty_lines(&mut buf));
            bytes.len() - buf.len()
        };
        assert_eq!(taken(b""), 0);
        assert_eq!(taken(b"\r\n\n\r\nGET"), 5);
        assert_eq!(taken(b"\n\r"), 1);
        assert_eq!(taken(b"\rX"), 0);
        assert_eq!(taken(b"GET\r\n\r\n"), 0);
    }
}
