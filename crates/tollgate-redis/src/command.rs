//! A script call's arguments, written where they go: as RESP bytes for the store's own
//! connection (`direct.rs`), or into a `redis::Cmd` for redis-rs's.
//!
//! The store's arguments are pushed through [`Args`], so one function writes a call's
//! arguments (`push_batch_call`, the lease and plan arguments) for either connection. On the
//! store's own connection a batch's arguments are written once, into [`Packed`], the bytes the
//! socket sends: a `redis::Cmd` would keep them in its own buffer and copy them again into
//! the packed command (under callgrind, a batch's arguments written and packed cost 623-637
//! instructions a request that way, 420 this way; docs/benchmarks.md, "twelfth session").
//!
//! Every argument is a bulk string (`$<len>\r\n<bytes>\r\n`); integers are their decimal
//! text, as redis-rs writes them. The array's header (`*<count>\r\n`) is written in front of
//! the arguments when the command is sent, in room kept for it, so nothing is moved.

use redis::Cmd;

/// Where a command's arguments go: one bulk string at a time.
pub(crate) trait Args {
    /// One argument, its bytes as they are.
    fn bulk(&mut self, bytes: &[u8]);
}

impl Args for Cmd {
    fn bulk(&mut self, bytes: &[u8]) {
        self.arg(bytes);
    }
}

impl dyn Args + '_ {
    /// One argument: bytes, a string, or an integer (its decimal text).
    pub(crate) fn arg<T: Arg>(&mut self, value: T) -> &mut Self {
        value.write_to(self);
        self
    }
}

/// A value that is one argument.
pub(crate) trait Arg {
    /// Writes itself as one argument.
    fn write_to(&self, out: &mut dyn Args);
}

impl Arg for &[u8] {
    fn write_to(&self, out: &mut dyn Args) {
        out.bulk(self);
    }
}

impl Arg for &str {
    fn write_to(&self, out: &mut dyn Args) {
        out.bulk(self.as_bytes());
    }
}

impl Arg for &String {
    fn write_to(&self, out: &mut dyn Args) {
        out.bulk(self.as_bytes());
    }
}

impl Arg for String {
    fn write_to(&self, out: &mut dyn Args) {
        out.bulk(self.as_bytes());
    }
}

impl Arg for Vec<u8> {
    fn write_to(&self, out: &mut dyn Args) {
        out.bulk(self);
    }
}

macro_rules! unsigned_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn write_to(&self, out: &mut dyn Args) {
                let mut digits = [0u8; 20];
                out.bulk(decimal(u64::from(*self), &mut digits));
            }
        }
    )*};
}
unsigned_arg!(u8, u16, u32, u64);

impl Arg for usize {
    fn write_to(&self, out: &mut dyn Args) {
        // usize is at most 64 bits on every target this builds for.
        let mut digits = [0u8; 20];
        out.bulk(decimal(*self as u64, &mut digits));
    }
}

macro_rules! signed_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn write_to(&self, out: &mut dyn Args) {
                let n = i64::from(*self);
                let mut digits = [0u8; 21];
                let text = decimal(n.unsigned_abs(), &mut digits[1..]).len();
                let start = 21 - text;
                if n < 0 {
                    digits[start - 1] = b'-';
                    out.bulk(&digits[start - 1..]);
                } else {
                    out.bulk(&digits[start..]);
                }
            }
        }
    )*};
}
signed_arg!(i8, i16, i32, i64);

/// The decimal text of `n`, written at the end of `digits` (20 bytes hold any `u64`).
fn decimal(mut n: u64, digits: &mut [u8]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[at..]
}

/// Room kept in front of the arguments for the array's header: `*`, at most 20 digits, CRLF.
const HEAD: usize = 23;

/// A command as the RESP bytes the store's own connection sends.
pub(crate) struct Packed {
    /// [`HEAD`] bytes of room, then the arguments.
    buf: Vec<u8>,
    args: u64,
    /// A Cluster node's ASK for it may be followed (see [`Packed::across_slots`]).
    pub(crate) follows_ask: bool,
}

impl Args for Packed {
    fn bulk(&mut self, bytes: &[u8]) {
        push_bulk(&mut self.buf, bytes);
        self.args += 1;
    }
}

/// Appends one bulk string to `out`: `$`, the length, CRLF, the bytes, CRLF. The length's
/// header comes from one stack buffer and the room is reserved once: two copies of any
/// length and a store of two bytes. Lengths under 100 (keys, quotas, numbers: nearly every
/// argument) are written without [`decimal`]'s loop: under callgrind (decision mode on Redis,
/// the packing of a lane's call), 442 instructions a request this way, 503 with every length
/// through `decimal`, 525 with each piece appended on its own as well. (Public for the
/// `redis_bench` example's client.)
#[doc(hidden)]
pub fn push_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut head = [0u8; 24];
    head[0] = b'$';
    let len = bytes.len();
    let digits = if len < 10 {
        head[1] = b'0' + len as u8;
        1
    } else if len < 100 {
        head[1] = b'0' + (len / 10) as u8;
        head[2] = b'0' + (len % 10) as u8;
        2
    } else {
        let mut d = [0u8; 20];
        let text = decimal(len as u64, &mut d);
        head[1..=text.len()].copy_from_slice(text);
        text.len()
    };
    head[digits + 1..digits + 3].copy_from_slice(b"\r\n");
    out.reserve(digits + 3 + len + 2);
    out.extend_from_slice(&head[..digits + 3]);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Appends `kind` (`*` for an array), `n` in decimal, and CRLF to `out`. (Public for the
/// `redis_bench` example's client.)
#[doc(hidden)]
pub fn push_header(out: &mut Vec<u8>, kind: u8, n: u64) {
    let mut digits = [0u8; 20];
    out.push(kind);
    out.extend_from_slice(decimal(n, &mut digits));
    out.extend_from_slice(b"\r\n");
}

impl Packed {
    /// An empty command with room for `bytes` of arguments (their text and framing).
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        let mut buf = Vec::with_capacity(HEAD + bytes);
        buf.resize(HEAD, 0);
        Packed {
            buf,
            args: 0,
            follows_ask: true,
        }
    }

    /// Marks a call of an across-slots script (its keys of several slots, one declared): a
    /// node answers ASK for it when the declared key has left a migrating slot, though the
    /// call's other keys of that slot may still be on the node; sent after the ASK, it would
    /// read those keys on the importing node, where they are not yet, and write them there.
    /// So it is not: its caller runs its plans alone, each with every key declared.
    pub(crate) fn across_slots(mut self, across: bool) -> Self {
        self.follows_ask = !across;
        self
    }

    /// The whole command: the array's header, then the arguments.
    pub(crate) fn bytes(&mut self) -> &[u8] {
        let mut digits = [0u8; 20];
        let count = decimal(self.args, &mut digits);
        let start = HEAD - count.len() - 3;
        self.buf[start] = b'*';
        self.buf[start + 1..HEAD - 2].copy_from_slice(count);
        self.buf[HEAD - 2..HEAD].copy_from_slice(b"\r\n");
        &self.buf[start..]
    }

    /// The same command for redis-rs's connection (a server the store's own connection does
    /// not reach, such as a Sentinel master over TLS without verification).
    pub(crate) fn to_cmd(&self) -> Cmd {
        let mut cmd = Cmd::new();
        for arg in self.args() {
            cmd.arg(arg);
        }
        cmd
    }

    /// The arguments, in order.
    pub(crate) fn args(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = self.buf.get(HEAD..).unwrap_or_default();
        std::iter::from_fn(move || {
            // Each argument as `bulk` wrote it: `$`, the length, CRLF, the bytes, CRLF.
            let digits_end = rest.iter().position(|&b| b == b'\r')?;
            let len: usize = std::str::from_utf8(rest.get(1..digits_end)?)
                .ok()?
                .parse()
                .ok()?;
            let arg = rest.get(digits_end + 2..digits_end + 2 + len)?;
            rest = rest.get(digits_end + 2 + len + 2..)?;
            Some(arg)
        })
    }
}

/// The bytes of `cmds` one after another, as one write sends them (a pipeline: the server
/// answers them in order).
pub(crate) fn joined(cmds: &mut [Packed]) -> Vec<u8> {
    let len = cmds.iter().map(|c| c.buf.len()).sum();
    let mut out = Vec::with_capacity(len);
    for c in cmds {
        out.extend_from_slice(c.bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum A {
        Bytes(Vec<u8>),
        Text(String),
        U64(u64),
        I64(i64),
        Usize(usize),
        I32(i32),
    }

    fn args() -> impl Strategy<Value = Vec<A>> {
        let one = prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(A::Bytes),
            ".{0,40}".prop_map(A::Text),
            any::<u64>().prop_map(A::U64),
            any::<i64>().prop_map(A::I64),
            any::<usize>().prop_map(A::Usize),
            any::<i32>().prop_map(A::I32),
            Just(A::U64(0)),
            Just(A::I64(i64::MIN)),
            Just(A::U64(u64::MAX)),
        ];
        // A command has a name at least (redis-rs writes nothing for none).
        proptest::collection::vec(one, 1..40)
    }

    fn push(out: &mut dyn Args, args: &[A]) {
        for a in args {
            match a {
                A::Bytes(b) => out.arg(b.as_slice()),
                A::Text(s) => out.arg(s),
                A::U64(n) => out.arg(*n),
                A::I64(n) => out.arg(*n),
                A::Usize(n) => out.arg(*n),
                A::I32(n) => out.arg(*n),
            };
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The bytes are redis-rs's for the same arguments, byte for byte, whatever they are:
        /// a server reads the same command from either connection.
        #[test]
        fn the_bytes_are_redis_rs_s(args in args(), cap in 0usize..64) {
            let mut cmd = Cmd::new();
            push(&mut cmd, &args);
            let mut packed = Packed::with_capacity(cap);
            push(&mut packed, &args);
            let ours = packed.bytes().to_vec();
            prop_assert_eq!(&ours, &cmd.get_packed_command());
            // Asked twice, the same bytes.
            prop_assert_eq!(packed.bytes(), &ours[..]);
            // And back: the arguments as written, for redis-rs's connection.
            prop_assert_eq!(packed.to_cmd().get_packed_command(), ours);
        }

        /// What the store's reader reads back is an array of the arguments.
        #[test]
        fn the_reply_reader_reads_the_arguments_back(args in args()) {
            let mut packed = Packed::with_capacity(0);
            push(&mut packed, &args);
            let mut cmd = Cmd::new();
            push(&mut cmd, &args);
            let bytes = packed.bytes().to_vec();
            let (v, used) = crate::resp::parse(&bytes)
                .map_err(|e| TestCaseError::fail(e.to_string()))?
                .ok_or_else(|| TestCaseError::fail("incomplete"))?;
            prop_assert_eq!(used, bytes.len());
            let redis::Value::Array(items) = v else {
                return Err(TestCaseError::fail("not an array"));
            };
            let expected: Vec<Vec<u8>> = cmd
                .args_iter()
                .filter_map(|a| match a {
                    redis::Arg::Simple(b) => Some(b.to_vec()),
                    _ => None,
                })
                .collect();
            let got: Vec<Vec<u8>> = items
                .into_iter()
                .filter_map(|i| match i {
                    redis::Value::BulkString(b) => Some(b),
                    _ => None,
                })
                .collect();
            prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn integers_are_their_decimal_text() {
        let mut p = Packed::with_capacity(0);
        let out: &mut dyn Args = &mut p;
        out.arg(0u64)
            .arg(9u8)
            .arg(10u32)
            .arg(-1i64)
            .arg(i64::MIN)
            .arg(u64::MAX)
            .arg(-7i32);
        let args: Vec<String> = p
            .args()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "0",
                "9",
                "10",
                "-1",
                "-9223372036854775808",
                "18446744073709551615",
                "-7"
            ]
        );
        assert!(p.bytes().starts_with(b"*7\r\n$1\r\n0\r\n"));
    }

    #[test]
    fn an_empty_command_is_an_empty_array() {
        let mut p = Packed::with_capacity(0);
        assert_eq!(p.bytes(), b"*0\r\n");
        assert_eq!(p.args().count(), 0);
    }

    /// Lengths of one digit, two, and more, at each edge.
    #[test]
    fn lengths_of_every_width() {
        for len in [
            0usize,
            1,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1000,
            65_536,
            1 << 20,
        ] {
            let value = vec![b'x'; len];
            let mut p = Packed::with_capacity(0);
            p.bulk(&value);
            let mut cmd = Cmd::new();
            cmd.arg(&value[..]);
            assert_eq!(p.bytes(), &cmd.get_packed_command()[..], "{len} bytes");
            assert_eq!(p.args().next().map(<[u8]>::len), Some(len));
        }
    }

    /// Headers of every width: a count of one digit to several.
    #[test]
    fn many_arguments() {
        for n in [9usize, 10, 99, 100, 1000, 12345] {
            let mut p = Packed::with_capacity(0);
            let mut cmd = Cmd::new();
            for i in 0..n {
                (&mut p as &mut dyn Args).arg(i);
                cmd.arg(i);
            }
            assert_eq!(p.bytes(), &cmd.get_packed_command()[..], "{n} arguments");
            assert_eq!(p.args().count(), n);
        }
    }
}
