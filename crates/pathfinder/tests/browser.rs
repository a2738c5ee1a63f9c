//! The HTML views (issue 28) in a real browser: pages written by `detect --html` and
//! `eval --out` are opened in headless Chromium, driven over the DevTools protocol, and checked
//! for the span tree, the investigation, the highlighted span, the fold of a 10,000-span trace,
//! and for making no network request. Screenshots are kept under `target/tmp/browser/` as the
//! test's artifacts. How fast the large page lays out is a benchmark's question, not this
//! test's (`cargo bench -p pathfinder --bench page_render`): a wall-clock bound here fails on
//! a loaded machine and proves nothing about the page.
//!
//! Needs Debian's `chromium` (installed by `.ci/setup`); `PATHFINDER_CHROMIUM` names another
//! binary. Without one the test fails and says so: a browser test that passes without a
//! browser would prove nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use cdp::{file_url as url, RENDERED_MS};

#[path = "support/cdp.rs"]
mod cdp;

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

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A page's counts, read in the page after it loaded.
const COUNTS: &str = r#"(function(){
  var blamed = document.querySelector('li.blamed');
  return {
    spans: document.querySelectorAll('ul.tree li.span').length,
    shown: Array.prototype.filter.call(document.querySelectorAll('ul.tree li.span'), function(e){return e.checkVisibility();}).length,
    errors: document.querySelectorAll('ul.tree li.err').length,
    turns: document.querySelectorAll('ol.turns > li').length,
    blamed: blamed ? blamed.querySelector('summary .name').textContent : null,
    verdicts: Array.prototype.map.call(document.querySelectorAll('.card.verdict > h3'), function(h){return h.textContent;}),
    truth: document.querySelectorAll('.card.truth').length,
    text: document.body.innerText.length
  };
})()"#;

/// Where the time of a page's load went (milliseconds since navigation began).
const TIMING: &str = "(function(){var n=performance.getEntriesByType('navigation')[0];\
  return {response_end: n.responseEnd, dom_interactive: n.domInteractive,\
  dom_content_loaded: n.domContentLoadedEventEnd, load: n.loadEventEnd, bytes: n.decodedBodySize};})()";

#[test]
fn pages_render_in_headless_chromium_without_network() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("traces.db");
    let labels = detect::synthetic::build_store(&db, 1).unwrap();
    let (trace, _) = labels
        .iter()
        .find(|(_, l)| l.truth.deficiency_id.as_deref() == Some("P16"))
        .unwrap();
    // A 10,000-span trace in the same store.
    let large = "00000000000000aa00000000000000bb";
    {
        let mut store = traces::Store::open(&db).unwrap();
        store
            .import_spans(
                detect::synthetic::large_trace(large, 10_000, 7),
                "synthetic:large",
            )
            .unwrap();
    }

    let detect_html = |trace: &str, page: &Path| {
        check(
            pathfinder()
                .args(["detect", "--db"])
                .arg(&db)
                .args(["--trace", trace, "--policy", "expert", "--html"])
                .arg(page)
                .output()
                .unwrap(),
        )
    };
    let one = dir.path().join("one.html");
    detect_html(trace, &one);
    let big = dir.path().join("large.html");
    detect_html(large, &big);
    let report = dir.path().join("report");
    let split = dir.path().join("split.jsonl");
    let lines: String = labels
        .iter()
        .take(6)
        .map(|(t, _)| format!("{}\n", json!({"trace_id": t})))
        .collect();
    std::fs::write(&split, lines).unwrap();
    check(
        pathfinder()
            .args(["eval", "--db"])
            .arg(&db)
            .arg("--split")
            .arg(&split)
            .args(["--detector", "keyword,expert", "--resamples", "20", "--out"])
            .arg(&report)
            .output()
            .unwrap(),
    );
    // The negative control: a page that does load something from the network.
    let leaky = dir.path().join("leaky.html");
    std::fs::write(
        &leaky,
        "<!DOCTYPE html><html><body><img src=\"http://192.0.2.1/pixel.png\"></body></html>",
    )
    .unwrap();

    let mut browser = cdp::Browser::launch(&dir.path().join("profile"));
    let out = artifacts();
    for (page, name) in [(&one, "trace.html"), (&big, "large.html")] {
        std::fs::copy(page, out.join(name)).unwrap();
    }

    // The control first: the recorder must see a request when there is one.
    let page = browser.open(&url(&leaky));
    assert!(
        page.network
            .iter()
            .any(|u| u.starts_with("http://192.0.2.1/")),
        "the network recorder saw no request on a page that makes one: {:?}",
        page.network
    );

    // One investigated trace: tree, turns, verdict, the blamed span highlighted.
    let page = browser.open(&url(&one));
    assert_eq!(page.foreign_requests(), Vec::<String>::new());
    let c = browser.eval(COUNTS);
    assert!(c["spans"].as_u64().unwrap() >= 3, "{c}");
    assert!(c["errors"].as_u64().unwrap() >= 1, "{c}");
    assert!(c["turns"].as_u64().unwrap() >= 2, "the expert's turns: {c}");
    assert_eq!(c["verdicts"], json!(["expert"]), "{c}");
    assert_eq!(c["truth"], json!(0), "detect has no label to show: {c}");
    assert!(c["blamed"].is_string(), "no span highlighted: {c}");
    // A span's fields are built into a table when their fold first opens.
    let fields = browser.eval(
        "(function(){var d=document.querySelector('li.blamed > details > details.fields');\
         d.open=true; return new Promise(function(r){setTimeout(function(){\
         r(Array.prototype.map.call(d.querySelectorAll('table.kv th'),\
         function(th){return th.textContent;}));},100);});})()",
    );
    assert_eq!(fields[0], json!("span_id"), "{fields}");
    browser.screenshot(&out.join("trace.png"));
    // "Expand all" opens every span.
    let opened = browser.eval(
        "(function(){document.querySelector('button[data-tree=open]').click();\
         return [document.querySelectorAll('details.span').length,\
         document.querySelectorAll('details.span[open]').length];})()",
    );
    assert_eq!(opened[0], opened[1], "{opened}");

    // The evaluation's index and one of its pages: both detectors side by side, right/wrong.
    let page = browser.open(&url(&report.join("index.html")));
    assert_eq!(page.foreign_requests(), Vec::<String>::new());
    let rows = browser.eval("document.querySelectorAll('table.index tbody tr').length");
    assert_eq!(rows, json!(12), "6 traces × 2 detectors");
    // Sorting by a column reorders the rows in place.
    let sorted = browser.eval(
        "(function(){var t=document.querySelector('table.index');\
         var before=t.tBodies[0].rows[0].cells[0].textContent;\
         var th=t.querySelectorAll('th'); th[th.length-1].click(); th[th.length-1].click();\
         return t.tBodies[0].rows.length;})()",
    );
    assert_eq!(sorted, json!(12));
    browser.screenshot(&out.join("index.png"));
    let first = labels[0].0.clone();
    let page = browser.open(&url(&report.join("traces").join(format!("{first}.html"))));
    assert_eq!(page.foreign_requests(), Vec::<String>::new());
    let c = browser.eval(COUNTS);
    assert_eq!(c["verdicts"], json!(["keyword", "expert"]), "{c}");
    assert_eq!(c["truth"], json!(1), "the ground truth beside them: {c}");
    let marks = browser.eval(
        "document.querySelectorAll('.right').length + document.querySelectorAll('.wrong').length",
    );
    assert!(
        marks.as_u64().unwrap() >= 2,
        "each verdict marked right or wrong"
    );

    // 10,000 spans: folded below the first levels (the time it took is printed, not judged).
    let page = browser.open(&url(&big));
    assert_eq!(page.foreign_requests(), Vec::<String>::new());
    let ms = browser.eval(RENDERED_MS).as_f64().unwrap();
    let timing = browser.eval(TIMING);
    let c = browser.eval(COUNTS);
    let spans = c["spans"].as_u64().unwrap();
    assert!(spans >= 9_990, "{c}");
    assert!(
        c["shown"].as_u64().unwrap() * 10 < spans,
        "the tree opens on a few of its spans, the rest folded: {c}"
    );
    browser.screenshot(&out.join("large.png"));
    eprintln!(
        "10,000-span page: {spans} spans, laid out {ms:.0} ms after navigation began ({timing}); \
         screenshots in {}",
        out.display()
    );
    browser.close();
    for name in ["trace.png", "index.png", "large.png"] {
        let png = std::fs::read(out.join(name)).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name} is a PNG");
    }
}
