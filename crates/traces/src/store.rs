//! The SQLite trace store (schema in SCHEMA.md). One transaction per imported input: either
//! every trace, span and label of a file is committed, or none is.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::assemble::{assemble, AssembledTrace, PlacedSpan, ToolRollup, TraceRow};
use crate::conventions::canonical_attributes;
use crate::error::{Error, Result};
use crate::import::{read_file, Batch, Format, ImportOptions, ImportReport, Located};
use crate::label::{Label, Truth};
use crate::span::{Span, SpanKind, StatusCode};

/// Bumped whenever a table or column changes meaning; stores of another version are refused.
pub const SCHEMA_VERSION: &str = "1";

/// The tables, columns and indexes; SCHEMA.md documents each.
pub const SCHEMA_SQL: &str = r#"
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS traces (
    trace_id       TEXT PRIMARY KEY,
    source_format  TEXT NOT NULL,
    source         TEXT NOT NULL,
    framework      TEXT,
    task           TEXT,
    status         TEXT NOT NULL,
    outcome        TEXT,
    has_error      INTEGER NOT NULL,
    error_count    INTEGER NOT NULL,
    span_count     INTEGER NOT NULL,
    input_tokens   INTEGER NOT NULL,
    output_tokens  INTEGER NOT NULL,
    total_tokens   INTEGER NOT NULL,
    started_ns     INTEGER,
    ended_ns       INTEGER,
    latency_ns     INTEGER,
    max_step       INTEGER,
    root_span_id   TEXT,
    attributes     TEXT NOT NULL DEFAULT '{}',
    imported_at_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_by_latency ON traces (latency_ns);
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (started_ns);

CREATE TABLE IF NOT EXISTS spans (
    trace_id       TEXT NOT NULL REFERENCES traces (trace_id),
    span_id        TEXT NOT NULL,
    parent_span_id TEXT,
    name           TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('agent', 'llm', 'tool', 'chain', 'retriever', 'other')),
    start_time_ns  INTEGER,
    end_time_ns    INTEGER,
    duration_ns    INTEGER,
    status_code    TEXT NOT NULL CHECK (status_code IN ('OK', 'ERROR', 'UNSET')),
    status_message TEXT,
    is_error       INTEGER NOT NULL,
    error_type     TEXT,
    error_message  TEXT,
    input          TEXT,
    output         TEXT,
    input_tokens   INTEGER,
    output_tokens  INTEGER,
    model          TEXT,
    tool_name      TEXT,
    tool_arguments TEXT,
    code_filepath  TEXT,
    code_function  TEXT,
    code_lineno    INTEGER,
    agent_name     TEXT,
    step           INTEGER,
    seq            INTEGER NOT NULL,
    depth          INTEGER NOT NULL,
    attributes     TEXT NOT NULL DEFAULT '{}',
    events         TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS spans_by_trace ON spans (trace_id, span_id);
CREATE INDEX IF NOT EXISTS spans_by_tool ON spans (tool_name, is_error) WHERE tool_name IS NOT NULL;
CREATE INDEX IF NOT EXISTS spans_errors ON spans (trace_id, step) WHERE is_error = 1;
CREATE INDEX IF NOT EXISTS spans_by_error_type ON spans (error_type) WHERE error_type IS NOT NULL;
-- Indexes over every span that no analyst query needs (they read `traces`/`trace_tools` or seek
-- by trace): each cost an index insert per span. Dropped from older stores too.
DROP INDEX IF EXISTS spans_by_kind;
DROP INDEX IF EXISTS spans_by_start;

CREATE TABLE IF NOT EXISTS trace_tools (
    trace_id          TEXT NOT NULL REFERENCES traces (trace_id),
    tool_name         TEXT NOT NULL,
    calls             INTEGER NOT NULL,
    errors            INTEGER NOT NULL,
    total_duration_ns INTEGER NOT NULL,
    max_consecutive   INTEGER NOT NULL,
    PRIMARY KEY (trace_id, tool_name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS trace_tools_by_tool ON trace_tools (tool_name);

CREATE TABLE IF NOT EXISTS labels (
    label_id      INTEGER PRIMARY KEY,
    trace_id      TEXT NOT NULL REFERENCES traces (trace_id),
    deficiency_id TEXT,
    component     TEXT,
    file          TEXT,
    function      TEXT,
    line_start    INTEGER,
    line_end      INTEGER,
    agent         TEXT,
    step          INTEGER,
    reason        TEXT,
    source        TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS labels_by_trace ON labels (trace_id);
"#;

/// The framework-neutral event view over `spans` (SCHEMA.md, "`events`"): what each span *did*
/// in words that no framework owns. Dropped and made again whenever a store is opened for
/// writing, so a store always carries this version's definition; it stores nothing.
///
/// An exception type keeps only its last dotted part (`openai.BadRequestError` →
/// `BadRequestError`), and its family is read from that name and the message: the module a
/// framework raises from names the framework, not the mistake.
pub const EVENTS_VIEW_SQL: &str = r#"
DROP VIEW IF EXISTS events;
CREATE VIEW events AS
SELECT trace_id, span_id, parent_span_id, seq, step, depth, event,
    agent_name AS agent,
    CASE WHEN event = 'tool_call' THEN tool_name END AS tool,
    CASE WHEN event = 'tool_call' AND tool_arguments IS NOT NULL THEN json_valid(tool_arguments) END AS arguments_valid,
    CASE WHEN event = 'tool_call' THEN tool_arguments END AS arguments,
    CASE WHEN event = 'tool_call' AND is_error = 0 THEN output END AS result,
    CASE WHEN event = 'llm_call' THEN output END AS reply,
    is_error, status_code AS status, short_type AS error_type,
    CASE
        WHEN is_error = 0 AND short_type IS NULL THEN NULL
        WHEN message LIKE '%context length%' OR message LIKE '%context_length%' OR message LIKE '%context window%' OR message LIKE '%maximum context%' THEN 'context_overflow'
        WHEN lower(short_type) LIKE '%ratelimit%' OR message LIKE '%429%' OR message LIKE '%rate limit%' THEN 'rate_limit'
        WHEN lower(short_type) LIKE '%timeout%' OR short_type IN ('CancelledError', 'DeadlineExceeded') THEN 'timeout'
        WHEN short_type = 'RecursionError' THEN 'recursion'
        WHEN lower(short_type) LIKE 'unicode%' THEN 'encoding'
        WHEN lower(short_type) LIKE '%decode%' OR lower(short_type) LIKE '%parse%' OR short_type = 'SyntaxError' THEN 'parse'
        WHEN lower(short_type) LIKE '%validation%' OR lower(short_type) LIKE '%schema%' THEN 'validation'
        WHEN lower(short_type) LIKE '%badrequest%' OR lower(short_type) LIKE '%status%error%' OR lower(short_type) LIKE '%apierror%' OR lower(short_type) LIKE '%httperror%' OR lower(short_type) LIKE '%unprocessable%' THEN 'request'
        WHEN message LIKE '%retries%' OR message LIKE '%retry%' OR lower(short_type) LIKE '%retr%' OR lower(short_type) LIKE '%unexpectedmodel%' THEN 'retries_exhausted'
        WHEN short_type IN ('KeyError', 'IndexError', 'LookupError', 'FileNotFoundError', 'NotFoundError', 'StopIteration') THEN 'lookup'
        WHEN short_type IN ('TypeError', 'AttributeError', 'NameError', 'UnboundLocalError') THEN 'type'
        WHEN short_type IN ('ValueError', 'AssertionError', 'ArithmeticError', 'ZeroDivisionError', 'OverflowError') THEN 'value'
        WHEN short_type IN ('PermissionError', 'OSError', 'IOError', 'ConnectionError') OR lower(short_type) LIKE '%connection%' THEN 'io'
        WHEN short_type IS NULL THEN 'unspecified'
        ELSE 'other'
    END AS error_family,
    error_message, duration_ns, input_tokens, output_tokens,
    CASE WHEN event = 'llm_call' THEN model END AS model
FROM (
    SELECT *,
        CASE
            WHEN kind = 'llm' THEN 'llm_call'
            WHEN kind = 'tool' THEN 'tool_call'
            WHEN kind = 'retriever' THEN 'retrieval'
            WHEN kind = 'agent' THEN 'agent_turn'
            WHEN upper(COALESCE(json_extract(attributes, '$."openinference.span.kind"'), '')) IN ('GUARDRAIL', 'EVALUATOR')
                OR lower(name) LIKE '%guardrail%' OR lower(name) LIKE '%validat%' THEN 'validation'
            WHEN lower(name) LIKE '%retry%' OR lower(name) LIKE '%retries%' OR lower(name) LIKE '%backoff%' THEN 'retry'
            WHEN kind = 'chain' OR json_extract(attributes, '$."gen_ai.operation.name"') = 'invoke_workflow' THEN 'workflow'
            ELSE 'other'
        END AS event,
        CASE WHEN error_type IS NOT NULL
            THEN substr(error_type, length(rtrim(error_type, replace(error_type, '.', ''))) + 1)
        END AS short_type,
        COALESCE(error_message, '') AS message
    FROM spans
);
"#;

/// The columns of `spans` in insert order.
const SPAN_COLUMNS: &str =
    "trace_id, span_id, parent_span_id, name, kind, start_time_ns, end_time_ns, \
    duration_ns, status_code, status_message, is_error, error_type, error_message, input, output, \
    input_tokens, output_tokens, model, tool_name, tool_arguments, code_filepath, code_function, \
    code_lineno, agent_name, step, seq, depth, attributes, events";

/// The two files [`Store::export_trace`] writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportedTrace {
    /// `DIR/<trace id>.json`: the `traces` row and its `trace_tools` rows.
    pub trace_json: PathBuf,
    /// `DIR/<trace id>.spans.jsonl`: the spans in the agents' JSON Lines format, in `seq` order.
    pub spans_jsonl: PathBuf,
}

/// An open trace database.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if needed) a store for reading and writing, in WAL mode.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        let conn = Connection::open(&path)?;
        Self::init(conn, path)
    }

    /// A private in-memory store (tests, scratch analyses).
    pub fn open_in_memory() -> Result<Store> {
        Self::init(Connection::open_in_memory()?, PathBuf::from(":memory:"))
    }

    fn init(conn: Connection, path: PathBuf) -> Result<Store> {
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        // Spans rows are about 1 KB: 16 KiB pages mean a quarter of the WAL frames and page
        // writes per import. Only takes effect on a new (empty) store, so it comes first.
        conn.execute_batch("PRAGMA page_size = 16384;")?;
        if path.as_os_str() != ":memory:" {
            let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                tracing::warn!(path = %path.display(), mode, "store is not in WAL mode");
            }
        }
        conn.execute_batch(
            // Foreign keys are declared for documentation; the importer inserts parents first,
            // and enforcing them costs a lookup per span. A larger autocheckpoint amortises
            // copying the WAL back into the database over several imported files.
            "PRAGMA synchronous = NORMAL; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -65536; \
             PRAGMA foreign_keys = OFF;",
        )?;
        // Checkpoint when the WAL holds about 64 MiB, whatever the store's page size.
        let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = {};",
            (64 << 20) / page_size.max(512)
        ))?;
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {SCHEMA_SQL} {EVENTS_VIEW_SQL} INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '{SCHEMA_VERSION}'); COMMIT;"
        ))?;
        let store = Store { conn, path };
        store.check_version()?;
        Ok(store)
    }

    /// Opens an existing store for reading only (`query_only` is set too, so even a raw
    /// connection handed out by [`Store::connection`] cannot write).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        if !path.is_file() {
            return Err(Error::Io {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no trace store here"),
            });
        }
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_URI,
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        conn.execute_batch("PRAGMA query_only = ON; PRAGMA cache_size = -65536;")?;
        let store = Store { conn, path };
        store.check_version()?;
        Ok(store)
    }

    fn check_version(&self) -> Result<()> {
        let found: Option<String> = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .or_else(|err| match err {
                // A database without our tables is not a trace store.
                rusqlite::Error::SqliteFailure(_, Some(ref m)) if m.contains("no such table") => {
                    Ok(None)
                }
                other => Err(other),
            })?;
        match found {
            Some(v) if v == SCHEMA_VERSION => Ok(()),
            other => Err(Error::SchemaVersion {
                path: self.path.clone(),
                found: other.unwrap_or_else(|| "none (not a trace store)".into()),
                expected: SCHEMA_VERSION.into(),
            }),
        }
    }

    /// The underlying connection, for SQL analyses.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Where the store lives (`:memory:` for in-memory stores).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Imports one file with default limits. See [`Store::import_file_with`].
    pub fn import_file(&mut self, path: impl AsRef<Path>, format: Format) -> Result<ImportReport> {
        self.import_file_with(path, format, &ImportOptions::default())
    }

    /// Imports one file in one transaction: on any error nothing of the file is committed.
    pub fn import_file_with(
        &mut self,
        path: impl AsRef<Path>,
        format: Format,
        options: &ImportOptions,
    ) -> Result<ImportReport> {
        self.import_path(path.as_ref(), format, options, None)
    }

    /// Imports a file that holds one trace under `trace_id` instead of the id its spans carry,
    /// in one transaction: a run's trace kept under an id the caller chose (one that says
    /// nothing about the run it came from). A file with spans of more than one trace is refused.
    pub fn import_file_as(
        &mut self,
        path: impl AsRef<Path>,
        format: Format,
        trace_id: &str,
    ) -> Result<ImportReport> {
        self.import_path(
            path.as_ref(),
            format,
            &ImportOptions::default(),
            Some(trace_id),
        )
    }

    /// Reads one file and imports it, its one trace put under `rekey` when given.
    fn import_path(
        &mut self,
        path: &Path,
        format: Format,
        options: &ImportOptions,
        rekey: Option<&str>,
    ) -> Result<ImportReport> {
        let source = path.display().to_string();
        let (format, mut batch) = read_file(path, format)?;
        if let Some(trace_id) = rekey {
            batch.rekey(trace_id, &source)?;
        }
        self.import_batch(batch, &source, format, options, false)
    }

    /// Imports spans built in memory (e.g. a Detector episode converted to spans) in one
    /// transaction. `source` names the input in errors and in `traces.source`.
    pub fn import_spans<I: IntoIterator<Item = Span>>(
        &mut self,
        spans: I,
        source: &str,
    ) -> Result<ImportReport> {
        let batch = Batch {
            spans: spans
                .into_iter()
                .enumerate()
                .map(|(i, span)| Located::new(span, format!("span #{i}")))
                .collect(),
            ..Batch::default()
        };
        self.import_batch(
            batch,
            source,
            Format::Spans,
            &ImportOptions::default(),
            false,
        )
    }

    /// Validates and commits a batch; with `replace`, traces already stored under its ids give
    /// way to it in the same transaction.
    fn import_batch(
        &mut self,
        batch: Batch,
        source: &str,
        format: Format,
        options: &ImportOptions,
        replace: bool,
    ) -> Result<ImportReport> {
        let mut prepared = prepare(batch, source, format, options)?;
        prepared.replace = replace;
        self.commit(&mut prepared)
    }

    /// Imports text held in memory (an OTLP request body, a document assembled from received
    /// spans) exactly as [`Store::import_file`] imports a file, in one transaction. With
    /// `replace`, traces already in the store under the same ids are replaced by the new ones
    /// in that transaction (their labels are kept): a trace that grew after it was first
    /// stored, as a live receiver sees it. Without it, an existing trace id is refused.
    pub fn import_text(
        &mut self,
        text: &str,
        format: Format,
        source: &str,
        replace: bool,
    ) -> Result<ImportReport> {
        let (format, batch) = crate::import::read_text(source, text, format)?;
        self.import_batch(batch, source, format, &ImportOptions::default(), replace)
    }

    /// Imports several files, each in its own transaction and in the given order (so with
    /// duplicate trace ids the earlier file wins). Reading, parsing and validating run on up
    /// to `workers` threads while this thread commits; the results come back in file order,
    /// and `on_done` is called after each file (for progress).
    pub fn import_files<P: AsRef<Path> + Sync>(
        &mut self,
        paths: &[P],
        format: Format,
        options: &ImportOptions,
        workers: usize,
        mut on_done: impl FnMut(&Path, &Result<ImportReport>),
    ) -> Vec<Result<ImportReport>> {
        use std::collections::BTreeMap;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::{mpsc, Condvar, Mutex};

        let workers = workers.clamp(1, 64).min(paths.len().max(1));
        // Workers stay at most WINDOW files ahead of the commits, bounding memory.
        let window = 2 * workers;
        let next = AtomicUsize::new(0);
        let committed = (Mutex::new(0usize), Condvar::new());
        let (tx, rx) = mpsc::sync_channel::<(usize, Result<Prepared>)>(window);
        // Committed inputs are freed on their own thread: a million small strings take the
        // committing thread, the bottleneck, a noticeable time to free.
        let (spent_tx, spent_rx) = mpsc::sync_channel::<Vec<EncodedTrace>>(window);
        let mut results: Vec<Result<ImportReport>> = Vec::with_capacity(paths.len());
        std::thread::scope(|scope| {
            scope.spawn(move || spent_rx.iter().for_each(drop));
            for _ in 0..workers {
                let tx = tx.clone();
                let (next, committed) = (&next, &committed);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= paths.len() {
                        break;
                    }
                    {
                        let (lock, ready) = committed;
                        let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
                        while i >= *done + window {
                            done = ready.wait(done).unwrap_or_else(|e| e.into_inner());
                        }
                    }
                    let path = paths[i].as_ref();
                    let prepared = read_file(path, format).and_then(|(format, batch)| {
                        prepare(batch, &path.display().to_string(), format, options)
                    });
                    if tx.send((i, prepared)).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            // Owned by this closure, so the freeing thread ends when the commits do.
            let spent_tx = spent_tx;
            let mut pending: BTreeMap<usize, Result<Prepared>> = BTreeMap::new();
            for (i, prepared) in rx.iter() {
                pending.insert(i, prepared);
                while let Some(prepared) = pending.remove(&results.len()) {
                    let result = prepared.and_then(|mut p| {
                        let result = self.commit(&mut p);
                        let _ = spent_tx.send(std::mem::take(&mut p.traces));
                        result
                    });
                    on_done(paths[results.len()].as_ref(), &result);
                    results.push(result);
                    let (lock, ready) = &committed;
                    *lock.lock().unwrap_or_else(|e| e.into_inner()) = results.len();
                    ready.notify_all();
                }
            }
        });
        results
    }

    /// Commits a prepared input in one transaction.
    ///
    /// The `CHECK (kind IN (…))` and `CHECK (status_code IN (…))` constraints of `spans` are
    /// skipped while the importer writes: SQLite evaluates an `IN` list by building a
    /// temporary b-tree for every inserted row, which took over a third of the committing
    /// thread's time, and the importer's values come from `SpanKind`/`StatusCode`, which only
    /// spell allowed values. Any other writer on this connection is checked as before.
    fn commit(&mut self, prepared: &mut Prepared) -> Result<ImportReport> {
        self.conn
            .execute_batch("PRAGMA ignore_check_constraints = ON")?;
        let result = self.write_prepared(prepared);
        let restored = self
            .conn
            .execute_batch("PRAGMA ignore_check_constraints = OFF");
        let report = result?;
        restored?;
        Ok(report)
    }

    fn write_prepared(&mut self, prepared: &mut Prepared) -> Result<ImportReport> {
        let Prepared {
            source,
            format,
            traces,
            labels,
            warnings,
            replace,
        } = prepared;
        let (source, format) = (source.as_str(), *format);
        let imported_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            if *replace {
                for trace in traces.iter() {
                    for table in ["spans", "trace_tools", "traces"] {
                        tx.prepare_cached(&format!("DELETE FROM {table} WHERE trace_id = ?1"))?
                            .execute([&trace.row.trace_id])?;
                    }
                }
            }
            let mut existing =
                tx.prepare_cached("SELECT source FROM traces WHERE trace_id = ?1")?;
            for trace in traces.iter() {
                if let Some(found) = existing
                    .query_row([&trace.row.trace_id], |r| r.get::<_, String>(0))
                    .optional()?
                {
                    return Err(Error::DuplicateTrace {
                        input: source.to_string(),
                        trace_id: trace.row.trace_id.clone(),
                        existing: found,
                    });
                }
            }
            let mut insert_trace = tx.prepare_cached(
                "INSERT INTO traces (trace_id, source_format, source, framework, task, status, outcome, \
                 has_error, error_count, span_count, input_tokens, output_tokens, total_tokens, started_ns, \
                 ended_ns, latency_ns, max_step, root_span_id, attributes, imported_at_ns) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
            )?;
            let mut insert_span = tx.prepare_cached(&format!(
                "INSERT INTO spans ({SPAN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, \
                 ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29)"
            ))?;
            let mut insert_tool = tx.prepare_cached(
                "INSERT INTO trace_tools (trace_id, tool_name, calls, errors, total_duration_ns, max_consecutive) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for EncodedTrace {
                row,
                spans,
                tools,
                attributes,
                span_attributes,
                span_events,
            } in traces.iter()
            {
                insert_trace.execute(params![
                    row.trace_id,
                    row.source_format.as_str(),
                    row.source,
                    row.framework,
                    row.task,
                    row.status.as_str(),
                    row.outcome,
                    row.has_error,
                    row.error_count,
                    row.span_count,
                    row.input_tokens,
                    row.output_tokens,
                    row.total_tokens,
                    row.started_ns,
                    row.ended_ns,
                    row.latency_ns,
                    row.max_step,
                    row.root_span_id,
                    attributes,
                    imported_at,
                ])?;
                for ((placed, attributes), events) in
                    spans.iter().zip(span_attributes).zip(span_events)
                {
                    let s = &placed.span;
                    insert_span.execute(params![
                        s.trace_id,
                        s.span_id,
                        s.parent_span_id,
                        s.name,
                        s.kind.as_str(),
                        s.start_time_ns,
                        s.end_time_ns,
                        s.duration_ns(),
                        s.status.as_str(),
                        s.status_message,
                        s.is_error(),
                        s.error_type,
                        s.error_message,
                        s.input,
                        s.output,
                        s.input_tokens,
                        s.output_tokens,
                        s.model,
                        s.tool_name,
                        s.tool_arguments,
                        s.code_filepath,
                        s.code_function,
                        s.code_lineno,
                        s.agent_name,
                        s.step,
                        placed.seq,
                        placed.depth,
                        attributes,
                        events,
                    ])?;
                }
                for tool in tools {
                    insert_tool.execute(params![
                        row.trace_id,
                        tool.tool_name,
                        tool.calls,
                        tool.errors,
                        tool.total_duration_ns,
                        tool.max_consecutive,
                    ])?;
                }
            }
            for label in labels.iter() {
                insert_label(&tx, label)?;
            }
        }
        tx.commit()?;
        let report = ImportReport {
            source: source.to_string(),
            format,
            trace_ids: traces.iter().map(|t| t.row.trace_id.clone()).collect(),
            spans: traces.iter().map(|t| t.spans.len()).sum(),
            labels: labels.len(),
            warnings: std::mem::take(warnings),
        };
        for warning in &report.warnings {
            tracing::debug!("{warning}");
        }
        Ok(report)
    }

    /// Records a ground-truth label for a trace already in the store. Returns its `label_id`.
    pub fn put_label(&mut self, label: &Label) -> Result<i64> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let id = insert_label(&tx, label)?;
        tx.commit()?;
        Ok(id)
    }

    /// The labels of one trace, oldest first.
    pub fn labels(&self, trace_id: &str) -> Result<Vec<Label>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT trace_id, deficiency_id, component, file, function, line_start, line_end, agent, step, \
             reason, source FROM labels WHERE trace_id = ?1 ORDER BY label_id",
        )?;
        let rows = stmt.query_map([trace_id], |r| {
            Ok((
                Label {
                    trace_id: r.get(0)?,
                    truth: Truth {
                        deficiency_id: r.get(1)?,
                        component: r.get(2)?,
                        file: r.get(3)?,
                        function: r.get(4)?,
                        line_start: r.get(5)?,
                        line_end: r.get(6)?,
                        agent: r.get(7)?,
                        step: r.get(8)?,
                    },
                    reason: r.get(9)?,
                    source: Value::Null,
                },
                r.get::<_, String>(10)?,
            ))
        })?;
        let mut labels = Vec::new();
        for row in rows {
            let (mut label, source) = row?;
            label.source = serde_json::from_str(&source)?;
            labels.push(label);
        }
        Ok(labels)
    }

    /// Every trace id, in import order.
    pub fn trace_ids(&self) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT trace_id FROM traces ORDER BY rowid")?;
        let ids = stmt
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(ids)
    }

    /// The spans of one trace in `seq` order, read back into the model.
    pub fn spans(&self, trace_id: &str) -> Result<Vec<Span>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id = ?1 ORDER BY seq"
        ))?;
        let mut rows = stmt.query([trace_id])?;
        let mut spans = Vec::new();
        while let Some(r) = rows.next()? {
            let kind: String = r.get(4)?;
            let status: String = r.get(8)?;
            let attributes: String = r.get(27)?;
            let events: Option<String> = r.get(28)?;
            spans.push(Span {
                trace_id: r.get(0)?,
                span_id: r.get(1)?,
                parent_span_id: r.get(2)?,
                name: r.get(3)?,
                kind: kind.parse().unwrap_or(SpanKind::Other),
                start_time_ns: r.get(5)?,
                end_time_ns: r.get(6)?,
                status: StatusCode::parse(&status).unwrap_or_default(),
                status_message: r.get(9)?,
                error_type: r.get(11)?,
                error_message: r.get(12)?,
                input: r.get(13)?,
                output: r.get(14)?,
                input_tokens: r.get(15)?,
                output_tokens: r.get(16)?,
                model: r.get(17)?,
                tool_name: r.get(18)?,
                tool_arguments: r.get(19)?,
                code_filepath: r.get(20)?,
                code_function: r.get(21)?,
                code_lineno: r.get(22)?,
                agent_name: r.get(23)?,
                step: r.get(24)?,
                attributes: serde_json::from_str(&attributes)?,
                events: match events {
                    Some(text) => serde_json::from_str(&text)?,
                    None => Vec::new(),
                },
            });
        }
        Ok(spans)
    }

    /// The agent of the first span (in `seq` order) at `step` of a trace that names one: the
    /// agent an answer pointing at that step blames.
    pub fn agent_at_step(&self, trace_id: &str, step: i64) -> Result<Option<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT agent_name FROM spans WHERE trace_id = ?1 AND step = ?2 AND agent_name IS NOT NULL ORDER BY seq LIMIT 1",
        )?;
        let mut rows = stmt.query(rusqlite::params![trace_id, step])?;
        Ok(match rows.next()? {
            Some(r) => Some(r.get(0)?),
            None => None,
        })
    }

    /// The `traces` row of one trace as a JSON object (attributes parsed), with its
    /// `trace_tools` rows under `tools`.
    pub fn trace_json(&self, trace_id: &str) -> Result<Map<String, Value>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT * FROM traces WHERE trace_id = ?1")?;
        let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
        let mut object = stmt
            .query_row([trace_id], |r| {
                let mut obj = Map::new();
                for (i, name) in names.iter().enumerate() {
                    if !crate::schema::is_hidden_column("traces", name) {
                        obj.insert(name.clone(), sql_to_json(r.get_ref(i)?));
                    }
                }
                Ok(obj)
            })
            .optional()?
            .ok_or_else(|| Error::UnknownTrace(trace_id.to_string()))?;
        if let Some(Value::String(attrs)) = object.get("attributes") {
            let parsed: Value = serde_json::from_str(attrs)?;
            object.insert("attributes".into(), parsed);
        }
        for flag in ["has_error"] {
            if let Some(v) = object.get(flag).and_then(Value::as_i64) {
                object.insert(flag.into(), Value::Bool(v != 0));
            }
        }
        let mut tools = self.conn.prepare_cached(
            "SELECT tool_name, calls, errors, total_duration_ns, max_consecutive FROM trace_tools \
             WHERE trace_id = ?1 ORDER BY calls DESC, tool_name",
        )?;
        let tools = tools
            .query_map([trace_id], |r| {
                Ok(serde_json::json!({
                    "tool_name": r.get::<_, String>(0)?,
                    "calls": r.get::<_, i64>(1)?,
                    "errors": r.get::<_, i64>(2)?,
                    "total_duration_ns": r.get::<_, i64>(3)?,
                    "max_consecutive": r.get::<_, i64>(4)?,
                }))
            })?
            .collect::<rusqlite::Result<Vec<Value>>>()?;
        object.insert("tools".into(), Value::Array(tools));
        Ok(object)
    }

    /// Writes `DIR/<id>.json` (the trace) and `DIR/<id>.spans.jsonl` (its spans in the agents'
    /// JSON Lines format, re-importable with `--format jsonl`). Labels are never exported:
    /// these are the files the Detector's shell reads. Each file is written to a temporary
    /// name and renamed, so a reader never sees half a file.
    pub fn export_trace(&self, trace_id: &str, dir: impl AsRef<Path>) -> Result<ExportedTrace> {
        let dir = dir.as_ref();
        let trace = self.trace_json(trace_id)?;
        let spans = self.spans(trace_id)?;
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let stem = file_stem(trace_id);
        let trace_json = dir.join(format!("{stem}.json"));
        let spans_jsonl = dir.join(format!("{stem}.spans.jsonl"));
        let mut text = serde_json::to_string_pretty(&trace)?;
        text.push('\n');
        write_atomically(&trace_json, text.as_bytes())?;
        let mut lines = String::new();
        for span in &spans {
            lines.push_str(&serde_json::to_string(&contract_line(span))?);
            lines.push('\n');
        }
        write_atomically(&spans_jsonl, lines.as_bytes())?;
        Ok(ExportedTrace {
            trace_json,
            spans_jsonl,
        })
    }
}

/// A trace with its JSON columns already encoded, so the committing thread only binds values.
struct EncodedTrace {
    row: TraceRow,
    spans: Vec<PlacedSpan>,
    tools: Vec<ToolRollup>,
    attributes: String,
    span_attributes: Vec<String>,
    span_events: Vec<Option<String>>,
}

/// One input, validated and encoded, ready to commit.
struct Prepared {
    source: String,
    format: Format,
    traces: Vec<EncodedTrace>,
    labels: Vec<Label>,
    warnings: Vec<String>,
    /// Replace traces already stored under the same ids instead of refusing them.
    replace: bool,
}

/// Everything of an import that needs no database: validation, derived columns, JSON
/// encoding. The attribute maps are encoded and freed here, off the committing thread.
fn prepare(
    mut batch: Batch,
    source: &str,
    format: Format,
    options: &ImportOptions,
) -> Result<Prepared> {
    let labels = std::mem::take(&mut batch.labels);
    let (assembled, warnings) = assemble(batch, source, format, options)?;
    let mut traces = Vec::with_capacity(assembled.len());
    for AssembledTrace {
        mut row,
        mut spans,
        tools,
    } in assembled
    {
        let attributes = serde_json::to_string(&std::mem::take(&mut row.attributes))?;
        let mut span_attributes = Vec::with_capacity(spans.len());
        let mut span_events = Vec::with_capacity(spans.len());
        for placed in &mut spans {
            span_attributes.push(match placed.raw_attributes.take() {
                Some(text) => text,
                None => serde_json::to_string(&std::mem::take(&mut placed.span.attributes))?,
            });
            let events = std::mem::take(&mut placed.span.events);
            span_events.push(if events.is_empty() {
                None
            } else {
                Some(serde_json::to_string(&events)?)
            });
        }
        traces.push(EncodedTrace {
            row,
            spans,
            tools,
            attributes,
            span_attributes,
            span_events,
        });
    }
    Ok(Prepared {
        source: source.to_string(),
        format,
        traces,
        labels,
        warnings,
        replace: false,
    })
}

fn insert_label(conn: &Connection, label: &Label) -> Result<i64> {
    let known: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM traces WHERE trace_id = ?1",
            [&label.trace_id],
            |r| r.get(0),
        )
        .optional()?;
    if known.is_none() {
        return Err(Error::UnknownTrace(label.trace_id.clone()));
    }
    let source = match &label.source {
        Value::Null => "{}".to_string(),
        other => serde_json::to_string(other)?,
    };
    conn.prepare_cached(
        "INSERT INTO labels (trace_id, deficiency_id, component, file, function, line_start, line_end, agent, \
         step, reason, source) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?
    .execute(params![
        label.trace_id,
        label.truth.deficiency_id,
        label.truth.component,
        label.truth.file,
        label.truth.function,
        label.truth.line_start,
        label.truth.line_end,
        label.truth.agent,
        label.truth.step,
        label.reason,
        source,
    ])?;
    Ok(conn.last_insert_rowid())
}

/// One span as the agents write it (agents/CONTRACT.md), attributes completed with the model's
/// fields so a re-import restores them.
fn contract_line(span: &Span) -> Value {
    let mut line = serde_json::json!({
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": span.name,
        "kind": span.kind.as_str(),
        "start_time_unix_nano": span.start_time_ns,
        "end_time_unix_nano": span.end_time_ns,
        "status": {"code": span.status.as_str(), "message": span.status_message.clone().unwrap_or_default()},
        "attributes": canonical_attributes(span),
    });
    if !span.events.is_empty() {
        line["events"] = Value::Array(span.events.clone());
    }
    line
}

fn sql_to_json(value: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef;
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Real(f) => serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        ValueRef::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::String(format!("<{} bytes>", b.len())),
    }
}

/// A file name for a trace id: ids are free text, so anything but `[A-Za-z0-9._-]` becomes `_`
/// and a leading dot is replaced, which keeps the files inside the output directory.
fn file_stem(trace_id: &str) -> String {
    let mut stem: String = trace_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.starts_with('.') {
        stem.replace_range(0..1, "_");
    }
    stem
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_stems_stay_inside_the_directory() {
        assert_eq!(file_stem("../../etc/passwd"), "_._.._etc_passwd");
        assert_eq!(file_stem("abc123"), "abc123");
    }

    #[test]
    fn new_stores_get_large_pages_and_only_the_queried_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path).unwrap();
        let conn = store.connection();
        let page_size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        assert_eq!(page_size, 16384);
        let checkpoint: i64 = conn
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(checkpoint, 4096);
        drop(store);
        // An older store's unqueried index is dropped on open.
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE INDEX spans_by_start ON spans (start_time_ns)")
            .unwrap();
        let store = Store::open(&path).unwrap();
        let mut indexes: Vec<String> = store
            .connection()
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'spans'")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        indexes.sort();
        assert_eq!(
            indexes,
            [
                "spans_by_error_type",
                "spans_by_tool",
                "spans_by_trace",
                "spans_errors"
            ]
        );
    }

    #[test]
    fn check_constraints_hold_again_after_an_import() {
        let mut store = Store::open_in_memory().unwrap();
        let mut span = Span::new("t1", "s1", "run", SpanKind::Agent);
        span.status = StatusCode::Ok;
        store.import_spans([span], "mem").unwrap();
        let err = store
            .connection()
            .execute(
                "INSERT INTO spans (trace_id, span_id, name, kind, status_code, is_error, seq, depth) \
                 VALUES ('t1', 's2', 'x', 'robot', 'OK', 0, 1, 0)",
                [],
            )
            .unwrap_err();
        assert!(err.to_string().contains("CHECK constraint failed"), "{err}");
    }

    #[test]
    fn the_agent_at_a_step_is_its_first_named_span() {
        let mut store = Store::open_in_memory().unwrap();
        let spans = [
            ("s1", None, 0),
            ("s2", None, 1),
            ("s3", Some("Analyst"), 1),
            ("s4", Some("Lead"), 1),
        ]
        .map(|(id, agent, step)| {
            let mut s = Span::new("t1", id, "turn", SpanKind::Agent);
            s.agent_name = agent.map(str::to_string);
            s.step = Some(step);
            s
        });
        store.import_spans(spans, "mem").unwrap();
        assert_eq!(
            store.agent_at_step("t1", 1).unwrap().as_deref(),
            Some("Analyst")
        );
        assert_eq!(store.agent_at_step("t1", 0).unwrap(), None);
        assert_eq!(store.agent_at_step("t1", 7).unwrap(), None);
    }

    #[test]
    fn labels_need_a_known_trace() {
        let mut store = Store::open_in_memory().unwrap();
        let err = store.put_label(&Label::new("nope")).unwrap_err();
        assert_eq!(err.to_string(), "trace nope is not in the store");
    }
}
