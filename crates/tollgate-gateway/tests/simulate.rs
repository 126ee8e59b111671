//! `tollgate simulate` as a user runs it: the binary, its JSON lines and its SVG.

use serde_json::Value;
use std::process::{Command, Output};

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("the tollgate binary runs")
}

fn json_lines(args: &[&str]) -> Vec<Value> {
    let out = tollgate(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8 output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
        .collect()
}

#[test]
fn boundary_scenario_admits_200_with_fixed_window_and_100_with_the_others() {
    let lines = json_lines(&["simulate", "--scenario", "boundary", "--format", "json"]);
    let expected = [
        ("fixed_window", 200),
        ("sliding_window_log", 100),
        ("sliding_window_counter", 100),
        ("token_bucket", 100),
        ("leaky_bucket", 100),
        ("gcra", 100),
    ];
    assert_eq!(lines.len(), expected.len());
    for (line, (algorithm, allowed)) in lines.iter().zip(expected) {
        assert_eq!(line["scenario"], "boundary");
        assert_eq!(line["algorithm"], algorithm);
        assert_eq!(line["sent"], 300, "{algorithm}");
        assert_eq!(line["allowed"], allowed, "{algorithm}");
        assert_eq!(line["denied"], 300 - allowed, "{algorithm}");
    }
}

#[test]
fn json_lines_start_with_the_documented_fields_in_order() {
    let out = tollgate(&["simulate", "--format", "json"]);
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    let first = text.lines().next().expect("one line per algorithm");
    assert!(
        first.starts_with(
            r#"{"scenario":"boundary","algorithm":"fixed_window","sent":300,"allowed":200,"denied":100"#
        ),
        "{first}"
    );
}

#[test]
fn every_scenario_accounts_for_every_request() {
    for scenario in ["boundary", "steady", "burst"] {
        let lines = json_lines(&["simulate", "--scenario", scenario, "--format", "json"]);
        assert_eq!(lines.len(), 6, "{scenario}");
        for line in &lines {
            let sent = line["sent"].as_u64().expect("sent");
            let allowed = line["allowed"].as_u64().expect("allowed");
            let denied = line["denied"].as_u64().expect("denied");
            assert!(sent > 0);
            assert_eq!(allowed + denied, sent, "{scenario}: {line}");
        }
        // The scenarios exist to show differences: not every algorithm agrees.
        let first = &lines[0]["allowed"];
        assert!(lines.iter().any(|l| &l["allowed"] != first), "{scenario}");
    }
}

#[test]
fn table_explains_each_algorithm() {
    let out = tollgate(&["simulate"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    for algorithm in [
        "fixed_window",
        "token_bucket",
        "gcra",
        "sliding_window_counter",
    ] {
        let row = text
            .lines()
            .find(|l| l.starts_with(algorithm))
            .unwrap_or_else(|| panic!("no row for {algorithm} in\n{text}"));
        assert!(row.split_whitespace().count() > 6, "no explanation: {row}");
    }
}

#[test]
fn svg_flag_writes_a_chart_with_a_panel_per_algorithm() {
    let dir = std::env::temp_dir().join(format!("tollgate-simulate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("boundary.svg");
    let out = tollgate(&[
        "simulate",
        "--format",
        "json",
        "--svg",
        path.to_str().expect("utf-8 path"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).expect("the SVG was written");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        svg.trim_start().starts_with("<svg"),
        "{}",
        &svg[..80.min(svg.len())]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    for text in [
        "fixed_window: 200 admitted",
        "gcra: 100 admitted",
        "time (s)",
        "rejected",
    ] {
        assert!(svg.contains(text), "the chart has no {text:?}");
    }
    // The time axis reads in round tenths of a second, never a float as computed.
    let texts: Vec<&str> = svg
        .split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim())
        })
        .collect();
    for tick in ["59.8", "59.9", "60.0", "60.1", "60.2"] {
        assert!(texts.contains(&tick), "no tick {tick:?} in {texts:?}");
    }
    assert!(
        texts.iter().all(|t| t.len() < 12 || t.contains(' ')),
        "a label with float noise: {texts:?}"
    );
}

#[test]
fn unknown_scenarios_are_usage_errors() {
    let out = tollgate(&["simulate", "--scenario", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("boundary"));
}

#[test]
fn version_is_printed() {
    let out = tollgate(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    assert_eq!(
        text.trim(),
        format!("tollgate {}", env!("CARGO_PKG_VERSION"))
    );
}
