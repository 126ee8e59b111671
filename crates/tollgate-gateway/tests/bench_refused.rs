//! `tollgate bench` against a target that refuses every connection measured nothing: it
//! must fail, not report its errors as throughput.

mod support;

use support::{free_port, tollgate};

#[test]
fn bench_against_a_refused_target_exits_non_zero() {
    // A port nothing listens on: every connection is refused.
    let port = free_port();
    let output = tollgate()
        .args(["bench", "--target", &format!("http://127.0.0.1:{port}/")])
        .args(["--duration", "1s", "--max-requests", "200", "--quiet"])
        .output()
        .expect("run tollgate bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("no request got an answer"), "{stderr}");
    assert!(stderr.contains("connect"), "{stderr}");
}
