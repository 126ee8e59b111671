//! `[server]` keys against hostile clients: forward-auth headers, ambiguous paths,
//! connection bounds, the body deadline, and `match.case_insensitive`.

use super::*;

fn parse(text: &str) -> Result<Config, Vec<String>> {
    validate::validate("t.toml", text, |_| None)
        .map_err(|e| e.0.iter().map(ToString::to_string).collect())
}

#[test]
fn the_defaults_bound_connections_and_bodies_and_read_the_caddy_headers() {
    let c = parse("").expect("empty config");
    let s = &c.server;
    assert_eq!(s.max_connections, 10_000);
    assert_eq!(s.max_connections_per_ip, 256);
    assert_eq!(s.body_timeout, Duration::from_secs(30));
    assert!(!s.allow_ambiguous_paths);
    assert_eq!(s.forward_auth.uri_header, "x-forwarded-uri");
    assert_eq!(s.forward_auth.method_header, "x-forwarded-method");
    assert!(!s.forward_auth.require_uri, "not written: not required");
}

#[test]
fn the_new_server_keys_are_read() {
    let c = parse(
        "[server]\nforward_auth = { uri_header = \"X-Original-URI\" }\nambiguous_paths = \"allow\"\n\
         max_connections = 50\nmax_connections_per_ip = 5\nbody_timeout = \"2s\"\n\
         [[policy]]\nname = \"p\"\nmatch = { path_prefix = \"/api\", case_insensitive = true }\n\
         algorithm = \"gcra\"\nlimit = 1\nperiod = \"1s\"\n",
    )
    .expect("valid");
    let s = &c.server;
    assert_eq!(s.forward_auth.uri_header, "x-original-uri");
    assert_eq!(s.forward_auth.method_header, "x-forwarded-method");
    assert!(s.forward_auth.require_uri, "written: required");
    assert!(s.allow_ambiguous_paths);
    assert_eq!((s.max_connections, s.max_connections_per_ip), (50, 5));
    assert_eq!(s.body_timeout, Duration::from_secs(2));
    assert!(c.policies[0].case_insensitive);
}

#[test]
fn wrong_values_are_reported_with_file_line_and_key() {
    let errors = parse(
        "[server]\nupstream = \"http://127.0.0.1:1\"\n\
         forward_auth = { uri_header = \"bad header\", method = \"x\" }\n",
    )
    .expect_err("unknown key in forward_auth");
    assert!(errors[0].contains("t.toml:3:"), "{errors:?}");
    let errors = parse(
        "[server]\nupstream = \"http://127.0.0.1:1\"\n\
         forward_auth = { uri_header = \"bad header\" }\n\
         ambiguous_paths = \"sometimes\"\nmax_connections = 0\nmax_connections_per_ip = -1\n\
         body_timeout = \"soon\"\n",
    )
    .expect_err("invalid values");
    let all = errors.join("\n");
    for (line, key) in [
        (3, "server.forward_auth: "),
        (3, "server.forward_auth.uri_header: "),
        (4, "server.ambiguous_paths: "),
        (5, "server.max_connections: "),
        (6, "server.max_connections_per_ip: "),
        (7, "server.body_timeout: "),
    ] {
        assert!(
            errors
                .iter()
                .any(|e| e.contains(&format!("t.toml:{line}:")) && e.contains(key)),
            "{key} at line {line} in:\n{all}"
        );
    }
    assert!(all.contains("is for decision mode"), "{all}");
}

#[test]
fn an_upstream_with_user_info_is_refused_without_echoing_it() {
    for url in [
        "http://admin:hunter2-pw@127.0.0.1:1",
        "http://hunter2-pw@127.0.0.1:1/base",
        "not a url at all :hunter2-pw@",
    ] {
        let text = format!("[server]\nupstream = \"{url}\"\n");
        let errors = parse(&text).expect_err("user info refused");
        let all = errors.join("\n");
        assert!(
            all.contains("t.toml:2:") && all.contains("server.upstream"),
            "{all}"
        );
        assert!(
            !all.contains("hunter2-pw"),
            "the credential was echoed: {all}"
        );
    }
    assert!(parse("[server]\nupstream = \"http://127.0.0.1:1/a@b\"\n").is_ok());
}

#[test]
fn the_admin_token_is_checked_and_an_open_admin_address_needs_one() {
    let errors = parse("[server]\nadmin_token = \"short\"\n").expect_err("short");
    assert!(errors[0].contains("t.toml:2:") && errors[0].contains("server.admin_token"));
    let errors =
        parse("[server]\nadmin_token = \"has a space inside of it\"\n").expect_err("space");
    assert!(errors[0].contains("server.admin_token"), "{errors:?}");
    let errors = parse("[server]\nadmin_listen = \"[::]:9090\"\n").expect_err("open");
    assert!(errors[0].contains("t.toml:2:") && errors[0].contains("server.admin_listen"));
    assert!(
        !errors[0].contains("admin_token:"),
        "one error, at the address"
    );
    assert!(parse("[server]\nadmin_listen = \"[::1]:9090\"\n").is_ok());
    let c =
        parse("[server]\nadmin_listen = \"0.0.0.0:9090\"\nadmin_token = \"0123456789abcdef\"\n")
            .expect("with a token");
    assert_eq!(
        c.server.admin_token.map(|t| t.0),
        Some(b"0123456789abcdef".to_vec())
    );
}
