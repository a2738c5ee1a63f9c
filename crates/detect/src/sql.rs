//! The `sql` tool: one SELECT at a time on a connection to the trace store that cannot change
//! it or reach past it.
//!
//! Layers, each sufficient on its own for writes: the file is opened `SQLITE_OPEN_READ_ONLY`
//! through a `mode=ro` URI; `query_only` is on; every statement must be read-only
//! (`sqlite3_stmt_readonly`); and an authorizer allows only SELECT, reads of the trace tables,
//! recursive CTEs, function calls (not `load_extension`) and a few schema-reading pragmas.
//! `ATTACH` is denied by the authorizer and impossible anyway (`SQLITE_LIMIT_ATTACHED` = 0);
//! the `labels` (ground truth) and `meta` tables cannot be read at all. A progress handler
//! stops a query at the wall-clock limit; results stop at a row limit and are rendered as a
//! compact aligned table.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

/// Tables the Detector may read. Ground truth (`labels`) and bookkeeping (`meta`) are not here.
pub const READABLE_TABLES: &[&str] = &["traces", "spans", "events", "trace_tools"];
/// Schema tables and table-valued functions that are safe to read.
const READABLE_SYSTEM: &[&str] = &[
    "sqlite_master",
    "sqlite_schema",
    "sqlite_temp_master",
    "json_each",
    "json_tree",
];
/// Pragmas that only describe the schema (and only for readable tables).
const SCHEMA_PRAGMAS: &[&str] = &[
    "table_info",
    "table_xinfo",
    "index_list",
    "index_info",
    "index_xinfo",
    "table_list",
    "foreign_key_list",
];
/// Functions that could load code or touch files.
const DENIED_FUNCTIONS: &[&str] = &[
    "load_extension",
    "readfile",
    "writefile",
    "edit",
    "fts3_tokenizer",
    "zipfile",
];

/// Limits of one SQL call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlLimits {
    /// The query is interrupted after this long.
    pub wall: Duration,
    /// Rows rendered; more rows are counted as "more" but not read.
    pub rows: usize,
    /// Longest rendered cell, in characters.
    pub cell_chars: usize,
}

impl Default for SqlLimits {
    fn default() -> Self {
        SqlLimits {
            wall: Duration::from_secs(2),
            rows: 200,
            cell_chars: 1_000,
        }
    }
}

/// Errors opening the guarded connection (refusals of a query are plain observation text).
#[derive(Debug, thiserror::Error)]
pub enum SqlOpenError {
    #[error("{path}: cannot open the trace store read-only: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("{path}: not a trace store of schema version {expected} (found {found})")]
    NotAStore {
        path: PathBuf,
        found: String,
        expected: &'static str,
    },
    #[error("{path}: the store has no `events` view: an older Pathfinder wrote it, and opening it for writing with this version (any `pathfinder traces import ... --db` into it) adds the view")]
    NoEventView { path: PathBuf },
}

/// A guarded read-only connection to one store.
pub struct SqlTool {
    conn: Connection,
    deadline: Arc<Mutex<Option<Instant>>>,
    denial: Arc<Mutex<Option<String>>>,
    limits: SqlLimits,
}

/// Why a query produced no table: refused by a guard, or failed in SQLite.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SqlRefusal {
    #[error("refused: {0}")]
    Refused(String),
    #[error("error: {0}")]
    Failed(String),
    #[error(
        "stopped: the query ran past the {0:?} limit; filter with WHERE, aggregate, or add LIMIT"
    )]
    TimedOut(Duration),
}

impl SqlTool {
    /// Opens `path` read-only and installs every guard.
    pub fn open(path: &Path, limits: SqlLimits) -> Result<SqlTool, SqlOpenError> {
        let open_err = |source| SqlOpenError::Open {
            path: path.to_path_buf(),
            source,
        };
        if !path.is_file() {
            return Err(open_err(rusqlite::Error::InvalidPath(path.to_path_buf())));
        }
        let uri = format!("file:{}?mode=ro", uri_escape(&path.to_string_lossy()));
        let conn = Connection::open_with_flags(
            uri,
            OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(open_err)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(open_err)?;
        conn.execute_batch("PRAGMA query_only = ON;")
            .map_err(open_err)?;
        use rusqlite::config::DbConfig;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)
            .map_err(open_err)?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)
            .map_err(open_err)?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)
            .map_err(open_err)?;
        conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)
            .map_err(open_err)?;
        conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, 50_000_000)
            .map_err(open_err)?;
        conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, 100_000)
            .map_err(open_err)?;
        let found: String = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .unwrap_or_else(|_| "none".to_string());
        if found != traces::SCHEMA_VERSION {
            return Err(SqlOpenError::NotAStore {
                path: path.to_path_buf(),
                found,
                expected: traces::SCHEMA_VERSION,
            });
        }
        // The probes read the framework-neutral event view; a store opened for writing by this
        // version always has it.
        let has_events: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'view' AND name = 'events')",
                [],
                |r| r.get(0),
            )
            .map_err(open_err)?;
        if !has_events {
            return Err(SqlOpenError::NoEventView {
                path: path.to_path_buf(),
            });
        }
        let deadline: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
        let watch = Arc::clone(&deadline);
        conn.progress_handler(
            1_000,
            Some(move || {
                watch
                    .lock()
                    .ok()
                    .and_then(|d| *d)
                    .is_some_and(|d| Instant::now() >= d)
            }),
        );
        let denial: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let note = Arc::clone(&denial);
        conn.authorizer(Some(move |ctx: AuthContext<'_>| match authorize(&ctx) {
            // A hidden column reads as NULL, so `SELECT *` still works.
            Ok(()) if reads_hidden_column(&ctx) => Authorization::Ignore,
            Ok(()) => Authorization::Allow,
            Err(reason) => {
                if let Ok(mut slot) = note.lock() {
                    slot.get_or_insert(reason);
                }
                Authorization::Deny
            }
        }));
        Ok(SqlTool {
            conn,
            deadline,
            denial,
            limits,
        })
    }

    pub fn limits(&self) -> &SqlLimits {
        &self.limits
    }

    /// Runs one statement and renders its rows (at most `output_chars` characters of table).
    pub fn run(&self, query: &str) -> Result<String, SqlRefusal> {
        let query = query.trim();
        if query.is_empty() {
            return Err(SqlRefusal::Refused(
                "empty query; write one SELECT statement".into(),
            ));
        }
        self.set_deadline(Some(Instant::now() + self.limits.wall));
        *self.denial.lock().expect("denial lock") = None;
        let result = self.run_inner(query);
        self.set_deadline(None);
        result
    }

    fn set_deadline(&self, value: Option<Instant>) {
        *self.deadline.lock().expect("deadline lock") = value;
    }

    fn explain(&self, err: rusqlite::Error) -> SqlRefusal {
        if let Some(reason) = self.denial.lock().ok().and_then(|mut d| d.take()) {
            return SqlRefusal::Refused(reason);
        }
        match err {
            rusqlite::Error::MultipleStatement => SqlRefusal::Refused(
                "one statement per call; remove everything after the first `;`".into(),
            ),
            rusqlite::Error::SqliteFailure(e, _)
                if e.code == rusqlite::ErrorCode::OperationInterrupted =>
            {
                SqlRefusal::TimedOut(self.limits.wall)
            }
            rusqlite::Error::SqliteFailure(e, msg) if e.code == rusqlite::ErrorCode::ReadOnly => {
                SqlRefusal::Refused(format!(
                    "the trace store is read-only ({})",
                    msg.unwrap_or_else(|| e.to_string())
                ))
            }
            rusqlite::Error::SqliteFailure(e, Some(msg)) => {
                SqlRefusal::Failed(format!("{msg} ({:?})", e.code))
            }
            other => SqlRefusal::Failed(other.to_string()),
        }
    }

    fn run_inner(&self, query: &str) -> Result<String, SqlRefusal> {
        let mut stmt = self.conn.prepare(query).map_err(|e| self.explain(e))?;
        if !stmt.readonly() {
            return Err(SqlRefusal::Refused(
                "only read-only SELECT statements are allowed".into(),
            ));
        }
        let names: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
        if names.is_empty() {
            return Err(SqlRefusal::Refused(
                "the statement returns no columns; write a SELECT".into(),
            ));
        }
        let mut rows = stmt.query([]).map_err(|e| self.explain(e))?;
        let mut table: Vec<Vec<String>> = Vec::new();
        let mut more = false;
        loop {
            match rows.next() {
                Ok(Some(row)) => {
                    if table.len() == self.limits.rows {
                        more = true;
                        break;
                    }
                    let mut cells = Vec::with_capacity(names.len());
                    for i in 0..names.len() {
                        let value = row.get_ref(i).map_err(|e| self.explain(e))?;
                        cells.push(render_cell(value, self.limits.cell_chars));
                    }
                    table.push(cells);
                }
                Ok(None) => break,
                Err(e) => return Err(self.explain(e)),
            }
        }
        Ok(render_table(&names, &table, more, self.limits.rows))
    }
}

/// Whether the action reads a column the Detector must not see (`traces.source`).
fn reads_hidden_column(ctx: &AuthContext<'_>) -> bool {
    matches!(ctx.action, AuthAction::Read { table_name, column_name }
        if traces::schema::is_hidden_column(table_name, column_name))
}

/// The authorizer's decision, with a reason a policy can act on.
fn authorize(ctx: &AuthContext<'_>) -> Result<(), String> {
    let hidden = |t: &str| {
        traces::schema::HIDDEN_TABLES
            .iter()
            .any(|h| h.eq_ignore_ascii_case(t))
    };
    match ctx.action {
        AuthAction::Select | AuthAction::Recursive => Ok(()),
        AuthAction::Read { table_name, .. } => {
            // Common table expressions are read under their own name, with no database.
            let in_database = ctx.database_name.is_some_and(|d| !d.is_empty());
            if hidden(table_name) {
                Err(format!("the `{table_name}` table is not readable by the Detector"))
            } else if !in_database
                || READABLE_TABLES.iter().chain(READABLE_SYSTEM).any(|t| t.eq_ignore_ascii_case(table_name))
                || table_name
                    .strip_prefix("pragma_")
                    .is_some_and(|p| SCHEMA_PRAGMAS.iter().any(|s| s.eq_ignore_ascii_case(p)))
            {
                Ok(())
            } else {
                Err(format!("reading `{table_name}` is not allowed; readable tables: {}", READABLE_TABLES.join(", ")))
            }
        }
        AuthAction::Function { function_name } => {
            if DENIED_FUNCTIONS.iter().any(|f| f.eq_ignore_ascii_case(function_name)) {
                Err(format!("the function `{function_name}` is not allowed"))
            } else {
                Ok(())
            }
        }
        AuthAction::Pragma { pragma_name, pragma_value } => {
            let name = pragma_name.to_ascii_lowercase();
            if !SCHEMA_PRAGMAS.contains(&name.as_str()) {
                return Err(format!(
                    "PRAGMA {pragma_name} is not allowed; allowed: {} (schema only)",
                    SCHEMA_PRAGMAS.join(", ")
                ));
            }
            match pragma_value {
                Some(v) if hidden(v.trim_matches(|c| c == '\'' || c == '"')) => {
                    Err(format!("the `{v}` table is not readable by the Detector"))
                }
                _ => Ok(()),
            }
        }
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => {
            Err("ATTACH and DETACH are not allowed: the Detector reads only the trace store".into())
        }
        AuthAction::Insert { .. } | AuthAction::Update { .. } | AuthAction::Delete { .. } => {
            Err("writes are not allowed: the trace store is read-only".into())
        }
        AuthAction::Transaction { .. } | AuthAction::Savepoint { .. } => {
            Err("transactions are not needed: each query is read on its own".into())
        }
        _ => Err("only SELECT statements are allowed (no schema changes, ANALYZE, REINDEX or virtual tables)".into()),
    }
}

fn render_cell(value: ValueRef<'_>, max_chars: usize) -> String {
    let text = match value {
        ValueRef::Null => return "NULL".to_string(),
        ValueRef::Integer(i) => return i.to_string(),
        ValueRef::Real(f) => return format!("{f}"),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Blob(b) => return format!("<blob {} bytes>", b.len()),
    };
    let mut out = String::with_capacity(text.len().min(max_chars + 16));
    let total = text.chars().count();
    for (count, c) in text.chars().enumerate() {
        if count == max_chars {
            let _ = write!(out, "…(+{} chars)", total - count);
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Columns padded to their widest cell (at most 40 characters; longer cells overflow), two
/// spaces apart, then a row count line.
fn render_table(names: &[String], rows: &[Vec<String>], more: bool, limit: usize) -> String {
    const MAX_PAD: usize = 40;
    let mut widths: Vec<usize> = names
        .iter()
        .map(|n| n.chars().count().min(MAX_PAD))
        .collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count().min(MAX_PAD));
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &String>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(cell);
            if i + 1 < names.len() {
                let len = cell.chars().count();
                l.extend(std::iter::repeat_n(' ', w.saturating_sub(len)));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut names.iter());
    for row in rows {
        line(&mut row.iter());
    }
    if more {
        let _ = writeln!(
            out,
            "({limit} rows shown; more rows exist: aggregate, filter or add LIMIT/OFFSET)"
        );
    } else {
        let _ = writeln!(
            out,
            "({} row{})",
            rows.len(),
            if rows.len() == 1 { "" } else { "s" }
        );
    }
    out
}

/// Escapes the characters a SQLite URI path treats specially.
fn uri_escape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        match b {
            b'?' | b'#' | b'%' | b' ' => {
                let _ = write!(out, "%{b:02X}");
            }
            _ => out.push(b as char),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_aligned_and_counted() {
        let out = render_table(
            &["kind".into(), "n".into()],
            &[
                vec!["llm".into(), "12".into()],
                vec!["tool".into(), "3".into()],
            ],
            false,
            200,
        );
        assert_eq!(out, "kind  n\nllm   12\ntool  3\n(2 rows)\n");
    }

    #[test]
    fn cells_escape_and_clip() {
        assert_eq!(render_cell(ValueRef::Text(b"a\nb"), 10), "a\\nb");
        assert_eq!(render_cell(ValueRef::Text(b"abcdef"), 3), "abc…(+3 chars)");
        assert_eq!(render_cell(ValueRef::Null, 3), "NULL");
    }

    #[test]
    fn uri_paths_are_escaped() {
        assert_eq!(uri_escape("/tmp/a b?c#d%"), "/tmp/a%20b%3Fc%23d%25");
    }
}
