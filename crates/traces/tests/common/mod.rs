//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rusqlite::Connection;
use traces::Store;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The six chat logs in Who&When's format that the repository carries
/// (tests/fixtures/who-and-when, written for this project; see its README.md).
pub fn who_and_when_fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/who-and-when");
    let mut files = Vec::new();
    for set in ["algorithm-generated", "hand-crafted"] {
        let mut set_files: Vec<PathBuf> = std::fs::read_dir(dir.join(set))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(set).display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        set_files.sort();
        files.extend(set_files);
    }
    assert_eq!(
        files.len(),
        6,
        "expected six chat logs in {}",
        dir.display()
    );
    files
}

/// Every row of every table, rendered, so a test can assert the store did not change.
pub fn snapshot(store: &Store) -> Vec<String> {
    let conn: &Connection = store.connection();
    let mut out = Vec::new();
    for table in ["traces", "spans", "trace_tools", "labels"] {
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY rowid"))
            .unwrap_or_else(|_| {
                conn.prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2"))
                    .unwrap()
            });
        let n = stmt.column_count();
        let rows = stmt
            .query_map([], |r| {
                let cells: Vec<String> = (0..n)
                    .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                    .collect();
                Ok(format!("{table}: {}", cells.join("|")))
            })
            .unwrap();
        out.extend(rows.map(Result::unwrap));
    }
    out
}

/// Rows of a query as strings, for comparing with known answers.
pub fn rows(conn: &Connection, sql: &str) -> Vec<Vec<String>> {
    let mut stmt = conn.prepare(sql).unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| {
        Ok((0..n)
            .map(|i| match r.get_ref(i).unwrap() {
                rusqlite::types::ValueRef::Null => "NULL".to_string(),
                rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                rusqlite::types::ValueRef::Real(v) => v.to_string(),
                rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                rusqlite::types::ValueRef::Blob(b) => format!("<{} bytes>", b.len()),
            })
            .collect())
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}
