//! MONITOR on a test's own redis-server, through a `redis-cli monitor` child: every command the
//! server runs, a script's own `redis.call`s included (their client shows as `lua`), with the
//! arguments as the server received them. A test reads what a script wrote, not only what it
//! answered: a write's PX, for one. Included by the test files that use it (`#[path]`), so its
//! own test runs once.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Only a guard against a hung test; nothing asserts on time.
const HANG: Duration = Duration::from_secs(30);

pub struct Monitor {
    port: u16,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

/// One command the server ran: the client that sent it (`lua` for a script's own) and its
/// arguments, unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub client: String,
    pub args: Vec<Vec<u8>>,
}

impl Monitor {
    /// Starts watching the server on `port`; returns once the server has said MONITOR is on.
    pub fn start(port: u16) -> Self {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "monitor"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli monitor");
        let out = child.stdout.take().expect("redis-cli's stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let into = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                into.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        let m = Self { port, child, lines };
        m.wait_for(|l| l == "OK", "MONITOR's OK");
        m
    }

    /// Every command seen up to now: the server echoes `mark` (a command of its own after
    /// everything the test ran before this call), and the lines before it are returned.
    pub fn seen(&self, mark: &str) -> Vec<Seen> {
        let echoed = tollgate_testkit::redis_cli(self.port, &["echo", mark]);
        assert_eq!(echoed.trim(), mark, "redis-cli echo");
        let quoted = format!("\"{mark}\"");
        let at = self.wait_for(|l| l.ends_with(&quoted), mark);
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines[..at].iter().filter_map(|l| parse(l)).collect()
    }

    /// Waits for a line that `is` (bounded by HANG); its index.
    fn wait_for(&self, is: impl Fn(&str) -> bool, what: &str) -> usize {
        let start = Instant::now();
        while start.elapsed() < HANG {
            {
                let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(i) = lines.iter().position(|l| is(l)) {
                    return i;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("MONITOR never showed {what}");
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A MONITOR line, `<time> [<db> <client>] "arg" "arg" ...` (each argument quoted, with
/// backslash escapes and `\xHH` for a byte that is not printable); `None` for another line.
pub fn parse(line: &str) -> Option<Seen> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let client = line[open + 1..close].split_once(' ')?.1.to_string();
    let mut rest = &line.as_bytes()[close + 1..];
    let mut args = Vec::new();
    loop {
        while let [b' ', tail @ ..] = rest {
            rest = tail;
        }
        let [b'"', tail @ ..] = rest else {
            break;
        };
        rest = tail;
        let mut arg = Vec::new();
        loop {
            match rest {
                [b'"', tail @ ..] => {
                    rest = tail;
                    break;
                }
                [b'\\', b'x', h, l, tail @ ..] => {
                    let hex = [*h, *l];
                    let hex = std::str::from_utf8(&hex).ok()?;
                    arg.push(u8::from_str_radix(hex, 16).ok()?);
                    rest = tail;
                }
                [b'\\', c, tail @ ..] => {
                    arg.push(match c {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'a' => 7,
                        b'b' => 8,
                        other => *other,
                    });
                    rest = tail;
                }
                [c, tail @ ..] => {
                    arg.push(*c);
                    rest = tail;
                }
                [] => return None,
            }
        }
        args.push(arg);
    }
    (!args.is_empty()).then_some(Seen { client, args })
}

#[test]
fn a_line_of_a_scripts_write_parses_into_its_arguments() {
    let line = r#"1796592622.067504 [0 lua] "SET" "t:{1}:p" "\x00\"a\\b\n" "PX" "1234" "GET""#;
    let seen = parse(line).expect("a command");
    assert_eq!(seen.client, "lua");
    let want: Vec<&[u8]> = vec![b"SET", b"t:{1}:p", b"\x00\"a\\b\n", b"PX", b"1234", b"GET"];
    assert_eq!(seen.args, want);
    assert_eq!(parse("OK"), None);
    assert_eq!(parse(r#"1.0 [0 lua] "unterminated"#), None);
}
