//! The probe library on real stores: every probe runs through the Detector's guarded SQL tool,
//! its digest keeps every row it returned, and the signatures a scenario plants show up.

use detect::probes::{self, LIBRARY};
use detect::sql::{SqlLimits, SqlTool};

/// A store of the synthetic scenarios, once each, and the Detector's SQL tool on it.
fn scenarios() -> (tempfile::TempDir, SqlTool, Vec<(String, traces::Label)>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&path, 1).unwrap();
    let sql = SqlTool::open(&path, SqlLimits::default()).unwrap();
    (dir, sql, labels)
}

#[test]
fn every_probe_runs_and_its_digest_keeps_every_signal_row() {
    let (_dir, sql, labels) = scenarios();
    let mut non_empty = vec![0usize; LIBRARY.len()];
    for (trace, _) in &labels {
        for (i, probe) in LIBRARY.iter().enumerate() {
            let obs = sql
                .run(&probe.query(trace))
                .unwrap_or_else(|e| panic!("probe {} on {trace}: {e:?}", probe.name));
            let rows: Vec<&str> = obs
                .lines()
                .skip(1)
                .filter(|l| !(l.starts_with('(') && l.ends_with(')')))
                .collect();
            let digest = probes::digest(&obs);
            if rows.is_empty() {
                assert_eq!(digest, "none", "probe {}", probe.name);
                continue;
            }
            non_empty[i] += 1;
            let kept: Vec<&str> = digest.lines().collect();
            assert_eq!(
                kept,
                rows.iter().map(|r| r.trim()).collect::<Vec<_>>(),
                "probe {}",
                probe.name
            );
            // Zero counts are left out in SQL: a signal line never ends in a bare zero count.
            for r in &rows {
                let summary = matches!(probe.name, "shape" | "handoffs" | "llm");
                assert!(!r.trim().ends_with(" 0") || summary, "{}: {r}", probe.name);
            }
        }
    }
    // Every probe but the ones tied to absent structure says something on some trace.
    for (p, n) in LIBRARY.iter().zip(&non_empty) {
        if !matches!(p.name, "arguments" | "handoffs") {
            assert!(*n > 0, "probe {} was empty on every trace", p.name);
        }
    }
}

#[test]
fn planted_signatures_reach_the_digests() {
    let (_dir, sql, labels) = scenarios();
    let flags = probes::by_name("flags").unwrap();
    let want = [
        ("P11", "flag temperature"),
        ("P16", "flag recursion"),
        ("C11", "flag refusal"),
    ];
    for (id, signal) in want {
        let (trace, _) = labels
            .iter()
            .find(|(_, l)| l.deficiency_id.as_deref() == Some(id))
            .unwrap();
        let digest = probes::digest(&sql.run(&flags.query(trace)).unwrap());
        assert!(digest.contains(signal), "{id}: {digest}");
    }
}
