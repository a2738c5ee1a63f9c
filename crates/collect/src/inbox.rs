//! The inbox: a SQLite file beside the trace store where every acknowledged span is durable
//! before its request is answered (WAL, `synchronous = FULL`), each trace's progress (spans
//! received, root seen, when the last span came, how many spans its last diagnosis read) and
//! each trace's latest verdict. It is what makes a SIGKILL lose nothing acknowledged: on start
//! the finisher finds every trace whose spans outnumber what was diagnosed.
//!
//! The trace store itself stays what `traces import` writes; the Detector investigates it, and
//! nothing of a verdict is put where the Detector could read it.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

use crate::intake::SpanRow;
use crate::Error;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inbox_spans (
    seq INTEGER PRIMARY KEY,
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    resource TEXT NOT NULL,
    scope TEXT NOT NULL,
    span TEXT NOT NULL,
    received_ms INTEGER NOT NULL,
    UNIQUE (trace_id, span_id)
);
CREATE TABLE IF NOT EXISTS inbox_traces (
    trace_id TEXT PRIMARY KEY,
    spans INTEGER NOT NULL,
    has_root INTEGER NOT NULL,
    first_ms INTEGER NOT NULL,
    last_ms INTEGER NOT NULL,
    diagnosed_spans INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS inbox_traces_open ON inbox_traces (last_ms) WHERE spans > diagnosed_spans;
CREATE TABLE IF NOT EXISTS verdicts (
    trace_id TEXT PRIMARY KEY,
    spans INTEGER NOT NULL,
    detector TEXT NOT NULL,
    label TEXT NOT NULL,
    verdict TEXT,
    explanation TEXT NOT NULL,
    transcript TEXT,
    framework TEXT,
    last_span_ms INTEGER NOT NULL,
    diagnosed_ms INTEGER NOT NULL,
    diagnoses INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS verdicts_recent ON verdicts (diagnosed_ms);
";

/// Milliseconds since the Unix epoch by this machine's clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One connection to the inbox.
pub struct Inbox {
    conn: Connection,
}

/// What one write added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Spans new to the inbox (a resent span is kept once).
    pub new: usize,
    pub duplicates: usize,
}

/// A trace ready to be diagnosed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub trace_id: String,
    pub spans: i64,
    pub last_ms: i64,
}

/// A stored verdict, as the page and the JSON API show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictRow {
    pub trace_id: String,
    /// How many spans the diagnosis read.
    pub spans: i64,
    pub detector: String,
    /// The deficiency id, `none` for a healthy trace, or `error` when no verdict came.
    pub label: String,
    /// The Detector's verdict as JSON (`detect::Verdict`), when it gave one.
    pub verdict: Option<serde_json::Value>,
    pub explanation: String,
    pub framework: Option<String>,
    /// When the trace's last span arrived and when its verdict was stored (ms since the epoch).
    pub last_span_ms: i64,
    pub diagnosed_ms: i64,
    /// How many times the trace was diagnosed (more than once when spans came after a verdict).
    pub diagnoses: i64,
}

impl Inbox {
    /// Opens (creating) the inbox. Writes are durable when they return.
    pub fn open(path: &Path) -> Result<Inbox, Error> {
        let conn = Connection::open(path).map_err(|e| Error::inbox(path, e))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(|e| Error::inbox(path, e))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(|e| Error::inbox(path, e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Inbox {
                path: path.to_path_buf(),
                reason: format!("the inbox must be in WAL mode, SQLite gave `{mode}`"),
            });
        }
        conn.execute_batch("PRAGMA synchronous = FULL;")
            .map_err(|e| Error::inbox(path, e))?;
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))
            .map_err(|e| Error::inbox(path, e))?;
        Ok(Inbox { conn })
    }

    /// Opens an existing inbox for reading (the page and the JSON API).
    pub fn open_read_only(path: &Path) -> Result<Inbox, Error> {
        let conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| Error::inbox(path, e))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(|e| Error::inbox(path, e))?;
        Ok(Inbox { conn })
    }

    /// Stores the spans of several requests in one transaction (group commit), at `now`.
    pub fn write(&mut self, batches: &[&[SpanRow]], now: i64) -> rusqlite::Result<Vec<Written>> {
        let tx = self.conn.transaction()?;
        let mut out = Vec::with_capacity(batches.len());
        {
            let mut insert = tx.prepare_cached(
                "INSERT OR IGNORE INTO inbox_spans (trace_id, span_id, resource, scope, span, received_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut progress = tx.prepare_cached(
                "INSERT INTO inbox_traces (trace_id, spans, has_root, first_ms, last_ms) VALUES (?1, 1, ?2, ?3, ?3) \
                 ON CONFLICT (trace_id) DO UPDATE SET spans = spans + 1, has_root = max(has_root, ?2), last_ms = max(last_ms, ?3)",
            )?;
            for rows in batches {
                let mut written = Written::default();
                for row in rows.iter() {
                    let added = insert.execute(params![
                        row.trace_id,
                        row.span_id,
                        row.resource,
                        row.scope,
                        row.span,
                        now
                    ])?;
                    if added == 1 {
                        progress.execute(params![row.trace_id, row.is_root, now])?;
                        written.new += 1;
                    } else {
                        written.duplicates += 1;
                    }
                }
                out.push(written);
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// Traces with spans no diagnosis has read, whose root has arrived and that have been
    /// quiet for `quiet_ms`, or that have been quiet for `max_wait_ms` without a root (a trace
    /// whose root is never exported is still diagnosed), oldest first.
    pub fn ready(&self, now: i64, quiet_ms: i64, max_wait_ms: i64) -> rusqlite::Result<Vec<Ready>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT trace_id, spans, last_ms FROM inbox_traces WHERE spans > diagnosed_spans \
             AND ((has_root = 1 AND last_ms <= ?1) OR last_ms <= ?2) ORDER BY last_ms",
        )?;
        let rows = stmt.query_map(params![now - quiet_ms, now - max_wait_ms], |r| {
            Ok(Ready {
                trace_id: r.get(0)?,
                spans: r.get(1)?,
                last_ms: r.get(2)?,
            })
        })?;
        rows.collect()
    }

    /// A trace's received spans as one OTLP/JSON document, and how many there are.
    pub fn assemble(&self, trace_id: &str) -> rusqlite::Result<(String, i64)> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT resource, scope, span FROM inbox_spans WHERE trace_id = ?1 ORDER BY seq",
        )?;
        let rows: Vec<(String, String, String)> = stmt
            .query_map([trace_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let text = crate::intake::assemble(
            rows.iter()
                .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())),
        );
        Ok((text, rows.len() as i64))
    }

    /// Stores a trace's verdict and marks the spans it read as diagnosed, in one transaction.
    pub fn record(
        &mut self,
        verdict: &VerdictRow,
        transcript: Option<&str>,
    ) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO verdicts (trace_id, spans, detector, label, verdict, explanation, transcript, framework, \
             last_span_ms, diagnosed_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
             ON CONFLICT (trace_id) DO UPDATE SET spans = ?2, detector = ?3, label = ?4, verdict = ?5, \
             explanation = ?6, transcript = ?7, framework = ?8, last_span_ms = ?9, diagnosed_ms = ?10, \
             diagnoses = diagnoses + 1",
            params![
                verdict.trace_id,
                verdict.spans,
                verdict.detector,
                verdict.label,
                verdict.verdict.as_ref().map(|v| v.to_string()),
                verdict.explanation,
                transcript,
                verdict.framework,
                verdict.last_span_ms,
                verdict.diagnosed_ms,
            ],
        )?;
        tx.execute(
            "UPDATE inbox_traces SET diagnosed_spans = max(diagnosed_spans, ?2) WHERE trace_id = ?1",
            params![verdict.trace_id, verdict.spans],
        )?;
        tx.commit()
    }

    /// The most recent verdicts, newest first.
    pub fn recent(&self, limit: usize) -> rusqlite::Result<Vec<VerdictRow>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {VERDICT_COLUMNS} FROM verdicts ORDER BY diagnosed_ms DESC, trace_id LIMIT ?1"
        ))?;
        let rows = stmt.query_map([limit as i64], verdict_row)?;
        rows.collect()
    }

    /// One trace's verdict and the transcript of its investigation (JSON).
    pub fn verdict(
        &self,
        trace_id: &str,
    ) -> rusqlite::Result<Option<(VerdictRow, Option<String>)>> {
        self.conn
            .query_row(
                &format!("SELECT {VERDICT_COLUMNS}, transcript FROM verdicts WHERE trace_id = ?1"),
                [trace_id],
                |r| Ok((verdict_row(r)?, r.get(11)?)),
            )
            .optional()
    }

    /// Counts for the page's heading: spans and traces received, traces diagnosed, traces
    /// waiting for a diagnosis.
    pub fn counts(&self) -> rusqlite::Result<Counts> {
        self.conn.query_row(
            "SELECT (SELECT COALESCE(SUM(spans), 0) FROM inbox_traces), (SELECT COUNT(*) FROM inbox_traces), \
             (SELECT COUNT(*) FROM verdicts), (SELECT COUNT(*) FROM inbox_traces WHERE spans > diagnosed_spans)",
            [],
            |r| {
                Ok(Counts {
                    spans: r.get(0)?,
                    traces: r.get(1)?,
                    diagnosed: r.get(2)?,
                    open: r.get(3)?,
                })
            },
        )
    }
}

/// The inbox's totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub spans: i64,
    pub traces: i64,
    pub diagnosed: i64,
    /// Traces with spans no diagnosis has read yet.
    pub open: i64,
}

const VERDICT_COLUMNS: &str = "trace_id, spans, detector, label, verdict, explanation, framework, \
    last_span_ms, diagnosed_ms, diagnoses, NULL";

fn verdict_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<VerdictRow> {
    let verdict: Option<String> = r.get(4)?;
    Ok(VerdictRow {
        trace_id: r.get(0)?,
        spans: r.get(1)?,
        detector: r.get(2)?,
        label: r.get(3)?,
        verdict: verdict.and_then(|v| serde_json::from_str(&v).ok()),
        explanation: r.get(5)?,
        framework: r.get(6)?,
        last_span_ms: r.get(7)?,
        diagnosed_ms: r.get(8)?,
        diagnoses: r.get(9)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(trace: &str, span: &str, root: bool) -> SpanRow {
        SpanRow {
            trace_id: trace.into(),
            span_id: span.into(),
            is_root: root,
            resource: "{}".into(),
            scope: "{}".into(),
            span: format!("{{\"spanId\":\"{span}\"}}"),
        }
    }

    #[test]
    fn a_trace_is_ready_once_its_root_came_and_it_went_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let mut inbox = Inbox::open(&dir.path().join("inbox.sqlite")).unwrap();
        let child = [row("t1", "a", false)];
        let written = inbox.write(&[&child], 1000).unwrap();
        assert_eq!(written[0].new, 1);
        // No root yet: only the long wait makes it ready.
        assert!(inbox.ready(5000, 1000, 60_000).unwrap().is_empty());
        assert_eq!(inbox.ready(62_000, 1000, 60_000).unwrap().len(), 1);
        let root = [row("t1", "r", true), row("t1", "a", false)];
        let written = inbox.write(&[&root], 2000).unwrap();
        assert_eq!(
            written[0],
            Written {
                new: 1,
                duplicates: 1
            }
        );
        assert!(
            inbox.ready(2500, 1000, 60_000).unwrap().is_empty(),
            "not quiet yet"
        );
        let ready = inbox.ready(3000, 1000, 60_000).unwrap();
        assert_eq!(
            ready,
            vec![Ready {
                trace_id: "t1".into(),
                spans: 2,
                last_ms: 2000
            }]
        );
        let verdict = VerdictRow {
            trace_id: "t1".into(),
            spans: 2,
            detector: "expert".into(),
            label: "none".into(),
            verdict: None,
            explanation: String::new(),
            framework: None,
            last_span_ms: 2000,
            diagnosed_ms: 3000,
            diagnoses: 1,
        };
        inbox.record(&verdict, None).unwrap();
        assert!(inbox.ready(9000, 1000, 60_000).unwrap().is_empty());
        // A late span re-opens the trace.
        inbox.write(&[&[row("t1", "late", false)]], 9000).unwrap();
        assert_eq!(inbox.ready(10_000, 1000, 60_000).unwrap()[0].spans, 3);
        inbox
            .record(
                &VerdictRow {
                    spans: 3,
                    ..verdict
                },
                None,
            )
            .unwrap();
        assert_eq!(inbox.recent(10).unwrap()[0].diagnoses, 2);
        let (text, n) = inbox.assemble("t1").unwrap();
        assert_eq!(n, 3);
        assert!(text.contains("\"late\""));
    }
}
