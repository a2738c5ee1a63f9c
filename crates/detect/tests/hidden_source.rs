//! The path a trace was imported from can name its ground truth (a generated corpus keeps each
//! episode in a directory named after the planted deficiency). Neither the SQL tool, nor schema
//! discovery, nor the exported files may show it.

use std::path::Path;

use detect::sql::{SqlLimits, SqlTool};
use traces::{Format, Store};

const SECRET: &str = "toolcaller.P16.ref-cycle-secret";

#[test]
fn the_import_path_never_reaches_the_detector() {
    let tmp = tempfile::tempdir().unwrap();
    let episode = tmp.path().join(SECRET);
    std::fs::create_dir(&episode).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces/tests/fixtures/good_agent_trace.jsonl");
    let trace = episode.join("trace.jsonl");
    std::fs::copy(&fixture, &trace).unwrap();
    let db = tmp.path().join("store.sqlite");
    let mut store = Store::open(&db).unwrap();
    store.import_file(&trace, Format::Jsonl).unwrap();
    let id = store.trace_ids().unwrap().remove(0);
    // The path is stored: it is the user's record of where the trace came from.
    let stored: String = store
        .connection()
        .query_row("SELECT source FROM traces", [], |r| r.get(0))
        .unwrap();
    assert!(stored.contains(SECRET));

    let sql = SqlTool::open(&db, SqlLimits::default()).unwrap();
    for query in [
        "SELECT source FROM traces",
        "SELECT * FROM traces",
        "SELECT group_concat(source) FROM traces WHERE source LIKE '%P16%'",
    ] {
        let out = sql.run(query).unwrap();
        assert!(
            !out.contains(SECRET) && !out.contains("P16"),
            "{query}:\n{out}"
        );
    }
    let none = sql
        .run("SELECT COUNT(*) FROM traces WHERE source IS NULL")
        .unwrap();
    assert!(none.contains('1'), "the column reads as NULL:\n{none}");

    let discovery = traces::schema::discover(store.connection(), 20_000).unwrap();
    assert!(!discovery.contains(SECRET), "{discovery}");
    assert!(!discovery.contains("source TEXT"), "{discovery}");

    let exported = store.trace_json(&id).unwrap();
    assert!(!exported.contains_key("source"));
    assert!(!serde_json::to_string(&exported).unwrap().contains(SECRET));
}
