//! Where a head read in pieces ends. A head (or a trailer section) that arrives over many
//! reads is parsed again only once the empty line that ends it has come: parsing it from its
//! start on every read would cost the square of its length, in CPU a peer controls by
//! writing a byte at a time. Read by decision mode's plain requests (`plain.rs`) and by the
//! proxy's upstream responses and trailers (`proxy/h1.rs`); hyper's server does the same for
//! the requests it reads.

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
}
