use super::*;

fn load(text: &str) -> Result<RlsConfig, RlsConfigErrors> {
    load_str([("rl.yaml", text)])
}

fn errors(text: &str) -> Vec<RlsConfigError> {
    match load(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.0,
    }
}

fn find(c: &RlsConfig, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
    c.find(domain, entries.iter().copied())
        .map(|f| c.rules()[f.rule].policy_name.clone())
}

const NESTED: &str = "\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/v2/*
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: remote_address
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 10}
";

#[test]
fn exact_value_wins_over_a_key_without_value() {
    let c = load(NESTED).expect("ok");
    assert_eq!(
        find(&c, "mongo_cps", &[("database", "users")]).as_deref(),
        Some("mongo_cps.database_users")
    );
    assert_eq!(
        find(&c, "mongo_cps", &[("database", "orders")]).as_deref(),
        Some("mongo_cps.database")
    );
}

#[test]
fn the_first_matching_wildcard_in_file_order_wins_as_in_envoyproxy() {
    let c = load(NESTED).expect("ok");
    // `/api/*` is written before `/api/v2/*`, and envoyproxy/ratelimit tries wildcards in
    // the order they are written.
    assert_eq!(
        find(&c, "mongo_cps", &[("path", "/api/v2/x")]).as_deref(),
        Some("mongo_cps.path_/api/*")
    );
    let swapped = NESTED
        .replace("/api/*", "/api/TMP*")
        .replace("/api/v2/*", "/api/*")
        .replace("/api/TMP*", "/api/v2/*");
    let swapped = load(&swapped).expect("ok");
    assert_eq!(
        find(&swapped, "mongo_cps", &[("path", "/api/v2/x")]).as_deref(),
        Some("mongo_cps.path_/api/v2/*"),
        "written first now"
    );
    assert_eq!(
        find(&c, "mongo_cps", &[("path", "/api/v1")]).as_deref(),
        Some("mongo_cps.path_/api/*")
    );
    assert_eq!(find(&c, "mongo_cps", &[("path", "/other")]), None);
}

#[test]
fn a_rule_applies_only_at_the_depth_of_the_request() {
    let c = load(NESTED).expect("ok");
    // remote_address has no rate_limit of its own; its child does.
    assert_eq!(
        find(&c, "mongo_cps", &[("remote_address", "1.2.3.4")]),
        None
    );
    assert_eq!(
        find(
            &c,
            "mongo_cps",
            &[("remote_address", "1.2.3.4"), ("path", "/x")]
        )
        .as_deref(),
        Some("mongo_cps.remote_address.path")
    );
    // More entries than the configuration is deep: no rule.
    assert_eq!(
        find(&c, "mongo_cps", &[("database", "users"), ("x", "y")]),
        None
    );
}

#[test]
fn unknown_domains_and_empty_descriptors_match_nothing() {
    let c = load(NESTED).expect("ok");
    assert_eq!(find(&c, "other", &[("database", "users")]), None);
    assert_eq!(find(&c, "mongo_cps", &[]), None);
}

#[test]
fn units_month_and_year_are_30_and_365_days_and_names_ignore_case() {
    let c = load("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: MONTH, requests_per_unit: 3}\n").expect("ok");
    let RuleLimit::Limited { limit, unit, .. } = c.rules()[0].limit else {
        panic!("limited expected")
    };
    assert_eq!(unit, Unit::Month);
    assert_eq!(limit.quota().period(), Duration::from_secs(30 * 86_400));
    assert_eq!(Unit::Year.seconds(), 365 * 86_400);
}

#[test]
fn tollgate_keys_set_the_algorithm_window_and_burst() {
    let c = load(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      unit_multiplier: 30\n      algorithm: token_bucket\n      burst: 40\n",
    )
    .expect("ok");
    let RuleLimit::Limited { limit, .. } = c.rules()[0].limit else {
        panic!("limited expected")
    };
    assert_eq!(limit.algorithm(), tollgate::quota::Algorithm::TokenBucket);
    assert_eq!(limit.quota().period(), Duration::from_secs(30));
    assert_eq!(limit.quota().burst(), 40);
}

#[test]
fn the_default_algorithm_is_a_fixed_window_of_one_unit() {
    let c = load("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 20}\n").expect("ok");
    let RuleLimit::Limited { limit, .. } = c.rules()[0].limit else {
        panic!("limited expected")
    };
    assert_eq!(limit.algorithm(), tollgate::quota::Algorithm::FixedWindow);
    assert_eq!(limit.quota().period(), Duration::from_secs(60));
}

#[test]
fn an_unknown_key_is_an_error_naming_line_and_key() {
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      requests_per_hour: 5\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].file, "rl.yaml");
    assert_eq!(e[0].line, 7);
    assert_eq!(e[0].key, "descriptors[0].rate_limit.requests_per_hour");
    assert!(e[0].message.contains("unknown key"), "{}", e[0].message);
    assert!(e[0].to_string().starts_with("error: rl.yaml:7:"));
}

#[test]
fn a_duplicate_descriptor_is_an_error() {
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].line, 5);
    assert_eq!(e[0].key, "descriptors[1]");
    assert!(
        e[0].message.contains("duplicate descriptor"),
        "{}",
        e[0].message
    );
}

#[test]
fn unlimited_with_a_unit_is_an_error() {
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].line, 6);
    assert_eq!(e[0].key, "descriptors[0].rate_limit.unit");
    assert!(e[0].message.contains("unlimited"), "{}", e[0].message);
}

#[test]
fn an_unknown_unit_is_an_error() {
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 3\n");
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].line, 5);
    assert_eq!(e[0].key, "descriptors[0].rate_limit.unit");
    assert!(e[0].message.contains("not a unit"), "{}", e[0].message);
}

/// A refused value is named by its file, line and key, never echoed (a reload's error is
/// logged and answered to whoever asked for it).
#[test]
fn a_refused_value_is_never_echoed() {
    for (field, value) in [
        ("unit", "s3cr3t-unit-98765"),
        ("requests_per_unit", "s3cr3t-98765"),
        ("requests_per_unit", "\"s3cr3t-98765\""),
        ("unit_multiplier", "s3cr3t-98765"),
    ] {
        let mut lines = vec!["unit: second", "requests_per_unit: 3"];
        lines.retain(|l| !l.starts_with(field));
        let refused = format!("{field}: {value}");
        lines.push(&refused);
        let block = lines.join("\n      ");
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {block}\n");
        let e = errors(&text);
        assert_eq!(e.len(), 1, "{field}: {e:?}");
        assert_eq!(e[0].line, 4 + lines.len(), "{field}: {e:?}");
        assert_eq!(e[0].key, format!("descriptors[0].rate_limit.{field}"));
        let shown = e[0].to_string();
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
}

#[test]
fn every_problem_of_a_file_is_reported() {
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    colour: red\n  - key: j\n    rate_limit: {unit: eon, requests_per_unit: 1}\n");
    assert_eq!(e.len(), 2, "{e:?}");
}

#[test]
fn a_domain_in_two_files_is_an_error() {
    let e = load_str([("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")]).expect_err("an error");
    assert_eq!(e.0.len(), 1);
    assert_eq!(e.0[0].file, "b.yaml");
}

#[test]
fn replaces_and_names_are_read() {
    let c = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: one}\n  - key: b\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{name: one}]\n").expect("ok");
    assert_eq!(c.rules()[0].name, "one");
    assert_eq!(c.rules()[1].replaces, vec!["one".to_string()]);
    let e = errors("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: one, replaces: [{name: one}]}\n");
    assert!(e[0].message.contains("itself"));
}

#[test]
fn a_quota_out_of_bounds_is_an_error_not_a_panic() {
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 2}\n");
    assert!(e[0].message.contains("invalid quota"), "{}", e[0].message);
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n");
    assert_eq!(e[0].key, "descriptors[0].rate_limit.requests_per_unit");
}

#[test]
fn a_directory_loads_every_yaml_file() {
    let dir = std::env::temp_dir().join(format!("tollgate-rls-cfg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("ok");
    std::fs::write(dir.join("a.yaml"), "domain: a\n").expect("ok");
    std::fs::write(dir.join("b.yml"), "domain: b\n").expect("ok");
    std::fs::write(dir.join("notes.txt"), "not yaml: [").expect("ok");
    let c = load_dir_or_file(&dir).expect("ok");
    assert!(c.has_domain("a") && c.has_domain("b"));
    assert_eq!(c.files().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn descriptors_nested_past_the_yaml_depth_bound_are_an_error_at_their_line() {
    // Each descriptor level is a mapping in a list: level i opens the (2i + 3)th container,
    // so level 31 is the 65th, one past the bound.
    let mut text = String::from("domain: d\ndescriptors:\n");
    for i in 0..40 {
        let pad = " ".repeat(2 + 4 * i);
        text.push_str(&format!("{pad}- key: k{i}\n{pad}  descriptors:\n"));
    }
    let e = errors(&text);
    assert_eq!(e.len(), 1, "{e:?}");
    // yaml-rust2 marks a block mapping's start at its first `:` (col 4i + 8).
    assert_eq!(
        (e[0].file.as_str(), e[0].line, e[0].col),
        ("rl.yaml", 65, 132)
    );
    assert!(
        e[0].message.contains("nested more than 64"),
        "{}",
        e[0].message
    );
}

#[test]
fn two_rules_with_one_policy_name_are_an_error() {
    let e = errors(
        "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!((e[0].file.as_str(), e[0].line), ("rl.yaml", 5));
    assert_eq!(e[0].key, "descriptors[1]");
    assert!(e[0].message.contains("\"d.a_b\""), "{}", e[0].message);
    assert!(
        e[0].message.contains("descriptors[0] (line 3)"),
        "{}",
        e[0].message
    );
    // Without a rate limit on one of them, no policy clashes.
    assert!(load("domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n").is_ok());
}

#[test]
fn a_rule_named_like_an_override_policy_is_an_error() {
    // `d.override` is where overrides that match no rule are counted.
    let e = errors(
        "domain: d\ndescriptors:\n  - key: override\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!((e[0].line, e[0].key.as_str()), (3, "descriptors[0]"));
    assert!(e[0].message.contains("limit overrides"), "{}", e[0].message);
    // `d.a.override` is where overrides of rule `d.a` are counted.
    let e = errors(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: override\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(
        (e[0].line, e[0].key.as_str()),
        (6, "descriptors[0].descriptors[0]")
    );
    // A child `override` under a descriptor without a rule clashes with nothing.
    assert!(load("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: override\n        rate_limit: {unit: second, requests_per_unit: 1}\n").is_ok());
}

#[test]
fn metadata_is_bounded_in_depth_and_size_and_reported_at_its_line() {
    let mut deep = String::from("domain: d\ndescriptors:\n  - key: k\n    metadata:\n");
    for i in 0..(MAX_METADATA_DEPTH + 2) {
        deep.push_str(&format!("{}l{i}:\n", "  ".repeat(i + 3)));
    }
    deep.push_str(&format!("{}x: 1\n", "  ".repeat(MAX_METADATA_DEPTH + 5)));
    deep.push_str("    rate_limit: {unit: hour, requests_per_unit: 1}\n");
    let e = errors(&deep);
    assert_eq!(e[0].key, "descriptors[0].metadata");
    assert!(e[0].message.contains("deeper"), "{}", e[0].message);
    assert!(
        e[0].line > 4,
        "the line of the value too deep: {}",
        e[0].line
    );
    let mut wide =
        String::from("domain: d\ndescriptors:\n  - key: k\n    metadata:\n      list: [");
    wide.push_str(&vec!["1"; MAX_METADATA_VALUES + 1].join(", "));
    wide.push_str("]\n");
    let e = errors(&wide);
    assert!(e[0].message.contains("more than"), "{}", e[0].message);
    // Within the bounds, any YAML value; a scalar instead of a mapping is refused.
    let ok = "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [1, two, {b: null}], c: true}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let c = load(ok).expect("ok");
    assert_eq!(
        c.rules()[0].metadata.as_ref().map(|m| m.fields.len()),
        Some(2)
    );
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    metadata: text\n");
    assert!(e[0].message.contains("mapping"), "{}", e[0].message);
}

#[test]
fn share_threshold_is_refused_on_a_value_without_a_wildcard() {
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    value: plain\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n");
    assert_eq!(
        (e[0].line, e[0].key.as_str()),
        (5, "descriptors[0].share_threshold")
    );
    let e = errors("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n");
    assert_eq!(e[0].key, "descriptors[0].share_threshold");
    assert!(load(
        "domain: d\ndescriptors:\n  - key: k\n    value: a*\n    share_threshold: true\n"
    )
    .is_ok());
}
