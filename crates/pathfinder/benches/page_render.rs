//! Time to lay out the trace view of a 10,000-span trace in headless Chromium, against what a
//! user would otherwise open in the same browser: the same trace's spans as exported by
//! `pathfinder traces export` (JSON Lines, shown as plain text). Both are loaded alternately, several times, in one browser on
//! one machine; the figure is the time from the navigation's start to a forced layout of the
//! loaded page (`performance.now()` after `getBoundingClientRect()`), median and worst.
//!
//! Run: `cargo bench -p pathfinder --bench page_render` (optionally `-- LOADS`, default 7).
//! Needs Debian's `chromium` (or `PATHFINDER_CHROMIUM`), as the browser test does.

use std::process::Command;

// Shared with the browser test; the bench takes no screenshots.
#[path = "../tests/support/cdp.rs"]
#[allow(dead_code)]
mod cdp;

use cdp::{file_url as url, RENDERED_MS};

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("running pathfinder");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Median and worst of a set of milliseconds.
fn summary(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    (ms[ms.len() / 2], ms[ms.len() - 1])
}

fn main() {
    let loads: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(7);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("traces.db");
    detect::synthetic::build_store(&db, 1).expect("store");
    let large = "00000000000000aa00000000000000bb";
    traces::Store::open(&db)
        .expect("store")
        .import_spans(
            detect::synthetic::large_trace(large, 10_000, 7),
            "synthetic:large",
        )
        .expect("large trace");

    let bin = env!("CARGO_BIN_EXE_pathfinder");
    let view = dir.path().join("large.html");
    run(Command::new(bin)
        .args(["detect", "--db"])
        .arg(&db)
        .args(["--trace", large, "--policy", "expert", "--html"])
        .arg(&view));
    let export = dir.path().join("export");
    run(Command::new(bin)
        .args(["traces", "export", "--db"])
        .arg(&db)
        .args(["--trace", large, "--out"])
        .arg(&export));
    // The spans as the text a user would scroll through (Chromium shows `.txt` as text; a
    // `.jsonl` file would be downloaded, not shown).
    let json = dir.path().join("large.spans.txt");
    std::fs::copy(export.join(format!("{large}.spans.jsonl")), &json).expect("spans export");

    let mut browser = cdp::Browser::launch(&dir.path().join("profile"));
    let pages = [
        ("trace view (detect --html)", &view),
        ("the trace's spans export, as text", &json),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); pages.len()];
    // One unmeasured load of each first: the browser's own start-up is not the page's.
    for (_, page) in &pages {
        browser.open(&url(page));
    }
    for _ in 0..loads {
        for (i, (_, page)) in pages.iter().enumerate() {
            let loaded = browser.open(&url(page));
            assert_eq!(loaded.foreign_requests(), Vec::<String>::new());
            times[i].push(browser.eval(RENDERED_MS).as_f64().expect("a number"));
        }
    }
    browser.close();

    println!("{loads} loads of each, alternating, one headless Chromium:");
    println!("| page | bytes | laid out, median | worst |");
    println!("|---|---|---|---|");
    let mut medians = Vec::new();
    for ((name, page), ms) in pages.iter().zip(times) {
        let bytes = std::fs::metadata(page).expect("page").len();
        let (median, worst) = summary(ms);
        medians.push(median);
        println!(
            "| {name} | {:.1} MB | {median:.0} ms | {worst:.0} ms |",
            bytes as f64 / 1e6
        );
    }
    println!(
        "ratio, view / spans export (median): {:.2}",
        medians[0] / medians[1]
    );
}
