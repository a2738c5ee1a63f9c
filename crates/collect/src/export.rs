//! Verdicts sent on to a downstream OpenTelemetry collector as `gen_ai.evaluation.result`
//! events (OTLP/HTTP JSON logs, `POST {endpoint}/v1/logs`), attached to the trace and its root
//! span, so a tool that shows GenAI evaluations (Logfire, Phoenix, Langfuse) shows the
//! Detector's verdict next to the trace.
//!
//! Plain `http://` only: a collector on the same host or network is the usual hop; TLS is for
//! that collector to do. A failed send is logged once per run of failures and not retried: the
//! verdict is already stored in the inbox and served by the receiver.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{json, Value};

use crate::inbox::VerdictRow;
use crate::Error;

/// Where evaluation events go.
#[derive(Debug)]
pub struct Exporter {
    host: String,
    port: u16,
    path: String,
    failing: AtomicBool,
}

impl Exporter {
    /// `url` is the collector's OTLP/HTTP base, e.g. `http://127.0.0.1:4318`.
    pub fn new(url: &str) -> Result<Exporter, Error> {
        let bad = |reason: &str| Error::Config(format!("--export-to {url}: {reason}"));
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// endpoints are supported"))?;
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| bad("the port is not a number"))?,
            ),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        Ok(Exporter {
            host: host.to_string(),
            port,
            path: format!("{base}/v1/logs"),
            failing: AtomicBool::new(false),
        })
    }

    /// Sends one verdict; failures are logged, never raised.
    pub fn send(&self, row: &VerdictRow, root_span: Option<&str>) {
        let body = evaluation_event(row, root_span).to_string();
        match self.post(&body) {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        "exporting verdicts to {}:{} works again",
                        self.host,
                        self.port
                    );
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "exporting a verdict to http://{}:{}{} failed: {e} (said once until it works again)",
                        self.host,
                        self.port,
                        self.path
                    );
                }
            }
        }
    }

    fn post(&self, body: &str) -> Result<(), String> {
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| e.to_string())?
            .next()
            .ok_or("the host resolves to no address")?;
        let mut stream =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let request = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.path,
            self.host,
            self.port,
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut response = Vec::new();
        let _ = stream.take(64 * 1024).read_to_end(&mut response);
        let response = String::from_utf8_lossy(&response);
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or("no HTTP status in the response")?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(format!("the collector answered {status}"))
        }
    }
}

/// The OTLP/JSON logs request carrying one `gen_ai.evaluation.result` event.
pub fn evaluation_event(row: &VerdictRow, root_span: Option<&str>) -> Value {
    let attr = |key: &str, value: &str| json!({"key": key, "value": {"stringValue": value}});
    let mut attributes = vec![
        attr("gen_ai.evaluation.name", "pathfinder.deficiency"),
        attr("gen_ai.evaluation.score.label", &row.label),
        attr("gen_ai.evaluation.explanation", &row.explanation),
        attr("pathfinder.detector", &row.detector),
        json!({"key": "pathfinder.spans", "value": {"intValue": row.spans.to_string()}}),
    ];
    if let Some(component) = row
        .verdict
        .as_ref()
        .and_then(|v| v.get("component"))
        .and_then(Value::as_str)
    {
        attributes.push(attr("pathfinder.component", component));
    }
    let mut record = json!({
        "timeUnixNano": (row.diagnosed_ms as i128 * 1_000_000).to_string(),
        "observedTimeUnixNano": (row.diagnosed_ms as i128 * 1_000_000).to_string(),
        "eventName": "gen_ai.evaluation.result",
        "severityNumber": 9,
        "severityText": "INFO",
        "traceId": row.trace_id,
        "attributes": attributes,
    });
    if let Some(span) = root_span {
        record["spanId"] = json!(span);
    }
    json!({"resourceLogs": [{
        "resource": {"attributes": [attr("service.name", "pathfinder-collect")]},
        "scopeLogs": [{"scope": {"name": "pathfinder.collect", "version": env!("CARGO_PKG_VERSION")}, "logRecords": [record]}]
    }]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_or_refused() {
        let e = Exporter::new("http://collector:4318/").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("collector", 4318, "/v1/logs")
        );
        let e = Exporter::new("http://h/otlp").unwrap();
        assert_eq!((e.port, e.path.as_str()), (80, "/otlp/v1/logs"));
        assert!(Exporter::new("https://h:4318").is_err());
        assert!(Exporter::new("http://h:x").is_err());
    }
}
