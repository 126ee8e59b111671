//! `[telemetry]`: where decision spans go. Nothing is sent unless `otlp_endpoint` is set; the
//! endpoint is an OTLP/gRPC collector over cleartext HTTP/2 (a collector sidecar or agent on
//! the node is the usual place; TLS is the collector's business towards its backends).

use super::error::Reporter;
use super::fields::{expand_env, field};
use super::raw::RawTelemetry;
use crate::schema as key;

/// The service name spans carry when `service_name` is not set.
pub const DEFAULT_SERVICE_NAME: &str = "tollgate";

/// A validated `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// `otlp_endpoint`: `http://HOST:PORT` of an OTLP/gRPC collector; `None`: no spans.
    pub otlp_endpoint: Option<String>,
    /// `sample_ratio`: the share of traces started here that are sent (0 to 1; a request's
    /// `traceparent` decides for its own trace).
    pub sample_ratio: f64,
    /// `service_name`: the `service.name` resource attribute.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sample_ratio: 1.0,
            service_name: DEFAULT_SERVICE_NAME.to_string(),
        }
    }
}

pub(super) fn telemetry(
    r: &mut Reporter<'_>,
    raw: RawTelemetry,
    env: &impl Fn(&str) -> Option<String>,
) -> TelemetryConfig {
    let default = TelemetryConfig::default();
    let otlp_endpoint = field(
        r,
        key::TELEMETRY_OTLP_ENDPOINT,
        &raw.otlp_endpoint,
        None,
        |s| endpoint(&expand_env(s, env)?).map(Some),
    );
    let sample_ratio = field(
        r,
        key::TELEMETRY_SAMPLE_RATIO,
        &raw.sample_ratio,
        default.sample_ratio,
        |v| {
            let v = match v {
                toml::Value::Float(f) => *f,
                toml::Value::Integer(i) => *i as f64,
                other => {
                    return Err(format!(
                        "is a {}; expected a number from 0 to 1 (e.g. 0.1 sends one trace in ten)",
                        other.type_str()
                    ))
                }
            };
            if (0.0..=1.0).contains(&v) {
                Ok(v)
            } else {
                Err("is not allowed; expected a number from 0 to 1 (e.g. 0.1 sends one trace in ten)".to_string())
            }
        },
    );
    let service_name = field(
        r,
        key::TELEMETRY_SERVICE_NAME,
        &raw.service_name,
        default.service_name,
        |s| {
            let s = expand_env(s, env)?;
            if s.is_empty() || s.len() > 128 || s.chars().any(char::is_control) {
                return Err(
                    "expected a name of 1 to 128 characters without control characters, e.g. \"tollgate\""
                        .to_string(),
                );
            }
            Ok(s)
        },
    );
    TelemetryConfig {
        otlp_endpoint,
        sample_ratio,
        service_name,
    }
}

/// `http://HOST:PORT` with no path beyond `/`, no user info and no query.
fn endpoint(s: &str) -> Result<String, String> {
    const HELP: &str =
        "expected the OTLP/gRPC collector as \"http://HOST:PORT\" (e.g. \"http://127.0.0.1:4317\")";
    let uri = super::fields::http_url(
        s,
        HELP,
        &format!("https is not supported; {HELP} (a collector on the same host or node, which forwards over TLS)"),
    )?;
    let Some(authority) = uri.authority() else {
        return Err(format!("has no host; {HELP}"));
    };
    if authority.port_u16().is_none() {
        return Err(format!("has no port; {HELP}"));
    }
    if uri.path() != "/" || uri.query().is_some() {
        return Err(format!(
            "has a path or query; {HELP} (the gRPC path is fixed)"
        ));
    }
    Ok(format!("http://{authority}"))
}

#[cfg(test)]
mod tests {
    use super::super::validate::validate;

    fn errors(text: &str) -> Vec<String> {
        match validate("t.toml", text, |_| None) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn nothing_is_sent_without_an_endpoint() {
        let c = validate("t.toml", "", |_| None).expect("valid");
        assert_eq!(c.telemetry.otlp_endpoint, None);
        assert_eq!(c.telemetry.service_name, "tollgate");
    }

    #[test]
    fn the_endpoint_ratio_and_name_are_read() {
        let text = "[telemetry]\notlp_endpoint = \"http://${HOST}:4317\"\nsample_ratio = 0.25\nservice_name = \"edge\"\n";
        let c =
            validate("t.toml", text, |n| (n == "HOST").then(|| "10.0.0.7".into())).expect("valid");
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://10.0.0.7:4317")
        );
        assert_eq!(c.telemetry.sample_ratio, 0.25);
        assert_eq!(c.telemetry.service_name, "edge");
        let whole = validate("t.toml", "[telemetry]\nsample_ratio = 1\n", |_| None).expect("valid");
        assert_eq!(whole.telemetry.sample_ratio, 1.0);
    }

    #[test]
    fn a_bad_endpoint_or_ratio_names_its_line_and_key() {
        let e = errors("[telemetry]\notlp_endpoint = \"https://c:4317\"\n");
        assert!(
            e[0].starts_with("error: t.toml:2:17: telemetry.otlp_endpoint: https is not supported"),
            "{e:?}"
        );
        let e = errors("[telemetry]\notlp_endpoint = \"http://c\"\n");
        assert!(e[0].contains("has no port"), "{e:?}");
        let e = errors("[telemetry]\notlp_endpoint = \"http://c:4317/v1/traces\"\n");
        assert!(e[0].contains("has a path"), "{e:?}");
        let e = errors("\n[telemetry]\nsample_ratio = 1.5\n");
        assert!(
            e[0].starts_with("error: t.toml:3:16: telemetry.sample_ratio: is not allowed"),
            "{e:?}"
        );
        let e = errors("[telemetry]\nsample_ratio = \"half\"\n");
        assert!(e[0].contains("expected a number from 0 to 1"), "{e:?}");
        let e = errors("[telemetry]\nservice_name = \"\"\n");
        assert!(e[0].contains("telemetry.service_name"), "{e:?}");
        let e = errors("[telemetry]\notlp = \"http://c:1\"\n");
        assert!(e[0].contains("telemetry"), "{e:?}");
    }
}
