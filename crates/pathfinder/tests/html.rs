//! `detect --html` and `eval --out` write self-contained HTML pages (issue 28), end to end on a
//! store of synthetic traces.

use std::process::Command;

fn pathfinder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
}

fn check(out: std::process::Output) {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn detect_and_eval_write_pages() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();
    let (trace, _) = labels
        .iter()
        .find(|(_, l)| l.truth.deficiency_id.as_deref() == Some("P16"))
        .unwrap();

    let page = dir.path().join("one.html");
    check(
        pathfinder()
            .args(["detect", "--db"])
            .arg(&db)
            .args(["--trace", trace, "--policy", "expert", "--html"])
            .arg(&page)
            .output()
            .unwrap(),
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<h2>Span tree</h2>") && html.contains("blamed by expert"));
    assert!(html.contains("<code>P16</code>") && !html.contains("Ground truth"));
    assert!(!html.contains("http://") && !html.contains("https://"));

    let out = dir.path().join("report");
    check(
        pathfinder()
            .args(["eval", "--db"])
            .arg(&db)
            .args(["--detector", "keyword,expert", "--resamples", "20", "--out"])
            .arg(&out)
            .output()
            .unwrap(),
    );
    let index = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert_eq!(
        index.matches("<tr><td><a href=\"traces/").count(),
        2 * labels.len()
    );
    let page = std::fs::read_to_string(out.join("traces").join(format!("{trace}.html"))).unwrap();
    assert!(page.contains("Ground truth"));
    assert!(page.contains("<h3>keyword</h3>") && page.contains("<h3>expert</h3>"));
    assert!(page.contains("✓ right"));
}
