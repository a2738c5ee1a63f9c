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
            // Every row, in words that name no path, module or id (`probes::scrub`).
            assert_eq!(
                kept,
                rows.iter()
                    .map(|r| probes::scrub(r.trim()))
                    .collect::<Vec<_>>(),
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
    // Every probe but the ones tied to absent structure says something on some trace (no
    // scenario hangs for 10 s: `timing_names_slow_spans_by_decade_and_ignores_clock_noise`
    // has one that does).
    for (p, n) in LIBRARY.iter().zip(&non_empty) {
        if !matches!(p.name, "arguments" | "handoffs" | "timing") {
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
            .find(|(_, l)| l.truth.deficiency_id.as_deref() == Some(id))
            .unwrap();
        let digest = probes::digest(&sql.run(&flags.query(trace)).unwrap());
        assert!(digest.contains(signal), "{id}: {digest}");
    }
}

#[test]
fn replies_counted_far_below_their_text_are_flagged() {
    // One synthetic run as recorded, and the same run with every long reply's usage read from
    // a partial buffer (P1's signature: a handful of tokens for a long answer).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traces.db");
    let mut store = traces::Store::open(&path).unwrap();
    let (spans, _) = detect::synthetic::scenario("C12", &format!("{:032x}", 1), 3).unwrap();
    let mut undercounted = detect::synthetic::scenario("C12", &format!("{:032x}", 2), 3)
        .unwrap()
        .0;
    let mut changed = 0;
    for s in &mut undercounted {
        if s.output.as_deref().is_some_and(|o| o.len() >= 40) && s.output_tokens.is_some() {
            s.output_tokens = Some(1);
            changed += 1;
        }
    }
    assert!(changed > 0);
    store.import_spans(spans, "synthetic:C12").unwrap();
    store.import_spans(undercounted, "synthetic:P1").unwrap();
    drop(store);
    let sql = SqlTool::open(&path, SqlLimits::default()).unwrap();
    let flags = probes::by_name("flags").unwrap();
    let digest = |t: u128| probes::digest(&sql.run(&flags.query(&format!("{t:032x}"))).unwrap());
    assert!(!digest(1).contains("token_undercount"), "{}", digest(1));
    assert!(
        digest(2).contains(&format!("flag token_undercount {changed}")),
        "{}",
        digest(2)
    );
    // No scenario as recorded counts its replies that far below their text.
    let (_dir, sql, labels) = scenarios();
    for (trace, _) in &labels {
        let d = probes::digest(&sql.run(&flags.query(trace)).unwrap());
        assert!(!d.contains("token_undercount"), "{trace}: {d}");
    }
}

#[test]
fn timing_names_slow_spans_by_decade_and_ignores_clock_noise() {
    // Two recordings of one run that differ only in how long their other spans took (a loaded
    // machine against an idle one: up to 2.5 s), and one span that waited 25 s in both.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("traces.db");
    let mut store = traces::Store::open(&path).unwrap();
    let recording = |n: u128, fast_ms: i64| {
        let (mut spans, _) = detect::synthetic::scenario("C12", &format!("{n:032x}"), 3).unwrap();
        let mut clock = spans[0].start_time_ns.unwrap();
        for (i, s) in spans.iter_mut().enumerate() {
            let ms = if i == 2 {
                25_000
            } else {
                fast_ms + i as i64 % 3
            };
            s.start_time_ns = Some(clock);
            s.end_time_ns = Some(clock + ms * 1_000_000);
            clock += (ms + 1) * 1_000_000;
        }
        // The slow span's event kind: the probe names kinds of event, never a span's name.
        let event = match spans[2].kind {
            traces::SpanKind::Llm => "llm_call",
            traces::SpanKind::Tool => "tool_call",
            traces::SpanKind::Agent => "agent_turn",
            traces::SpanKind::Retriever => "retrieval",
            _ => "workflow",
        };
        (spans, event)
    };
    let (idle, slow) = recording(1, 2);
    let (loaded, _) = recording(2, 2_500);
    store.import_spans(idle, "synthetic:C12").unwrap();
    store.import_spans(loaded, "synthetic:C12").unwrap();
    drop(store);
    let sql = SqlTool::open(&path, SqlLimits::default()).unwrap();
    let timing = probes::by_name("timing").unwrap();
    let digest = |t: u128| probes::digest(&sql.run(&timing.query(&format!("{t:032x}"))).unwrap());
    assert_eq!(digest(1), digest(2));
    assert!(
        digest(1).starts_with("slow ") && digest(1).ends_with(&format!("{slow} 10s+")),
        "{}",
        digest(1)
    );
    assert_eq!(digest(1).lines().count(), 1, "{}", digest(1));
}
